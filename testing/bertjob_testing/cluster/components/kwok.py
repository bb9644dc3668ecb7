"""kwok: the fake nodes' kubelet (:mod:`bertjob_testing.cluster.nodes` makes the nodes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bertjob_testing.cluster import pki
from bertjob_testing.cluster.build import executable
from bertjob_testing.cluster.catalog import component
from bertjob_testing.cluster.components.controller_manager import POD_CIDR
from bertjob_testing.cluster.nodes import FAKE_NODE_ANNOTATION, stages
from bertjob_testing.cluster.process import answers, free_port, insecure


@dataclass
class Kwok:
    """kwok as ``kubeconfig``'s user, serving the nodes' kubelet API (``kubectl logs``) with
    ``serving``, managing only the nodes annotated :data:`FAKE_NODE_ANNOTATION`."""

    workdir: Path
    kubeconfig: Path
    serving: pki.KeyPair
    extra_args: list[str] = field(default_factory=list)
    name: str = "kwok"
    version: str = field(default_factory=lambda: component("kwok").version)
    port: int = 0

    def command(self) -> list[str]:
        """Its command with a fresh port, which is both its own server's and the nodes' kubelet
        port: the API server reaches the kubelet API (logs) there."""
        self.port = free_port()
        config = self.workdir / "kwok-stages.yaml"
        config.write_text(stages())
        return [
            str(executable("kwok", "kwok")),
            f"--kubeconfig={self.kubeconfig}",
            f"--config={config}",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
            f"--cidr={POD_CIDR}",
            "--node-ip=127.0.0.1",
            f"--node-port={self.port}",
            f"--server-address=127.0.0.1:{self.port}",
            f"--tls-cert-file={self.serving.cert}",
            f"--tls-private-key-file={self.serving.key}",
            "--enable-crds=Logs,ClusterLogs",
        ]

    def environment(self) -> dict[str, str] | None:
        """The caller's."""
        return None

    def ready(self) -> bool:
        """Its /healthz answers."""
        return answers(f"https://127.0.0.1:{self.port}/healthz", insecure())
