"""The test cluster's real node: containerd, runc and the kubelet on this machine, registered beside
kwok's fake nodes, where the pods we render really run.

:class:`RealNode` starts it on a :class:`bertjob_testing.cluster.controlplane.ControlPlane`: a
cgroup root, a pod subnet on a bridge of its own, the pause image (built here, :mod:`oci`),
containerd, then the kubelet, and waits until the node is Ready. Everything it makes is the run's
own (names and directories carry a token of the run) and is undone at the end, also by the reaper
when the test run dies (:mod:`bertjob_testing.cluster.nodecleanup`, registered before anything is
made). The node is tainted :data:`TAINT`, so only pods that tolerate it land there: the fake pods
of the other tests stay on kwok's nodes.
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

from bertjob_testing.cluster import oci, pki
from bertjob_testing.cluster.build import executable
from bertjob_testing.cluster.components.containerd import Containerd
from bertjob_testing.cluster.components.kubelet import Kubelet
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.kubectl import kubeconfig_text
from bertjob_testing.cluster.process import StartError, tail, with_testing_on_path

# Only pods that tolerate this run on the real node.
TAINT = {"key": "bertjob.dev/real-node", "value": "true", "effect": "NoSchedule"}
TOLERATION = {"key": TAINT["key"], "operator": "Equal", "value": TAINT["value"], "effect": TAINT["effect"]}
# The pods' addresses: a /24 of this /16 per node, one not routed on this machine yet.
POD_NETWORK = ipaddress.ip_network("10.244.0.0/16")
READY_TIMEOUT_S = 120.0


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 of :data:`POD_NETWORK` that no route of this machine covers (another run's bridge).

    Raises:
        StartError: all are taken.
    """
    routes = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True, check=True).stdout
    taken = {
        ipaddress.ip_network(line.split()[0], strict=False)
        for line in routes.splitlines()
        if line and line.split()[0][0].isdigit()
    }
    subnets = list(POD_NETWORK.subnets(new_prefix=24))[1:]
    start = secrets.randbelow(len(subnets))
    for subnet in subnets[start:] + subnets[:start]:
        if not any(subnet.overlaps(route) for route in taken):
            return subnet  # type: ignore[return-value]
    raise StartError(f"no /24 of {POD_NETWORK} is free of routes on this machine")


@dataclass
class RealNode:
    """A real node on ``plane`` with its files in ``workdir``."""

    plane: ControlPlane
    workdir: Path
    token: str = field(default_factory=lambda: secrets.token_hex(3))
    subnet: ipaddress.IPv4Network | None = None
    containerd: Containerd | None = None

    @property
    def name(self) -> str:
        """The node's name."""
        return f"real-{self.token}"

    @property
    def cgroup_root(self) -> str:
        """The cgroup (in every v1 hierarchy) its pods' cgroups are made under."""
        return f"/bertjob-{self.token}"

    @property
    def bridge(self) -> str:
        """The pods' bridge (15 characters at most)."""
        return f"bjcni{self.token}"

    @property
    def network(self) -> str:
        """The CNI network's name."""
        return f"bertjob-{self.token}"

    def start(self) -> None:
        """Start the node and wait until it is Ready (its taint set, the not-ready one lifted).

        Raises:
            bertjob_testing.cluster.process.StartError: a component did not start, or the node was
                not Ready in :data:`READY_TIMEOUT_S` (the kubelet's log's last lines).
            subprocess.CalledProcessError: the pause image could not be built or imported.
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
                f"--bridge={self.bridge}",
                f"--network={self.network}",
            ],
        )
        self._make_cgroup_root()
        self.subnet = free_subnet()
        self._make_bridge()
        conf = self.workdir / "cni" / "net.d"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "10-bertjob.conflist").write_text(json.dumps(self._cni_config()))
        self.containerd = Containerd(self.workdir / "containerd", conf)
        self.plane.start_component(self.containerd)
        self.import_image(oci.pause_archive(self.workdir / "images"))
        authority = pki.CertificateAuthority.load(self.plane.ca.parent)
        user = authority.issue(f"node-{self.token}", f"system:node:{self.name}", ("system:nodes",))
        kubeconfig = self.workdir / "kubelet.kubeconfig"
        kubeconfig.write_text(
            kubeconfig_text(
                self.plane.server,
                self.plane.ca,
                {"client-certificate": str(user.cert), "client-key": str(user.key)},
            )
        )
        serving = authority.issue(f"kubelet-{self.token}", self.name, hosts=(self.address,), server=True)
        kubelet = Kubelet(
            self.workdir / "kubelet",
            self.name,
            kubeconfig,
            self.plane.ca,
            serving,
            self.containerd.socket,
            self.cgroup_root,
            self.address,
        )
        kubelet.extra_args = [f"--register-with-taints={TAINT['key']}={TAINT['value']}:{TAINT['effect']}"]
        self.plane.start_component(kubelet)
        self._wait_ready()
        self.plane.timings["real node"] = time.monotonic() - started

    @property
    def address(self) -> str:
        """The node's InternalIP: its bridge's address, the pods' gateway. (The kubelet refuses a
        loopback node IP, and the API server reaches the kubelet API there.)"""
        assert self.subnet is not None, "start the node first"
        return str(next(self.subnet.hosts()))

    def _make_bridge(self) -> None:
        """The pods' bridge with the node's address, made before containerd's bridge plugin would
        make it at the first pod: the kubelet registers the address at its start."""
        assert self.subnet is not None
        for command in (
            ["ip", "link", "add", self.bridge, "type", "bridge"],
            ["ip", "address", "add", f"{self.address}/{self.subnet.prefixlen}", "dev", self.bridge],
            ["ip", "link", "set", self.bridge, "up"],
        ):
            subprocess.run(command, check=True, capture_output=True, text=True)

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
                "--no-unpack=false",
                str(archive),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout

    def _cni_config(self) -> dict[str, object]:
        assert self.subnet is not None
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
                        "ranges": [[{"subnet": str(self.subnet)}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.workdir / "cni" / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def _make_cgroup_root(self) -> None:
        """The cgroup root in every v1 hierarchy (the kubelet requires it to exist); cpuset's gets
        its parent's CPUs and memory nodes, without which no task may join it."""
        from bertjob_testing.cluster.nodecleanup import hierarchies

        for hierarchy in hierarchies():
            directory = hierarchy / self.cgroup_root.lstrip("/")
            directory.mkdir(exist_ok=True)
            for key in ("cpuset.cpus", "cpuset.mems"):
                if (hierarchy / key).exists():
                    (directory / key).write_text((hierarchy / key).read_text())

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            node = self.plane.kubectl.get("node", self.name)
            conditions = ((node or {}).get("status") or {}).get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                self.plane.kubectl(
                    "taint", "node", self.name, "node.kubernetes.io/not-ready:NoSchedule-", check=False
                )
                return
            time.sleep(0.5)
        log = tail(self.plane.workdir / "kubelet.log")
        raise StartError(f"node {self.name} was not Ready in {READY_TIMEOUT_S:.0f} s:\n{log}")


__all__ = ["TAINT", "TOLERATION", "RealNode", "with_testing_on_path"]
