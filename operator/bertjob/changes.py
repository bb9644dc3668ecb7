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

Each child records the safe fields last applied to it, and a change writes to it only the fields
that differ from that record (:func:`child_patch`): what others wrote to the child stays. A child
that Kueue manages (the ``kueue.x-k8s.io/queue-name`` label, :func:`queued`) is created suspended
and is never unsuspended by the operator: Kueue unsuspends it when it admits it, and a user's
resume only stops the operator holding it suspended (:func:`to_write`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from typing import Any

from bertjob_api.crd import JobStatus

# Fields of spec.runPolicy applied to a running job, as named in Kubeflow's RunPolicy too.
SAFE_RUN_POLICY = ("suspend", "ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit")
SAFE_FIELDS = tuple(f"spec.runPolicy.{name}" for name in SAFE_RUN_POLICY)
# On the data Job and the training job: the safe fields as last applied to it (the data Job's for
# the training job made when it completes), which the next change is compared with.
APPLIED_ANNOTATION = "bertjob.dev/applied-run-policy"
# The label by which Kueue manages a job (spec.queueName sets it).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Failures that a corrected spec may clear: the job is rendered again from the new spec.
RENDERED_AGAIN = ("InvalidSpec", "RenderFailed")


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


def renders_again(status: JobStatus) -> bool:
    """Whether a change of the spec renders the job again from the new spec: the job failed for
    its spec (phase Failed, its Failed condition's reason one of :data:`RENDERED_AGAIN`)."""
    failure = next((c for c in status.conditions if c.type == "Failed" and c.status == "True"), None)
    return status.phase == "Failed" and failure is not None and failure.reason in RENDERED_AGAIN


def refused_fields(
    status: JobStatus, basis: object, candidate: object, safe_fields: tuple[str, ...] = SAFE_FIELDS
) -> list[str]:
    """The fields of a change of a job's spec from ``basis`` to ``candidate`` (both valid, after
    defaults) that the operator cannot apply to it, by dotted path; [] for a change it applies
    whole. This is the rule of the operator's update handler and of the admission webhook alike.

    A job without a phase has not been handled yet: its children will be rendered from whatever
    spec it has then, so any change goes. A job that failed for its spec (:func:`renders_again`)
    is rendered again, so any change goes too. Otherwise the job has children, which take only
    ``safe_fields`` (the job's launcher's, :func:`split`): every other changed field is refused.
    """
    if status.phase is None or renders_again(status):
        return []
    return split(changed_fields(basis, candidate), safe_fields)[1]


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


def training_patch(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Merge patch that writes ``fields`` (safe run-policy fields by name, as :func:`to_write`
    gives them) into a Kubeflow training job's ``runPolicy`` (PyTorchJob, MPIJob); {} for none."""
    return {"spec": {"runPolicy": dict(fields)}} if fields else {}


def prepare_patch(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Merge patch that writes ``fields`` (as :func:`to_write` gives them) into the data-preparation
    Job: its ``suspend``, the one run-policy field it takes after its creation; {} for none."""
    return {"spec": {"suspend": fields["suspend"]}} if "suspend" in fields else {}


def queued(obj: Mapping[str, Any]) -> bool:
    """Whether Kueue manages ``obj`` (a child as rendered or as read): it carries the
    ``kueue.x-k8s.io/queue-name`` label, from ``spec.queueName`` or from Kueue's webhook."""
    labels = (obj.get("metadata") or {}).get("labels")
    return isinstance(labels, Mapping) and bool(labels.get(QUEUE_LABEL))


def normal(policy: Mapping[str, Any]) -> dict[str, Any]:
    """The safe run-policy fields of ``policy`` (by name, missing ones as None) with ``suspend`` as
    a child holds it: true or false, never absent."""
    found = {name: policy.get(name) for name in SAFE_RUN_POLICY}
    return found | {"suspend": found["suspend"] is True}


def to_write(applied: Mapping[str, Any], wanted: Mapping[str, Any], *, queued: bool) -> dict[str, Any]:
    """The safe run-policy fields to write to a child (by name; None removes one) that holds
    ``applied`` (the fields as last written to it, :func:`applied_run_policy`) so that it takes
    ``wanted``: only those that differ, so a change writes what the user changed and leaves what
    others wrote; and never ``suspend: false`` to a queued child, which Kueue suspends and
    unsuspends on admission (it runs outside its quota otherwise), while a suspend by the user is
    written to it, as a parent may suspend a job that Kueue manages."""
    before, after = normal(applied), normal(wanted)
    fields = {name: after[name] for name in SAFE_RUN_POLICY if after[name] != before[name]}
    if queued and fields.get("suspend") is False:
        del fields["suspend"]
    return fields


def recorded(policy: Mapping[str, Any]) -> dict[str, Any]:
    """Merge patch that records ``policy`` on a child as the safe run-policy fields applied to it
    (:data:`APPLIED_ANNOTATION`), which the next change is compared with (:func:`to_write`)."""
    return {"metadata": {"annotations": {APPLIED_ANNOTATION: json.dumps(normal(policy), sort_keys=True)}}}


def child_patch(
    applied: Mapping[str, Any],
    wanted: Mapping[str, Any],
    *,
    queued: bool,
    write: Callable[[Mapping[str, Any]], dict[str, Any]],
) -> dict[str, Any]:
    """Merge patch that gives a child holding ``applied`` the fields of ``wanted`` that changed
    (:func:`to_write`, turned into a patch of the child's kind by ``write``: a launcher's
    ``policy_patch`` or :func:`prepare_patch`) and records ``wanted`` as applied; {} when nothing
    changed."""
    if normal(applied) == normal(wanted):
        return {}
    return merged(write(to_write(applied, wanted, queued=queued)), recorded(wanted))


def as_created(
    obj: Mapping[str, Any], policy: Mapping[str, Any], write: Callable[[Mapping[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    """``obj`` (a child rendered with the safe run-policy fields ``policy``) as it is created: with
    ``policy`` recorded as applied (:func:`recorded`), and suspended if it is queued (Kueue's
    webhook would suspend it anyway, and unsuspends it on admission; ``write`` makes the patch of
    its kind, as in :func:`child_patch`)."""
    created = merged(obj, recorded(policy))
    return merged(created, write({"suspend": True})) if queued(obj) else created


def applied_run_policy(child: Mapping[str, Any], accepted_spec: object) -> dict[str, Any]:
    """The safe run-policy fields as last applied to a child (the training job or the data Job):
    those recorded on it (:func:`recorded`), or, where it has no readable record (a child made
    before records were kept), those of ``accepted_spec``."""
    annotations = (child.get("metadata") or {}).get("annotations") or {}
    try:
        found = json.loads(annotations.get(APPLIED_ANNOTATION) or "null")
    except (TypeError, ValueError):
        found = None
    if isinstance(found, dict) and set(found) == set(SAFE_RUN_POLICY):
        return found
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
