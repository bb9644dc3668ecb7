"""The status state machine (:mod:`bertjob.lifecycle`) as pure functions, one table per move.

Each row is a status and an observation, and the phase, conditions and Event it must lead to;
no cluster, no emulator. The end-to-end tests show the same moves through kopf.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bertjob import lifecycle
from bertjob_api.crd import ChildRef, Condition, JobStatus, Phase

T0 = datetime(2026, 1, 1, tzinfo=UTC)
AT = T0 + timedelta(minutes=5)
DATA_JOB = ChildRef(api_version="batch/v1", kind="Job", name="demo-prepare")
TRAINING = ChildRef(api_version="kubeflow.org/v1", kind="PyTorchJob", name="demo")


def cond(
    type_: Any, status: bool = True, reason: str = "", message: str = "", at: datetime = T0
) -> Condition:
    """A condition, its reason defaulting to its type."""
    return lifecycle.condition(type_, reason or type_, message, at, status)


def conditions(status: JobStatus) -> dict[str, tuple[str, str]]:
    """``{type: (status, reason)}`` of a status's conditions."""
    return {item.type: (item.status, item.reason) for item in status.conditions}


# --- launched -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preparing", "suspended", "phase", "types"),
    [
        (False, False, "Pending", {"Created"}),
        (True, False, "Preparing", {"Created", "Preparing"}),
        (False, True, "Suspended", {"Created"}),
        (True, True, "Suspended", {"Created", "Preparing"}),
    ],
)
def test_launched(preparing: bool, suspended: bool, phase: Phase, types: set[str]) -> None:
    # A job failed for its spec, with a refused change, rendered again.
    before = JobStatus(
        phase="Failed",
        conditions=[cond("Failed", reason="InvalidSpec"), cond("SpecChangeRefused"), cond("Running")],
        completion_time=T0,
        start_time=T0,
    )
    children = [DATA_JOB] if preparing else [TRAINING]
    after = lifecycle.launched(
        before, children=children, config_map="demo-job", preparing=preparing, suspended=suspended,
        generation=3, at=AT,
    )  # fmt: skip

    assert after.phase == phase
    assert set(conditions(after)) == types | {"Running"}
    assert conditions(after)["Created"] == ("True", "ChildrenCreated")
    assert (after.children, after.config_map, after.observed_generation) == (children, "demo-job", 3)
    assert after.completion_time is None
    assert after.start_time == T0, "the first launch's start time is kept"
    assert lifecycle.launched(JobStatus(), children=children, config_map=None, preparing=preparing,
                              suspended=suspended, generation=None, at=AT).start_time == AT  # fmt: skip


# --- the data Job -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job_status", "outcome"),
    [
        ({}, None),
        ({"conditions": None}, None),
        ({"conditions": [{"type": "Suspended", "status": "True"}]}, None),
        ({"conditions": [{"type": "Complete", "status": "False"}]}, None),
        ({"conditions": ["garbage", {"type": "Complete", "status": "True"}]}, ("Complete", "Complete", "")),
        (
            {
                "conditions": [
                    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "m"}
                ]
            },
            ("Failed", "BackoffLimitExceeded", "m"),
        ),
        (
            {"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}]},
            ("Failed", "PodFailurePolicy", ""),
        ),
    ],
)
def test_prepare_outcome(job_status: dict[str, Any], outcome: tuple[str, str, str] | None) -> None:
    assert lifecycle.prepare_outcome(job_status) == outcome


@pytest.mark.parametrize(
    ("phase", "suspended", "expected"),
    [
        ("Preparing", False, "Pending"),
        ("Preparing", True, "Suspended"),
        ("Suspended", True, "Suspended"),
        ("Suspended", False, "Pending"),
        ("Failed", False, "Failed"),
        ("Succeeded", True, "Succeeded"),
    ],
)
def test_prepared(phase: Phase, suspended: bool, expected: Phase) -> None:
    before = JobStatus(phase=phase, children=[DATA_JOB, TRAINING], conditions=[cond("Preparing")])

    after = lifecycle.prepared(before, TRAINING, "Completed", "", suspended, AT)

    assert after.phase == expected
    assert conditions(after)["Preparing"] == ("False", "PrepareJobCompleted")
    assert conditions(after)["Prepared"] == ("True", "Completed")
    assert after.children == [DATA_JOB, TRAINING], "the training child is listed once, last"


