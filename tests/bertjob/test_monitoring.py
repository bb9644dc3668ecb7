"""``bertjob_jobs`` forgets a job deleted while the operator's watch was away: a resumed watch lists
again and sends no DELETED event for it, so the count is pruned from lists of each namespace
(:meth:`bertjob.monitoring.JobPhases.prune`, :func:`bertjob.monitoring.resync`); what an event
newer than the list said is never undone. The real API server's case is
tests/cluster/test_apiserver_restart.py.

A fake clock stands for ``time.monotonic()``, so "seen after the list started" is exact, and a fake
``CustomObjectsApi`` for the lists: what is checked here is the bookkeeping, not the request.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from bertjob import monitoring
from bertjob.monitoring import JobPhases
from bertjob_api.contract import PLURAL


class Clock:
    """``time.monotonic()`` as the test sets it, in seconds."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(monitoring.time, "monotonic", fake)
    return fake


def _gauge(jobs: JobPhases) -> dict[str, float]:
    """``bertjob_jobs`` by phase, the zeros left out."""
    [family] = jobs.collect()
    return {sample.labels["phase"]: sample.value for sample in family.samples if sample.value}


def test_the_prune_forgets_a_job_not_listed_and_seen_before_the_list(clock: Clock) -> None:
    jobs = JobPhases()
    jobs.seen("team-a", "kept", "Running")
    jobs.seen("team-a", "deleted", "Pending")
    clock.now += 1
    assert jobs.prune("team-a", {"kept"}, started=clock.now) == ["deleted"]
    assert _gauge(jobs) == {"Running": 1}
    assert jobs.count() == 1


def test_the_prune_keeps_a_job_seen_after_the_list_started(clock: Clock) -> None:
    jobs = JobPhases()
    jobs.seen("team-a", "old", "Pending")
    started = clock.now + 1
    # Created while the list was on its way: its event is newer than what the list answered.
    clock.now = started + 0.5
    jobs.seen("team-a", "new", None)
    assert jobs.prune("team-a", set(), started) == ["old"]
    assert _gauge(jobs) == {monitoring.UNSET_PHASE: 1}
    # Seen at the very second a list started: not older than the list, so kept too.
    clock.now += 1
    jobs.seen("team-a", "again", "Pending")
    assert jobs.prune("team-a", set(), clock.now) == ["new"]
    assert jobs.namespaces() == {"team-a"}


def test_the_prune_leaves_other_namespaces_alone(clock: Clock) -> None:
    jobs = JobPhases()
    jobs.seen("team-a", "same-name", "Running")
    jobs.seen("team-b", "same-name", "Succeeded")
    jobs.seen("team-b", "other", "Failed")
    clock.now += 1
    assert jobs.prune("team-a", set(), clock.now) == ["same-name"]
    assert _gauge(jobs) == {"Succeeded": 1, "Failed": 1}
    assert jobs.namespaces() == {"team-b"}


class Objects:
    """A ``CustomObjectsApi`` whose lists answer ``listed`` by namespace, or raise ``failing``'s."""

    def __init__(self, listed: dict[str, list[str]], failing: dict[str, Exception]) -> None:
        self.listed, self.failing = listed, failing
        self.asked: list[tuple[str, str, float]] = []

    def list_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, _request_timeout: float
    ) -> dict[str, Any]:
        self.asked.append((namespace, plural, _request_timeout))
        if namespace in self.failing:
            raise self.failing[namespace]
        return {"items": [{"metadata": {"name": name}} for name in self.listed[namespace]]}


def test_a_resync_lists_each_namespace_counted_and_a_failed_list_leaves_its_namespace_as_it_is(
    clock: Clock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    jobs = JobPhases()
    for namespace in ("team-a", "team-b", "team-c"):
        jobs.seen(namespace, "kept", "Running")
        jobs.seen(namespace, "deleted", "Pending")
    clock.now += 1
    objects = Objects(
        {"team-a": ["kept"], "team-c": ["kept"]},
        {"team-b": ApiException(status=503, reason="Service Unavailable")},
    )
    monkeypatch.setattr(monitoring, "CustomObjectsApi", lambda api: objects)
    with caplog.at_level(logging.WARNING, logger=monitoring.log.name):
        monitoring.resync(api=None, period_s=60, jobs=jobs)  # type: ignore[arg-type]
    assert objects.asked == [(ns, PLURAL, monitoring.LIST_TIMEOUT_S) for ns in ("team-a", "team-b", "team-c")]
    assert _gauge(jobs) == {"Running": 3, "Pending": 1}
    [warning] = [record.getMessage() for record in caplog.records]
    assert warning == (
        f"cannot list the {PLURAL} of team-b to recount bertjob_jobs (HTTP 503 Service Unavailable); "
        "trying again in 60 s"
    )
    # The server unreachable: the same one line, and the count kept for the next resync.
    caplog.clear()
    objects.failing = dict.fromkeys(("team-a", "team-b", "team-c"), ConnectionRefusedError(111, "refused"))
    monitoring.resync(api=None, period_s=60, jobs=jobs)  # type: ignore[arg-type]
    assert [record.getMessage().split(" (")[1] for record in caplog.records] == [
        "[Errno 111] refused); trying again in 60 s"
    ] * 3
    assert _gauge(jobs) == {"Running": 3, "Pending": 1}
