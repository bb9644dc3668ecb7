"""The operator: kopf handlers for BertPretrainJobs and their children.

    kopf run --standalone --all-namespaces -m bertjob.handlers

The lifecycle: spec -> validate (:func:`bertjob_api.spec.parse_job`, then defaults and cross-field
checks inside :func:`bertjob.render.render`) -> render -> create the children, owned by the job
(all of them; or, with ``spec.prepare.enabled``, all but the training job, which is created when
the data Job completes) -> watch the data Job and the training job -> status
(:mod:`bertjob.lifecycle`). Phase 1 and phase 2 run in the one training job. Spec changes later are
applied only where safe (:mod:`bertjob.changes`). A bad spec fails the job for good, with a
condition and an event naming the field; the API server not being ready is retried. Events are
written into the status with the change they report and posted from there (:func:`announce`).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import kopf
import kubernetes
import yaml
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from bertjob import changes, launchers, lifecycle, prerequisites
from bertjob import monitoring as metrics
from bertjob.children import (
    ForeignObjectError,
    clear_status,
    create_children,
    is_prepare_job,
    is_training_child,
    patch_child,
    patch_status,
    post_event,
    read,
    read_owner,
)
from bertjob.launchers import registry
from bertjob.render import NAME_LABEL, RenderError, config_map_name, render
from bertjob_api.contract import API_VERSION, GROUP, JOB_FILE, KIND, PLURAL, VERSION
from bertjob_api.crd import ChildRef, JobStatus
from bertjob_api.spec import JobSpec, SpecError, parse_job, to_document
from bertjob_api.validation import cluster_job

# kopf's bookkeeping goes to annotations under our own domain, never into the status.
STORAGE_PREFIX = GROUP
RETRY_DELAY_S = 30
# Failures that a corrected spec may clear: the job is rendered again from the new spec.
RENDERED_AGAIN = ("InvalidSpec", "RenderFailed")
READY = threading.Event()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Connect the Kubernetes client (in-cluster, or ``$KUBECONFIG``), place kopf's state, serve
    metrics on ``$BERTJOB_METRICS_PORT`` if set, and become ready once the BertPretrainJob CRD
    exists (:mod:`bertjob.prerequisites`, every ``$BERTJOB_CRD_RETRY_SECONDS``, default 30).

    Raises:
        OSError: the metrics port is taken.
        ValueError: ``$BERTJOB_CRD_RETRY_SECONDS`` is not a number.
    """
    kubernetes.config.load_config()
    memo.api = ApiClient()
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=STORAGE_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=STORAGE_PREFIX)
    if port := os.environ.get(metrics.PORT_ENV):
        memo.metrics = metrics.serve(int(port), READY)
    retry_s = float(os.environ.get(prerequisites.RETRY_ENV, prerequisites.RETRY_S))
    memo.crd_check = prerequisites.start(memo.api, READY, retry_s)


@kopf.on.cleanup()
def stop_metrics(memo: kopf.Memo, **_: Any) -> None:
    """Stop serving metrics and checking for the CRD."""
    READY.clear()
    if stop := memo.get("crd_check"):
        stop.set()
    if server := memo.get("metrics"):
        server.shutdown()


@kopf.on.probe(id="jobs")
def jobs_seen(**_: Any) -> int:
    """Liveness detail: how many BertPretrainJobs the operator follows."""
    return metrics.JOBS.count()


@kopf.on.event(GROUP, VERSION, PLURAL)
async def count_job(body: kopf.Body, type: str | None, **_: Any) -> None:
    """Keep ``bertjob_jobs{phase}`` up to date.

    Every event of every job passes here: it runs on kopf's event loop, not in a thread of its
    pool, because it does no I/O and the hop to a thread and back would cost more than the work.
    """
    namespace, name = str(body.metadata.namespace), str(body.metadata.name)
    if type == "DELETED":
        metrics.JOBS.gone(namespace, name)
    else:
        metrics.JOBS.seen(namespace, name, lifecycle.of(body).phase)