# --- the training child ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("true", "phase"),
    [
        ((), None),
        (("Created",), "Pending"),
        (("Created", "Running"), "Running"),
        (("Created", "Restarting"), "Running"),
        (("Created", "Running", "Succeeded"), "Succeeded"),
        (("Created", "Running", "Failed"), "Failed"),
        (("Succeeded", "Failed"), "Succeeded"),
        (("Suspended",), None),
    ],
)
def test_child_phase(true: tuple[str, ...], phase: Phase | None) -> None:
    found = [cond(type_) for type_ in true] + [cond("Running", status=False)] * ("Running" not in true)
    assert lifecycle.child_phase(found) == phase


@pytest.mark.parametrize(
    ("phase", "child", "suspended", "expected"),
    [
        ("Pending", ("Created",), False, "Pending"),
        ("Pending", ("Created", "Running"), False, "Running"),
        ("Running", ("Created", "Restarting"), False, "Running"),
        ("Running", ("Created", "Running", "Succeeded"), False, "Succeeded"),
        ("Running", ("Created", "Running", "Failed"), False, "Failed"),
        ("Suspended", ("Created", "Running"), True, "Suspended"),
        ("Suspended", ("Created", "Running", "Succeeded"), True, "Succeeded"),
        ("Suspended", (), True, "Suspended"),
        ("Succeeded", ("Failed",), False, "Succeeded"),
        ("Failed", ("Running",), False, "Failed"),
        # Kueue holds a queued child (created suspended) and preempts an admitted one.
        ("Pending", ("Created", "Suspended"), True, "Pending"),
        ("Running", ("Created", "Suspended"), True, "Suspended"),
    ],
)
def test_follow_child(phase: Phase, child: tuple[str, ...], suspended: bool, expected: Phase) -> None:
    before = JobStatus(phase=phase)

    after = lifecycle.follow_child(before, [cond(type_) for type_ in child], suspended, AT)

    assert after.phase == expected
    if phase in lifecycle.TERMINAL_PHASES:
        assert after == before, "a finished job no longer moves"
    else:
        assert set(conditions(after)) == set(child), "the child's conditions are mirrored"
        assert after.completion_time == (AT if expected in lifecycle.TERMINAL_PHASES else None)


def test_a_condition_the_child_dropped_is_no_longer_true() -> None:
    """training-operator removes Restarting once Running is True again (and keeps it removed when
    the job fails): the job's copy turns False rather than staying True beside Failed."""
    restarting = lifecycle.follow_child(
        JobStatus(phase="Running"), [cond("Created"), cond("Restarting")], False, T0
    )
    assert conditions(restarting)["Restarting"] == ("True", "Restarting")

    failed = lifecycle.follow_child(
        restarting, [cond("Created"), cond("Running", False), cond("Failed")], False, AT
    )

    assert failed.phase == "Failed"
    assert conditions(failed)["Restarting"] == ("False", "Restarting")
    [dropped] = [c for c in failed.conditions if c.type == "Restarting"]
    assert (dropped.message, dropped.last_transition_time) == ("no longer reported by the training job", AT)


def _pod(name: str, phase: str, *codes: tuple[int, str]) -> dict[str, Any]:
    """A pod as the API server lists it, its containers terminated with (exit code, finishedAt)."""
    states = [{"state": {"terminated": {"exitCode": code, "finishedAt": at}}} for code, at in codes]
    return {"metadata": {"name": name}, "status": {"phase": phase, "containerStatuses": states}}


