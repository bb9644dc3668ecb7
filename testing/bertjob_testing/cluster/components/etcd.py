"""etcd for the test control plane: one member on 127.0.0.1, no fsync (envtest's flags)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bertjob_testing.cluster.build import executable
from bertjob_testing.cluster.catalog import component
from bertjob_testing.cluster.process import answers, free_port


@dataclass
class Etcd:
    """etcd with its data in ``workdir/etcd-data``; ``url`` is its client URL once started."""

    workdir: Path
    extra_args: list[str] = field(default_factory=list)
    name: str = "etcd"
    version: str = field(default_factory=lambda: component("etcd").version)
    url: str = ""

    def command(self) -> list[str]:
        """etcd's command with fresh client and peer ports."""
        client, peer = free_port(), free_port()
        self.url = f"http://127.0.0.1:{client}"
        return [
            str(executable("etcd", "etcd")),
            f"--data-dir={self.workdir / 'etcd-data'}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]

    def environment(self) -> dict[str, str] | None:
        """The caller's."""
        return None

    def ready(self) -> bool:
        """Its /health answers."""
        return answers(f"{self.url}/health")
