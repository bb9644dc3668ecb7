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
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

import kopf
import kubernetes
import yaml
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from bertjob import admission, changes, lifecycle, prerequisites, progress, replicas
from bertjob import monitoring as metrics
from bertjob.children import (
    ForeignObjectError,
    create_children,
    is_prepare_job,
    is_training_child,
    job_pods,
    patch_child,
    patch_status,
    post_event,
    read,
    read_job,
    read_owner,
)
from bertjob.diffbase import BoundedDiffBaseStorage, spec_of
from bertjob.launchers import registry
from bertjob.render import NAME_LABEL, ProgressEndpoint, RenderError, config_map_name, render, rendered
from bertjob_api.contract import API_VERSION, GROUP, JOB_FILE, KIND, PLURAL, VERSION
from bertjob_api.crd import ChildRef, JobStatus
from bertjob_api.spec import SpecError, parse_job, to_document

# kopf's bookkeeping goes to annotations under our own domain, never into the status.
STORAGE_PREFIX = GROUP
RETRY_DELAY_S = 30
# A status write that finds the job changed since it was read (409 Conflict) reads it again and
# recomputes, this many times in all, then leaves it to kopf's retry (after CONFLICT_DELAY_S).
WRITE_ATTEMPTS = 5
CONFLICT_DELAY_S = 1
# Failures that a corrected spec may clear: the job is rendered again from the new spec.
RENDERED_AGAIN = changes.RENDERED_AGAIN
READY = threading.Event()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Connect the Kubernetes client (in-cluster, or ``$KUBECONFIG``), place kopf's state, serve
    metrics on ``$BERTJOB_METRICS_PORT`` if set, recount ``bertjob_jobs`` from lists every
    ``$BERTJOB_JOBS_RESYNC_SECONDS`` (:func:`bertjob.monitoring.start_resync`, default 60), and
    become ready once the BertPretrainJob CRD exists (:mod:`bertjob.prerequisites`, every
    ``$BERTJOB_CRD_RETRY_SECONDS``, default 30); serve the validating admission webhook if
    ``$BERTJOB_WEBHOOK_CERT_DIR`` is set (:func:`bertjob.admission.configure`), the trainers'
    progress endpoint if ``$BERTJOB_PROGRESS_URL`` is (:func:`bertjob.progress.configure`), and
    take part in kopf's peering if ``$BERTJOB_PEERING`` is (:func:`bertjob.replicas.configure`).

    Raises:
        OSError: the metrics port is taken.
        ValueError: ``$BERTJOB_CRD_RETRY_SECONDS``, ``$BERTJOB_JOBS_RESYNC_SECONDS`` or
            ``$BERTJOB_WEBHOOK_PORT`` is not a number.
        FileNotFoundError: ``$BERTJOB_WEBHOOK_CERT_DIR`` lacks the certificate or its key.
        kubernetes.client.exceptions.ApiException: the progress endpoint's Secret could not be
            read or written, or the peering object made.
    """
    kubernetes.config.load_config()
    memo.api = ApiClient()
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=STORAGE_PREFIX)
    # The last spec handled, as a digest when too large for the job's annotations (bertjob.diffbase).
    settings.persistence.diffbase_storage = BoundedDiffBaseStorage(prefix=STORAGE_PREFIX)
    admission.configure(settings)
    replicas.configure(settings, memo.api)
    if serving := progress.configure(memo.api, os.environ):
        memo.progress_server = serving.server
        memo.progress = serving.endpoint
    if port := os.environ.get(metrics.PORT_ENV):
        memo.metrics = metrics.serve(int(port), READY)
    retry_s = float(os.environ.get(prerequisites.RETRY_ENV, prerequisites.RETRY_S))
    resync_s = float(os.environ.get(metrics.JOBS_RESYNC_ENV, metrics.JOBS_RESYNC_S))
    memo.crd_check = prerequisites.start(memo.api, READY, retry_s)
    memo.jobs_resync = metrics.start_resync(memo.api, resync_s)


@kopf.on.cleanup()
def stop_metrics(memo: kopf.Memo, **_: Any) -> None:
    """Stop serving metrics and progress reports, recounting the jobs, and checking for the CRD."""
    READY.clear()
    for thread in ("crd_check", "jobs_resync"):
        if stop := memo.get(thread):
            stop.set()
    if server := memo.get("metrics"):
        server.shutdown()
    if server := memo.get("progress_server"):
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
        launch(memo.api, body, memo.get("progress"))
    else:
        _write(memo.api, body, lambda status: status)


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
    launch(memo.api, body, memo.get("progress"))


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
@metrics.observed("update")
def update_job(body: kopf.Body, old: Any, new: Any, memo: kopf.Memo, **_: Any) -> None:
    """Apply a spec change to a job that has children, where safe; see :func:`change`. A spec too
    large for kopf's record reaches here as its digest: the new one is read from the job."""
    change(memo.api, body, spec_of(old, None), spec_of(new, body), memo.get("progress"))


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
        _fail(memo.api, job, "PrepareFailed", f"{body.metadata.name}: {reason}: {message}")
        return
    accepted = _accepted(memo.api, job, current) or _document(job)
    # Not the spec as it is now: a change refused since must not reach the training job.
    policy = changes.applied_run_policy(body, accepted["spec"])
    objects = _children_of(memo.api, job, changes.accepted_document(accepted, policy), memo.get("progress"))
    _create(memo.api, job, objects)
    [training] = [_ref(obj) for obj in objects if is_training_child(obj)]
    suspended = policy["suspend"] is True
    at = lifecycle.now()
    _write(memo.api, job, lambda status: lifecycle.prepared(status, training, reason, message, suspended, at))


