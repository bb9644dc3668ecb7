"""spec.queueName under launcher trainjob: a warning, not a refusal (docs/design.md, "Kueue and
TrainJob"). The Kueue the tests run (v0.17.0) is built against Trainer v2.2 and the TrainJob we render
is Trainer v2.3's; Kueue supports that from v0.20, which the tests cannot build."""

from __future__ import annotations

from typing import Any

import pytest

from bertjob_api.spec import parse_job
from bertjob_api.validation import KUEUE_TRAINJOB_UNTESTED, cluster_job, warnings
from bertjob_testing.jobs import example, valid_job, with_value


def _spec(**changes: Any) -> Any:
    document = valid_job()
    for dotted, value in changes.items():
        document = with_value(document, dotted.replace("__", "."), value)
    return cluster_job(parse_job(document)).spec


def test_a_queued_trainjob_is_warned_of_naming_the_field() -> None:
    assert warnings(_spec(spec__launcher="trainjob", spec__queueName="team-a")) == [
        ("spec.queueName", KUEUE_TRAINJOB_UNTESTED)
    ]


@pytest.mark.parametrize(
    "changes",
    [
        {"spec__launcher": "trainjob"},
        {"spec__queueName": "team-a"},
        {"spec__launcher": "mpijob", "spec__queueName": "team-a"},
    ],
    ids=["trainjob-unqueued", "pytorchjob-queued", "mpijob-queued"],
)
def test_other_jobs_get_no_warning(changes: dict[str, Any]) -> None:
    assert warnings(_spec(**changes)) == []


def test_the_queued_trainjob_example_is_valid_and_warned_of() -> None:
    # A warning, not a refusal: a cluster on Kueue v0.20 or later queues it.
    spec = cluster_job(parse_job(example("bert-base-trainjob.yaml"))).spec

    assert spec.queue_name is not None
    assert [path for path, _ in warnings(spec)] == ["spec.queueName"]
