"""kube-scheduler for the test control plane (kwok only runs pods that have a node)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bertjob_testing.cluster.build import executable
from bertjob_testing.cluster.catalog import component
from bertjob_testing.cluster.components.controller_manager import secure_flags
from bertjob_testing.cluster.process import answers, free_port, insecure


@dataclass
class Scheduler:
    """kube-scheduler as ``kubeconfig``'s user."""

    kubeconfig: Path
    ca: Path
    extra_args: list[str] = field(default_factory=list)
    name: str = "kube-scheduler"
    version: str = field(default_factory=lambda: component("kubernetes").version)
    port: int = 0

    def command(self) -> list[str]:
        """Its command with a fresh secure port."""
        self.port = free_port()
        return [
            str(executable("kubernetes", "kube-scheduler")),
            *secure_flags(self.kubeconfig, self.ca, self.port),
            "--v=1",
        ]

    def environment(self) -> dict[str, str] | None:
        """The caller's."""
        return None

    def ready(self) -> bool:
        """Its /healthz answers."""
        return answers(f"https://127.0.0.1:{self.port}/healthz", insecure())
