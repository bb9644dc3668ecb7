"""The operator end to end: `kopf run` against kmock's Kubernetes emulator on 127.0.0.1.

The operator runs for real (a `kopf run --standalone -A -m bertjob.handlers` subprocess with a
kubeconfig pointing at the emulator); the test talks to the same emulator through the kubernetes
client, as `kubectl` would. Waits are bounded, and the operator is always stopped.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp.web
import attrs
import kmock
import pytest
import yaml
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi, V1ConfigMap
from kubernetes.client.exceptions import ApiException
from kubernetes.config import new_client_from_config

from bertjob.handlers import ForeignObjectError, create_children
from bertjob.launchers import ChildKind
from bertjob.render import render
from bertjob.spec import GROUP, PLURAL, VERSION, parse_job
from jobs import valid_job, with_value
from k8s_schema import assert_valid

WAIT_S = 30
PYTORCHJOBS = ChildKind("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")
T = TypeVar("T")


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator plus the metadata a real API server fills on every write."""

    _versions: Iterator[int] = attrs.field(factory=lambda: itertools.count(1), init=False)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
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
        response = await super()._handle(request)
        if request.action == kmock.action.CREATE and response.status == 200 and not response.prepared:
            response.set_status(201)  # the kubernetes client reads no body from a 200 to a POST
        return response


def _declare(server: ApiServer) -> None:
    verbs = {"create", "get", "list", "watch", "patch", "update", "delete"}
    # kopf starts no watch until discovery lists namespaces and CRDs.
    server.resources["v1/namespaces"] = kmock.ResourceInfo(kind="Namespace", namespaced=False, verbs=verbs)
    server.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = kmock.ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False, verbs=verbs
    )
    server.resources[f"{GROUP}/{VERSION}/{PLURAL}"] = kmock.ResourceInfo(
        kind="BertPretrainJob",
        singular="bertpretrainjob",
        namespaced=True,
        verbs=verbs,
        subresources={"status"},
    )
    server.resources["kubeflow.org/v1/pytorchjobs"] = kmock.ResourceInfo(
        kind="PyTorchJob", singular="pytorchjob", namespaced=True, verbs=verbs, subresources={"status"}
    )
    server.resources["v1/configmaps"] = kmock.ResourceInfo(kind="ConfigMap", namespaced=True, verbs=verbs)
    server.resources["v1/events"] = kmock.ResourceInfo(kind="Event", namespaced=True, verbs=verbs)


@contextlib.contextmanager
def _emulator() -> Iterator[str]:
    """Serve the emulator from a thread with its own event loop; yield its URL."""
    address: queue.Queue[str] = queue.Queue()
    stop = threading.Event()

    async def serve() -> None:
        server = ApiServer()
        _declare(server)
        async with server, kmock.Server(server) as http:
            address.put(f"http://{http.host}:{http.port}")
            while not stop.is_set():
                await asyncio.sleep(0.05)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    try:
        yield address.get(timeout=WAIT_S)
    finally:
        stop.set()
        thread.join(timeout=WAIT_S)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@attrs.define