def _pod_failure(api: ApiClient, job: Mapping[str, Any], logger: Any) -> str | None:
    """Which pod of ``job`` failed, with its exit code (:func:`lifecycle.pod_failure`); None when
    the pods cannot be read (the job's status then says what the training job says)."""
    meta = job["metadata"]
    try:
        return lifecycle.pod_failure(job_pods(api, meta["namespace"], meta["name"]))
    except ApiException as error:
        logger.warning("could not list the pods of %s/%s: %s", meta["namespace"], meta["name"], error.reason)
        return None


@metrics.observed("mirror")
def mirror_child(body: kopf.Body, memo: kopf.Memo, logger: Any, **_: Any) -> None:
    """Copy a training job's conditions into its BertPretrainJob's phase and conditions."""
    launcher = registry.of_kind(body.get("apiVersion"), body.get("kind"))
    conditions = launcher.conditions(_status_of(body), lifecycle.now()) if launcher else []
    job = read_owner(memo.api, body) if launcher and conditions else None
    if job is None:
        return
    # The child's own spec holds the suspend as applied (a refused change never reaches it), or
    # as Kueue holds it until it admits the child.
    suspended = launcher is not None and launcher.suspended(body.get("spec"))
    child, at = _ref(body), lifecycle.now()
    if lifecycle.child_phase(conditions) == "Failed" and (job.get("status") or {}).get("phase") != "Failed":
        conditions = lifecycle.with_pod_failure(conditions, _pod_failure(memo.api, job, logger))

    def follow(status: JobStatus) -> JobStatus:
        # Until the job's status names this child, a status patch of the create handler may follow.
        if child not in status.children:
            return status
        return lifecycle.follow_child(status, conditions, suspended, at)

    _write(memo.api, job, follow)


def launch(api: ApiClient, job: Mapping[str, Any], progress: ProgressEndpoint | None = None) -> None:
    """Render ``job`` and create its children (owned by it): all of them, or all but the
    training job while a data Job runs first; then record them in its status.

    Raises:
        kopf.PermanentError: the spec is invalid, or its children cannot be rendered or are
            refused; the status is Failed with a condition saying why.
        kopf.TemporaryError: the API server could not take the children yet; kopf retries.
    """
    objects = _children_of(api, job, _document(job), progress)
    preparing = any(is_prepare_job(obj) for obj in objects)
    first = [obj for obj in objects if not (preparing and is_training_child(obj))]
    _create(api, job, first)
    refs = [_ref(obj) for obj in first if is_prepare_job(obj) or is_training_child(obj)]
    at = lifecycle.now()
    _write(
        api,
        job,
        lambda status: lifecycle.launched(
            status,
            children=refs,
            config_map=config_map_name(job["metadata"]["name"]),
            preparing=preparing,
            suspended=changes.suspended(job.get("spec")),
            generation=job["metadata"].get("generation"),
            at=at,
        ),
    )