@pytest.mark.parametrize(
    ("pods", "says"),
    [
        (
            [_pod("j-worker-0", "Failed", (1, "2026-01-01T00:00:02Z")), _pod("j-master-0", "Running")],
            "pod j-worker-0 exited with code 1: a failure no retry mends",
        ),
        # The first to fail, not the peers that stopped after it.
        (
            [
                _pod("j-node-0-1", "Failed", (201, "2026-01-01T00:00:09Z")),
                _pod("j-node-0-0", "Failed", (2, "2026-01-01T00:00:03Z")),
            ],
            "pod j-node-0-0 exited with code 2: the job file does not pass validation",
        ),
        ([_pod("j-launcher", "Failed", (137, "2026-01-01T00:00:01Z"))], "code 137: killed by SIGKILL"),
        ([_pod("j-launcher", "Failed", (3, "2026-01-01T00:00:01Z"))], "pod j-launcher exited with code 3"),
        ([_pod("j-master-0", "Succeeded", (0, "2026-01-01T00:00:01Z"))], None),
        ([_pod("j-master-0", "Failed")], None),
        ([], None),
    ],
)
def test_pod_failure_names_the_first_pod_that_failed(pods: list[dict[str, Any]], says: str | None) -> None:
    found = lifecycle.pod_failure(pods)

    if says is None:
        assert found is None
    else:
        assert found is not None and says in found, found
        assert found.endswith(says) or ": " in found


def test_the_pod_that_failed_goes_into_the_failed_condition_only() -> None:
    child = [cond("Created"), cond("Failed", message="job j is failing because Worker replica(s) failed.")]

    named = lifecycle.with_pod_failure(child, "pod j-worker-0 exited with code 1")

    assert [c.message for c in named] == [
        "",
        "job j is failing because Worker replica(s) failed: pod j-worker-0 exited with code 1",
    ]
    assert lifecycle.with_pod_failure(child, None) == child


def test_child_conditions_mirror_kubeflows_types_only() -> None:
    status = {
        "conditions": [
            {
                "type": "Running",
                "status": "True",
                "reason": "Up",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            },
            {"type": "Restarting", "status": "maybe", "lastTransitionTime": "yesterday"},
            {"type": "JobQueued", "status": "True"},
            "garbage",
            {"type": "Failed", "status": "False", "message": "x" * 5000},
        ]
    }

    found = lifecycle.child_conditions(status, AT)

    assert [(c.type, c.status, c.reason, c.last_transition_time) for c in found] == [
        ("Running", "True", "Up", T0),
        ("Restarting", "Unknown", "Restarting", AT),
        ("Failed", "False", "Failed", AT),
    ]
    assert len(found[-1].message) == lifecycle.MESSAGE_LIMIT


# --- a Trainer v2 TrainJob's status ----------------------------------------------------------------


