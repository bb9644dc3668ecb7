"""kopf's record of the last spec it handled, kept small enough for the job's annotations.

kopf remembers what it last handled of each job (its "essence": the spec, labels and annotations)
in an annotation of the job, and compares the job with it to tell a creation and a change apart.
The API server allows 256 KiB of annotations on an object in all; a valid job's spec can be larger
(an image name or an environment value of 300 KB renders objects that fit the 1 MiB the operator
allows one object). A real API server refused kopf's record of such a job ('metadata.annotations:
Too long: may not be more than 262144 bytes'), so kopf never recorded it as handled and ran its
creation again on every event, without end, logging the refusal each time.

:class:`BoundedDiffBaseStorage` keeps kopf's record as kopf does, except for an essence larger
than :data:`MAX_RECORD_BYTES`: its spec is recorded as a digest (:data:`DIGEST_KEY`). A change of
such a spec still changes the digest, so kopf still calls the update handler, which reads the spec
from the job itself (:func:`spec_of`) instead of the digest kopf hands it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

# Half the 256 KiB the API server allows an object's annotations in all: the rest is left to the
# job's own annotations (kubectl's last-applied-configuration, which kopf leaves out of its record).
MAX_RECORD_BYTES = 128 * 1024
# The only key of a spec recorded as its digest.
DIGEST_KEY = "bertjob.dev/sha256"


def record_bytes(essence: Mapping[str, Any]) -> int:
    """Bytes of ``essence`` as kopf writes it into its annotation (JSON)."""
    return len(
        json.dumps(essence, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
    )


def digest(spec: Any) -> dict[str, str]:
    """The record of a spec too large to keep: the SHA-256 of its canonical JSON."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return {DIGEST_KEY: hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()}


def is_digest(value: Any) -> bool:
    """Whether ``value`` is the record of a spec kept as its digest (:func:`digest`)."""
    return isinstance(value, Mapping) and set(value) == {DIGEST_KEY}


def spec_of(value: Any, body: Mapping[str, Any] | None) -> Any:
    """A spec kopf hands a handler (``old`` or ``new``) as it was: itself, or, for a digest, the
    job's spec as ``body`` holds it (the new one) and None where there is no body (an old spec,
    which is not kept)."""
    if not is_digest(value):
        return value
    return None if body is None else body.get("spec")


class BoundedDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's :class:`kopf.AnnotationsDiffBaseStorage`, recording the spec of an essence larger
    than :data:`MAX_RECORD_BYTES` as its digest, both to store and to compare with (the two are
    built alike, so an unchanged job compares equal to its record)."""

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        essence = super().build(body=body, extra_fields=extra_fields)
        if "spec" in essence and record_bytes(essence) > MAX_RECORD_BYTES:
            essence["spec"] = digest(essence["spec"])
        return essence
