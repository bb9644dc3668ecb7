"""Create, read and patch a job's children (and the job's own status) through the API server.

Children are whatever :func:`bertjob.render.render` returns: a ConfigMap, a ServiceAccount, a Role
and RoleBinding, the data-preparation ``batch/v1`` Job and the launcher's training job. They are
addressed by ``apiVersion`` and ``kind`` through one table, with plain REST calls, so that a new
launcher's kind needs no code here.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from bertjob.launchers import registry
from bertjob_api.contract import API_VERSION, JOB_LABEL, KIND, job_path, status_path
from bertjob_api.crd import PendingEvent

MERGE_PATCH = "application/merge-patch+json"
# The kinds the renderer makes besides the launchers' own, by (apiVersion, kind).
BUILTIN_PLURALS = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("batch/v1", "Job"): "jobs",
}
PREPARE_KIND = ("batch/v1", "Job")
# The "From" of the operator's Events in `kubectl describe`.
EVENT_SOURCE = "bertjob-operator"


class ForeignObjectError(Exception):
    """A child's name is taken by an object that this job does not own."""


def is_training_child(obj: Mapping[str, Any]) -> bool:
    """Whether ``obj`` is a launcher's training job (rather than its config, RBAC or data Job)."""
    return registry.of_kind(obj.get("apiVersion"), obj.get("kind")) is not None


def is_prepare_job(obj: Mapping[str, Any]) -> bool:
    """Whether ``obj`` is the data-preparation Job."""
    return (obj.get("apiVersion"), obj.get("kind")) == PREPARE_KIND


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    """URL path of the namespaced collection holding objects of ``kind``.

    Raises:
        KeyError: a kind that the renderer does not make.
    """
    plurals = BUILTIN_PLURALS | {
        (launcher.child.api_version, launcher.child.kind): launcher.child.plural
        for launcher in registry.LAUNCHERS.values()
    }
    plural = plurals[(api_version, kind)]
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{root}/namespaces/{namespace}/{plural}"


def object_path(obj: Mapping[str, Any]) -> str:
    """URL path of ``obj`` (a manifest with apiVersion, kind, metadata.name and namespace)."""
    meta = obj["metadata"]
    return f"{collection_path(obj['apiVersion'], obj['kind'], meta['namespace'])}/{meta['name']}"


def call(
    api: ApiClient, method: str, path: str, body: object = None, content_type: str | None = None
) -> dict[str, Any]:
    """One request to the API server; the JSON object it answers.

    Raises:
        ApiException: a status outside 2xx (its ``status`` and ``body`` say why).
    """
    headers = {"Accept": "application/json"}
    if content_type:
        headers["Content-Type"] = content_type
    request = api.param_serialize(
        method=method, resource_path=path, header_params=headers, body=body, auth_settings=["BearerToken"]
    )
    response = api.call_api(*request)
    response.read()
    if not 200 <= response.status <= 299:
        raise ApiException(http_resp=response)
    result = json.loads(response.data or b"{}")
    return result if isinstance(result, dict) else {}


def job_pods(api: ApiClient, namespace: str, job_name: str) -> list[dict[str, Any]]:
    """The pods of job ``job_name`` (its label), as the API server lists them: read when its
    training job fails, to name the pod that failed and its exit code.

    Raises:
        ApiException: the server refused the list.
    """
    selector = urllib.parse.urlencode({"labelSelector": f"{JOB_LABEL}={job_name}"})
    found = call(api, "GET", f"/api/v1/namespaces/{namespace}/pods?{selector}")
    return list(found.get("items") or [])


def create_children(api: ApiClient, objects: Iterable[dict[str, Any]], *, owner_uid: str) -> None:
    """Create each object in its namespace; one that exists already and is owned by ``owner_uid``
    counts as created, so that a retried handler or a restarted operator never duplicates anything.

    Raises:
        ForeignObjectError: an object of that name exists and belongs to someone else.
        ApiException: the API server refused an object, or failed.
    """
    for obj in objects:
        meta = obj["metadata"]
        try:
            call(api, "POST", collection_path(obj["apiVersion"], obj["kind"], meta["namespace"]), obj)
        except ApiException as error:
            if error.status != 409:
                raise
            refs = call(api, "GET", object_path(obj)).get("metadata", {}).get("ownerReferences") or []
            if not any(isinstance(ref, Mapping) and ref.get("uid") == owner_uid for ref in refs):
                raise ForeignObjectError(
                    f"{obj['kind']} {meta['name']} already exists and is not owned by this job"
                ) from None


def patch_child(api: ApiClient, obj: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """Merge-patch a child; False if it does not exist (not created yet, or deleted).

    Raises:
        ApiException: the API server refused the patch, or failed.
    """
    try:
        call(api, "PATCH", object_path(obj), patch, MERGE_PATCH)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def read(api: ApiClient, obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The object named like ``obj`` as the API server holds it; None if there is none.

    Raises:
        ApiException: the API server failed.
    """
    try:
        return call(api, "GET", object_path(obj))
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def read_owner(api: ApiClient, child: Mapping[str, Any]) -> dict[str, Any] | None:
    """The BertPretrainJob that controls ``child`` (by its ownerReference, uid checked); None if
    the child has no such owner or the owner is gone.

    Raises:
        ApiException: the API server failed.
    """
    meta = child.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("apiVersion") == API_VERSION and ref.get("kind") == KIND and ref.get("controller"):
            try:
                owner = call(api, "GET", job_path(str(meta.get("namespace")), str(ref.get("name"))))
            except ApiException as error:
                if error.status == 404:
                    return None
                raise
            return owner if owner.get("metadata", {}).get("uid") == ref.get("uid") else None
    return None


def read_job(api: ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The BertPretrainJob ``namespace/name`` as the API server holds it; None if there is none.

    Raises:
        ApiException: the API server failed.
    """
    try:
        return call(api, "GET", job_path(namespace, name))
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def patch_status(
    api: ApiClient, job: Mapping[str, Any], status: Mapping[str, Any], resource_version: str | None = None
) -> dict[str, Any]:
    """Merge-patch the given fields of a BertPretrainJob's status (through its status subresource);
    the job as written. With ``resource_version`` the patch is a precondition: the API server
    applies it only to the job of that resourceVersion, and answers 409 Conflict otherwise. A
    field that is not an object in the status is replaced whole by what the patch gives it
    (RFC 7386), ``None`` removes one.

    Raises:
        ApiException: the API server refused the patch (409: ``resource_version`` is stale), or
            failed.
    """
    meta = job["metadata"]
    body: dict[str, Any] = {"status": status}
    if resource_version is not None:
        body["metadata"] = {"resourceVersion": resource_version}
    return call(api, "PATCH", status_path(meta["namespace"], meta["name"]), body, MERGE_PATCH)


def post_event(api: ApiClient, job: Mapping[str, Any], name: str, event: PendingEvent) -> bool:
    """Post ``event`` about the BertPretrainJob ``job`` as the core/v1 Event ``name``; False if an
    Event of that name exists already (posted before), which is then left as it is.

    Raises:
        ApiException: the API server refused the Event, or failed.
    """
    meta = job["metadata"]
    namespace = meta["namespace"]
    at = event.time.isoformat().replace("+00:00", "Z")
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": meta["name"],
            "namespace": namespace,
            "uid": meta.get("uid"),
        },
        "type": event.type,
        "reason": event.reason,
        "message": event.message,
        "source": {"component": EVENT_SOURCE},
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 1,
    }
    try:
        call(api, "POST", f"/api/v1/namespaces/{namespace}/events", body)
    except ApiException as error:
        if error.status == 409:
            return False
        raise
    return True