def change(
    api: ApiClient, job: Mapping[str, Any], old: Any, new: Any, progress: ProgressEndpoint | None = None
) -> None:
    """Apply a change of ``job``'s spec from ``old`` to ``new``.

    A job that failed for its spec is rendered again. Otherwise the new spec is compared with the
    accepted one (in the job's ConfigMap): the safe run-policy fields are written to the children
    where they differ from those last applied to each (:func:`_apply_run_policy`), and the rest is
    refused with a SpecChangeRefused condition and a warning event naming the fields; an invalid
    new spec is refused whole: no child is patched and the phase does not move (not even for
    ``suspend``).

    Raises:
        kopf.PermanentError, kopf.TemporaryError: as :func:`launch`, when rendering again; a status
            write that kept conflicting with others (:func:`_write`).
        ApiException: the API server refused a child's patch.
    """
    current = lifecycle.of(job)
    if changes.renders_again(current):
        launch(api, job, progress)
        return
    if current.phase is None:
        return
    accepted = _accepted(api, job, current)
    try:
        # Checked as launch() checks it, the size of what it renders included.
        candidate = to_document(rendered(parse_job(_document(job))).job)
        basis, wanted = (accepted["spec"], candidate["spec"]) if accepted else (old, new)
        safe_fields = admission.launcher_of(accepted or candidate).safe_fields
        # The rule the admission webhook applies before the change is stored (bertjob.admission).
        refused = changes.refused_fields(current, basis, wanted, safe_fields)
        valid = True
        why = "not applied to a job that has started"
    except SpecError as error:
        valid, refused, safe_fields = False, changes.changed_fields(old, new), ()
        why = f"invalid spec ({_problems(error)}), nothing applied"
    spec = job.get("spec")
    if valid and current.phase not in lifecycle.TERMINAL_PHASES:
        accepted_spec = accepted["spec"] if accepted else old
        _apply_run_policy(api, job, current, spec, accepted_spec, safe_fields)
    at = lifecycle.now()
    generation = job["metadata"].get("generation")
    suspend = changes.suspended(spec)

    def changed(status: JobStatus) -> JobStatus:
        updated = lifecycle.spec_change(status, refused, why, generation, at)
        if valid and suspend != (status.phase == "Suspended"):
            updated = lifecycle.suspension(updated, suspend, any(map(_trains, status.children)), at)
        return updated

    message = lifecycle.short(f"{why}: {', '.join(refused)}")
    warning = [lifecycle.Transition("Warning", "SpecChangeRefused", message)] if refused else []
    _write(api, job, changed, warning)


def _apply_run_policy(
    api: ApiClient,
    job: Mapping[str, Any],
    current: JobStatus,
    spec: object,
    accepted_spec: object,
    safe_fields: tuple[str, ...],
) -> None:
    """Write into each child the safe run-policy fields (of ``safe_fields``) that ``spec`` changes
    from those last applied to it (:func:`bertjob.changes.child_patch`), and record them on it: the
    training job, or, while the data Job runs first, the data Job, for the training job made from
    its record later. Only the fields that changed are written, so what others wrote stays, and a
    child that Kueue manages is never unsuspended (:func:`bertjob.changes.to_write`).

    Raises:
        ApiException: the API server refused a child's read or patch.
    """
    found = {ref: read(api, _target(job, ref)) for ref in current.children}
    prepare = next((obj for obj in found.values() if obj is not None and is_prepare_job(obj)), None)
    trains = any(map(_trains, current.children))
    for ref, child in found.items():
        launcher = registry.of_kind(ref.api_version, ref.kind)
        if child is None or (
            launcher is None and (trains or current.phase not in ("Preparing", "Suspended"))
        ):
            continue
        # A training job made before records were kept was rendered with the data Job's record.
        made_with = {"runPolicy": changes.applied_run_policy(prepare or {}, accepted_spec)}
        applied = changes.applied_run_policy(child, made_with if launcher else accepted_spec)
        wanted = changes.applicable(spec, {"runPolicy": applied}, safe_fields)["runPolicy"]
        write = launcher.policy_patch if launcher else changes.prepare_patch
        patch = changes.child_patch(applied, wanted, queued=changes.queued(child), write=write)
        if patch:
            patch_child(api, _target(job, ref), patch)


def _children_of(
    api: ApiClient, job: Mapping[str, Any], document: dict[str, Any], progress: ProgressEndpoint | None
) -> list[dict[str, Any]]:
    """The rendered children of ``document``, owned by ``job``, as they are created
    (:func:`bertjob.changes.as_created`: a queued one suspended, each with its run policy recorded).
    Callers pass a document whose safe run-policy fields are those applied to the job
    (:func:`bertjob.changes.accepted_document`), so the children render with them."""
    meta = job["metadata"]
    try:
        objects = render(parse_job(document, f"{meta['namespace']}/{meta['name']}"), progress)
    except SpecError as error:
        raise _fail(api, job, "InvalidSpec", _problems(error)) from error
    except RenderError as error:
        raise _fail(api, job, "RenderFailed", str(error)) from error
    policy = changes.safe_run_policy(document.get("spec"))
    for index, obj in enumerate(objects):
        launcher = registry.of_kind(obj.get("apiVersion"), obj.get("kind"))
        if launcher is not None:
            objects[index] = changes.as_created(obj, policy, launcher.policy_patch)
        elif is_prepare_job(obj) and changes.queued(obj):
            objects[index] = changes.as_created(obj, policy, changes.prepare_patch)
    kopf.adopt(objects, owner=_body(job))
    return objects


