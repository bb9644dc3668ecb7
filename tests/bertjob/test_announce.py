"""The operator posts each Event that a job's status holds once, however many watch events list it."""

from __future__ import annotations

import uuid
from typing import Any

import kopf
import pytest
from kubernetes.client.exceptions import ApiException

from bertjob import handlers


def _job(*names: str) -> kopf.Body:
    """A job whose status holds a pending Event under each of ``names``, as a watch event sends it."""
    pending = {
        name: {"type": "Normal", "reason": "Pending", "message": "", "time": "2026-01-01T00:00:00Z"}
        for name in names
    }
    metadata = {"name": "job", "namespace": "default", "uid": "uid-1"}
    return kopf.Body({"metadata": metadata, "status": {"pendingEvents": pending}})


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """The requests that announce makes, as (what, detail); its posts and patches succeed."""
    made: list[tuple[str, Any]] = []
    monkeypatch.setattr(handlers, "post_event", lambda api, job, name, event: made.append(("post", name)))
    monkeypatch.setattr(handlers, "patch_status", lambda api, job, patch: made.append(("patch", patch)))
    return made


def test_a_stale_watch_event_does_not_post_or_remove_the_events_again(api: list[tuple[str, Any]]) -> None:
    # Event names are the job's and a timestamp: unique to each test here, as in a cluster.
    first, second = (f"job.{uuid.uuid4().hex}" for _ in range(2))
    stale = _job(first, second)
    handlers.announce(body=stale, memo=kopf.Memo(api=None))
    # The watch event that kopf's own patch sends can arrive before the removal, still listing both.
    assert not handlers._has_pending_events(body=stale, type="MODIFIED")
    handlers.announce(body=stale, memo=kopf.Memo(api=None))
    assert api == [
        ("post", min(first, second)),
        ("post", max(first, second)),
        ("patch", {"pendingEvents": {first: None, second: None}}),
    ]
    # A new Event recorded later is posted, the old ones still left out.
    third = f"job.{uuid.uuid4().hex}"
    handlers.announce(body=_job(first, second, third), memo=kopf.Memo(api=None))
    assert api[3:] == [("post", third), ("patch", {"pendingEvents": {third: None}})]


def test_events_whose_removal_failed_are_posted_and_removed_the_next_time(
    api: list[tuple[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"job.{uuid.uuid4().hex}"

    def refused(api_client: Any, job: Any, patch: Any) -> None:
        raise ApiException(status=500, reason="Internal Server Error")

    monkeypatch.setattr(handlers, "patch_status", refused)
    with pytest.raises(ApiException):
        handlers.announce(body=_job(name), memo=kopf.Memo(api=None))
    monkeypatch.setattr(handlers, "patch_status", lambda api_client, job, patch: api.append(("patch", patch)))
    assert handlers._has_pending_events(body=_job(name), type="MODIFIED")
    handlers.announce(body=_job(name), memo=kopf.Memo(api=None))
    assert api == [("post", name), ("post", name), ("patch", {"pendingEvents": {name: None}})]
