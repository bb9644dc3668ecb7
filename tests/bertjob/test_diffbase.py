"""kopf's record of the last spec handled (bertjob.diffbase): as kopf keeps it, but for a spec too
large for the job's annotations, kept as its digest (a real API server refused kopf's record of a
job with a 300 KB image: 'metadata.annotations: Too long: may not be more than 262144 bytes';
tests/cluster/test_handlers_e2e.py runs such a job on it)."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from bertjob import diffbase, handlers
from bertjob.diffbase import DIGEST_KEY, MAX_RECORD_BYTES, BoundedDiffBaseStorage, record_bytes, spec_of
from tests.bertjob.e2e import named_job

PREFIX = handlers.STORAGE_PREFIX


def _body(**fields: Any) -> kopf.Body:
    document = named_job("recorded", **fields)
    document["metadata"].update({"namespace": "ns", "uid": "u", "labels": {"team": "a"}})
    return kopf.Body(document)


def _build(storage: kopf.AnnotationsDiffBaseStorage, body: kopf.Body) -> dict[str, Any]:
    return dict(storage.build(body=body))


def test_a_spec_that_fits_is_recorded_as_kopf_records_it() -> None:
    body = _body(spec__image="x" * 100_000)

    essence = _build(BoundedDiffBaseStorage(prefix=PREFIX), body)

    assert essence == _build(kopf.AnnotationsDiffBaseStorage(prefix=PREFIX), body)
    assert essence["spec"]["image"] == "x" * 100_000


def test_a_spec_too_large_for_the_annotations_is_recorded_as_its_digest() -> None:
    storage = BoundedDiffBaseStorage(prefix=PREFIX)
    big = _body(spec__image="x" * 300_000)
    assert record_bytes(_build(kopf.AnnotationsDiffBaseStorage(prefix=PREFIX), big)) > MAX_RECORD_BYTES

    essence = _build(storage, big)

    assert list(essence["spec"]) == [DIGEST_KEY] and len(essence["spec"][DIGEST_KEY]) == 64
    assert essence["metadata"] == {"labels": {"team": "a"}}
    assert record_bytes(essence) < 1024
    # Built alike to store and to compare: the same spec, the same record; another, another.
    assert _build(storage, _body(spec__image="x" * 300_000)) == essence
    assert _build(storage, _body(spec__image="y" * 300_000)) != essence
    patch = kopf.Patch()
    storage.store(body=big, patch=patch, essence=storage.build(body=big))
    annotations = patch["metadata"]["annotations"]
    assert len(annotations[f"{PREFIX}/last-handled-configuration"]) < 1024


@pytest.mark.parametrize(
    ("value", "body", "expected"),
    [
        ({"image": "a"}, None, {"image": "a"}),
        (diffbase.digest({"image": "a"}), None, None),
        (diffbase.digest({"image": "a"}), {"spec": {"image": "b"}}, {"image": "b"}),
    ],
)
def test_a_digest_handed_to_a_handler_is_the_jobs_spec_or_nothing(
    value: Any, body: dict[str, Any] | None, expected: Any
) -> None:
    assert spec_of(value, body) == expected


def test_the_update_handler_reads_a_recorded_digest_from_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Any, Any]] = []
    monkeypatch.setattr(handlers, "change", lambda api, body, old, new, progress: seen.append((old, new)))
    body = _body(spec__image="x" * 300_000)

    handlers.update_job.__wrapped__(  # type: ignore[attr-defined]
        body=body, old=diffbase.digest({}), new=diffbase.digest(body["spec"]), memo=kopf.Memo(api=None)
    )

    assert seen == [(None, body["spec"])]
