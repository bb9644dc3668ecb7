"""A real Kubernetes control plane on 127.0.0.1 for the tests, built from source
(``hack/build-cluster.sh``): etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
kwok with fake nodes.

Each process is a component module (:mod:`bertjob_testing.cluster.components`) whose flags follow
controller-runtime's envtest (``pkg/internal/testing/controlplane``) with what our tests need
besides (see each module). :class:`ControlPlane` starts them in order, registers each before its
probe runs, and stops them all. The components and the users (``admin`` in ``system:masters``)
authenticate with certificates of one test CA (:mod:`bertjob_testing.cluster.pki`).

Nothing on 127.0.0.0/8 is reached through a ClusterIP, which nothing routes here: a Service the API
server must dial (a webhook) is made ``type: ExternalName`` to ``localhost``
(:meth:`bertjob_testing.cluster.kubectl.Kubectl.route_service_to_localhost`), as kwokctl does for
local processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertjob_testing.cluster import nodes, pki, reaper
from bertjob_testing.cluster.build import crds, executable
from bertjob_testing.cluster.catalog import component
from bertjob_testing.cluster.components.apiserver import AUDIT_LOG, APIServer
from bertjob_testing.cluster.components.controller_manager import ControllerManager
from bertjob_testing.cluster.components.etcd import Etcd
from bertjob_testing.cluster.components.kwok import Kwok
from bertjob_testing.cluster.components.scheduler import Scheduler
from bertjob_testing.cluster.kubectl import Kubectl, cert_user, kubeconfig_text
from bertjob_testing.cluster.process import (
    Component,
    PortTakenError,
    Process,
    Registry,
    StopError,
    launch,
    stop_all,
    stop_group,
    tail,
)

START_TIMEOUT_S = 120.0
PORT_TRIES = 3
STATE_FILE = "cluster.json"
REGISTRY_DIR = "processes"


@dataclass
class ControlPlane:
    """A control plane in ``workdir``: where it serves, how to reach it, and its processes.

    ``kubectl`` runs the built kubectl as ``admin`` (a kubeconfig of a ``system:masters`` user);
    :meth:`kubeconfig_for_token` makes one for another identity (a service account's token).
    ``extra_args`` are more flags for a component, by its name (``kube-apiserver``), after its own;
    ``apiserver`` is the catalog component whose API server runs (``kube-apiserver`` for the
    oldest version the chart claims).
    """

    workdir: Path
    extra_args: Mapping[str, Sequence[str]] = field(default_factory=dict)
    apiserver: str = "kubernetes"
    server: str = ""
    ca: Path = Path()
    admin: Path = Path()
    version: str = ""
    # Seconds from each component's start to ready, and the whole start.
    timings: dict[str, float] = field(default_factory=dict)
    # The processes this object started (another process's plane has none: see pids).
    processes: dict[str, Process] = field(default_factory=dict)
    # What each of them runs, by name (the etcd URL, an API server's certificates and port).
    components: dict[str, Component] = field(default_factory=dict)
    kubectl: Kubectl = field(default_factory=lambda: Kubectl(Path(), Path()))
    reaper: int = 0

    @property
    def registry(self) -> Registry:
        """The process groups this plane started (also those its controllers started)."""
        return Registry(self.workdir / REGISTRY_DIR)

    @property
    def pids(self) -> dict[str, int]:
        """Each running component's process group, by name."""
        return self.registry.groups()

    # --- start and stop ---

    def start(self, api_only: bool = False) -> None:
        """Build what is missing, then start every component in order and wait for each; only
        etcd and kube-apiserver when ``api_only``. Whatever fails, nothing started is left
        running, and the reaper stops everything if the test run dies first.

        Raises:
            bertjob_testing.cluster.build.BuildError: a binary could not be built.
            bertjob_testing.cluster.process.StartError: a component did not start (its name,
                version and log's last lines).
        """
        started = time.monotonic()
        self.version = component(self.apiserver).version
        self.reaper = reaper.start(self.registry, self.workdir / "reaper.log")
        certs = self.workdir / "pki"
        certs.mkdir(parents=True, exist_ok=True)
        authority = pki.CertificateAuthority(certs)
        self.ca = authority.cert
        keys = pki.service_account_keys(certs)
        try:
            etcd = Etcd(self.workdir)
            self.start_component(etcd)
            admin = authority.issue("admin", "admin", ("system:masters",))
            apiserver = APIServer(self.workdir, etcd.url, authority, keys, admin, self.apiserver)
            self.start_component(apiserver)
            self.server = apiserver.url
            self.admin = self.workdir / "admin.kubeconfig"
            self.admin.write_text(kubeconfig_text(self.server, self.ca, cert_user(admin)))
            self.kubectl = Kubectl(executable("kubernetes", "kubectl"), self.admin)
            if api_only:
                return
            user = authority.issue("components", "system:bertjob-test-components", ("system:masters",))
            config = self.workdir / "components.kubeconfig"
            config.write_text(kubeconfig_text(self.server, self.ca, cert_user(user)))
            self.start_component(ControllerManager(config, self.ca, keys))
            self.start_component(Scheduler(config, self.ca))
            for path in crds("kwok"):
                self.kubectl("apply", "--server-side", "-f", str(path))
            self.kubectl.wait_established()
            serving = authority.issue("kwok", "kwok", hosts=("127.0.0.1", "localhost"), server=True)
            self.start_component(Kwok(self.workdir, config, serving))
            self.add_nodes()
        except BaseException:
            with contextlib.suppress(StopError):
                self.stop()
            raise
        finally:
            self.timings["total"] = time.monotonic() - started

    def start_component(self, kind: Component) -> Process:
        """Start ``kind`` with its :attr:`extra_args` entry added, registered before its probe
        runs, and wait until it is ready; started again on new ports when it lost one to another
        process.

        Raises:
            bertjob_testing.cluster.process.StartError: it exited or was not ready in
                :data:`START_TIMEOUT_S`; PortTakenError after :data:`PORT_TRIES` tries.
        """
        kind.extra_args = [*kind.extra_args, *self.extra_args.get(kind.name, ())]
        self.components[kind.name] = kind
        for attempt in range(PORT_TRIES):
            process = launch(kind, self.workdir / f"{kind.name}.log", self.registry)
            self.processes[kind.name] = process
            try:
                self.timings[kind.name] = process.wait_ready(kind.ready, START_TIMEOUT_S)
            except PortTakenError:
                stop_group(process.pid)
                self.registry.remove(kind.name)
                if attempt == PORT_TRIES - 1:
                    raise
                continue
            return process
        raise AssertionError("unreachable")

    def stop_component(self, name: str) -> None:
        """Stop the component ``name`` (SIGTERM to its process group, then SIGKILL), as a crash or
        a rolling restart of that one process would; the others run on. Nothing happens when it
        is not running."""
        process, pid = self.processes.pop(name, None), self.registry.groups().get(name)
        if process is not None:
            process.stop()  # and reaped
        elif pid is not None:
            stop_group(pid)
        self.registry.remove(name)

    def start_apiserver(
        self, name: str = APIServer.name, port: int = 0, issuer: str = "", audit: bool = True
    ) -> APIServer:
        """Start a kube-apiserver ``name`` over this plane's etcd, with the first one's CA,
        service-account keys and build (:class:`APIServer`: ``port``, ``issuer``, ``audit``), and
        wait until it is ready: the first started again (its name and port, after
        :meth:`stop_component`), or another member of an HA control plane (another name).

        Raises:
            KeyError: this plane has started no API server.
            bertjob_testing.cluster.process.StartError: it did not start.
        """
        first = self.components[APIServer.name]
        assert isinstance(first, APIServer)
        server = APIServer(
            self.workdir,
            first.etcd,
            first.authority,
            first.keys,
            first.admin,
            first.component_name,
            name=name,
            port=port,
            issuer=issuer,
            audit=audit,
        )
        self.start_component(server)
        return server

    def admin_kubectl(self, server: str, path: Path) -> Kubectl:
        """kubectl as ``admin`` (``system:masters``) of the API server at ``server`` (a URL; one
        of :meth:`start_apiserver`'s), its kubeconfig written to ``path``.

        Raises:
            KeyError: this plane has started no API server.
        """
        first = self.components[APIServer.name]
        assert isinstance(first, APIServer)
        path.write_text(kubeconfig_text(server, self.ca, cert_user(first.admin)))
        return Kubectl(self.kubectl.binary, path)

    def stop(self) -> None:
        """Stop every component, the last started first, then the reaper (always safe to call
        again).

        Raises:
            bertjob_testing.cluster.process.StopError: some could not be stopped (each named);
                all the others were.
        """
        try:
            stop_all(self.registry)
        finally:
            self.processes.clear()
            if self.reaper:
                stop_group(self.reaper)
                self.reaper = 0

    def add_nodes(self, names: Sequence[str] = tuple(nodes.NODES)) -> None:
        """Create fake nodes ``names`` (of :data:`bertjob_testing.cluster.nodes.NODES`; all at
        the start) and wait until they are Ready.

        Raises:
            bertjob_testing.cluster.process.StartError: not all Ready in time.
        """
        self.timings["nodes"] = nodes.add_nodes(self.kubectl, self.workdir / "kwok.log", names)

    # --- clients ---

    def kubeconfig_for_token(self, path: Path, token: str) -> Path:
        """Write a kubeconfig that authenticates with bearer ``token`` to ``path``."""
        path.write_text(kubeconfig_text(self.server, self.ca, {"token": token}))
        return path

    def audited_changes(
        self, resource: str, namespace: str, name: str, subresource: str | None = None
    ) -> list[dict[str, Any]]:
        """The audit events of every change (create, update, patch) of training job ``name`` of
        ``resource`` (its plural: ``pytorchjobs``) in ``namespace`` that the API server took, in
        order: who (``user.username``), the verb and the request body (``requestObject``); with
        ``subresource``, the changes of that subresource (``bertpretrainjobs``' ``status``
        patches)."""
        found = []
        log = self.workdir / AUDIT_LOG
        for line in log.read_text().splitlines() if log.exists() else []:
            event = json.loads(line)
            target = event.get("objectRef") or {}
            taken = 200 <= (event.get("responseStatus") or {}).get("code", 0) < 300
            where = ("resource", "namespace", "name", "subresource")
            if taken and tuple(target.get(key) for key in where) == (resource, namespace, name, subresource):
                found.append(event)
        return found

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
            "kubectl": str(self.kubectl.binary),
            "reaper": self.reaper,
        }
        temporary = self.workdir / f"{STATE_FILE}.tmp"
        temporary.write_text(json.dumps(state))
        temporary.rename(self.workdir / STATE_FILE)

    @classmethod
    def load(cls, workdir: Path) -> ControlPlane:
        """The cluster another process started in ``workdir`` (its ``cluster.json``)."""
        state = json.loads((workdir / STATE_FILE).read_text())
        admin = Path(state["admin"])
        return cls(
            workdir,
            server=state["server"],
            ca=Path(state["ca"]),
            admin=admin,
            version=state["version"],
            timings=state["timings"],
            kubectl=Kubectl(Path(state["kubectl"]), admin),
            reaper=state["reaper"],
        )


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


__all__ = ["ControlPlane", "environment_without_proxy", "running_control_plane"]
