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
    training = changes.training_patch(spec)["spec"]["runPolicy"]
    assert training == {**expected, "suspend": suspended}, "a training job is suspended or not"
    prepare = changes.prepare_patch(spec)
    assert prepare["spec"] == {"suspend": suspended}
    assert json.loads(prepare["metadata"]["annotations"][changes.APPLIED_ANNOTATION]) == expected


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
    spec = {"runPolicy": {"suspend": True, "activeDeadlineSeconds": 60}}
    assert trainjob.policy_patch(spec) == {"spec": {"suspend": True}}
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
        changes.prepare_patch(applied)["metadata"]["annotations"][changes.APPLIED_ANNOTATION]
    )

    assert (recorded["activeDeadlineSeconds"], recorded["suspend"]) == (60, True)
    everything = changes.applicable(spec, accepted, registry.get("pytorchjob").safe_fields)
    assert everything["runPolicy"]["activeDeadlineSeconds"] == 120
