"""A real Kubernetes control plane on 127.0.0.1 for the tests, built from source
(``hack/build-cluster.sh``): etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
kwok with fake nodes.

The flags follow controller-runtime's envtest (``pkg/internal/testing/controlplane``) with what
envtest leaves out and our tests need: RBAC with client-certificate users, a service-account
signing key (``TokenRequest``), the controller-manager's garbage collector, Job, namespace,
service-account and pod-GC controllers, a scheduler, and kwok making pods of fake nodes run and
end (:data:`EXIT_CODE_ANNOTATION`). The components and the users (``admin`` in ``system:masters``)
authenticate with certificates of one test CA (:mod:`bertjob_testing.cluster.pki`).

Nothing on 127.0.0.0/8 is reached through a ClusterIP, which nothing routes here: a Service the API
server must dial (a webhook) is made ``type: ExternalName`` to ``localhost``
(:meth:`ControlPlane.route_service_to_localhost`), as kwokctl does for local processes.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bertjob_testing.cluster import pki
from bertjob_testing.cluster.process import (
    PortTakenError,
    Process,
    StartError,
    answers,
    free_port,
    insecure,
    stop_group,
    tail,
)
from bertjob_testing.cluster.versions import Binaries, binaries, module_dir, versions

# Annotating a running pod with this (value: an exit code) ends it: Succeeded for 0, else Failed
# with every container terminated with that code (pod-end-stage.yaml).
EXIT_CODE_ANNOTATION = "bertjob.dev/kwok-exit-code"
# kwok manages the nodes that carry this annotation, and only those.
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
START_TIMEOUT_S = 120.0
PORT_TRIES = 3
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
# The controller-manager's controllers the tests need (kube-controller-manager --controllers).
CONTROLLERS = (
    "garbage-collector-controller",
    "job-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "pod-garbage-collector-controller",
    # Binds a claim to a matching PersistentVolume (the examples' claims), without which the
    # scheduler leaves a pod that mounts one Pending.
    "persistentvolume-binder-controller",
)
# The fake nodes' allocatable: CPU nodes and nodes with NVIDIA GPUs and Habana Gaudis.
NODES: dict[str, dict[str, str]] = {
    "cpu-0": {"cpu": "64", "memory": "512Gi", "pods": "110"},
    "cpu-1": {"cpu": "64", "memory": "512Gi", "pods": "110"},
    "gpu-0": {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"},
    "gpu-1": {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"},
    "gaudi-0": {"cpu": "96", "memory": "1Ti", "pods": "110", "habana.ai/gaudi": "8"},
    "gaudi-1": {"cpu": "96", "memory": "1Ti", "pods": "110", "habana.ai/gaudi": "8"},
}
STATE_FILE = "cluster.json"
AUDIT_LOG = "audit.log"
# What the API server's audit log records: the training jobs' changes, with their bodies (who wrote
# what to a child, which the status alone does not tell: a write that another controller undoes at
# once leaves no trace there).
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "Request",
            "verbs": ["create", "update", "patch"],
            "resources": [
                {"group": "kubeflow.org", "resources": ["pytorchjobs", "mpijobs"]},
                {"group": "trainer.kubeflow.org", "resources": ["trainjobs"]},
            ],
        },
        {"level": "None"},
    ],
}


def kubeconfig_text(server: str, ca: Path, user: Mapping[str, str]) -> str:
    """A kubeconfig for ``server`` (trusting ``ca``) as ``user`` (``client-certificate`` and
    ``client-key`` paths, or ``token``)."""
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
            "users": [{"name": "user", "user": dict(user)}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
            "current-context": "test",
        }
    )


@dataclass
class ControlPlane:
    """A running control plane: where it serves, how to reach it, and its processes.

    ``admin`` is a kubeconfig of a ``system:masters`` user; :meth:`kubeconfig_for_token` makes
    one for another identity (a service account's token).
    """

    workdir: Path
    server: str = ""
    ca: Path = Path()
    admin: Path = Path()
    version: str = ""
    etcd: str = ""
    # Seconds from each component's start to ready, and the whole start.
    timings: dict[str, float] = field(default_factory=dict)
    processes: dict[str, Process] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    kubectl_binary: Path = Path()

    # --- start and stop ---

    def start(self, tools: Binaries | None = None, api_only: bool = False) -> None:
        """Build what is missing, then start every component in order and wait for each; only
        etcd and kube-apiserver when ``api_only``.

        Raises:
            bertjob_testing.cluster.versions.BuildError: a binary could not be built.
            StartError: a component did not start (its name, version and log's last lines).
        """
        started = time.monotonic()
        tools = tools or binaries()
        self.version = tools.kubernetes_version
        self.kubectl_binary = tools.kubectl
        certs = self.workdir / "pki"
        certs.mkdir(parents=True, exist_ok=True)
        authority = pki.CertificateAuthority(certs)
        self.ca = authority.cert
        service_accounts = pki.service_account_keys(certs)
        try:
            self.start_component("etcd", lambda: self._etcd(tools))
            self.start_component(
                "kube-apiserver", lambda: self._apiserver(tools, authority, service_accounts)
            )
            if api_only:
                return
            components = authority.issue("components", "system:bertjob-test-components", ("system:masters",))
            config = self.workdir / "components.kubeconfig"
            config.write_text(kubeconfig_text(self.server, self.ca, _cert_user(components)))
            self.start_component(
                "kube-controller-manager", lambda: self._controller_manager(tools, config, service_accounts)
            )
            self.start_component("kube-scheduler", lambda: self._scheduler(tools, config))
            self._apply_kwok_crds()
            kubelet = authority.issue("kwok", "kwok", hosts=("127.0.0.1", "localhost"), server=True)
            self.start_component("kwok", lambda: self._kwok(tools, config, kubelet))
            self.add_nodes()
        except BaseException:
            self.stop()
            raise
        finally:
            self.timings["total"] = time.monotonic() - started

    def stop(self) -> None:
        """Stop every component, the last started first (always safe to call again)."""
        for name in reversed(list(self.pids)):
            process = self.processes.get(name)
            if process is not None:
                process.stop()
            else:
                stop_group(self.pids[name])
        self.processes.clear()
        self.pids.clear()

    def start_component(self, name: str, start: Callable[[], Process]) -> Process:
        """Run ``start()`` (which starts a component and waits until it is ready), again with new
        ports when the component lost a port to another process; the component is then among
        those :meth:`stop` stops.

        Raises:
            StartError: as ``start()``; PortTakenError after three tries.
        """
        for attempt in range(PORT_TRIES):
            try:
                process = start()
            except PortTakenError:
                if attempt == PORT_TRIES - 1:
                    raise
                continue
            self.processes[name] = process
            self.pids[name] = process.pid
            self.timings[name] = process.ready_s
            return process
        raise AssertionError("unreachable")

    def _process(self, name: str, version: str, command: Sequence[str]) -> Process:
        return Process(f"{name} {version}", command, self.workdir / f"{name}.log")

    def _etcd(self, tools: Binaries) -> Process:
        client, peer = free_port(), free_port()
        data = self.workdir / "etcd-data"
        process = self._process(
            "etcd",
            versions()["ETCD_VERSION"],
            [
                str(tools.etcd),
                f"--data-dir={data}",
                f"--listen-client-urls=http://127.0.0.1:{client}",
                f"--advertise-client-urls=http://127.0.0.1:{client}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self.etcd = f"http://127.0.0.1:{client}"
        process.wait_ready(lambda: answers(f"http://127.0.0.1:{client}/health"), START_TIMEOUT_S)
        return process

    def _apiserver(self, tools: Binaries, authority: pki.CertificateAuthority, keys: pki.KeyPair) -> Process:
        port = free_port()
        serving = authority.issue(
            "apiserver",
            "kube-apiserver",
            hosts=("127.0.0.1", "localhost", "kubernetes.default.svc"),
            server=True,
        )
        server = f"https://127.0.0.1:{port}"
        process = self._process(
            "kube-apiserver",
            tools.kubernetes_version,
            [
                str(tools.kube_apiserver),
                f"--etcd-servers={self.etcd}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={authority.cert}",
                "--authorization-mode=RBAC",
                f"--service-account-issuer={server}",
                f"--service-account-key-file={keys.cert}",
                f"--service-account-signing-key-file={keys.key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                # `kubectl logs`: the API server dials the node's InternalIP (127.0.0.1) at its
                # kubelet port, where kwok serves the pod's Logs (its serving certificate is ours).
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-certificate-authority={authority.cert}",
                f"--audit-policy-file={self._audit_policy()}",
                f"--audit-log-path={self.workdir / AUDIT_LOG}",
                "--v=1",
            ],
        )
        admin = authority.issue("admin", "admin", ("system:masters",))
        self.server = server
        self.admin = self.workdir / "admin.kubeconfig"
        self.admin.write_text(kubeconfig_text(server, authority.cert, _cert_user(admin)))
        context = insecure()
        context.load_cert_chain(admin.cert, admin.key)
        process.wait_ready(lambda: answers(f"{server}/readyz", context), START_TIMEOUT_S)
        return process

    def _audit_policy(self) -> Path:
        """The API server's audit policy: every change of a training job, with its request body
        (:meth:`audited_changes`); nothing else."""
        path = self.workdir / "audit-policy.yaml"
        path.write_text(yaml.safe_dump(AUDIT_POLICY))
        return path

    def _component_flags(self, config: Path, port: int) -> list[str]:
        """What the controller-manager and the scheduler share: the kubeconfig for the API and for
        checking their own clients, a secure port on 127.0.0.1, no leader election."""
        return [
            f"--kubeconfig={config}",
            f"--authentication-kubeconfig={config}",
            f"--authorization-kubeconfig={config}",
            # Clients authenticate with certificates of our CA only: no front-proxy CA to look up
            # (the lookup logs an error every few seconds without one).
            "--authentication-skip-lookup=true",
            f"--client-ca-file={self.ca}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--leader-elect=false",
        ]

    def _controller_manager(self, tools: Binaries, config: Path, keys: pki.KeyPair) -> Process:
        port = free_port()
        process = self._process(
            "kube-controller-manager",
            tools.kubernetes_version,
            [
                str(tools.kube_controller_manager),
                *self._component_flags(config, port),
                f"--controllers={','.join(CONTROLLERS)}",
                f"--service-account-private-key-file={keys.key}",
                f"--root-ca-file={self.ca}",
                f"--cluster-cidr={POD_CIDR}",
                "--v=1",
            ],
        )
        process.wait_ready(lambda: answers(f"https://127.0.0.1:{port}/healthz", insecure()), START_TIMEOUT_S)
        return process

    def _scheduler(self, tools: Binaries, config: Path) -> Process:
        port = free_port()
        process = self._process(
            "kube-scheduler",
            tools.kubernetes_version,
            [
                str(tools.kube_scheduler),
                *self._component_flags(config, port),
                "--v=1",
            ],
        )
        process.wait_ready(lambda: answers(f"https://127.0.0.1:{port}/healthz", insecure()), START_TIMEOUT_S)
        return process

    def _apply_kwok_crds(self) -> None:
        """kwok's ``Logs`` and ``ClusterLogs`` CRDs (from its module), which it watches: a ``Logs``
        object named as a pod makes ``kubectl logs`` serve a file of CRI log lines."""
        bases = module_dir("sigs.k8s.io/kwok", versions()["KWOK_VERSION"]) / "kustomize" / "crd" / "bases"
        for kind in ("logs", "clusterlogs"):
            self.kubectl("apply", "--server-side", "-f", str(bases / f"kwok.x-k8s.io_{kind}.yaml"))
        self.wait_established()

    def _kwok(self, tools: Binaries, config: Path, serving: pki.KeyPair) -> Process:
        # One port for kwok's server and the nodes' kubelet port: the API server reaches the
        # kubelet API (logs) there.
        port = free_port()
        stages = self.workdir / "kwok-stages.yaml"
        stages.write_text(_stages())
        process = self._process(
            "kwok",
            versions()["KWOK_VERSION"],
            [
                str(tools.kwok),
                f"--kubeconfig={config}",
                f"--config={stages}",
                f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
                f"--cidr={POD_CIDR}",
                "--node-ip=127.0.0.1",
                f"--node-port={port}",
                f"--server-address=127.0.0.1:{port}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                "--enable-crds=Logs,ClusterLogs",
            ],
        )
        process.wait_ready(lambda: answers(f"https://127.0.0.1:{port}/healthz", insecure()), START_TIMEOUT_S)
        return process

    def add_nodes(self, names: Sequence[str] = tuple(NODES)) -> None:
        """Create the fake nodes ``names`` (of :data:`NODES`; all at the start) and wait until kwok
        has made them Ready; then lift the not-ready taint the API server puts on a new node.

        Raises:
            StartError: not all Ready in :data:`START_TIMEOUT_S` (kwok's log's last lines).
        """
        for name in names:
            allocatable = NODES[name]
            accelerator = next((key for key in allocatable if "/" in key), "")
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {FAKE_NODE_ANNOTATION: "fake"},
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                        **(
                            {"bertjob.dev/test-accelerator": accelerator.split("/")[0]} if accelerator else {}
                        ),
                    },
                },
                "status": {"allocatable": allocatable, "capacity": allocatable},
            }
            self.kubectl("apply", "-f", "-", input=json.dumps(node))
        started = time.monotonic()
        while time.monotonic() - started < START_TIMEOUT_S:
            nodes = json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)["items"]
            ready = [
                node
                for node in nodes
                if node["metadata"]["name"] in names
                and any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in node["status"].get("conditions", [])
                )
            ]
            if len(ready) == len(names):
                # The API server taints a new node not-ready (TaintNodesByCondition); the node
                # lifecycle controller, which would lift it, is not run: it would also need kwok's
                # lease heartbeats to keep the nodes Ready.
                taint = "node.kubernetes.io/not-ready:NoSchedule-"
                for name in names:
                    self.kubectl("taint", "node", name, taint, check=False)
                self.timings["nodes"] = time.monotonic() - started
                return
            time.sleep(0.2)
        raise StartError(
            f"kwok made {len(ready)} of {len(names)} nodes Ready:\n{tail(self.workdir / 'kwok.log')}"
        )

    # --- clients ---

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        input: str | None = None,
        check: bool = True,
        timeout_s: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl (of the cluster's version) as ``admin`` or ``kubeconfig``.

        Raises:
            AssertionError: ``check`` and kubectl failed; the message has its stderr.
        """
        result = subprocess.run(
            [str(self.kubectl_binary), f"--kubeconfig={kubeconfig or self.admin}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    def get(self, *args: str) -> Any:
        """``kubectl get ARGS -o json`` as admin, as a document; None when kubectl fails (not found)."""
        result = self.kubectl("get", *args, "-o", "json", check=False)
        return json.loads(result.stdout) if result.returncode == 0 else None

    def kubeconfig_for_token(self, path: Path, token: str) -> Path:
        """Write a kubeconfig that authenticates with bearer ``token`` to ``path``."""
        path.write_text(kubeconfig_text(self.server, self.ca, {"token": token}))
        return path

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A token of service account ``namespace/name`` from the API server (``TokenRequest``,
        ``kubectl create token``)."""
        return self.kubectl("create", "token", name, "-n", namespace, f"--duration={seconds}s").stdout.strip()

    def wait_established(self, timeout_s: float = 60.0) -> None:
        """Wait until every CRD the server holds is Established. (``kubectl wait
        --for=condition=Established`` fails at once, rather than waiting, on a CRD so new that it
        has no conditions yet.)

        Raises:
            AssertionError: some were not in ``timeout_s`` seconds, naming them.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            listed = self.get("crd") or {"items": []}
            pending = [
                crd["metadata"]["name"]
                for crd in listed["items"]
                if not any(
                    c.get("type") == "Established" and c.get("status") == "True"
                    for c in (crd.get("status") or {}).get("conditions") or []
                )
            ]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"CRDs not Established after {timeout_s:.0f} s: {', '.join(pending)}")
            time.sleep(0.2)

    def mount_secret(self, namespace: str, name: str, directory: Path) -> bool:
        """Write Secret ``namespace/name``'s keys as files of ``directory`` (each to a temporary
        name, then renamed), as the kubelet mounts a Secret volume, once it has a ``tls.crt``;
        whether it had one."""
        found = self.get("secret", name, "-n", namespace)
        data = (found or {}).get("data") or {}
        if "tls.crt" not in data:
            return False
        directory.mkdir(parents=True, exist_ok=True)
        for key, value in data.items():
            temporary = directory / f".{key}.tmp"
            temporary.write_bytes(base64.b64decode(value))
            temporary.rename(directory / key)
        return True

    def route_service_to_localhost(self, namespace: str, name: str) -> None:
        """Make Service ``namespace/name`` ``type: ExternalName`` to ``localhost``, so that the API
        server reaches a process of this machine through it (a webhook's Service)."""
        patch = {
            "spec": {
                "type": "ExternalName",
                "externalName": "localhost",
                "clusterIP": None,
                "clusterIPs": None,
                "selector": None,
            }
        }
        self.kubectl("patch", "service", name, "-n", namespace, "--type=merge", "-p", json.dumps(patch))

    def audited_changes(self, resource: str, namespace: str, name: str) -> list[dict[str, Any]]:
        """The audit events of every change (create, update, patch) of training job ``name`` of
        ``resource`` (its plural: ``pytorchjobs``) in ``namespace`` that the API server took, in
        order: who (``user.username``), the verb and the request body (``requestObject``)."""
        found = []
        log = self.workdir / AUDIT_LOG
        for line in log.read_text().splitlines() if log.exists() else []:
            event = json.loads(line)
            target = event.get("objectRef") or {}
            taken = 200 <= (event.get("responseStatus") or {}).get("code", 0) < 300
            if (target.get("resource"), target.get("namespace"), target.get("name")) == (
                resource,
                namespace,
                name,
            ) and taken:
                found.append(event)
        return found

    def events(self, namespace: str | None = None) -> str:
        """The cluster's events, oldest first (for a failed test's report)."""
        scope = ["-n", namespace] if namespace else ["-A"]
        result = self.kubectl("get", "events", *scope, "--sort-by=.lastTimestamp", check=False)
        return result.stdout + result.stderr

    def logs(self, lines: int = 30) -> str:
        """The last lines of every component's log."""
        return "\n".join(
            f"--- {log.name} ---\n{tail(log, lines)}" for log in sorted(self.workdir.glob("*.log"))
        )

    # --- sharing between pytest-xdist workers ---

    def save(self) -> None:
        """Write what another process needs to use and stop this cluster to ``cluster.json``."""
        state = {
            "server": self.server,
            "ca": str(self.ca),
            "admin": str(self.admin),
            "version": self.version,
            "timings": self.timings,
            "pids": self.pids,
            "kubectl": str(self.kubectl_binary),
        }
        temporary = self.workdir / f"{STATE_FILE}.tmp"
        temporary.write_text(json.dumps(state))
        temporary.rename(self.workdir / STATE_FILE)

    @classmethod
    def load(cls, workdir: Path) -> ControlPlane:
        """The cluster another process started in ``workdir`` (its ``cluster.json``)."""
        state = json.loads((workdir / STATE_FILE).read_text())
        return cls(
            workdir,
            state["server"],
            Path(state["ca"]),
            Path(state["admin"]),
            state["version"],
            timings=state["timings"],
            pids=state["pids"],
            kubectl_binary=Path(state["kubectl"]),
        )


def _cert_user(pair: pki.KeyPair) -> dict[str, str]:
    return {"client-certificate": str(pair.cert), "client-key": str(pair.key)}


def _stages() -> str:
    """kwok's own stages that make fake nodes Ready, pods Running and deleted pods gone (from
    kwok's module at the pinned version), and ours that ends a pod with a chosen exit code."""
    kwok = module_dir("sigs.k8s.io/kwok", versions()["KWOK_VERSION"]) / "kustomize" / "stage"
    files = [
        kwok / "node" / "fast" / "node-initialize.yaml",
        kwok / "pod" / "fast" / "pod-ready.yaml",
        kwok / "pod" / "fast" / "pod-delete.yaml",
        Path(__file__).with_name("pod-end-stage.yaml"),
    ]
    return "\n---\n".join(path.read_text() for path in files)


@contextlib.contextmanager
def running_control_plane(workdir: Path) -> Iterator[ControlPlane]:
    """A started :class:`ControlPlane` in ``workdir``, stopped on exit whatever happened; its
    logs stay in ``workdir``."""
    plane = ControlPlane(workdir)
    try:
        plane.start()
        yield plane
    finally:
        plane.stop()


def environment_without_proxy() -> dict[str, str]:
    """This process's environment with loopback exempted from any proxy (clients reach
    127.0.0.1 directly)."""
    return {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


__all__ = [
    "EXIT_CODE_ANNOTATION",
    "ControlPlane",
    "StartError",
    "environment_without_proxy",
    "running_control_plane",
]
