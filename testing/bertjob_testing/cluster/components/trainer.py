"""Kubeflow Trainer v2's controller (TrainJob): its certificate management off, serving a
certificate of the controllers' test CA from ``$TMPDIR/k8s-webhook-server/serving-certs``, its own
``TMPDIR``."""

from __future__ import annotations

from dataclasses import dataclass, field

from bertjob_testing.cluster.build import executable, source
from bertjob_testing.cluster.catalog import component
from bertjob_testing.cluster.process import answers, free_port
from bertjob_testing.cluster.webhooks import Site, Webhooks, register, serving_certs, write_config

NAMESPACE = "kubeflow-system"
SERVICE = "kubeflow-trainer-controller-manager"
WEBHOOKS = Webhooks("manifests/base/webhook", NAMESPACE, SERVICE, "trainer-")


@dataclass
class Trainer:
    """Trainer's controller manager with its webhook and status server on ports of its own."""

    site: Site
    extra_args: list[str] = field(default_factory=list)
    name: str = "trainer"
    version: str = field(default_factory=lambda: component("trainer").version)
    probe_port: int = 0

    def command(self) -> list[str]:
        """Certificates, webhooks for a fresh port and the configuration file; its command."""
        webhook, self.probe_port = free_port(), free_port()
        tmpdir = self.site.directory("trainer-tmp")
        serving_certs(
            self.site.authority,
            "trainer",
            SERVICE,
            NAMESPACE,
            tmpdir / "k8s-webhook-server" / "serving-certs",
        )
        register(self.site, source("trainer"), WEBHOOKS, webhook, ca=self.site.authority.cert)
        config = write_config(
            self.site.workdir / "trainer-config.yaml",
            {
                "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
                "kind": "Configuration",
                "webhook": {"port": webhook, "host": self.site.host},
                "metrics": {"bindAddress": f"127.0.0.1:{free_port()}", "secureServing": False},
                "health": {"healthProbeBindAddress": f"127.0.0.1:{self.probe_port}"},
                "leaderElection": {"leaderElect": False},
                "certManagement": {"enable": False},
                "statusServer": {"port": free_port()},
            },
        )
        return [str(executable("trainer", "trainer-controller-manager")), f"--config={config}"]

    def environment(self) -> dict[str, str] | None:
        """Its namespace and its own TMPDIR."""
        return self.site.environment(TMPDIR=str(self.site.directory("trainer-tmp")), POD_NAMESPACE=NAMESPACE)

    def ready(self) -> bool:
        """Its readiness endpoint answers."""
        return answers(f"http://127.0.0.1:{self.probe_port}/readyz")
