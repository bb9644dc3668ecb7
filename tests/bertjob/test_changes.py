"""Spec-change rules (:mod:`bertjob.changes`) as pure functions: which changes a started job takes.

Each row is an accepted spec and a new one, and the fields applied and refused, with the message
the job's SpecChangeRefused condition then carries (:func:`bertjob.lifecycle.spec_change`, with the
reason the handler gives); then the patches that carry the applied fields to the children.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from bertjob import changes, lifecycle
from bertjob.launchers import registry
from bertjob_api.crd import JobStatus

AT = datetime(2026, 1, 1, tzinfo=UTC)
# What the operator says of a valid change it does not apply (bertjob.handlers).
WHY = "not applied to a job that has started"
ACCEPTED: dict[str, Any] = {
    "image": "ghcr.io/bertjob/trainer:0.1.0",
    "model": {"preset": "bert-tiny"},
    "phases": [{"maxSeqLength": 128}],
    "runPolicy": {"suspend": False, "backoffLimit": 3},
}


def _with(**changed: Any) -> dict[str, Any]:
    return {**ACCEPTED, **changed}


@pytest.mark.parametrize(
    ("new", "applied", "refused"),
    [
        (ACCEPTED, [], []),
        (_with(runPolicy={"suspend": True, "backoffLimit": 3}), ["spec.runPolicy.suspend"], []),
        (
            _with(runPolicy={"suspend": False, "ttlSecondsAfterFinished": 60, "activeDeadlineSeconds": 7200}),
            [
                "spec.runPolicy.activeDeadlineSeconds",
                "spec.runPolicy.backoffLimit",
                "spec.runPolicy.ttlSecondsAfterFinished",
            ],
            [],
        ),
        (_with(model={"preset": "bert-base"}), [], ["spec.model.preset"]),
        (_with(image="other:1"), [], ["spec.image"]),
        # A list is compared whole: which entry changed is not named.
        (_with(phases=[{"maxSeqLength": 512}]), [], ["spec.phases"]),
        (_with(runPolicy={"suspend": False, "backoffLimit": 3, "schedulingPolicy": {"queue": "q"}}), [],
         ["spec.runPolicy.schedulingPolicy"]),
        (_with(runPolicy={"suspend": True}, seed=7),
         ["spec.runPolicy.backoffLimit", "spec.runPolicy.suspend"], ["spec.seed"]),
        ({key: value for key, value in ACCEPTED.items() if key != "model"}, [], ["spec.model"]),
        # A spec that is not a mapping differs whole.
        ("garbage", [], ["spec"]),
    ],
)  # fmt: skip
def test_which_changes_a_started_job_takes(new: Any, applied: list[str], refused: list[str]) -> None:
    assert changes.split(changes.changed_fields(ACCEPTED, new)) == (applied, refused)

    status = lifecycle.spec_change(JobStatus(phase="Running"), refused, WHY, 2, AT)

    found = {c.type: (c.status, c.reason, c.message) for c in status.conditions}
    expected = ("True", "UnsafeChange", f"{WHY}: {', '.join(refused)}") if refused else None
    assert found.get("SpecChangeRefused") == expected


@pytest.mark.parametrize(
    ("spec", "policy", "suspended"),
    [
        (None, {}, False),
        ("garbage", {}, False),
        ({"runPolicy": "garbage"}, {}, False),
        ({"runPolicy": {"suspend": True}}, {"suspend": True}, True),
        ({"runPolicy": {"suspend": "yes"}}, {"suspend": "yes"}, False),
        (
            {"runPolicy": {"backoffLimit": 2, "schedulingPolicy": {"queue": "q"}}},
            {"backoffLimit": 2},
            False,
        ),
    ],
)
def test_the_safe_run_policy_of_a_spec(spec: object, policy: dict[str, Any], suspended: bool) -> None:
    """Missing fields are None (a merge patch removes them); unsafe ones are left out."""
    expected = {name: policy.get(name) for name in changes.SAFE_RUN_POLICY}
    assert changes.safe_run_policy(spec) == expected
    assert changes.suspended(spec) is suspended
    normal = changes.normal(changes.safe_run_policy(spec))
    assert normal == {**expected, "suspend": suspended}, "a child is suspended or not"
    recorded = changes.recorded(changes.safe_run_policy(spec))
    assert json.loads(recorded["metadata"]["annotations"][changes.APPLIED_ANNOTATION]) == normal


@pytest.mark.parametrize(
    ("obj", "patch", "result"),
    [
        ({"a": 1}, {}, {"a": 1}),
        ({"a": 1}, {"a": None}, {}),
        ({"a": 1}, {"b": None}, {"a": 1}),
        ({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}, {"a": {"b": 1, "c": 3}}),
        ({"a": 1}, {"a": {"b": None, "c": 1}}, {"a": {"c": 1}}),
        ({"a": [1, 2]}, {"a": [3]}, {"a": [3]}),
    ],
)
def test_merged_is_a_json_merge_patch(
    obj: dict[str, Any], patch: dict[str, Any], result: dict[str, Any]
) -> None:
    before = json.dumps(obj)
    assert changes.merged(obj, patch) == result
    assert json.dumps(obj) == before, "the original is left as it was"


def test_children_render_from_the_accepted_spec_with_the_applied_run_policy() -> None:
    config_job = {"apiVersion": "bertjob.dev/v1alpha1", "spec": ACCEPTED}
    applied = changes.safe_run_policy({"runPolicy": {"suspend": True, "ttlSecondsAfterFinished": 60}})

    document = changes.accepted_document(config_job, applied)

    assert document["spec"]["runPolicy"] == {"suspend": True, "ttlSecondsAfterFinished": 60}
    assert {key: value for key, value in document["spec"].items() if key != "runPolicy"} == {
        key: value for key, value in ACCEPTED.items() if key != "runPolicy"
    }


def test_a_trainjob_takes_suspend_alone() -> None:
    """Trainer v2's TrainJob has suspend, and an activeDeadlineSeconds that cannot change (the CRD's
    rule self == oldSelf): the other safe fields are refused for it, and its patch is spec.suspend."""
    trainjob = registry.get("trainjob")
    fields = ["spec.runPolicy.suspend", "spec.runPolicy.activeDeadlineSeconds", "spec.image"]

    assert changes.split(fields, trainjob.safe_fields) == (
        ["spec.runPolicy.suspend"],
        ["spec.runPolicy.activeDeadlineSeconds", "spec.image"],
    )
    assert changes.split(fields, registry.get("pytorchjob").safe_fields) == (fields[:2], fields[2:])
    assert trainjob.policy_patch({"suspend": True, "activeDeadlineSeconds": 60}) == {
        "spec": {"suspend": True}
    }
    assert trainjob.policy_patch({"activeDeadlineSeconds": 60}) == {}
    assert trainjob.suspended({"suspend": True}) is True
    assert trainjob.suspended({"runPolicy": {"suspend": True}}) is False
    assert registry.get("mpijob").suspended({"runPolicy": {"suspend": True}}) is True


def test_a_change_refused_for_a_trainjob_is_not_recorded_for_it_on_the_data_job() -> None:
    """While the data Job runs, the safe fields are recorded on it for the training job made later:
    a TrainJob's launcher records suspend alone, the other fields as accepted."""
    accepted = {"runPolicy": {"activeDeadlineSeconds": 60}}
    spec = {"runPolicy": {"activeDeadlineSeconds": 120, "suspend": True}}

    applied = changes.applicable(spec, accepted, registry.get("trainjob").safe_fields)
    recorded = json.loads(
        changes.recorded(applied["runPolicy"])["metadata"]["annotations"][changes.APPLIED_ANNOTATION]
    )

    assert (recorded["activeDeadlineSeconds"], recorded["suspend"]) == (60, True)
    everything = changes.applicable(spec, accepted, registry.get("pytorchjob").safe_fields)
    assert everything["runPolicy"]["activeDeadlineSeconds"] == 120


