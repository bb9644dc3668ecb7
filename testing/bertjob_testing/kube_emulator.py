"""A Kubernetes API on 127.0.0.1 (kmock's emulator) with the operator running against it.

Shared by the end-to-end tests and ``benchmarks/operator_load.py``. :func:`running_cluster` serves
the emulator from a thread, declares the resources of the given CRDs, and runs ``kopf run
--standalone -A -m bertjob.handlers`` as a subprocess whose kubeconfig points at it; the caller
talks to the same emulator through the kubernetes client, as ``kubectl`` would. The operator's
requests are told from the caller's by their bearer token and recorded, for the RBAC check.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import itertools
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal import parsing
from kmock._internal.k8s import KubernetesError, KubernetesObjectNotFoundError
from kubernetes.client import ApiClient, Configuration, CustomObjectsApi
from kubernetes.config import new_client_from_config

from bertjob.replicas import PEERING_ENV
from bertjob_api import crd as bertjob_crd
from bertjob_api.spec import GROUP, PLURAL, VERSION
from bertjob_testing.cluster.build import upstream_crd
from bertjob_testing.cluster.process import die_with_parent

WAIT_S = 30
# The upstream CRD of each launcher's training job (``spec.launcher``): Kubeflow's training operator
# (PyTorchJob), mpi-operator (MPIJob) and Kubeflow Trainer v2.3.0 (TrainJob).
KUBEFLOW_CRD_FILES = {
    "pytorchjob": "kubeflow.org_pytorchjobs.yaml",
    "mpijob": "kubeflow.org_mpijobs.yaml",
    "trainjob": "trainer.kubeflow.org_trainjobs.yaml",
}
OPERATOR_TOKEN = "operator-token"
T = TypeVar("T")

# Built-in kinds the operator touches: (group/version/plural, kind, namespaced).
BUILTIN = [
    ("v1/namespaces", "Namespace", False),
    ("apiextensions.k8s.io/v1/customresourcedefinitions", "CustomResourceDefinition", False),
    ("v1/configmaps", "ConfigMap", True),
    ("v1/serviceaccounts", "ServiceAccount", True),
    ("v1/events", "Event", True),
    ("rbac.authorization.k8s.io/v1/roles", "Role", True),
    ("rbac.authorization.k8s.io/v1/rolebindings", "RoleBinding", True),
    ("batch/v1/jobs", "Job", True),
]
VERBS = {"create", "get", "list", "watch", "patch", "update", "delete"}


_parse_path = parsing.parse_path


def _parse_path_with_namespaces(path: str) -> parsing.ParsedPath:
    # kmock 0.8 reads /api/v1/namespaces[/NAME] as the prefix of a namespaced path and fails
    # (ValueError); kopf lists and watches namespaces when it serves named ones (--namespace).
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) <= 4:
        return parsing.ParsedPath("", "v1", "namespaces", None, parts[3] if len(parts) == 4 else None, None)
    return _parse_path(path)


parsing.parse_path = _parse_path_with_namespaces


def cluster_crds(
    launchers: Iterable[str] = tuple(KUBEFLOW_CRD_FILES), ours: bool = True
) -> list[dict[str, Any]]:
    """The CRDs of a cluster to run the operator against: ours (generated from the spec) unless
    ``ours`` is false, and the upstream Kubeflow CRD of each of ``launchers`` (``spec.launcher``
    values) from the controllers' Go modules at the pinned versions
    (:func:`bertjob_testing.cluster.build.upstream_crd`).

    Raises:
        bertjob_testing.cluster.build.BuildError: a module could not be downloaded.
    """
    crds = [bertjob_crd.crd()] if ours else []
    for launcher in launchers:
        crds.append(yaml.safe_load(upstream_crd(KUBEFLOW_CRD_FILES[launcher]).read_text()))
    return crds


class WaitTimeoutError(AssertionError):
    """A bounded wait ran out (the message carries the operator's log tail)."""


@dataclass(frozen=True)
class Call:
    """One request the operator made: HTTP method, API group, resource, subresource, whether it
    named an object and asked to watch, and its namespace (None for a cluster-wide request)."""

    method: str
    group: str
    resource: str
    subresource: str | None
    named: bool
    watch: bool
    namespace: str | None = None


MERGE_PATCH = "application/merge-patch+json"
RESOURCE_VERSION_PATH = "/metadata/resourceVersion"


@attrs.frozen
class ConflictError(KubernetesError):
    """409 Conflict: a write whose ``metadata.resourceVersion`` is not the stored object's, as an API
    server answers it (a Status with reason Conflict)."""

    status: int = 409
    reason: str = "Conflict"


def merge_patch(target: Any, patch: Any) -> Any:
    """``target`` with the JSON merge patch ``patch`` applied, as RFC 7386 defines it and an API
    server applies one: an object merges key by key (None removes a key), anything else replaces
    what it patches, an object over a string or a list too (where kmock's own merge refuses)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _content_type(request: kmock.Request) -> str:
    found = [value for key, value in request.headers.items() if key.lower() == "content-type"]
    return found[0].split(";")[0].strip() if found else ""


def precondition(data: Any) -> str | None:
    """The resourceVersion that a write's body asks the stored object to have: the one its object
    (a merge patch, a PUT) carries, or the value a JSON patch adds or replaces it with; None when
    the write carries none, which an API server applies unconditionally (kopf's patches)."""
    if isinstance(data, Mapping):
        version = (data.get("metadata") or {}).get("resourceVersion")
        return None if version is None else str(version)
    for op in data if isinstance(data, list) else []:
        if (
            isinstance(op, Mapping)
            and op.get("path") == RESOURCE_VERSION_PATH
            and op.get("op") in ("add", "replace")
        ):
            return str(op.get("value"))
    return None


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator plus what a real API server does on every write: metadata (uid,
    resourceVersion, generation bumped by spec changes, creationTimestamp), 201 for a create,
    409 Conflict for a write that carries a resourceVersion other than the stored one (the object
    or its status subresource), JSON merge patches as RFC 7386 merges them, and the garbage
    collector deleting the dependents of a deleted owner. Writes are served one at a time, so that
    the check of a resourceVersion and the write it guards are one step."""

    _versions: Iterator[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    _writes: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)
    calls: list[Call] = attrs.field(factory=list, init=False)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # kmock keeps every request for assertions, and finds a request's reaction by testing, for
        # each reaction in turn, whether the request is among the requests that the reaction's
        # filter lets through: the criteria run on every request kept, for every reaction. The
        # tests assert on ApiServer.calls instead, so only the requests not yet answered are kept
        # (a watch until its stream starts), this one first, where each reaction looks first.
        if self._requests and self._requests[-1] is request:
            self._requests.insert(0, self._requests.pop())
        try:
            return await self._served(request)
        finally:
            self._forget(request)

    def _forget(self, request: kmock.Request) -> None:
        for index, kept in enumerate(self._requests):
            if kept is request:
                del self._requests[index]
                return

    async def _served(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None:
            self._record(request)
        writes = (kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE)
        if request.resource is None or request.action not in writes:
            return await self._stored_write(request)
        async with self._writes:
            if request.action == kmock.action.UPDATE:
                self._check_version(request)
            return await self._stored_write(request)

    def _check_version(self, request: kmock.Request) -> None:
        """Raise :class:`ConflictError` if ``request`` (a patch or an update) carries a
        resourceVersion other than that of the object it names."""
        stored = self._stored(request)
        wanted = precondition(request.data)
        if stored is None or wanted is None:
            return
        if wanted != str(stored.get("metadata", {}).get("resourceVersion")):
            assert request.resource is not None
            what = f"{request.resource.plural}.{request.resource.group}".rstrip(".")
            raise ConflictError(
                message=(
                    f'Operation cannot be fulfilled on {what} "{request.name}": the object has been '
                    "modified; please apply your changes to the latest version and try again"
                ),
                details={
                    "name": request.name,
                    "group": request.resource.group,
                    "kind": request.resource.plural,
                },
            )

    async def _stored_write(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        update = request.action == kmock.action.UPDATE
        if update and isinstance(request.data, list) and self._stored(request):
            # A JSON patch is a write too: the object gets a new resourceVersion.
            version = str(next(self._versions))
            request.data.append({"op": "add", "path": RESOURCE_VERSION_PATH, "value": version})
        if request.resource is not None and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            meta["resourceVersion"] = str(next(self._versions))
            if request.action == kmock.action.CREATE:
                if "name" not in meta and "generateName" in meta:
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                if request.namespace:
                    meta.setdefault("namespace", request.namespace)
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("generation", 1)
                now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
                meta.setdefault("creationTimestamp", now.isoformat().replace("+00:00", "Z"))
            elif (
                request.action == kmock.action.UPDATE
                and request.subresource is None
                and "spec" in request.data
            ):
                existing = self._stored(request)
                meta["generation"] = int((existing or {}).get("metadata", {}).get("generation", 1)) + 1
            if request.action == kmock.action.UPDATE and _content_type(request) == MERGE_PATCH:
                self._merge(request)
        doomed = self._stored(request) if request.action == kmock.action.DELETE else None
        response = await super()._handle(request)
        if request.action == kmock.action.CREATE and response.status == 200 and not response.prepared:
            response.set_status(201)  # the kubernetes client reads no body from a 200 to a POST
        if doomed is not None and response.status < 300:
            await self._collect_garbage(str(doomed.get("metadata", {}).get("uid")))
        return response

    def _merge(self, request: kmock.Request) -> None:
        """Store the object that the merge patch ``request`` makes (:func:`merge_patch`), and leave
        kmock's own merge nothing to merge: it refuses an object over a string, which RFC 7386 and
        an API server take."""
        obj = self._live(request)
        if obj is None:
            return  # kmock answers 404
        merged = merge_patch(dict(obj.raw), request.data)
        obj.patch([{"op": "replace", "path": "", "value": merged}])
        request.data.clear()

    def _record(self, request: kmock.Request) -> None:
        if request.headers.get("Authorization") != f"Bearer {OPERATOR_TOKEN}":
            return
        assert request.resource is not None
        self.calls.append(
            Call(
                method=str(request.method.value if request.method else ""),
                group=request.resource.group or "",
                resource=request.resource.plural or "",
                subresource=request.subresource,
                named=request.name is not None,
                watch=request.action == kmock.action.WATCH,
                namespace=request.namespace,
            )
        )

    def _live(self, request: kmock.Request, name: str | None = None) -> Any:
        """The live object (kmock's ``Object``) that ``request`` names (or, with ``name`` given,
        the object of that name in its namespace); None if there is none, or it was deleted."""
        key: Any = (request.resource, request.namespace, name or request.name)
        if key[2] is None or key not in self.objects or self.objects[key].deleted:
            return None
        return self.objects[key]

    def _stored(self, request: kmock.Request) -> dict[str, Any] | None:
        obj = self._live(request)
        return None if obj is None else dict(obj.raw)

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        # Its reaction is found: an open watch need not be kept among the requests being matched.
        self._forget(request)
        async for item in super()._serve_watch(request):
            yield item

    # kmock answers a read, create or update by testing every stored object of every kind against
    # the request, which grows with the store; these find the one object by its key, which is
    # where kmock's own create and update (in _handle) store it.
    async def _serve_fetch(self, request: kmock.Request) -> Any:
        obj = self._live(request)
        if obj is None:
            raise KubernetesObjectNotFoundError()
        return obj.raw

    async def _serve_create(self, request: kmock.Request) -> Any:
        meta = request.data.get("metadata", {})
        key: Any = (
            request.resource,
            request.namespace or meta.get("namespace"),
            request.name or meta.get("name"),
        )
        return self.objects[key].raw

    async def _serve_update(self, request: kmock.Request) -> Any:
        # A patch that just released the object's last finalizer answers its last state.
        key: Any = (request.resource, request.namespace, request.name)
        return self.objects[key].last.raw

    async def _collect_garbage(self, uid: str) -> None:
        async with self._lock:
            dependents = [
                (key, obj)
                for key, obj in self.objects.items()
                if not obj.deleted
                and any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences") or [])
            ]
            for (resource, _, _), obj in dependents:
                raw = obj.raw
                obj.delete()
                await self._buses[resource].put({"type": "DELETED", "object": raw})
        for _, obj in dependents:
            await self._collect_garbage(str(obj.last.get("metadata", {}).get("uid")))


def serve(server: ApiServer, crd: Mapping[str, Any]) -> None:
    """Let the emulator serve every version of ``crd``'s resource (names, scope and subresources as
    the CRD gives them), as an API server does once a CRD is established; the CRD object itself is
    not stored."""
    spec, names = crd["spec"], crd["spec"]["names"]
    for version in spec["versions"]:
        server.resources[f"{spec['group']}/{version['name']}/{names['plural']}"] = kmock.ResourceInfo(
            kind=names["kind"],
            singular=names.get("singular"),
            namespaced=spec["scope"] == "Namespaced",
            verbs=VERBS,
            subresources=set(version.get("subresources") or {}),
        )


def declare(server: ApiServer, crds: Iterable[Mapping[str, Any]]) -> None:
    """Declare the built-in kinds and every served version of ``crds`` (names, scope and
    subresources as the CRDs give them), and store the CRDs themselves."""
    for path, kind, namespaced in BUILTIN:
        server.resources[path] = kmock.ResourceInfo(kind=kind, namespaced=namespaced, verbs=VERBS)
    for crd in crds:
        serve(server, crd)
        server.objects[
            (
                kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions"),
                None,
                crd["metadata"]["name"],
            )
        ] = crd


@contextlib.contextmanager
def emulator(crds: list[Mapping[str, Any]]) -> Iterator[tuple[str, ApiServer]]:
    """Serve the emulator from a thread with its own event loop; yield its URL and the server."""
    ready: queue.Queue[tuple[str, ApiServer]] = queue.Queue()
    stop = threading.Event()

    async def serve() -> None:
        server = ApiServer()
        declare(server, crds)
        async with server, kmock.Server(server) as http:
            ready.put((f"http://{http.host}:{http.port}", server))
            while not stop.is_set():
                await asyncio.sleep(0.05)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    try:
        yield ready.get(timeout=WAIT_S)
    finally:
        stop.set()
        thread.join(timeout=WAIT_S)


@contextlib.contextmanager
def one_job(namespace: str, name: str) -> Iterator[tuple[str, CustomObjectsApi]]:
    """The emulator with our CRD and one BertPretrainJob, ``valid_job()`` as ``namespace/name``
    (what a trainer reports its progress and results to); yield its URL and a client of it."""
    from bertjob_testing.jobs import valid_job  # bertjob_testing.jobs is the test data, imported late

    with emulator([bertjob_crd.crd()]) as (url, _):
        configuration = Configuration()
        configuration.host = url
        api = CustomObjectsApi(ApiClient(configuration))
        job = {**valid_job(), "metadata": {"name": name, "namespace": namespace}}
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
        yield url, api


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def answers(url: str) -> bool:
    """Whether ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def kubeconfig(path: Path, url: str, token: str) -> Path:
    """Write a kubeconfig for ``url`` with a bearer ``token`` to ``path``."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kmock", "cluster": {"server": url}}],
                "users": [{"name": "user", "user": {"token": token}}],
                "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "user"}}],
                "current-context": "kmock",
            }
        )
    )
    return path


@attrs.define
class Cluster:
    """The emulator, a client of it, and the operator subprocess (restartable)."""

    api: ApiClient
    server: ApiServer
    workdir: Path
    operator_config: Path
    operator: subprocess.Popen[bytes] | None = None
    liveness: str = ""
    metrics: str = ""
    starts: int = 0
    # kopf's scope: every namespace when empty, else one --namespace per entry (the chart's
    # watchNamespaces).
    namespaces: tuple[str, ...] = ()
    # Turns the operator's command and environment into the command that runs it, e.g. inside a
    # built image (tests/images); None runs it from this interpreter's environment.
    launch: Callable[[list[str], dict[str, str]], list[str]] | None = None
    # Seconds the liveness endpoint may take to answer after a start.
    start_wait_s: float = WAIT_S
    # More environment of the operator's (the webhook's certificate directory and port).
    env: dict[str, str] = attrs.Factory(dict)
    # The ClusterKopfPeering to run in (bertjob.replicas), as the chart's replicas do; None: kopf's
    # --standalone, the one operator of the cluster.
    peering: str | None = None

    def start(self) -> None:
        """Start ``kopf run`` and wait until its liveness endpoint answers."""
        self.starts += 1
        self.liveness = f"http://127.0.0.1:{free_port()}/healthz"
        port = free_port()
        self.metrics = f"http://127.0.0.1:{port}"
        own = {
            "KUBECONFIG": str(self.operator_config),
            "BERTJOB_METRICS_PORT": str(port),
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1",
            **self.env,
        }
        scope = [f"--namespace={name}" for name in self.namespaces] or ["--all-namespaces"]
        liveness = f"--liveness={self.liveness}"
        standalone = ["--standalone"] if self.peering is None else []
        if self.peering is not None:
            own[PEERING_ENV] = self.peering
        command = ["kopf", "run", *standalone, *scope, liveness, "-m", "bertjob.handlers"]
        if self.launch is None:
            command[0] = str(Path(sys.executable).with_name("kopf"))
        else:
            command = self.launch(command, own)
        with self.log.open("ab") as output:
            output.write(f"--- operator start {self.starts} ---\n".encode())
            output.flush()
            self.operator = subprocess.Popen(
                command,
                env={**os.environ, **own},
                stdout=output,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )
        self.wait_for("the liveness endpoint", lambda: answers(self.liveness), wait_s=self.start_wait_s)

    def stop(self) -> None:
        """Stop the operator (SIGTERM, then SIGKILL after 10 s)."""
        if self.operator is None:
            return
        self.operator.terminate()
        try:
            self.operator.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.operator.kill()
            self.operator.wait(timeout=10)
        self.operator = None

    @property
    def log(self) -> Path:
        """The operator's log (all its starts)."""
        return self.workdir / "operator.log"

    def wait_for(self, what: str, probe: Callable[[], T | None], wait_s: float = WAIT_S) -> T:
        """Poll ``probe`` until it returns something truthy.

        Raises:
            WaitTimeoutError: after ``wait_s`` seconds, or when the operator exited.
        """
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.operator is not None and self.operator.poll() is not None:
                raise WaitTimeoutError(f"the operator exited\n{self.log_tail()}")
            value = probe()
            if value:
                return value
            time.sleep(0.1)
        raise WaitTimeoutError(f"waited {wait_s} s for {what}\n{self.log_tail()}")

    def log_tail(self) -> str:
        """The last 40 lines of the operator's log."""
        return "--- operator log ---\n" + "\n".join(self.log.read_text().splitlines()[-40:])

    def create_job(self, document: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
        """Create a BertPretrainJob; the object as stored."""
        result = CustomObjectsApi(self.api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, document
        )
        assert isinstance(result, dict)
        return result

    def job(self, name: str, namespace: str = "default") -> dict[str, Any]:
        """A BertPretrainJob as stored."""
        result = CustomObjectsApi(self.api).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name
        )
        assert isinstance(result, dict)
        return result

    def status_when(self, name: str, phase: str, wait_s: float = WAIT_S) -> dict[str, Any]:
        """The job's status once its phase is ``phase``."""

        def probe() -> dict[str, Any] | None:
            status: dict[str, Any] = self.job(name).get("status") or {}
            return status if status.get("phase") == phase else None

        return self.wait_for(f"{name} to be {phase}", probe, wait_s)

    def patch_job(self, name: str, patch: dict[str, Any], namespace: str = "default") -> None:
        """Merge-patch a BertPretrainJob, as ``kubectl patch --type merge`` would."""
        CustomObjectsApi(self.api).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, patch, _content_type="application/merge-patch+json"
        )

    def object(
        self, group_version_plural: str, name: str, namespace: str = "default"
    ) -> dict[str, Any] | None:
        """One live object of a resource in the emulator; None if there is none."""
        found = [
            obj for obj in self.stored(group_version_plural, namespace) if obj["metadata"]["name"] == name
        ]
        return found[0] if found else None

    def report(
        self, group_version_plural: str, name: str, status: dict[str, Any], namespace: str = "default"
    ) -> None:
        """Patch a child's status (``kubeflow.org/v1/pytorchjobs``, ``batch/v1/jobs``), as Kubeflow's
        operator or the Job controller would."""
        group, version, plural = group_version_plural.split("/")
        CustomObjectsApi(self.api).patch_namespaced_custom_object_status(
            group,
            version,
            namespace,
            plural,
            name,
            {"status": status},
            _content_type="application/merge-patch+json",
        )

    def events(self, name: str, namespace: str = "default") -> list[dict[str, Any]]:
        """The Events about the object named ``name``."""
        return [
            event
            for event in self.stored("v1/events", namespace)
            if (event.get("involvedObject") or {}).get("name") == name
        ]

    def reasons_when(self, name: str, wanted: Callable[[list[str]], bool]) -> list[str]:
        """The reasons of the Events about ``name`` once ``wanted(reasons)`` holds: kopf posts
        events after the status patch they go with, so a test waits for them too."""
        return self.wait_for(
            f"events about {name}",
            lambda: (
                (reasons := [event["reason"] for event in self.events(name)]) and wanted(reasons) and reasons
            ),
        )

    def stored(self, group_version_plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every live object of a resource (``batch/v1/jobs``, ``v1/configmaps``) in the emulator."""
        wanted = kmock.resource(group_version_plural)
        while True:
            try:
                # The emulator's thread may add an object while this one reads the store.
                items = list(self.server.objects.items())
            except RuntimeError:
                continue
            return [
                obj.raw
                for (resource, ns, _), obj in items
                if resource == wanted and not obj.deleted and namespace in (None, ns)
            ]


@contextlib.contextmanager
def running_cluster(
    workdir: Path,
    crds: list[Mapping[str, Any]],
    namespaces: tuple[str, ...] = (),
    launch: Callable[[list[str], dict[str, str]], list[str]] | None = None,
    start_wait_s: float = WAIT_S,
) -> Iterator[Cluster]:
    """The emulator with ``crds`` declared and the operator running against it; stopped after.

    ``namespaces``, ``launch`` and ``start_wait_s`` are :class:`Cluster`'s: the operator's scope,
    how its command is run, and how long its liveness endpoint may take to answer (seconds).
    """
    with emulator(crds) as (url, server):
        mine = kubeconfig(workdir / "kubeconfig", url, "tester-token")
        cluster = Cluster(
            new_client_from_config(config_file=str(mine)),
            server,
            workdir,
            kubeconfig(workdir / "operator-kubeconfig", url, OPERATOR_TOKEN),
            namespaces=namespaces,
            launch=launch,
            start_wait_s=start_wait_s,
        )
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()
