"""Spec changes to a job that already has children: which are applied, and how.

A running job takes only changes to the training job's run policy that Kubeflow's operators act on
while the job runs: ``suspend`` (pods deleted, resumed later from the last checkpoint),
``ttlSecondsAfterFinished``, ``activeDeadlineSeconds`` and ``backoffLimit`` (a TrainJob: ``suspend``
alone, its launcher's ``safe_fields``). Everything else
(model, data, phases, image, topology, pods...) would change a job half-way through training,
so it is refused and reaches no child. A spec that is invalid as a whole is refused whole: not even
its safe fields are applied. The accepted spec stays in the job's ConfigMap; children made later
(the training job after the data Job) are rendered from it, with the safe fields as last applied
(:func:`applied_run_policy`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

# Fields of spec.runPolicy applied to a running job, as named in Kubeflow's RunPolicy too.
SAFE_RUN_POLICY = ("suspend", "ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit")
SAFE_FIELDS = tuple(f"spec.runPolicy.{name}" for name in SAFE_RUN_POLICY)
# On the data Job: the safe fields as last applied, for the training job made when it completes.
APPLIED_ANNOTATION = "bertjob.dev/applied-run-policy"


def changed_fields(old: object, new: object, prefix: str = "spec") -> list[str]:
    """Dotted paths (``spec.runPolicy.suspend``) of what differs between two specs; mappings are
    compared key by key, anything else (lists included) whole."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        found: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            found += changed_fields(old.get(key), new.get(key), f"{prefix}.{key}")
        return found
    return [] if old == new else [prefix]


def split(fields: list[str], safe_fields: tuple[str, ...] = SAFE_FIELDS) -> tuple[list[str], list[str]]:
    """``fields`` as (safe to apply, refused); ``safe_fields`` are those the child's launcher applies
    to a running child (all of :data:`SAFE_FIELDS` for Kubeflow's jobs, suspend alone for a TrainJob)."""
    safe = [field for field in fields if field in safe_fields]
    return safe, [field for field in fields if field not in safe_fields]


def safe_run_policy(spec: object) -> dict[str, Any]:
    """The safe run-policy fields of a spec as it is now (missing ones as None, which a merge patch
    reads as "remove"); a spec of the wrong shape counts as setting none of them."""
    policy = spec.get("runPolicy") if isinstance(spec, Mapping) else None
    policy = policy if isinstance(policy, Mapping) else {}
    return {name: policy.get(name) for name in SAFE_RUN_POLICY}


def applicable(
    spec: object, accepted_spec: object, safe_fields: tuple[str, ...] = SAFE_FIELDS
) -> dict[str, Any]:
    """The run policy a change of ``accepted_spec`` to ``spec`` applies, as a spec (``runPolicy``
    only): the fields of ``safe_fields`` as ``spec`` has them, the other safe fields as
    ``accepted_spec`` has them (a TrainJob's launcher refuses all but suspend)."""
    now, before = safe_run_policy(spec), safe_run_policy(accepted_spec)
    return {
        "runPolicy": {
            name: now[name] if f"spec.runPolicy.{name}" in safe_fields else before[name]
            for name in SAFE_RUN_POLICY
        }
    }


def suspended(spec: object) -> bool:
    """Whether ``spec.runPolicy.suspend`` is true."""
    return safe_run_policy(spec)["suspend"] is True


def training_patch(spec: object) -> dict[str, Any]:
    """Merge patch that gives a Kubeflow training job (PyTorchJob, MPIJob) the safe fields of ``spec``."""
    policy = safe_run_policy(spec)
    policy["suspend"] = policy["suspend"] is True
    return {"spec": {"runPolicy": policy}}


def prepare_patch(spec: object) -> dict[str, Any]:
    """Merge patch that suspends or resumes the data-preparation Job with the job, and records the
    safe fields of ``spec`` on it as applied (:data:`APPLIED_ANNOTATION`)."""
    applied = json.dumps(safe_run_policy(spec), sort_keys=True)
    return {"metadata": {"annotations": {APPLIED_ANNOTATION: applied}}, "spec": {"suspend": suspended(spec)}}


def applied_run_policy(prepare_job: Mapping[str, Any], accepted_spec: object) -> dict[str, Any]:
    """The safe run-policy fields as last applied to a job that has a data Job: those recorded on
    the data Job by :func:`prepare_patch`, or, before any change was applied (or when the record is
    unreadable), those of the accepted spec."""
    annotations = (prepare_job.get("metadata") or {}).get("annotations") or {}
    try:
        recorded = json.loads(annotations.get(APPLIED_ANNOTATION) or "null")
    except (TypeError, ValueError):
        recorded = None
    if isinstance(recorded, dict) and set(recorded) == set(SAFE_RUN_POLICY):
        return recorded
    return safe_run_policy(accepted_spec)


def merged(obj: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` with a JSON merge patch (RFC 7396) applied: mappings merge, None removes a key."""
    result = copy.deepcopy(dict(obj))
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merged(result[key], value)
        elif isinstance(value, Mapping):
            result[key] = merged({}, value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def accepted_document(config_job: Mapping[str, Any], policy: Mapping[str, Any]) -> dict[str, Any]:
    """The job document to render children from after the job started: the accepted one (from
    its ConfigMap) with the safe run-policy fields ``policy`` (:func:`applied_run_policy`)."""
    return merged(config_job, {"spec": {"runPolicy": dict(policy)}})
