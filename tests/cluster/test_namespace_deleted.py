"""A namespace deleted with jobs in it, on the real control plane: the namespace controller and the
garbage collector remove everything (the jobs, their children and pods), no finalizer holds the
namespace, and the operator does not loop on errors about the objects that went away.

Why kwok: the pods only need to exist (stand-ins for the training operator's); what is tested is
what the API server, its controllers and the operator do with the objects.
"""

from __future__ import annotations

import json
import time

import pytest

from bertjob_api.contract import PLURAL
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.operator import RealCluster, wait_until
from tests.bertjob.e2e import named_job
from tests.cluster.test_operator import _phase, _stand_in_for_the_training_operator, forbidden

pytestmark = pytest.mark.timeout(300)
JOBS = 3


def test_a_namespace_deleted_with_running_jobs_goes_and_leaves_the_operator_quiet(
    operator: RealCluster, control_plane: ControlPlane
) -> None:
    plane = control_plane
    namespace = "deleted-with-jobs"
    plane.kubectl("create", "namespace", namespace)
    names = [f"job-{index}" for index in range(JOBS)]
    for name in names:
        plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(named_job(name)))
    for name in names:
        _phase(operator, namespace, name, "Pending")
        _stand_in_for_the_training_operator(plane, namespace, name)
    lines_before = len(operator.log.read_text().splitlines())

    started = time.monotonic()
    plane.kubectl("delete", "namespace", namespace, "--wait=false")
    wait_until(
        f"the namespace {namespace} to be gone",
        lambda: plane.kubectl("get", "namespace", namespace, check=False).returncode != 0,
        wait_s=180,
    )
    gone_s = time.monotonic() - started
    assert not plane.kubectl.get(PLURAL, "-A")["items"] or all(
        job["metadata"]["namespace"] != namespace for job in plane.kubectl.get(PLURAL, "-A")["items"]
    )
    # A few lines about the jobs going away are expected; a loop of retries is not.
    time.sleep(5)
    after = operator.log.read_text().splitlines()[lines_before:]
    errors = [line for line in after if namespace in line and ("ERROR" in line or "Traceback" in line)]
    assert len(errors) <= JOBS, "\n".join(errors[:20])
    assert not forbidden(operator), "\n".join(forbidden(operator))
    print(f"\nthe namespace with {JOBS} jobs was gone {gone_s:.1f} s after its deletion")