def _trainjob_condition(type_: str, status: str = "True", reason: str = "") -> dict[str, Any]:
    """A metav1.Condition as Trainer v2's controller writes it into a TrainJob's status."""
    return {
        "type": type_,
        "status": status,
        "reason": reason or type_,
        "message": f"TrainJob is {type_.lower()}",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


def _jobs(ready: int, active: int = 1) -> list[dict[str, Any]]:
    """``status.jobsStatus``: the counts of the `node` replicated job's child Jobs."""
    return [{"name": "node", "ready": ready, "succeeded": 0, "failed": 0, "active": active, "suspended": 0}]


@pytest.mark.parametrize(
    ("status", "expected", "phase"),
    [
        ({}, {}, None),
        (
            {"conditions": [_trainjob_condition("Created", reason="JobsCreationSucceeded")]},
            {"Created": "True"},
            "Pending",
        ),
        ({"jobsStatus": _jobs(ready=0)}, {"Running": "False"}, None),
        ({"jobsStatus": _jobs(ready=1)}, {"Running": "True"}, "Running"),
        (
            {"conditions": [_trainjob_condition("Complete")], "jobsStatus": _jobs(ready=1)},
            {"Succeeded": "True", "Running": "False"},
            "Succeeded",
        ),
        (
            {
                "conditions": [_trainjob_condition("Failed", reason="DeadlineExceeded")],
                "jobsStatus": _jobs(0, 0),
            },
            {"Failed": "True", "Running": "False"},
            "Failed",
        ),
        (
            {"conditions": [_trainjob_condition("Suspended", reason="Suspended")], "jobsStatus": _jobs(0, 0)},
            {"Suspended": "True", "Running": "False"},
            None,
        ),
        (
            {"conditions": [_trainjob_condition("Suspended", "False", "Resumed")]},
            {"Suspended": "False"},
            None,
        ),
        # Kubeflow v1's type is not a TrainJob's: a TrainJob never reports Running itself.
        ({"conditions": [_trainjob_condition("Running"), _trainjob_condition("Succeeded")]}, {}, None),
    ],
)
def test_trainjob_status_reads_as_our_conditions(
    status: dict[str, Any], expected: dict[str, str], phase: Phase | None
) -> None:
    found = lifecycle.trainjob_conditions(status, AT)

    assert {item.type: item.status for item in found} == expected
    assert lifecycle.child_phase(found) == phase
    assert lifecycle.has_trainjob_conditions(status) == bool(expected)


def test_a_trainjobs_times_and_reasons_are_kept() -> None:
    status = {"conditions": [_trainjob_condition("Failed", reason="DeadlineExceeded")]}

    [failed] = lifecycle.trainjob_conditions(status, AT)

    assert (failed.reason, failed.message, failed.last_transition_time) == (
        "DeadlineExceeded",
        "TrainJob is failed",
        T0,
    )


def test_a_running_trainjob_keeps_its_running_conditions_time() -> None:
    """Running is derived, with the time of the event that showed it: followed again, an unchanged
    Running keeps the time it first became true (with_condition)."""
    first = lifecycle.follow_child(
        JobStatus(phase="Pending"), lifecycle.trainjob_conditions({"jobsStatus": _jobs(1)}, T0), False, T0
    )
    again = lifecycle.follow_child(
        first, lifecycle.trainjob_conditions({"jobsStatus": _jobs(1)}, AT), False, AT
    )

    assert again.phase == "Running"
    [running] = [item for item in again.conditions if item.type == "Running"]
    assert running.last_transition_time == T0


# --- the user: suspend, and changes to the spec ---------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "suspended", "has_training", "expected", "condition"),
    [
        ("Running", True, True, "Suspended", ("True", "SuspendedByUser")),
        ("Preparing", True, False, "Suspended", ("True", "SuspendedByUser")),
        ("Suspended", False, True, "Pending", ("False", "ResumedByUser")),
        ("Suspended", False, False, "Preparing", ("False", "ResumedByUser")),
        ("Succeeded", True, True, "Succeeded", None),
        ("Failed", False, True, "Failed", None),
    ],
)
def test_suspension(
    phase: Phase, suspended: bool, has_training: bool, expected: Phase, condition: tuple[str, str] | None
) -> None:
    after = lifecycle.suspension(JobStatus(phase=phase), suspended, has_training, AT)

    assert after.phase == expected
    assert conditions(after).get("Suspended") == condition


@pytest.mark.parametrize(
    ("earlier", "refused", "condition"),
    [
        ((), (), None),
        ((), ("spec.model",), ("True", "UnsafeChange", "why: spec.model")),
        ((), ("spec.image", "spec.model"), ("True", "UnsafeChange", "why: spec.image, spec.model")),
        (("SpecChangeRefused",), (), ("False", "ChangeApplied", "the latest spec change was applied")),
        (("SpecChangeRefused",), ("spec.seed",), ("True", "UnsafeChange", "why: spec.seed")),
    ],
)
def test_spec_change(
    earlier: tuple[str, ...], refused: tuple[str, ...], condition: tuple[str, str, str] | None
) -> None:
    before = JobStatus(phase="Running", conditions=[cond(type_) for type_ in earlier], observed_generation=1)

    after = lifecycle.spec_change(before, list(refused), "why", 2, AT)

    found = {c.type: (c.status, c.reason, c.message) for c in after.conditions}
    assert found.get("SpecChangeRefused") == condition
    assert after.observed_generation == 2
    assert after.phase == "Running", "a spec change alone does not move the phase"


# --- failures, conditions and Events ---------------------------------------------------------------


def test_failed_records_the_completion_time_once() -> None:
    first = lifecycle.failed(JobStatus(phase="Running"), "InvalidSpec", "spec.model: bad", AT)
    again = lifecycle.failed(first, "RenderFailed", "later", AT + timedelta(hours=1))

    assert (first.phase, first.completion_time) == ("Failed", AT)
    assert conditions(first)["Failed"] == ("True", "InvalidSpec")
    assert (again.completion_time, conditions(again)["Failed"]) == (AT, ("True", "RenderFailed"))


def test_an_unchanged_condition_keeps_its_transition_time() -> None:
    status = lifecycle.with_condition(JobStatus(), cond("Running", at=T0))

    same = lifecycle.with_condition(status, cond("Running", at=AT))
    changed = lifecycle.with_condition(status, cond("Running", status=False, at=AT))

    assert same.conditions[0].last_transition_time == T0
    assert [(c.status, c.last_transition_time) for c in changed.conditions] == [("False", AT)]


