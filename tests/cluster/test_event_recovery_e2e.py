"""Every phase change gets exactly one Event, even when the operator dies between the status patch
and the Event: the operator runs as :mod:`faulty_operator`, which kills it at a chosen API call,
and is then started again without the fault.

On the real control plane: the chart's operator is stopped for this module and the faulty one
runs in its place, under the same ServiceAccount and webhook (one operator at a time); the chart's
own starts again after.

Why kwok: no pod needs to run: the fault is the operator's own death at a chosen API call, and the
test writes the child's Running and Succeeded as Kubeflow would.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bertjob_testing.cluster.operator import RealCluster as Cluster
from bertjob_testing.kube_emulator import WAIT_S
from tests.bertjob import faulty_operator
from tests.bertjob.e2e import PYTORCHJOBS
from tests.bertjob.e2e import named_job as _job
from tests.bertjob.faulty_operator import FAULT_ENV, FAULT_EXIT
from tests.kubeflow_env import kubeflow_condition

pytestmark = pytest.mark.xdist_group("operator")

# Where faulty_operator is, for kopf's -m.
HERE = Path(faulty_operator.__file__).resolve().parent
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
def faulty(operator: Cluster, faults: Faults) -> Iterator[Cluster]:
    """The chart's operator run as :mod:`faulty_operator`, no fault set yet; as itself again after."""
    operator.stop()
    operator.launch = faults.launch
    try:
        operator.start()
        yield operator
    finally:
        operator.stop()
        operator.launch = None
        operator.start()


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
    faulty: Cluster, cluster: Cluster, faults: Faults, at: str
) -> None:
    assert faulty is cluster  # the faulty operator, its calls in the test's namespace
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
