"""Every phase change gets exactly one Event, even when the operator dies between the status patch
and the Event: the operator runs as :mod:`faulty_operator`, which kills it at a chosen API call,
and is then started again without the fault.

Its own cluster (the session's one must not be killed), with the PyTorchJob CRD only.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bertjob_testing.kube_emulator import WAIT_S, Cluster, cluster_crds, running_cluster
from tests.bertjob.e2e import PYTORCHJOBS
from tests.bertjob.e2e import named_job as _job
from tests.bertjob.faulty_operator import FAULT_ENV, FAULT_EXIT
from tests.kubeflow_env import kubeflow_condition

HERE = Path(__file__).resolve().parent
KOPF = str(Path(sys.executable).with_name("kopf"))


class Faults:
    """The fault point the next operator start gets (``$BERTJOB_TEST_DIE_AFTER``); empty for none."""

    def __init__(self) -> None:
        self.at = ""

    def launch(self, command: list[str], _env: dict[str, str]) -> list[str]:
        """``command`` (``kopf run ... -m bertjob.handlers``) running :mod:`faulty_operator`."""
        module = command.index("bertjob.handlers")
        wrapped = [KOPF, *command[1:module], "faulty_operator", *command[module + 1 :]]
        path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
        return ["env", f"PYTHONPATH={path}", f"{FAULT_ENV}={self.at}", *wrapped]


@pytest.fixture(scope="module")
def faults() -> Faults:
    """Where the operator of :func:`faulty` dies."""
    return Faults()


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory, faults: Faults) -> Iterator[Cluster]:
    """The emulator and the operator run as :mod:`faulty_operator`, no fault set yet."""
    crds = cluster_crds(["pytorchjob"])
    with running_cluster(tmp_path_factory.mktemp("faults"), crds, launch=faults.launch) as cluster:
        yield cluster


def _restart(cluster: Cluster, faults: Faults, at: str) -> None:
    cluster.stop()
    faults.at = at
    cluster.start()


def _died(cluster: Cluster) -> None:
    assert cluster.operator is not None
    assert cluster.operator.wait(timeout=WAIT_S) == FAULT_EXIT, cluster.log_tail()
    cluster.operator = None


def _finish(cluster: Cluster, name: str) -> list[str]:
    """The job's Event reasons once it Succeeded and every Event about it is posted."""
    cluster.report(PYTORCHJOBS, name, {"conditions": [kubeflow_condition("Succeeded")]})
    cluster.status_when(name, "Succeeded")
    return cluster.reasons_when(name, lambda reasons: "Succeeded" in reasons)


@pytest.mark.parametrize("at", ["status:Running", "event:Running"])
def test_a_phase_change_gets_one_event_though_the_operator_died(
    faulty: Cluster, faults: Faults, at: str
) -> None:
    name = f"dies-after-{at.split(':')[0]}"
    _restart(faulty, faults, at)
    faulty.create_job(_job(name))
    faulty.status_when(name, "Pending")
    faulty.reasons_when(name, lambda reasons: "Pending" in reasons)

    faulty.report(PYTORCHJOBS, name, {"conditions": [kubeflow_condition("Running")]})
    _died(faulty)
    assert faulty.job(name)["status"]["phase"] == "Running"
    _restart(faulty, faults, "")

    reasons = _finish(faulty, name)
    assert [reasons.count(reason) for reason in ("Pending", "Running", "Succeeded")] == [1, 1, 1], reasons
    # The operator removes an Event from the status after posting it, so this comes a moment later.
    faulty.wait_for("no pending Events", lambda: not faulty.job(name)["status"].get("pendingEvents") or None)
