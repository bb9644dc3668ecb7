"""Kueue, with the integrations of our launchers' jobs. Its own certificate management stays on
(off, it reads its metrics certificate from the fixed ``/etc/kueue/metrics/certs``): its rotator
writes to the configured ``certDir`` and injects its CA into the webhook configurations and the
CRDs' conversion webhooks, so its CRDs are rendered from its own kustomize component with their
conversion webhooks pointed at its port."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bertjob_testing.cluster.build import executable, source
from bertjob_testing.cluster.catalog import component
from bertjob_testing.cluster.process import answers, free_port
from bertjob_testing.cluster.webhooks import Site, Webhooks, empty_secret, register, write_config

NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"
SECRET = "kueue-webhook-server-cert"
# The integrations enabled (its configuration's integrations.frameworks).
FRAMEWORKS = (
    "batch/job",
    "kubeflow.org/pytorchjob",
    "kubeflow.org/mpijob",
    "trainer.kubeflow.org/trainjob",
    "jobset.x-k8s.io/jobset",
)
# Its webhooks kept: its own kinds and the enabled integrations' (the others are not served when
# their integration is off, and with failurePolicy Fail would refuse every such object).
KEPT = frozenset(
    f"{prefix}{kind}.kb.io"
    for prefix in "mv"
    for kind in (
        "clusterqueue",
        "cohort",
        "resourceflavor",
        "workload",
        "job",
        "jobset",
        "mpijob",
        "pytorchjob",
        "trainjob",
    )
)
WEBHOOKS = Webhooks("config/components/webhook", NAMESPACE, SERVICE, "kueue-", KEPT)


@dataclass
class Kueue:
    """Kueue's controller manager with its webhook on a port of its own."""

    site: Site
    extra_args: list[str] = field(default_factory=list)
    name: str = "kueue"
    version: str = field(default_factory=lambda: component("kueue").version)
    probe_port: int = 0

    @property
    def certs(self) -> Path:
        """Its certDir."""
        return self.site.directory("kueue-certs")

    def command(self) -> list[str]:
        """CRDs and webhooks for a fresh port, the Secret its rotator fills, the configuration
        file; its command."""
        webhook, self.probe_port = free_port(), free_port()
        self._apply_crds(webhook)
        register(self.site, source("kueue"), WEBHOOKS, webhook, ca=None)
        empty_secret(self.site.kubectl, NAMESPACE, SECRET)
        config = write_config(
            self.site.workdir / "kueue-config.yaml",
            {
                "apiVersion": "config.kueue.x-k8s.io/v1beta2",
                "kind": "Configuration",
                "namespace": NAMESPACE,
                "webhook": {"port": webhook, "host": self.site.host, "certDir": str(self.certs)},
                "metrics": {"bindAddress": f"127.0.0.1:{free_port()}"},
                "health": {"healthProbeBindAddress": f"127.0.0.1:{self.probe_port}"},
                "leaderElection": {"leaderElect": False},
                "internalCertManagement": {
                    "enable": True,
                    "webhookServiceName": SERVICE,
                    "webhookSecretName": SECRET,
                },
                "manageJobsWithoutQueueName": False,
                "integrations": {"frameworks": list(FRAMEWORKS)},
            },
        )
        return [
            str(executable("kueue", "kueue")),
            f"--config={config}",
            f"--visibility-server-port={free_port()}",
            "--feature-gates=VisibilityOnDemand=false",
        ]

    def _apply_crds(self, port: int) -> None:
        rendered = self.site.kubectl("kustomize", str(source("kueue") / "config/components/crd")).stdout
        documents: list[dict[str, Any]] = []
        for document in yaml.safe_load_all(rendered):
            conversion = (document.get("spec") or {}).get("conversion") or {}
            reference = ((conversion.get("webhook") or {}).get("clientConfig") or {}).get("service")
            if reference is not None:
                reference.update({"namespace": NAMESPACE, "name": SERVICE, "port": port})
            documents.append(document)
        listed = {"apiVersion": "v1", "kind": "List", "items": documents}
        self.site.kubectl.apply(listed, "--server-side", "--force-conflicts")
        self.site.kubectl.wait_established()

    def environment(self) -> dict[str, str] | None:
        """The admin's kubeconfig."""
        return self.site.environment()

    def ready(self) -> bool:
        """Its rotator filled the Secret (written to its certDir) and its readiness endpoint
        answers."""
        return self.site.kubectl.mount_secret(NAMESPACE, SECRET, self.certs) and answers(
            f"http://127.0.0.1:{self.probe_port}/readyz"
        )
