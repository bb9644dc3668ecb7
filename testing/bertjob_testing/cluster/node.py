"""The test cluster's real node: containerd, runc, the kubelet, kube-proxy and CoreDNS on this
machine, registered beside kwok's fake nodes, where the pods we render really run.

:class:`RealNode` starts it on a :class:`bertjob_testing.cluster.controlplane.ControlPlane`, as kind
starts a node in a container, but with processes of this machine:

- a network namespace of the run's own (``ip netns``), linked to this machine's by a veth pair on a
  /24 of its own (:attr:`RealNode.address` is the node's end, its InternalIP), with a bridge and
  another /24 for the pods, routed from this machine (the API server reaches the kubelet and the
  pods there); everything in it (the bridge, kube-proxy's rules) goes with it;
- a relay from this machine's end of the link to the API server, which listens on loopback alone:
  the ``kubernetes`` Service's endpoint, and the address the node's components dial;
- a cgroup root, containerd's files and the pause image (built here, :mod:`oci`), then containerd,
  the kubelet, kube-proxy and CoreDNS, each inside the namespace (:mod:`namespaces`).

Everything is the run's own (names carry a token of the run) and is undone at the end, also by the
reaper when the test run dies (:mod:`nodecleanup`, registered before anything is made). The node is
tainted :data:`TAINT`, so only pods that tolerate it land there: the fake pods of the other tests
stay on kwok's nodes.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertjob_testing.cluster import oci, pki
from bertjob_testing.cluster.build import executable
from bertjob_testing.cluster.components.apiserver import SERVICE_CIDR
from bertjob_testing.cluster.components.containerd import Containerd
from bertjob_testing.cluster.components.coredns import CoreDNS
from bertjob_testing.cluster.components.kube_proxy import KubeProxy
from bertjob_testing.cluster.components.kubelet import Kubelet
from bertjob_testing.cluster.components.relay import Relay
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.kubectl import cert_user, endpoint_slice, kubeconfig_text
from bertjob_testing.cluster.nodecleanup import hierarchies
from bertjob_testing.cluster.nodes import is_ready, lift_not_ready_taint
from bertjob_testing.cluster.process import StartError, tail

# Only pods that tolerate this run on the real node.
TAINT = {"key": "bertjob.dev/real-node", "value": "true", "effect": "NoSchedule"}
TOLERATION = {"key": TAINT["key"], "operator": "Equal", "value": TAINT["value"], "effect": TAINT["effect"]}
# The node's link and its pods' addresses: a /24 of this /16 each, not routed on this machine yet.
POD_NETWORK = ipaddress.IPv4Network("10.244.0.0/16")
# The name the API server's certificate carries, which clients dialling the relay's address check.
API_SERVER_NAME = "kubernetes.default.svc"
READY_TIMEOUT_S = 120.0


class PodError(AssertionError):
    """A pod on the real node did not get where a test waited for it; the message says why."""


def free_subnets(count: int) -> list[ipaddress.IPv4Network]:
    """``count`` /24s of :data:`POD_NETWORK` that no route of this machine covers (another run's
    node), picked from a random start.

    Raises:
        StartError: not enough are free.
    """
    routes = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True, check=True).stdout
    taken = [
        ipaddress.ip_network(line.split()[0], strict=False)
        for line in routes.splitlines()
        if line and line.split()[0][0].isdigit()
    ]
    subnets = list(POD_NETWORK.subnets(new_prefix=24))[1:]
    start = secrets.randbelow(len(subnets))
    free = [s for s in subnets[start:] + subnets[:start] if not any(s.overlaps(route) for route in taken)]
    if len(free) < count:
        raise StartError(f"fewer than {count} /24s of {POD_NETWORK} are free of routes on this machine")
    return free[:count]


def ip(*args: str) -> None:
    """Run ``ip ARGS``.

    Raises:
        subprocess.CalledProcessError: it failed (its stderr in the error).
    """
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class RealNode:
    """A real node on ``plane`` with its files in ``workdir``."""

    plane: ControlPlane
    workdir: Path
    token: str = field(default_factory=lambda: secrets.token_hex(3))
    link: ipaddress.IPv4Network | None = None
    pods: ipaddress.IPv4Network | None = None
    containerd: Containerd | None = None

    @property
    def name(self) -> str:
        """The node's name."""
        return f"real-{self.token}"

    @property
    def cgroup_root(self) -> str:
        """The cgroup (in every hierarchy) its pods' cgroups are made under."""
        return f"/bertjob-{self.token}"

    @property
    def netns(self) -> str:
        """Its network namespace's name (``/run/netns/<name>``)."""
        return f"bertjob-{self.token}"

    @property
    def netns_path(self) -> Path:
        """Its network namespace's file."""
        return Path("/run/netns") / self.netns

    @property
    def containerd_root(self) -> Path:
        """containerd's root: the images' content and snapshots, deleted when the node stops."""
        return self.workdir / "containerd" / "root"

    @property
    def bridge(self) -> str:
        """The pods' bridge in its namespace (15 characters at most)."""
        return f"bjcni{self.token}"

    @property
    def network(self) -> str:
        """The CNI network's name."""
        return f"bertjob-{self.token}"

    @property
    def host_link(self) -> str:
        """This machine's end of the node's link (a veth)."""
        return f"bjh{self.token}"

    @property
    def host_address(self) -> str:
        """This machine's end of the node's link."""
        assert self.link is not None, "start the node first"
        return str(self.link.network_address + 1)

    @property
    def address(self) -> str:
        """The node's end of its link: its InternalIP, where the kubelet serves."""
        assert self.link is not None, "start the node first"
        return str(self.link.network_address + 2)

    @property
    def gateway(self) -> str:
        """The pods' gateway on the bridge, also where CoreDNS answers (the kubelet's clusterDNS)."""
        assert self.pods is not None, "start the node first"
        return str(self.pods.network_address + 1)

    def start(self) -> None:
        """Start the node and wait until it is Ready (its taint set, the not-ready one lifted).

        Raises:
            bertjob_testing.cluster.process.StartError: a component did not start, or the node was
                not Ready in :data:`READY_TIMEOUT_S` (the kubelet's log's last lines).
            subprocess.CalledProcessError: a network step, or building or importing the pause
                image, failed.
        """
        started = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.plane.registry.add_cleanup(
            f"node-{self.token}",
            [
                sys.executable,
                "-m",
                "bertjob_testing.cluster.nodecleanup",
                f"--workdir={self.workdir}",
                f"--cgroup-root={self.cgroup_root}",
                f"--netns={self.netns}",
                f"--link={self.host_link}",
                f"--network={self.network}",
                f"--discard={self.containerd_root}",
            ],
        )
        self._make_cgroup_root()
        self.link, self.pods = free_subnets(2)
        self._make_network()
        relay = Relay(self.host_address, int(self.plane.server.rpartition(":")[2]))
        self.plane.start_component(relay)
        api = f"https://{self.host_address}:{relay.port}"
        self._publish_api_endpoint(relay.port)

        conf = self.workdir / "cni" / "net.d"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "10-bertjob.conflist").write_text(json.dumps(self._cni_config()))
        self.containerd = Containerd(self.containerd_root.parent, conf, netns=self.netns_path)
        self.plane.start_component(self.containerd)
        self.import_image(oci.pause_archive(self.workdir / "images"))

        authority = pki.CertificateAuthority.load(self.plane.ca.parent)
        node_user = authority.issue(f"node-{self.token}", f"system:node:{self.name}", ("system:nodes",))
        serving = authority.issue(f"kubelet-{self.token}", self.name, hosts=(self.address,), server=True)
        kubelet = Kubelet(
            self.workdir / "kubelet",
            self.name,
            self._kubeconfig("kubelet", api, node_user),
            self.plane.ca,
            serving,
            self.containerd.socket,
            self.cgroup_root,
            self.address,
            self.netns_path,
            cluster_dns=[self.gateway],
        )
        kubelet.extra_args = [f"--register-with-taints={TAINT['key']}={TAINT['value']}:{TAINT['effect']}"]
        self.plane.start_component(kubelet)
        # kube-proxy and CoreDNS read every Service and endpoint: the components' user.
        components = authority.issue(
            f"node-components-{self.token}", "system:bertjob-test-components", ("system:masters",)
        )
        admin = self._kubeconfig("components", api, components)
        self.plane.start_component(KubeProxy(self.workdir, self.name, admin, self.netns_path, self.address))
        self.plane.start_component(CoreDNS(self.workdir, admin, self.netns_path, self.gateway, self.address))
        self._wait_ready()
        self.plane.timings["real node"] = time.monotonic() - started

    def import_image(self, archive: Path) -> str:
        """Import the OCI or Docker archive ``archive`` into containerd's ``k8s.io`` namespace (the
        CRI's), where pods with ``imagePullPolicy: IfNotPresent`` find it; ctr's output.

        Raises:
            subprocess.CalledProcessError: ctr refused it (its stderr in the error).
        """
        assert self.containerd is not None, "start the node first"
        result = subprocess.run(
            [
                str(executable("containerd", "ctr")),
                f"--address={self.containerd.socket}",
                "--namespace=k8s.io",
                "images",
                "import",
                str(archive),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout

    def ctr_import_command(self, archive: str = "ARCHIVE") -> str:
        """The command that imports an image archive into this node (for messages)."""
        assert self.containerd is not None, "start the node first"
        ctr = executable("containerd", "ctr")
        return f"{ctr} --address={self.containerd.socket} --namespace=k8s.io images import {archive}"

    def wait_for_pod(
        self, name: str, namespace: str, phases: tuple[str, ...] = ("Running",), wait_s: float = 120.0
    ) -> dict[str, Any]:
        """Wait until pod ``namespace/name`` is in one of ``phases``; the pod.

        Raises:
            PodError: one of its images is not in the node's containerd (no registry can be
                pulled from here): the message names the image and the command that imports it;
                or it was not in ``phases`` in ``wait_s`` seconds: the message has its phase, its
                containers' states and its Events.
        """
        deadline = time.monotonic() + wait_s
        found: dict[str, Any] = {}
        while time.monotonic() < deadline:
            found = self.plane.kubectl.get("pod", name, "-n", namespace) or {}
            status = found.get("status") or {}
            if status.get("phase") in phases:
                return found
            for container in status.get("containerStatuses") or []:
                waiting = (container.get("state") or {}).get("waiting") or {}
                if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull"):
                    raise PodError(
                        f"pod {namespace}/{name}: image {container['image']} is not on node {self.name} "
                        f"(nothing can be pulled here); import it with: {self.ctr_import_command()}"
                    )
            time.sleep(0.5)
        status = found.get("status") or {}
        states = {c["name"]: c.get("state") for c in status.get("containerStatuses") or []}
        events = self.plane.kubectl(
            "get", "events", "-n", namespace, f"--field-selector=involvedObject.name={name}", check=False
        ).stdout
        raise PodError(
            f"pod {namespace}/{name} was not {' or '.join(phases)} in {wait_s:.0f} s: phase "
            f"{status.get('phase')}, containers {json.dumps(states)}\nits events:\n{events}"
        )

    # --- the steps ---

    def _make_cgroup_root(self) -> None:
        """The cgroup root in every hierarchy (the kubelet requires it to exist); cpuset's gets its
        parent's CPUs and memory nodes, without which no task may join it."""
        for hierarchy in hierarchies():
            directory = hierarchy / self.cgroup_root.lstrip("/")
            directory.mkdir(exist_ok=True)
            for key in ("cpuset.cpus", "cpuset.mems"):
                if (hierarchy / key).exists():
                    (directory / key).write_text((hierarchy / key).read_text())

    def _make_network(self) -> None:
        """The namespace, its link to this machine, the pods' bridge and the routes both ways;
        forwarding on in the namespace, and bridged traffic through its iptables (kube-proxy's
        rules must see a pod reaching a Service whose endpoint is on the same bridge)."""
        assert self.link is not None and self.pods is not None
        host_end, node_end = self.host_link, f"bjn{self.token}"
        inside = ("-n", self.netns)
        ip("netns", "add", self.netns)
        ip("link", "add", host_end, "type", "veth", "peer", "name", node_end, "netns", self.netns)
        ip("address", "add", f"{self.host_address}/{self.link.prefixlen}", "dev", host_end)
        ip("link", "set", host_end, "up")
        ip(*inside, "link", "set", "lo", "up")
        ip(*inside, "address", "add", f"{self.address}/{self.link.prefixlen}", "dev", node_end)
        ip(*inside, "link", "set", node_end, "up")
        ip(*inside, "link", "add", self.bridge, "type", "bridge")
        ip(*inside, "address", "add", f"{self.gateway}/{self.pods.prefixlen}", "dev", self.bridge)
        ip(*inside, "link", "set", self.bridge, "up")
        ip(*inside, "route", "add", "default", "via", self.host_address)
        ip("route", "add", str(self.pods), "via", self.address)
        for key in ("net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables"):
            subprocess.run(
                ["ip", "netns", "exec", self.netns, "sh", "-c", f"echo 1 > /proc/sys/{key}"],
                check=True,
                capture_output=True,
                text=True,
            )

    def _publish_api_endpoint(self, port: int) -> None:
        """The ``kubernetes`` Service's endpoint: the relay (the API server reconciles none itself,
        ``--endpoint-reconciler-type=none``); the pods' in-cluster clients dial its ClusterIP."""
        self.plane.kubectl.apply(
            endpoint_slice("kubernetes", "default", self.host_address, port, "test-node.bertjob.dev")
        )

    def _kubeconfig(self, name: str, server: str, user: pki.KeyPair) -> Path:
        """A kubeconfig for ``server`` (the relay) as ``user``, checking the API server's
        certificate for :data:`API_SERVER_NAME` (the relay's address is not among its names)."""
        path = self.workdir / f"{name}.kubeconfig"
        path.write_text(kubeconfig_text(server, self.plane.ca, cert_user(user), API_SERVER_NAME))
        return path

    def _cni_config(self) -> dict[str, object]:
        assert self.pods is not None
        return {
            "cniVersion": "1.0.0",
            "name": self.network,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": str(self.pods)}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.workdir / "cni" / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if is_ready(self.plane.kubectl.get("node", self.name) or {}):
                lift_not_ready_taint(self.plane.kubectl, self.name)
                return
            time.sleep(0.5)
        log = tail(self.plane.workdir / "kubelet.log")
        raise StartError(f"node {self.name} was not Ready in {READY_TIMEOUT_S:.0f} s:\n{log}")


__all__ = ["SERVICE_CIDR", "TAINT", "TOLERATION", "PodError", "RealNode"]