# The run policy as last applied to a child (its record), and a later spec's: what the child gets.
APPLIED = {
    "suspend": False,
    "backoffLimit": 3,
    "ttlSecondsAfterFinished": None,
    "activeDeadlineSeconds": None,
}


def _policy(**changed: Any) -> dict[str, Any]:
    return {"runPolicy": {**APPLIED, **changed}}


@pytest.mark.parametrize(
    ("launcher", "spec", "queued", "written"),
    [
        # Nothing of the run policy changed (an unrelated change): nothing is written, not suspend.
        ("pytorchjob", _policy(), False, None),
        ("pytorchjob", _policy(), True, None),
        ("pytorchjob", {"runPolicy": {"backoffLimit": 3}}, True, None),
        # Only the field that changed is written; a suspend that Kueue holds stays.
        ("pytorchjob", _policy(backoffLimit=7), True, {"spec": {"runPolicy": {"backoffLimit": 7}}}),
        ("mpijob", _policy(ttlSecondsAfterFinished=60), False,
         {"spec": {"runPolicy": {"ttlSecondsAfterFinished": 60}}}),
        ("pytorchjob", {"runPolicy": {"suspend": False}}, False,
         {"spec": {"runPolicy": {"backoffLimit": None}}}),
        # The user's suspend reaches every child, a queued one too (a parent may suspend it).
        ("pytorchjob", _policy(suspend=True), False, {"spec": {"runPolicy": {"suspend": True}}}),
        ("pytorchjob", _policy(suspend=True), True, {"spec": {"runPolicy": {"suspend": True}}}),
        ("trainjob", _policy(suspend=True), True, {"spec": {"suspend": True}}),
        # A TrainJob takes suspend alone: a changed deadline is neither written nor recorded.
        ("trainjob", _policy(activeDeadlineSeconds=60), False, None),
        ("trainjob", _policy(activeDeadlineSeconds=60, suspend=True), False, {"spec": {"suspend": True}}),
        # The data Job takes suspend; the other fields are only recorded, for the training job.
        (None, _policy(suspend=True, backoffLimit=7), False, {"spec": {"suspend": True}}),
        (None, _policy(backoffLimit=7), False, {}),
    ],
)  # fmt: skip
def test_which_fields_reach_a_child(
    launcher: str | None, spec: dict[str, Any], queued: bool, written: dict[str, Any] | None
) -> None:
    safe_fields = registry.get(launcher or "pytorchjob").safe_fields
    write = registry.get(launcher).policy_patch if launcher else changes.prepare_patch
    wanted = changes.applicable(spec, {"runPolicy": APPLIED}, safe_fields)["runPolicy"]

    patch = changes.child_patch(APPLIED, wanted, queued=queued, write=write)

    if written is None:
        assert patch == {}
        return
    record = json.loads(patch.pop("metadata")["annotations"][changes.APPLIED_ANNOTATION])
    assert patch == written
    assert record == changes.normal(wanted)