def _create(api: ApiClient, job: Mapping[str, Any], objects: list[dict[str, Any]]) -> None:
    try:
        create_children(api, objects, owner_uid=str(job["metadata"]["uid"]))
    except ForeignObjectError as error:
        raise _fail(api, job, "ChildConflict", str(error)) from error
    except ApiException as error:
        answer = f"{error.status} {error.reason}"
        if error.status in (400, 422):
            raise _fail(api, job, "ChildRejected", f"{answer}: {error.body}") from error
        # The server's own message says what was refused (a 403 names the verb and the resource).
        said = _server_message(error)
        raise kopf.TemporaryError(
            f"the API server answered {answer}" + (f": {said}" if said else ""), delay=RETRY_DELAY_S
        ) from error


def _server_message(error: ApiException) -> str:
    """The ``message`` of the Status an API server answered with; '' when the body has none."""
    try:
        status = json.loads(error.body or "")
    except (TypeError, ValueError):
        return ""
    return str(status.get("message") or "") if isinstance(status, dict) else ""


def _write(
    api: ApiClient,
    job: Mapping[str, Any],
    change: Callable[[JobStatus], JobStatus],
    events: Sequence[lifecycle.Transition] = (),
    transition: bool = True,
) -> None:
    """Write the status that ``change`` (a pure function of :mod:`bertjob.lifecycle`) makes of the
    job's status, recording ``events`` and, if ``transition``, the Event of a phase change in the
    same patch; :func:`announce` posts them. The kstatus conditions (Ready, Reconciling, Stalled)
    are derived from the status ``change`` makes (:func:`bertjob.lifecycle.with_kstatus`).

    Optimistic concurrency: ``change`` is applied to the status as read (``job`` first), and the
    fields that differ are merge-patched with the resourceVersion read as a precondition, so a
    writer that read before another wrote (the training job's conditions and a spec change, both
    rewriting ``conditions``) gets 409 Conflict instead of undoing the other's write: it reads the
    job again and applies ``change`` to that, up to :data:`WRITE_ATTEMPTS` times. Fields of the
    wrong shape (:func:`bertjob.lifecycle.read`) are written over in the same patch. Nothing is
    written to a job that is gone, or to another job of its name.

    Raises:
        kopf.TemporaryError: every attempt conflicted; kopf retries a change or create handler.
        ApiException: the API server refused the patch otherwise, or failed.
    """
    meta = job["metadata"]
    read: Mapping[str, Any] | None = job
    for _ in range(WRITE_ATTEMPTS):
        if read is None or read["metadata"].get("uid") != meta.get("uid"):
            return
        current, junk = lifecycle.read(read)
        # The kstatus conditions follow from the rest, as written here, and from the generation
        # of the job as read: never from the handler's idea of them.
        new = lifecycle.with_kstatus(change(current), read["metadata"].get("generation"), lifecycle.now())
        phase_change = lifecycle.transition(current, new) if transition else None
        stamp = time.time_ns()
        named = {
            lifecycle.event_name(meta["name"], stamp + index): event
            for index, event in enumerate([*([phase_change] if phase_change else []), *events])
        }
        patch = lifecycle.status_patch(current, lifecycle.record(new, named, lifecycle.now()), junk)
        if not patch and not junk:
            return
        try:
            patch_status(api, read, patch, resource_version=read["metadata"].get("resourceVersion"))
            return
        except ApiException as error:
            if error.status != 409:
                raise
        read = read_job(api, meta["namespace"], meta["name"])
    raise kopf.TemporaryError(
        f"the status changed under each of {WRITE_ATTEMPTS} writes (409 Conflict)", delay=CONFLICT_DELAY_S
    )


def _fail(api: ApiClient, job: Mapping[str, Any], reason: str, message: str) -> kopf.PermanentError:
    warning = lifecycle.Transition("Warning", reason, lifecycle.short(message))
    at, generation = lifecycle.now(), job["metadata"].get("generation")
    _write(
        api, job, lambda status: lifecycle.failed(status, reason, message, at, generation), [warning], False
    )
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


def _target(job: Mapping[str, Any], ref: ChildRef) -> dict[str, Any]:
    """The child ``ref`` of ``job`` as :mod:`bertjob.children` addresses it."""
    return {"apiVersion": ref.api_version, "kind": ref.kind, "metadata": _meta(job, ref.name)}


def _ref(obj: Mapping[str, Any]) -> ChildRef:
    return ChildRef(api_version=obj["apiVersion"], kind=obj["kind"], name=obj["metadata"]["name"])


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