class Cluster:
    api: ApiClient
    operator: subprocess.Popen[bytes]
    log: Path
    liveness: str

    def wait_for(self, what: str, probe: Callable[[], T | None]) -> T:
        """Poll ``probe`` until it returns something truthy; fail after WAIT_S seconds."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            assert self.operator.poll() is None, f"the operator exited\n{self.log_tail()}"
            value = probe()
            if value:
                return value
            time.sleep(0.2)
        pytest.fail(f"waited {WAIT_S} s for {what}\n{self.log_tail()}")

    def log_tail(self) -> str:
        return "--- operator log ---\n" + "\n".join(self.log.read_text().splitlines()[-40:])

    def create_job(self, document: dict[str, Any]) -> dict[str, Any]:
        result = CustomObjectsApi(self.api).create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, document
        )
        assert isinstance(result, dict)
        return result

    def job(self, name: str) -> dict[str, Any]:
        result = CustomObjectsApi(self.api).get_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, name
        )
        assert isinstance(result, dict)
        return result

    def status_when(self, name: str, phase: str) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            status: dict[str, Any] = self.job(name).get("status") or {}
            return status if status.get("phase") == phase else None

        return self.wait_for(f"{name} to be {phase}", probe)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("e2e")
    with _emulator() as url:
        kubeconfig = workdir / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "kmock", "cluster": {"server": url}}],
                    "users": [{"name": "tester", "user": {"token": "not-checked"}}],
                    "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "tester"}}],
                    "current-context": "kmock",
                }
            )
        )
        liveness = f"http://127.0.0.1:{_free_port()}/healthz"
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1",
        }
        log = workdir / "operator.log"
        kopf = Path(sys.executable).with_name("kopf")
        command = [
            str(kopf),
            "run",
            "--standalone",
            "--all-namespaces",
            f"--liveness={liveness}",
            "-m",
            "bertjob.handlers",
        ]
        with log.open("wb") as output:
            operator = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
        try:
            cluster = Cluster(new_client_from_config(config_file=str(kubeconfig)), operator, log, liveness)
            cluster.wait_for("the liveness endpoint", lambda: _alive(liveness))
            yield cluster
        finally:
            operator.terminate()
            try:
                operator.wait(timeout=10)
            except subprocess.TimeoutExpired:
                operator.kill()
                operator.wait(timeout=10)


def _alive(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _named(document: dict[str, Any], name: str) -> dict[str, Any]:
    return with_value(document, "metadata.name", name)


def test_a_valid_job_gets_owned_children_and_a_status(
    cluster: Cluster, bertjob_schema: dict[str, Any]
) -> None:
    job = cluster.create_job(_named(valid_job(), "demo"))
    uid = job["metadata"]["uid"]

    status = cluster.status_when("demo", "Pending")

    assert status["children"] == [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "demo"}]
    assert status["configMap"] == "demo-config"
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [("Created", "True")]
    assert_valid(status, bertjob_schema["properties"]["status"])
    owner = {
        "apiVersion": "bertjob.dev/v1alpha1",
        "kind": "BertPretrainJob",
        "name": "demo",
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    config_map = cluster.api.sanitize_for_serialization(
        CoreV1Api(cluster.api).read_namespaced_config_map("demo-config", "default")
    )
    assert config_map["metadata"]["ownerReferences"] == [owner]
    assert yaml.safe_load(config_map["data"]["job.yaml"])["spec"]["image"] == "ghcr.io/bertjob/trainer:0.1.0"
    child = CustomObjectsApi(cluster.api).get_namespaced_custom_object(
        "kubeflow.org", "v1", "default", "pytorchjobs", "demo"
    )
    assert isinstance(child, dict)
    assert child["metadata"]["ownerReferences"] == [owner]
    assert child["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["image"] == (
        "ghcr.io/bertjob/trainer:0.1.0"
    )


def test_the_childs_outcome_is_mirrored_into_the_job(cluster: Cluster) -> None:
    cluster.create_job(_named(valid_job(), "mirrored"))
    cluster.status_when("mirrored", "Pending")
    children = CustomObjectsApi(cluster.api)

    for phase in ("Running", "Succeeded"):
        condition = {
            "type": phase,
            "status": "True",
            "reason": f"PyTorchJob{phase}",
            "message": "from the child",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        children.patch_namespaced_custom_object_status(
            "kubeflow.org",
            "v1",
            "default",
            "pytorchjobs",
            "mirrored",
            {"status": {"conditions": [condition]}},
        )
        status = cluster.status_when("mirrored", phase)

    assert {c["type"]: c["reason"] for c in status["conditions"]} == {
        "Created": "ChildrenCreated",
        "Running": "PyTorchJobRunning",
        "Succeeded": "PyTorchJobSucceeded",
    }
    assert "completionTime" in status


@pytest.mark.parametrize(
    ("name", "field", "value", "named"),
    [
        # Fits the schema, but 64 sequences cannot be split over 3 processes.
        ("indivisible", "spec.topology.processesPerNode", 3, "spec.phases[0].globalBatchSize"),
        # What a cluster without the CRD (or with schema validation off) would let through.
        ("mistyped", "spec.image", 5, "spec.image"),
        ("misspelt", "spec.phases.0.batchSize", 64, "spec.phases[0].batchSize"),
        ("not-a-mapping", "spec", "hello", "spec: Input should be a valid dictionary"),
        # A valid custom resource name, but the job's children need a DNS label.
        ("dotted.name", "metadata.name", "dotted.name", "metadata.name"),
    ],
)
def test_a_bad_spec_fails_the_job_naming_the_field(
    cluster: Cluster, name: str, field: str, value: Any, named: str
) -> None:
    cluster.create_job(_named(with_value(valid_job(), field, value), name))

    status = cluster.status_when(name, "Failed")

    [condition] = status["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == ("Failed", "True", "InvalidSpec")
    assert named in condition["message"]
    with pytest.raises(ApiException) as missing:
        CoreV1Api(cluster.api).read_namespaced_config_map(f"{name}-config", "default")
    assert missing.value.status == 404
    cluster.wait_for(
        f"an InvalidSpec event about {name}",
        lambda: [
            event
            for event in CoreV1Api(cluster.api).list_namespaced_event("default").items
            if event.involved_object.name == name
            and event.reason == "InvalidSpec"
            and named in (event.message or "")
        ],
    )
    assert cluster.operator.poll() is None and _alive(cluster.liveness)


def test_a_name_taken_by_someone_else_fails_the_job(cluster: Cluster) -> None:
    CoreV1Api(cluster.api).create_namespaced_config_map(
        "default", V1ConfigMap.model_validate({"metadata": {"name": "taken-config"}, "data": {}})
    )
    cluster.create_job(_named(valid_job(), "taken"))

    status = cluster.status_when("taken", "Failed")

    assert status["conditions"][-1]["reason"] == "ChildConflict"
    assert "ConfigMap taken-config already exists" in status["conditions"][-1]["message"]


def test_creating_the_children_again_is_a_no_op(cluster: Cluster) -> None:
    objects = render(parse_job(_named(valid_job(), "twice")))
    for obj in objects:
        obj["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "bertjob.dev/v1alpha1",
                "kind": "BertPretrainJob",
                "name": "twice",
                "uid": "uid-of-twice",
            }
        ]

    create_children(cluster.api, copy.deepcopy(objects), PYTORCHJOBS, owner_uid="uid-of-twice")
    create_children(cluster.api, copy.deepcopy(objects), PYTORCHJOBS, owner_uid="uid-of-twice")

    with pytest.raises(ForeignObjectError, match="PyTorchJob twice already exists"):
        create_children(cluster.api, objects[1:], PYTORCHJOBS, owner_uid="another-uid")
