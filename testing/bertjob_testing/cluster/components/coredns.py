"""CoreDNS as the real node's cluster DNS: the ``kubernetes`` plugin answers Services' and pods'
names under ``cluster.local`` from the API server; nothing is forwarded (the machine reaches no
outside name server, and no test may). It listens on the pods' gateway inside the node's network
namespace, which is the kubelet's ``clusterDNS``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bertjob_testing.cluster.build import executable
from bertjob_testing.cluster.catalog import component
from bertjob_testing.cluster.process import answers, free_port, in_namespaces, with_testing_on_path


@dataclass
class CoreDNS:
    """CoreDNS on ``listen`` (port 53) in the network namespace at ``netns``, reading the API as
    ``kubeconfig``'s user; its health endpoint on the node's ``address``."""

    workdir: Path
    kubeconfig: Path
    netns: Path
    listen: str
    address: str
    extra_args: list[str] = field(default_factory=list)
    name: str = "coredns"
    version: str = field(default_factory=lambda: component("coredns").version)
    health_port: int = 0

    def corefile(self) -> str:
        """Its Corefile."""
        return (
            ".:53 {\n"
            f"    bind {self.listen}\n"
            "    errors\n"
            f"    health {self.address}:{self.health_port}\n"
            "    kubernetes cluster.local in-addr.arpa ip6.arpa {\n"
            f"        kubeconfig {self.kubeconfig}\n"
            "        pods insecure\n"
            "    }\n"
            "    cache 5\n"
            "}\n"
        )

    def command(self) -> list[str]:
        """Its command inside the node's namespace, its Corefile written first."""
        self.health_port = free_port()
        corefile = self.workdir / "Corefile"
        corefile.write_text(self.corefile())
        return [
            *in_namespaces(f"--netns={self.netns}"),
            str(executable("coredns", "coredns")),
            f"-conf={corefile}",
        ]

    def environment(self) -> dict[str, str] | None:
        """This package on the path (for the namespace's helper)."""
        return with_testing_on_path()

    def ready(self) -> bool:
        """Its health endpoint answers."""
        return answers(f"http://{self.address}:{self.health_port}/health")
