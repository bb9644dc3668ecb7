"""Events recorded in the status, and the run policy as applied: the pure parts, without a cluster."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from bertjob import changes, lifecycle
from bertjob_api.crd import JobStatus

AT = datetime(2026, 1, 1, tzinfo=UTC)


def test_recording_an_event_patches_only_its_own_key() -> None:
    # The status read may be stale: "job.0" may have been posted and removed since, and another
    # writer may have added "job.1". The patch names only the new key, so it neither brings back the
    # one nor drops the other.
    read = lifecycle.record(
        JobStatus(phase="Pending"), {"job.0": lifecycle.Transition("Normal", "Pending", "")}, AT
    )
    moved = lifecycle.moved(read, "Running", AT)

    patch = lifecycle.status_patch(
        read, lifecycle.record(moved, {"job.2": lifecycle.Transition("Normal", "Running", "m")}, AT)
    )

    assert patch == {
        "pendingEvents": {
            "job.2": {"type": "Normal", "reason": "Running", "message": "m", "time": "2026-01-01T00:00:00Z"}
        },
        "phase": "Running",
    }


def test_an_event_name_fits_a_kubernetes_name() -> None:
    name = lifecycle.event_name("a" * 250 + "-b", 2**63)

    assert len(name) <= lifecycle.NAME_LIMIT
    assert name.endswith(f".{2**63:x}") and not name.startswith("-")
    assert lifecycle.event_name("demo", 255) == "demo.ff"


def test_the_applied_run_policy_is_the_one_recorded_on_the_data_job() -> None:
    accepted = {"runPolicy": {"suspend": False, "backoffLimit": 3}}
    recorded = changes.recorded({"suspend": True, "ttlSecondsAfterFinished": 60})
    data_job = {"metadata": recorded["metadata"]}

    assert changes.applied_run_policy(data_job, accepted) == {
        "suspend": True,
        "ttlSecondsAfterFinished": 60,
        "activeDeadlineSeconds": None,
        "backoffLimit": None,
    }
    for unreadable in (None, "{", json.dumps({"suspend": True}), json.dumps([1])):
        annotations = {} if unreadable is None else {changes.APPLIED_ANNOTATION: unreadable}
        assert changes.applied_run_policy({"metadata": {"annotations": annotations}}, accepted) == {
            "suspend": False,
            "ttlSecondsAfterFinished": None,
            "activeDeadlineSeconds": None,
            "backoffLimit": 3,
        }
