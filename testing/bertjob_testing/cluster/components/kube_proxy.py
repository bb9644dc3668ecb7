"""kube-proxy of the real node, in iptables mode inside the node's network namespace: Services'
ClusterIPs reach their endpoints from the node's pods, with rules in that namespace alone (two
runs' kube-proxies would otherwise rewrite each other's chains). Conntrack sysctls are left as they
are (kind's settings: ``maxPerCore: 0`` and zero timeouts), since they are not this test's to set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bertjob_testing.cluster.build import executable
from bertjob_testing.cluster.catalog import component
from bertjob_testing.cluster.process import answers, free_port, in_namespaces, with_testing_on_path

POD_NETWORK = "10.244.0.0/16"


@dataclass
class KubeProxy:
    """kube-proxy for node ``node_name`` as ``kubeconfig``'s user, in the network namespace at
    ``netns``, its health endpoint on the node's ``address``."""

    workdir: Path
    node_name: str
    kubeconfig: Path
    netns: Path
    address: str
    extra_args: list[str] = field(default_factory=list)
    name: str = "kube-proxy"
    version: str = field(default_factory=lambda: component("kubernetes").version)
    healthz_port: int = 0

    def command(self) -> list[str]:
        """Its command inside the node's namespace, its configuration written first."""
        self.healthz_port = free_port()
        config = self.workdir / "kube-proxy-config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                    "kind": "KubeProxyConfiguration",
                    "clientConnection": {"kubeconfig": str(self.kubeconfig)},
                    "mode": "iptables",
                    "clusterCIDR": POD_NETWORK,
                    "hostnameOverride": self.node_name,
                    "bindAddress": self.address,
                    "healthzBindAddress": f"{self.address}:{self.healthz_port}",
                    "metricsBindAddress": f"{self.address}:{free_port()}",
                    "conntrack": {
                        "maxPerCore": 0,
                        "tcpEstablishedTimeout": "0s",
                        "tcpCloseWaitTimeout": "0s",
                    },
                    "iptables": {"syncPeriod": "10s", "minSyncPeriod": "0s"},
                }
            )
        )
        return [
            *in_namespaces(f"--netns={self.netns}"),
            str(executable("kubernetes", "kube-proxy")),
            f"--config={config}",
            "--v=1",
        ]

    def environment(self) -> dict[str, str] | None:
        """This package on the path (for the namespace's helper)."""
        return with_testing_on_path()

    def ready(self) -> bool:
        """Its /healthz answers (200 once it has synced its rules)."""
        return answers(f"http://{self.address}:{self.healthz_port}/healthz")