@pytest.mark.parametrize(
    ("applied", "queued", "written"),
    [
        (True, False, {"suspend": False}),
        # Resumed by the user: a queued child is left to Kueue, which unsuspends it on admission...
        (True, True, {}),
        # ...and one that another controller suspended is never unsuspended, as nothing changed.
        (False, False, {}),
        (False, True, {}),
    ],
)
def test_resuming_never_unsuspends_what_kueue_holds(
    applied: bool, queued: bool, written: dict[str, Any]
) -> None:
    before = {**APPLIED, "suspend": applied}

    assert changes.to_write(before, {**APPLIED, "suspend": False}, queued=queued) == written


@pytest.mark.parametrize(
    ("launcher", "queued", "suspend"),
    [
        ("pytorchjob", True, True),
        ("pytorchjob", False, False),
        ("mpijob", True, True),
        ("trainjob", True, True),
    ],
)
def test_a_queued_child_is_created_suspended(launcher: str, queued: bool, suspend: bool) -> None:
    labels = {changes.QUEUE_LABEL: "team-a"} if queued else {"app": "x"}
    child = {
        "metadata": {"name": "c", "labels": labels},
        "spec": {"suspend": False, "runPolicy": {"suspend": False}},
    }
    policy = changes.safe_run_policy({"runPolicy": {"backoffLimit": 2}})

    created = changes.as_created(child, policy, registry.get(launcher).policy_patch)

    suspended = registry.get(launcher).suspended(created["spec"])
    assert suspended is suspend
    record = json.loads(created["metadata"]["annotations"][changes.APPLIED_ANNOTATION])
    assert record == {**changes.normal(policy), "suspend": False}, "the user's policy, not Kueue's hold"
    assert child["spec"] == {"suspend": False, "runPolicy": {"suspend": False}}, (
        "the rendered child is left alone"
    )
