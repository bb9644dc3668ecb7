"""The operator: kopf handlers for BertPretrainJobs.

    kopf run --standalone --all-namespaces -m bertjob.handlers

The pipeline: spec -> validate (:func:`bertjob.spec.parse_job`, then defaults and cross-field
checks inside :func:`bertjob.render.render`) -> render -> apply (adopt and create the children
here) -> watch the child (its Kubeflow conditions) -> status. A bad spec fails the job for good,
with a condition and an event naming the field; the API server not being ready is retried.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf
import kubernetes
import pydantic
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi, V1ConfigMap
from kubernetes.client.exceptions import ApiException

from bertjob import launchers
from bertjob.crd import ChildRef, Condition, JobStatus
from bertjob.launchers import ChildKind, ChildState, Launcher
from bertjob.render import NAME_LABEL, RenderError, config_map_name, render
from bertjob.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION, SpecError, parse_job

# kopf's bookkeeping goes to annotations under our own domain, never into the status.
STORAGE_PREFIX = "bertjob.dev"
RETRY_DELAY_S = 30
TERMINAL_PHASES = ("Succeeded", "Failed")


class ForeignObjectError(Exception):
    """A child's name is taken by an object that this job does not own."""


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Connect the Kubernetes client (in-cluster, or ``$KUBECONFIG``) and place kopf's state."""
    kubernetes.config.load_config()
    memo.api = ApiClient()
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=STORAGE_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=STORAGE_PREFIX)


@kopf.on.create(GROUP, VERSION, PLURAL)
def create_job(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Render a new job, create its children (owned by it) and record them in its status.

    Raises:
        kopf.PermanentError: the spec is invalid, or its children cannot be rendered or are
            refused; the status is Failed with a condition saying why.
        kopf.TemporaryError: the API server could not take the children yet; kopf retries.
    """
    now = _now()
    document = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": body.metadata.name, "namespace": body.metadata.namespace},
        "spec": body.get("spec"),
    }
    try:
        job = parse_job(document, f"{body.metadata.namespace}/{body.metadata.name}")
        objects = render(job)
    except SpecError as error:
        message = "; ".join(f"{path}: {problem}" for path, problem in error.problems)
        raise _fail(body, patch, "InvalidSpec", message, now) from error
    except RenderError as error:
        raise _fail(body, patch, "RenderFailed", str(error), now) from error

    child_kind = launchers.get(job.spec.launcher).child
    kopf.adopt(objects, owner=body)
    try:
        create_children(memo.api, objects, child_kind, owner_uid=str(body.metadata.uid))
    except ForeignObjectError as error:
        raise _fail(body, patch, "ChildConflict", str(error), now) from error
    except ApiException as error:
        answer = f"{error.status} {error.reason}"
        if error.status in (400, 422):
            raise _fail(body, patch, "ChildRejected", f"{answer}: {error.body}", now) from error
        raise kopf.TemporaryError(f"the API server answered {answer}", delay=RETRY_DELAY_S) from error

    child, config_map = job.metadata.name, config_map_name(job.metadata.name)
    message = f"Created ConfigMap {config_map} and {child_kind.kind} {child}"
    status = JobStatus(
        phase="Pending",
        conditions=[
            Condition(
                type="Created",
                status="True",
                reason="ChildrenCreated",
                message=message,
                last_transition_time=now,
            )
        ],
        children=[ChildRef(api_version=child_kind.api_version, kind=child_kind.kind, name=child)],
        config_map=config_map,
        start_time=now,
    )
    patch.status.update(_dump(status))
    logger.info(message)


def create_children(
    api: ApiClient, objects: list[dict[str, Any]], child: ChildKind, *, owner_uid: str
) -> None:
    """Create each object in its namespace; one that exists already and is owned by ``owner_uid``
    counts as created, so that a retried handler never duplicates anything.

    Raises:
        ForeignObjectError: an object of that name exists and belongs to someone else.
        ApiException: the API server refused an object, or failed.
    """
    for obj in objects:
        try:
            _create(api, obj, child)
        except ApiException as error:
            if error.status != 409:
                raise
            existing = _read(api, obj, child)
            refs = existing.get("metadata", {}).get("ownerReferences") or []
            if not any(ref.get("uid") == owner_uid for ref in refs):
                raise ForeignObjectError(
                    f"{obj['kind']} {obj['metadata']['name']} already exists and is not owned by this job"
                ) from None


def mirror_child(launcher: Launcher, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Copy a child's Running, Succeeded or Failed into its BertPretrainJob's phase and conditions."""
    state = launcher.state(body)
    owner = next(
        (
            ref["name"]
            for ref in body.metadata.get("ownerReferences") or []
            if ref.get("apiVersion") == API_VERSION and ref.get("kind") == KIND
        ),
        None,
    )
    if state is None or owner is None:
        return
    api = CustomObjectsApi(memo.api)
    namespace = str(body.metadata.namespace)
    try:
        parent = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, owner)
    except ApiException as error:
        if error.status == 404:
            return
        raise
    status = _status_of(parent if isinstance(parent, Mapping) else {})
    # Until the create handler has recorded this child, its own status patch would undo ours.
    if not any(ref.name == body.metadata.name and ref.kind == body.get("kind") for ref in status.children):
        return
    if status.phase in TERMINAL_PHASES or status.phase == state.phase:
        return
    updated = advance(status, state, _now())
    api.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        owner,
        {"status": _dump(updated)},
        _content_type="application/merge-patch+json",
    )
    logger.info(f"{KIND} {owner} is {state.phase}")


