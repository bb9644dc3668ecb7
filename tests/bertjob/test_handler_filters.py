"""The filters on the children's watchers pass exactly the events whose handler has work to do:
a training job with a condition to mirror, a data Job with an outcome."""

from datetime import UTC, datetime

import pytest

from bertjob import handlers, lifecycle
from bertjob.launchers import registry

AT = datetime(2026, 1, 1, tzinfo=UTC)
CONDITIONS = [
    None,
    [],
    ["Running"],
    [{"type": "Running", "status": "True"}],
    [{"type": "Created"}],
    [{"type": "Complete", "status": "True"}],
    [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}],
    [{"type": "Failed", "status": "False"}],
    [{"type": "Unknown", "status": "True"}, 3],
    [{"status": "True"}],
    [{"type": "Suspended", "status": "True", "lastTransitionTime": "not a time"}],
]


@pytest.mark.parametrize("conditions", CONDITIONS)
@pytest.mark.parametrize("has_status", [True, False])
@pytest.mark.parametrize("launcher", sorted(registry.LAUNCHERS))
def test_filters_pass_the_events_their_handler_acts_on(conditions, has_status, launcher):
    status = {"conditions": conditions} if has_status else None
    body = {**_kind(launcher), "metadata": {"name": "c", "namespace": "n"}, "status": status}
    mirrored = registry.LAUNCHERS[launcher].conditions(status or {}, AT)
    assert handlers._has_conditions(body=body) == bool(mirrored)
    assert handlers._has_outcome(body=body) == (lifecycle.prepare_outcome(status or {}) is not None)


@pytest.mark.parametrize(
    ("launcher", "passed"), [("trainjob", True), ("pytorchjob", False), ("mpijob", False)]
)
def test_a_trainjobs_child_jobs_pass_its_filter_alone(launcher, passed):
    """A TrainJob reports running through status.jobsStatus, which Kubeflow's jobs do not have."""
    status = {"jobsStatus": [{"name": "node", "ready": 1, "active": 1, "failed": 0, "succeeded": 0}]}
    body = {**_kind(launcher), "metadata": {"name": "c", "namespace": "n"}, "status": status}
    assert handlers._has_conditions(body=body) is passed


def test_a_child_of_another_kind_passes_no_filter():
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "status": {"conditions": [{"type": "Failed", "status": "True"}]},
    }
    assert handlers._has_conditions(body=body) is False


def _kind(launcher: str) -> dict[str, str]:
    child = registry.LAUNCHERS[launcher].child
    return {"apiVersion": child.api_version, "kind": child.kind}