# (namespace, Event name) of the Events this process posted and removed from their job's status,
# the most recent ANNOUNCED_KEPT: a watch event that the job's status sends before that removal
# reaches the operator still lists them, and is not answered by posting and removing them again.
ANNOUNCED: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
ANNOUNCED_KEPT = 4096
ANNOUNCED_LOCK = threading.Lock()


def _unannounced(namespace: str, names: Iterable[str]) -> list[str]:
    """Those of ``names`` (a job's pending Events) that this process has not posted and removed."""
    with ANNOUNCED_LOCK:
        return sorted(name for name in names if (namespace, name) not in ANNOUNCED)


def _has_pending_events(body: kopf.Body, type: str | None, **_: Any) -> bool:
    pending = lifecycle.of(body).pending_events
    return type != "DELETED" and bool(_unannounced(str(body.metadata.namespace), pending))


def _has_junk_status(body: kopf.Body, type: str | None, **_: Any) -> bool:
    return type != "DELETED" and bool(lifecycle.read(body)[1])


@kopf.on.event(GROUP, VERSION, PLURAL, when=_has_junk_status)
def repair_status(body: kopf.Body, memo: kopf.Memo, logger: Any, **_: Any) -> None:
    """Write a well-formed status over one that has fields of the wrong shape (or is not an object),
    with one warning naming them. A job that the create handler has handled and whose phase is lost
    with them is launched again (its children exist already and are found, not made twice), which
    writes its status anew; otherwise only the junk fields are removed. Either write is a status
    that reads whole, so the event it causes passes this handler by.

    Raises:
        kopf.PermanentError, kopf.TemporaryError: as :func:`launch`; an event handler is not
            retried, so a failure is logged once (and a bad spec recorded as a condition).
        ApiException: the API server refused the status patch.
    """
    current, junk = lifecycle.read(body)
    logger.warning("status fields of the wrong shape, read as absent and rewritten: %s", ", ".join(junk))
    annotations = body.metadata.annotations or {}
    if current.phase is None and f"{STORAGE_PREFIX}/last-handled-configuration" in annotations:
        launch(memo.api, body)
    else:
        _write(memo.api, body, current, current)