def advance(status: JobStatus, state: ChildState, now: datetime) -> JobStatus:
    """``status`` moved to the child's phase, with a matching condition."""
    condition = Condition(
        type=state.phase,
        status="True",
        reason=state.reason or state.phase,
        message=state.message,
        last_transition_time=now,
    )
    completion = now if state.phase in TERMINAL_PHASES else status.completion_time
    updated = with_condition(status, condition)
    return updated.model_copy(update={"phase": state.phase, "completion_time": completion})


def with_condition(status: JobStatus, condition: Condition) -> JobStatus:
    """``status`` with ``condition`` replacing any earlier one of its type."""
    kept = [existing for existing in status.conditions if existing.type != condition.type]
    return status.model_copy(update={"conditions": [*kept, condition]})


def _fail(
    body: kopf.Body, patch: kopf.Patch, reason: str, message: str, now: datetime
) -> kopf.PermanentError:
    condition = Condition(
        type="Failed", status="True", reason=reason, message=message, last_transition_time=now
    )
    status = with_condition(_status_of(body), condition).model_copy(update={"phase": "Failed"})
    patch.status.update(_dump(status))
    kopf.warn(body, reason=reason, message=message)
    return kopf.PermanentError(f"{reason}: {message}")


def _status_of(obj: Mapping[str, Any]) -> JobStatus:
    try:
        return JobStatus.model_validate(obj.get("status") or {})
    except pydantic.ValidationError:
        # A status this operator did not write is replaced rather than trusted.
        return JobStatus()


def _dump(status: JobStatus) -> dict[str, Any]:
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def _now() -> datetime:
    # Kubernetes timestamps have whole seconds.
    return datetime.now(UTC).replace(microsecond=0)


def _create(api: ApiClient, obj: dict[str, Any], child: ChildKind) -> None:
    namespace = obj["metadata"]["namespace"]
    if obj["kind"] == "ConfigMap":
        CoreV1Api(api).create_namespaced_config_map(namespace, V1ConfigMap.model_validate(obj))
    else:
        CustomObjectsApi(api).create_namespaced_custom_object(
            child.group, child.version, namespace, child.plural, obj
        )


def _read(api: ApiClient, obj: dict[str, Any], child: ChildKind) -> Mapping[str, Any]:
    name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
    if obj["kind"] == "ConfigMap":
        existing = CoreV1Api(api).read_namespaced_config_map(name, namespace)
        found: object = api.sanitize_for_serialization(existing)
    else:
        found = CustomObjectsApi(api).get_namespaced_custom_object(
            child.group, child.version, namespace, child.plural, name
        )
    return found if isinstance(found, Mapping) else {}


# One watcher per launcher's child kind, for the children this operator labels.
for _launcher in launchers.LAUNCHERS.values():
    kopf.on.event(
        _launcher.child.group,
        _launcher.child.version,
        _launcher.child.plural,
        id=f"mirror-{_launcher.child.plural}",
        labels={NAME_LABEL: "bertjob"},
    )(functools.partial(mirror_child, _launcher))
