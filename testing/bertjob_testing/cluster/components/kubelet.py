"""The kubelet of the test cluster's real node, from the same Kubernetes build as the control
plane: containerd's CRI, the cgroupfs driver (no systemd here) on cgroup v1, which kubelet 1.35+
refuses unless told ``failCgroupV1: false``, a cgroup root, a root directory, ports and a node
name of the run's own (two runs on one machine at once), the API server's client certificate as
the one it trusts, and eviction and image-GC thresholds that a shared development disk does not
trip.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bertjob_testing.cluster import pki
from bertjob_testing.cluster.build import executable
from bertjob_testing.cluster.catalog import component
from bertjob_testing.cluster.process import answers, free_port, in_namespaces, with_testing_on_path


@dataclass
class Kubelet:
    """kubelet of node ``node_name`` as ``kubeconfig``'s user (``system:node:<name>``), in the
    node's network namespace ``netns``, serving its API on the node's ``address`` with ``serving``
    (of the cluster's CA ``ca``), its pods' cgroups under ``cgroup_root``, its files under
    ``workdir``."""

    workdir: Path
    node_name: str
    kubeconfig: Path
    ca: Path
    serving: pki.KeyPair
    runtime_socket: Path
    cgroup_root: str
    address: str
    netns: Path
    cluster_dns: list[str] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)
    name: str = "kubelet"
    version: str = field(default_factory=lambda: component("kubernetes").version)
    healthz_port: int = 0

    def configuration(self, port: int) -> dict[str, object]:
        """Its KubeletConfiguration (kubelet.config.k8s.io/v1beta1) with its API on ``port``."""
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.address,
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": self.address,
            "healthzPort": self.healthz_port,
            "tlsCertFile": str(self.serving.cert),
            "tlsPrivateKeyFile": str(self.serving.key),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.ca)},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.runtime_socket}",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "failCgroupV1": False,
            "failSwapOn": False,
            "clusterDomain": "cluster.local",
            "clusterDNS": self.cluster_dns,
            # A development machine's disk is shared with everything else: evict for nothing short
            # of a full disk, and never collect the images the tests imported (none can be pulled).
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "makeIPTablesUtilChains": False,
            "resolvConf": "/etc/resolv.conf",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "nodeStatusUpdateFrequency": "5s",
            "shutdownGracePeriod": "0s",
        }

    def command(self) -> list[str]:
        """Its command with fresh ports, its configuration written first."""
        port, self.healthz_port = free_port(), free_port()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "kubelet-config.yaml"
        config.write_text(yaml.safe_dump(self.configuration(port)))
        return [
            *in_namespaces(f"--netns={self.netns}"),
            str(executable("kubernetes", "kubelet")),
            f"--config={config}",
            f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={self.workdir / 'root'}",
            f"--hostname-override={self.node_name}",
            f"--node-ip={self.address}",
            "--v=1",
        ]

    def environment(self) -> dict[str, str] | None:
        """This package on the path (for the namespace's helper)."""
        return with_testing_on_path()

    def ready(self) -> bool:
        """Its /healthz answers."""
        return answers(f"http://{self.address}:{self.healthz_port}/healthz")