@kopf.on.event(GROUP, VERSION, PLURAL, when=_has_pending_events)
def announce(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Post the Events that the job's status holds (``status.pendingEvents``), each under its own
    name, then remove them from the status. Every status write that records an Event, and every
    start of the operator (which lists the jobs), passes here, so an Event is posted even when the
    operator died between the status patch and the Event; an Event posted before, by an operator
    that died before removing it, exists already under its name and is not posted twice. Events
    that this process has posted and removed already are left out (:data:`ANNOUNCED`).

    Raises:
        ApiException: the API server refused an Event or the status patch; what is left is posted
            the next time the job changes, or when the operator starts again.
    """
    pending = lifecycle.of(body).pending_events
    namespace = str(body.metadata.namespace)
    posted: dict[str, None] = {}
    for name in _unannounced(namespace, pending):
        post_event(memo.api, body, name, pending[name])
        posted[name] = None
    if not posted:
        return
    patch_status(memo.api, body, {"pendingEvents": posted})
    with ANNOUNCED_LOCK:
        ANNOUNCED.update(dict.fromkeys((namespace, name) for name in posted))
        while len(ANNOUNCED) > ANNOUNCED_KEPT:
            ANNOUNCED.popitem(last=False)


@kopf.on.create(GROUP, VERSION, PLURAL)
@metrics.observed("create")
def create_job(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Render a new job and create its children; see :func:`launch`."""
    launch(memo.api, body)


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
@metrics.observed("update")
def update_job(body: kopf.Body, old: Any, new: Any, memo: kopf.Memo, **_: Any) -> None:
    """Apply a spec change to a job that has children, where safe; see :func:`change`."""
    change(memo.api, body, old, new)


@metrics.observed("prepare")
def prepare_finished(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """When the data Job of a job completes, create the training job; when it fails, fail the job.

    Raises:
        kopf.TemporaryError: the API server could not take the training job yet.
    """
    outcome = lifecycle.prepare_outcome(_status_of(body))
    job = read_owner(memo.api, body) if outcome else None
    if outcome is None or job is None:
        return
    current = lifecycle.of(job)
    if current.phase in lifecycle.TERMINAL_PHASES or any(_trains(child) for child in current.children):
        return
    verdict, reason, message = outcome
    if verdict == "Failed":
        _fail(memo.api, job, current, "PrepareFailed", f"{body.metadata.name}: {reason}: {message}")
        return
    accepted = _accepted(memo.api, job, current) or _document(job)
    # Not the spec as it is now: a change refused since must not reach the training job.
    policy = changes.applied_run_policy(body, accepted["spec"])
    objects = _children_of(memo.api, job, current, changes.accepted_document(accepted, policy))
    _create(memo.api, job, current, objects)
    [training] = [_ref(obj) for obj in objects if is_training_child(obj)]
    suspended = policy["suspend"] is True
    _write(
        memo.api,
        job,
        current,
        lifecycle.prepared(current, training, reason, message, suspended, lifecycle.now()),
    )


@metrics.observed("mirror")
def mirror_child(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Copy a training job's conditions into its BertPretrainJob's phase and conditions."""
    launcher = registry.of_kind(body.get("apiVersion"), body.get("kind"))
    conditions = launcher.conditions(_status_of(body), lifecycle.now()) if launcher else []
    job = read_owner(memo.api, body) if launcher and conditions else None
    if job is None:
        return
    current = lifecycle.of(job)
    # Until the job's status names this child, a status patch of the create handler may follow ours.
    if _ref(body) not in current.children:
        return
    # The child's own spec holds the suspend as applied (a refused change never reaches it).
    suspended = launcher is not None and launcher.suspended(body.get("spec"))
    _write(memo.api, job, current, lifecycle.follow_child(current, conditions, suspended, lifecycle.now()))


def launch(api: ApiClient, job: Mapping[str, Any]) -> None:
    """Render ``job`` and create its children (owned by it): all of them, or all but the
    training job while a data Job runs first; then record them in its status.

    Raises:
        kopf.PermanentError: the spec is invalid, or its children cannot be rendered or are
            refused; the status is Failed with a condition saying why.
        kopf.TemporaryError: the API server could not take the children yet; kopf retries.
    """
    current = lifecycle.of(job)
    objects = _children_of(api, job, current, _document(job))
    preparing = any(is_prepare_job(obj) for obj in objects)
    first = [obj for obj in objects if not (preparing and is_training_child(obj))]
    _create(api, job, current, first)
    launched = lifecycle.launched(
        current,
        children=[_ref(obj) for obj in first if is_prepare_job(obj) or is_training_child(obj)],
        config_map=config_map_name(job["metadata"]["name"]),
        preparing=preparing,
        suspended=changes.suspended(job.get("spec")),
        generation=job["metadata"].get("generation"),
        at=lifecycle.now(),
    )
    _write(api, job, current, launched)


def change(api: ApiClient, job: Mapping[str, Any], old: Any, new: Any) -> None:
    """Apply a change of ``job``'s spec from ``old`` to ``new``.

    A job that failed for its spec is rendered again. Otherwise the new spec is compared with the
    accepted one (in the job's ConfigMap): the safe run-policy fields are patched into the
    children, and the rest is refused with a SpecChangeRefused condition and a warning event
    naming the fields; an invalid new spec is refused whole: no child is patched and the phase
    does not move (not even for ``suspend``).

    Raises:
        kopf.PermanentError, kopf.TemporaryError: as :func:`launch`, when rendering again.
        ApiException: the API server refused a child's patch.
    """
    current = lifecycle.of(job)
    failure = next((c for c in current.conditions if c.type == "Failed" and c.status == "True"), None)
    if current.phase == "Failed" and failure is not None and failure.reason in RENDERED_AGAIN:
        launch(api, job)
        return
    if current.phase is None:
        return
    accepted = _accepted(api, job, current)
    try:
        candidate = to_document(cluster_job(parse_job(_document(job))))
        fields = (
            changes.changed_fields(accepted["spec"], candidate["spec"])
            if accepted
            else changes.changed_fields(old, new)
        )
        safe_fields = _launcher_of(accepted or candidate).safe_fields
        refused = changes.split(fields, safe_fields)[1]
        valid = True
        why = "not applied to a job that has started"
    except SpecError as error:
        valid, refused, safe_fields = False, changes.changed_fields(old, new), ()
        why = f"invalid spec ({_problems(error)}), nothing applied"
    spec = job.get("spec")
    # The safe fields are patched whole each time: the children then follow the spec as it is now.
    if valid and current.phase not in lifecycle.TERMINAL_PHASES:
        for ref in current.children:
            target = {"apiVersion": ref.api_version, "kind": ref.kind, "metadata": _meta(job, ref.name)}
            if launcher := registry.of_kind(ref.api_version, ref.kind):
                patch_child(api, target, launcher.policy_patch(spec))
            elif current.phase in ("Preparing", "Suspended") and not any(map(_trains, current.children)):
                # Recorded for the training job made later: what its launcher takes of the change.
                applied = changes.applicable(spec, (accepted or {}).get("spec", spec), safe_fields)
                patch_child(api, target, changes.prepare_patch(applied))
    at = lifecycle.now()
    updated = lifecycle.spec_change(current, refused, why, job["metadata"].get("generation"), at)
    if valid and changes.suspended(spec) != (current.phase == "Suspended"):
        has_training = any(map(_trains, current.children))
        updated = lifecycle.suspension(updated, changes.suspended(spec), has_training, at)
    message = lifecycle.short(f"{why}: {', '.join(refused)}")
    warning = [lifecycle.Transition("Warning", "SpecChangeRefused", message)] if refused else []
    _write(api, job, current, updated, warning)


def _children_of(
    api: ApiClient, job: Mapping[str, Any], current: JobStatus, document: dict[str, Any]
) -> list[dict[str, Any]]:
    """The rendered children of ``document``, owned by ``job``. Callers pass a document whose
    safe run-policy fields are those applied to the job (:func:`bertjob.changes.accepted_document`),
    so the children render with them."""
    meta = job["metadata"]
    try:
        objects = render(parse_job(document, f"{meta['namespace']}/{meta['name']}"))
    except SpecError as error:
        raise _fail(api, job, current, "InvalidSpec", _problems(error)) from error
    except RenderError as error:
        raise _fail(api, job, current, "RenderFailed", str(error)) from error
    kopf.adopt(objects, owner=_body(job))
    return objects


def _create(
    api: ApiClient, job: Mapping[str, Any], current: JobStatus, objects: list[dict[str, Any]]
) -> None:
    try:
        create_children(api, objects, owner_uid=str(job["metadata"]["uid"]))
    except ForeignObjectError as error:
        raise _fail(api, job, current, "ChildConflict", str(error)) from error
    except ApiException as error:
        answer = f"{error.status} {error.reason}"
        if error.status in (400, 422):
            raise _fail(api, job, current, "ChildRejected", f"{answer}: {error.body}") from error
        raise kopf.TemporaryError(f"the API server answered {answer}", delay=RETRY_DELAY_S) from error


def _write(
    api: ApiClient,
    job: Mapping[str, Any],
    old: JobStatus,
    new: JobStatus,
    events: Sequence[lifecycle.Transition] = (),
    transition: bool = True,
) -> None:
    """Patch the fields of the status that changed, recording ``events`` and, if ``transition``,
    the Event of a phase change in the same patch; :func:`announce` posts them."""
    phase_change = lifecycle.transition(old, new) if transition else None
    stamp = time.time_ns()
    named = {
        lifecycle.event_name(job["metadata"]["name"], stamp + index): event
        for index, event in enumerate([*([phase_change] if phase_change else []), *events])
    }
    patch = lifecycle.status_patch(old, lifecycle.record(new, named, lifecycle.now()))
    # Fields of the wrong shape in the status as read (lifecycle.read) go first: they read as
    # absent, so the patch is computed as if they were.
    junk = lifecycle.read(job)[1]
    if junk:
        clear_status(api, job, junk)
    if patch:
        patch_status(api, job, patch)


def _fail(
    api: ApiClient, job: Mapping[str, Any], current: JobStatus, reason: str, message: str
) -> kopf.PermanentError:
    warning = lifecycle.Transition("Warning", reason, lifecycle.short(message))
    _write(api, job, current, lifecycle.failed(current, reason, message, lifecycle.now()), [warning], False)
    return kopf.PermanentError(f"{reason}: {lifecycle.short(message)}")


def _accepted(api: ApiClient, job: Mapping[str, Any], current: JobStatus) -> dict[str, Any] | None:
    """The job document the children were rendered from (its ConfigMap's job.yaml); None if the
    ConfigMap is gone or not ours to read."""
    if current.config_map is None:
        return None
    found = read(api, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(job, current.config_map)})
    try:
        document = yaml.safe_load(((found or {}).get("data") or {}).get(JOB_FILE) or "null")
    except yaml.YAMLError:
        return None
    return document if isinstance(document, dict) and isinstance(document.get("spec"), dict) else None


def _document(job: Mapping[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "spec": job.get("spec"),
    }


def _body(job: Mapping[str, Any]) -> kopf.Body:
    # kopf's adoption helper takes its Body; a job read through the API is a dict.
    return job if isinstance(job, kopf.Body) else kopf.Body(cast(kopf.RawBody, dict(job)))


def _meta(job: Mapping[str, Any], name: str) -> dict[str, str]:
    return {"name": name, "namespace": job["metadata"]["namespace"]}


def _ref(obj: Mapping[str, Any]) -> ChildRef:
    return ChildRef(api_version=obj["apiVersion"], kind=obj["kind"], name=obj["metadata"]["name"])


def _launcher_of(document: Mapping[str, Any]) -> launchers.Launcher:
    """The launcher of a job document: its ``spec.launcher``, or the spec's default where a
    document written without defaults lacks it.

    Raises:
        SpecError: no launcher of that name.
    """
    default = JobSpec.model_fields["launcher"].default
    return registry.get(str(document["spec"].get("launcher", default)))


def _trains(ref: ChildRef) -> bool:
    return is_training_child({"apiVersion": ref.api_version, "kind": ref.kind})


def _problems(error: SpecError) -> str:
    return "; ".join(f"{path}: {problem}" for path, problem in error.problems)


def _has_conditions(body: kopf.Body, **_: Any) -> bool:
    """Whether :func:`mirror_child` has anything to mirror from a training job: without, it returns
    at once, and the filter spares kopf the hop to a thread and back (a created child's first event)."""
    launcher = registry.of_kind(body.get("apiVersion"), body.get("kind"))
    return launcher is not None and launcher.has_conditions(_status_of(body))


def _has_outcome(body: kopf.Body, **_: Any) -> bool:
    """Whether :func:`prepare_finished` has an outcome to act on (it returns at once without)."""
    return lifecycle.prepare_outcome(_status_of(body)) is not None


def _status_of(child: Mapping[str, Any]) -> Mapping[str, Any]:
    """A child's status; one that is not an object reads as empty."""
    status = child.get("status")
    return status if isinstance(status, Mapping) else {}


# One watcher per launcher's child kind, and one for the data Jobs, for the objects we label.
for _launcher in registry.LAUNCHERS.values():
    kopf.on.event(
        _launcher.child.group,
        _launcher.child.version,
        _launcher.child.plural,
        id=f"mirror-{_launcher.child.plural}",
        labels={NAME_LABEL: "bertjob"},
        when=_has_conditions,
    )(mirror_child)
kopf.on.event("batch", "v1", "jobs", id="prepare-jobs", labels={NAME_LABEL: "bertjob"}, when=_has_outcome)(
    prepare_finished
)