@pytest.mark.parametrize(
    ("old", "new", "failure", "event"),
    [
        ("Pending", "Pending", None, None),
        (None, None, None, None),
        (None, "Pending", None, ("Normal", "Pending", "New -> Pending")),
        ("Pending", "Running", None, ("Normal", "Running", "Pending -> Running")),
        ("Running", "Failed", ("BackoffLimitExceeded", "pod crashed"),
         ("Warning", "BackoffLimitExceeded", "Running -> Failed: pod crashed")),
        ("Running", "Failed", None, ("Warning", "Failed", "Running -> Failed")),
        ("Suspended", "Succeeded", None, ("Normal", "Succeeded", "Suspended -> Succeeded")),
    ],
)  # fmt: skip
def test_transition(
    old: Phase | None, new: Phase | None, failure: tuple[str, str] | None, event: tuple[Any, str, str] | None
) -> None:
    found = [cond("Failed", reason=failure[0], message=failure[1])] if failure else []

    transition = lifecycle.transition(JobStatus(phase=old), JobStatus(phase=new, conditions=found))

    assert transition == (lifecycle.Transition(*event) if event else None)


@pytest.mark.parametrize(
    ("before", "after", "patch"),
    [
        ({}, {}, {}),
        ({"phase": "Pending"}, {"phase": "Running"}, {"phase": "Running"}),
        ({"phase": "Pending", "configMap": "c"}, {"phase": "Pending"}, {"configMap": None}),
        # The trainer's progress is never the operator's to write, nor to delete.
        ({"phase": "Running"}, {"phase": "Running", "progress": {"phase": 1, "step": 1, "totalSteps": 2,
                                                                 "updateTime": "2026-01-01T00:00:00Z"}}, {}),
        # Nor are its fine-tuning results, written once each task ends.
        ({"phase": "Running", "results": [{"task": "mrpc", "metric": "f1", "median": 0.8, "best": 0.9,
                                           "seeds": 3, "summary": "mrpc f1 0.8000"}]},
         {"phase": "Succeeded"}, {"phase": "Succeeded"}),
    ],
)  # fmt: skip
def test_status_patch(before: dict[str, Any], after: dict[str, Any], patch: dict[str, Any]) -> None:
    assert lifecycle.status_patch(JobStatus.model_validate(before), JobStatus.model_validate(after)) == patch


@pytest.mark.parametrize(
    ("obj", "phase"),
    [
        ({}, None),
        ({"status": None}, None),
        ({"status": {"phase": "Running"}}, "Running"),
        ({"status": {"phase": "Exploded"}}, None),
        ({"status": {"conditions": "not a list"}}, None),
    ],
)
def test_a_status_the_operator_did_not_write_reads_as_empty(obj: dict[str, Any], phase: Phase | None) -> None:
    assert lifecycle.of(obj).phase == phase


@pytest.mark.parametrize(("length", "kept"), [(0, 0), (1024, 1024), (1025, 1024), (5000, 1024)])
def test_short(length: int, kept: int) -> None:
    message = lifecycle.short("x" * length)
    assert len(message) == kept
    assert message.endswith("...") == (length > lifecycle.MESSAGE_LIMIT)


