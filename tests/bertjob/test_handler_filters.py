"""The filters on the children's watchers pass exactly the events whose handler has work to do:
a training job with a condition to mirror, a data Job with an outcome."""

from datetime import UTC, datetime

import pytest

from bertjob import handlers, lifecycle

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
def test_filters_pass_the_events_their_handler_acts_on(conditions, has_status):
    status = {"conditions": conditions} if has_status else None
    body = {"metadata": {"name": "c", "namespace": "n"}, "status": status}
    mirrored = lifecycle.child_conditions(status or {}, AT)
    assert handlers._has_conditions(body=body) == bool(mirrored)
    assert handlers._has_outcome(body=body) == (lifecycle.prepare_outcome(status or {}) is not None)
