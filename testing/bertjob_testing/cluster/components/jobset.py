"""JobSet, which a TrainJob makes: its certificate management off, serving a certificate of the
controllers' test CA from a directory of its own (``certDir``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bertjob_testing.cluster.build import executable, source
from bertjob_testing.cluster.catalog import component
from bertjob_testing.cluster.process import answers, free_port
from bertjob_testing.cluster.webhooks import Site, Webhooks, register, serving_certs, write_config

NAMESPACE = "jobset-system"
WEBHOOKS = Webhooks("config/components/webhook", NAMESPACE, "jobset-webhook-service", "jobset-")


@dataclass
class JobSet:
    """JobSet's controller with its webhook on a port of its own."""

    site: Site
    extra_args: list[str] = field(default_factory=list)
    name: str = "jobset"
    version: str = field(default_factory=lambda: component("jobset").version)
    probe_port: int = 0

    def command(self) -> list[str]:
        """Certificates, webhooks for a fresh port and the configuration file; its command."""
        webhook, self.probe_port = free_port(), free_port()
        certs = serving_certs(
            self.site.authority, "jobset", WEBHOOKS.service, NAMESPACE, self.site.directory("jobset-certs")
        )
        register(self.site, source("jobset"), WEBHOOKS, webhook, ca=self.site.authority.cert)
        config = write_config(
            self.site.workdir / "jobset-config.yaml",
            {
                "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
                "kind": "Configuration",
                "webhook": {"port": webhook, "host": self.site.host, "certDir": str(certs)},
                "metrics": {"bindAddress": f"127.0.0.1:{free_port()}"},
                "health": {"healthProbeBindAddress": f"127.0.0.1:{self.probe_port}"},
                "leaderElection": {"leaderElect": False},
                "internalCertManagement": {"enable": False},
            },
        )
        return [str(executable("jobset", "jobset")), f"--config={config}"]

    def environment(self) -> dict[str, str] | None:
        """The admin's kubeconfig."""
        return self.site.environment()

    def ready(self) -> bool:
        """Its readiness endpoint answers."""
        return answers(f"http://127.0.0.1:{self.probe_port}/readyz")