@pytest.mark.parametrize(
    ("raw", "phase", "conditions", "junk"),
    [
        (None, None, [], ()),
        ("garbage", None, [], ("status",)),
        (["Running"], None, [], ("status",)),
        (12, None, [], ("status",)),
        ({"phase": 12}, None, [], ("phase",)),
        ({"phase": "Running", "conditions": "x"}, "Running", [], ("conditions",)),
        ({"phase": 12, "conditions": "x", "configMap": "demo-job"}, None, [], ("conditions", "phase")),
        ({"phase": "Pending", "conditions": ["x", 1]}, "Pending", [], ("conditions",)),
        ({"phase": "Pending", "pendingEvents": "x"}, "Pending", [], ("pendingEvents",)),
        ({"phase": "Pending", "pendingEvents": {"a": "x"}}, "Pending", [], ("pendingEvents",)),
        ({"phase": "Pending", "progress": "x", "observedGeneration": "one"}, "Pending", [],
         ("observedGeneration", "progress")),
        ({"phase": "Pending", "conditions": [{"type": "Created", "status": "True", "reason": "R",
          "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}, "Pending", ["Created"], ()),
    ],
)  # fmt: skip
def test_a_malformed_status_reads_field_by_field(
    raw: Any, phase: Phase | None, conditions: list[str], junk: tuple[str, ...]
) -> None:
    status, found = lifecycle.read({"status": raw})
    assert (status.phase, [c.type for c in status.conditions], found) == (phase, conditions, junk)
    assert lifecycle.of({"status": raw}) == status
    if isinstance(raw, dict) and "configMap" in raw:
        assert status.config_map == raw["configMap"]


@pytest.mark.parametrize(
    ("raw", "after", "patch"),
    [
        # Junk the new status does not set is deleted; junk it sets is given whole, not merged.
        ({"phase": 12, "configMap": "c"}, {"configMap": "c"}, {"phase": None}),
        ({"phase": "Pending", "conditions": "x"}, {"phase": "Running"},
         {"phase": "Running", "conditions": []}),
        ({"phase": "Pending", "pendingEvents": "x"},
         {"phase": "Pending", "pendingEvents": {"e": {"type": "Normal", "reason": "R", "message": "m",
                                                       "time": "2026-01-01T00:00:00Z"}}},
         {"pendingEvents": {"e": {"type": "Normal", "reason": "R", "message": "m",
                                  "time": "2026-01-01T00:00:00Z"}}}),
        # The trainer's field of the wrong shape too: it writes it again.
        ({"phase": "Running", "progress": "x"}, {"phase": "Running"}, {"progress": None}),
        # A status that is not an object is written whole (None: every field of the new status).
        ("garbage", {}, None),
        ("garbage", {"phase": "Pending", "configMap": "c"}, None),
    ],
)  # fmt: skip
def test_a_status_patch_writes_over_junk(
    raw: Any, after: dict[str, Any], patch: dict[str, Any] | None
) -> None:
    current, junk = lifecycle.read({"status": raw})
    assert junk, "the row has junk"
    new = JobStatus.model_validate(after)

    written = lifecycle.status_patch(current, new, junk)

    assert written == (lifecycle.dump(new) if patch is None else patch)


# --- kstatus conditions -----------------------------------------------------------------------------

FAILED = cond("Failed", reason="BackoffLimitExceeded", message="worker 1 exited 137")
REFUSED = cond("SpecChangeRefused", reason="UnsafeChange", message="not applied: spec.image")
INVALID = cond("Failed", reason="InvalidSpec")
APPLIED = cond("SpecChangeRefused", False, "ChangeApplied")


@pytest.mark.parametrize(
    ("phase", "extra", "observed", "generation", "ready", "reconciling", "stalled"),
    [
        # phase, other conditions, observedGeneration, metadata.generation ->
        # Ready (status, reason), Reconciling reason, Stalled reason (None: absent)
        (None, [], None, 1, ("False", "Launching"), "Launching", None),
        ("Pending", [], 1, 1, ("False", "Pending"), "Pending", None),
        ("Preparing", [], 1, 1, ("False", "Preparing"), "Preparing", None),
        ("Running", [], 1, 1, ("True", "Running"), None, None),
        ("Running", [cond("Restarting")], 1, 1, ("True", "Running"), None, None),
        ("Succeeded", [], 1, 1, ("True", "Succeeded"), None, None),
        ("Suspended", [], 2, 2, ("False", "Suspended"), None, None),
        ("Failed", [FAILED], 1, 1, ("False", "BackoffLimitExceeded"), None, "BackoffLimitExceeded"),
        ("Failed", [INVALID], None, 1, ("False", "InvalidSpec"), None, "InvalidSpec"),
        ("Failed", [], 1, 1, ("False", "Failed"), None, "Failed"),
        # A refused change stalls the job whatever its phase; one applied since does not.
        ("Running", [REFUSED], 2, 2, ("False", "SpecChangeRefused"), None, "SpecChangeRefused"),
        ("Pending", [REFUSED], 2, 2, ("False", "SpecChangeRefused"), None, "SpecChangeRefused"),
        ("Succeeded", [REFUSED], 2, 2, ("False", "SpecChangeRefused"), None, "SpecChangeRefused"),
        ("Running", [APPLIED], 3, 3, ("True", "Running"), None, None),
        # A spec generation the operator has not handled yet: reconciling, whatever came before.
        ("Running", [], 1, 2, ("False", "NewGeneration"), "NewGeneration", None),
        ("Running", [REFUSED], 2, 3, ("False", "NewGeneration"), "NewGeneration", None),
        ("Failed", [INVALID], 1, 2, ("False", "NewGeneration"), "NewGeneration", None),
        # No generation to compare (an old status, or a job read without one): the phase decides.
        ("Running", [], None, 2, ("True", "Running"), None, None),
        ("Running", [], 1, None, ("True", "Running"), None, None),
    ],
)  # fmt: skip
def test_kstatus(
    phase: Phase | None,
    extra: list[Condition],
    observed: int | None,
    generation: int | None,
    ready: tuple[str, str],
    reconciling: str | None,
    stalled: str | None,
) -> None:
    before = JobStatus(phase=phase, conditions=[cond("Created"), *extra], observed_generation=observed)

    after = lifecycle.with_kstatus(before, generation, AT)

    found = conditions(after)
    assert found["Ready"] == ready
    assert found.get("Reconciling") == (reconciling and ("True", reconciling))
    assert found.get("Stalled") == (stalled and ("True", stalled))
    # The other conditions, the phase and observedGeneration are left as they were.
    others = [item for item in after.conditions if item.type not in lifecycle.KSTATUS_TYPES]
    assert others == before.conditions
    assert (after.phase, after.observed_generation) == (phase, observed)


def test_kstatus_messages_say_why() -> None:
    failed = lifecycle.with_kstatus(JobStatus(phase="Failed", conditions=[FAILED]), 1, AT)
    refused = lifecycle.with_kstatus(JobStatus(phase="Running", conditions=[REFUSED]), None, AT)
    behind = lifecycle.with_kstatus(JobStatus(phase="Running", observed_generation=3), 4, AT)

    assert {c.type: c.message for c in failed.conditions if c.type in ("Ready", "Stalled")} == {
        "Ready": "worker 1 exited 137",
        "Stalled": "worker 1 exited 137",
    }
    assert lifecycle._true(refused, "Stalled").message == "not applied: spec.image"  # type: ignore[union-attr]
    assert "generation 4" in lifecycle._true(behind, "Reconciling").message  # type: ignore[union-attr]


def test_kstatus_conditions_go_when_they_no_longer_hold() -> None:
    pending = lifecycle.with_kstatus(JobStatus(phase="Pending", observed_generation=1), 1, T0)
    assert set(conditions(pending)) == {"Ready", "Reconciling"}

    running = lifecycle.with_kstatus(lifecycle.moved(pending, "Running", AT), 1, AT)
    failed = lifecycle.with_kstatus(lifecycle.failed(running, "BackoffLimitExceeded", "", AT), 1, AT)
    # Resumed from a refused change by undoing it: Stalled goes, Ready comes back.
    refused = lifecycle.with_kstatus(lifecycle.spec_change(running, ["spec.image"], "no", 2, AT), 2, AT)
    undone = lifecycle.with_kstatus(lifecycle.spec_change(refused, [], "", 3, AT), 3, AT)

    assert conditions(running) == {"Ready": ("True", "Running")}
    assert set(conditions(failed)) == {"Ready", "Stalled", "Failed"}
    assert conditions(refused)["Stalled"] == ("True", "SpecChangeRefused")
    assert "Stalled" not in conditions(undone) and conditions(undone)["Ready"] == ("True", "Running")


def test_kstatus_keeps_the_transition_time_of_what_did_not_change() -> None:
    first = lifecycle.with_kstatus(JobStatus(phase="Running", observed_generation=1), 1, T0)
    again = lifecycle.with_kstatus(first, 1, AT)

    assert again == first
    assert lifecycle._true(again, "Ready").last_transition_time == T0  # type: ignore[union-attr]


def test_failed_records_the_generation_that_failed() -> None:
    launched = JobStatus(phase="Pending", observed_generation=1)

    assert lifecycle.failed(launched, "InvalidSpec", "spec.x", AT, generation=2).observed_generation == 2
    assert lifecycle.failed(launched, "BackoffLimitExceeded", "", AT).observed_generation == 1
