"""mpi-operator (MPIJob v2beta1). Its leader election is always on (its lock namespace is created
by :class:`bertjob_testing.cluster.controllers.Controllers`), so it is ready once it holds its lease.
Its health endpoint listens on ``:8080``, a constant of ``cmd/mpi-operator/app/server.go``: it runs
in a network namespace of its own (:mod:`bertjob_testing.cluster.namespaces`) that forwards only the API
server's port, so that two runs on one machine do not collide there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from bertjob_testing.cluster.build import executable
from bertjob_testing.cluster.catalog import component
from bertjob_testing.cluster.process import free_port, in_namespaces, with_testing_on_path
from bertjob_testing.cluster.webhooks import Site

LOCK_NAMESPACE = "mpi-operator"


@dataclass
class MPIOperator:
    """mpi-operator as the admin of ``site``'s API server at ``server``."""

    site: Site
    server: str
    extra_args: list[str] = field(default_factory=list)
    name: str = "mpi-operator"
    version: str = field(default_factory=lambda: component("mpi-operator").version)

    def command(self) -> list[str]:
        """Its command, inside a network namespace of its own."""
        api_port = urlsplit(self.server).port
        return [
            *in_namespaces(f"--forward={api_port}"),
            str(executable("mpi-operator", "mpi-operator")),
            f"--kubeConfig={self.site.kubectl.kubeconfig}",
            f"--lock-namespace={LOCK_NAMESPACE}",
            f"--monitoring-port={free_port()}",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
        ]

    def environment(self) -> dict[str, str] | None:
        """The admin's kubeconfig, and this package on the path (for the namespace's helper)."""
        return with_testing_on_path(self.site.environment())

    def ready(self) -> bool:
        """It holds its leader lease."""
        lease = self.site.kubectl.get("lease", "mpi-operator", "-n", LOCK_NAMESPACE)
        return bool(lease and lease.get("spec", {}).get("holderIdentity"))
