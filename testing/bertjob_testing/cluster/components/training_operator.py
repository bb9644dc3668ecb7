"""Kubeflow's training-operator v1, PyTorchJob only (its v1 MPIJob would collide with
mpi-operator's v2beta1).

Its certificate rotator (cert-controller, ``pkg/cert/cert.go``) fills a Secret, then waits until a
``tls.crt`` exists in the fixed ``/tmp/k8s-webhook-server/serving-certs``, where a pod would mount
that Secret; it only looks whether the file exists. Its webhook server, controller-runtime's, reads
``$TMPDIR/k8s-webhook-server/serving-certs``. So each run gives it a ``TMPDIR`` of its own and writes
the filled Secret there, and the fixed path only needs some ``tls.crt``: one is made there once, when
missing, and never removed or read, so that two runs on one machine do not touch each other's
certificates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bertjob_testing.cluster.build import executable, source
from bertjob_testing.cluster.catalog import component
from bertjob_testing.cluster.process import answers, free_port
from bertjob_testing.cluster.webhooks import Site, Webhooks, empty_secret, register

# Where the rotator looks for a mounted certificate (pkg/cert/cert.go's certDir).
ROTATOR_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
NAMESPACE = "kubeflow"
SECRET = "training-operator-webhook-cert"
WEBHOOKS = Webhooks(
    "manifests/base/webhook",
    NAMESPACE,
    "training-operator",
    "",
    frozenset({"validator.pytorchjob.training-operator.kubeflow.org"}),
)


def placeholder_certificate(directory: Path = ROTATOR_CERT_DIR) -> None:
    """A ``tls.crt`` in ``directory`` for the rotator's existence check, made once (to a
    temporary name, then renamed) when none is there; never the certificate served."""
    target = directory / "tls.crt"
    if target.exists():
        return
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".tls.crt.{free_port()}.tmp"
    temporary.write_text("# not a certificate: the test cluster's training-operator only checks it exists\n")
    temporary.replace(target)


@dataclass
class TrainingOperator:
    """training-operator with its webhook on a port of its own and its certificates in
    ``site``'s ``training-operator-tmp``."""

    site: Site
    extra_args: list[str] = field(default_factory=list)
    name: str = "training-operator"
    version: str = field(default_factory=lambda: component("training-operator").version)
    probe_port: int = 0

    @property
    def certs(self) -> Path:
        """Where its webhook server reads its certificate (``$TMPDIR/k8s-webhook-server/...``)."""
        return self.site.directory("training-operator-tmp") / "k8s-webhook-server" / "serving-certs"

    def command(self) -> list[str]:
        """Register its webhook for a fresh port, prepare its certificates; its command."""
        webhook, self.probe_port = free_port(), free_port()
        register(self.site.kubectl, source("training-operator"), WEBHOOKS, webhook, ca=None)
        placeholder_certificate()
        empty_secret(self.site.kubectl, NAMESPACE, SECRET)
        return [
            str(executable("training-operator", "training-operator")),
            "--enable-scheme=pytorchjob",
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            f"--health-probe-bind-address=127.0.0.1:{self.probe_port}",
            f"--webhook-server-port={webhook}",
            "--webhook-service-name=training-operator",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
        ]

    def environment(self) -> dict[str, str] | None:
        """Its namespace (the rotator's Secret's) and its own TMPDIR."""
        return self.site.environment(MY_POD_NAMESPACE=NAMESPACE, TMPDIR=str(self.certs.parents[1]))

    def ready(self) -> bool:
        """The rotator filled the Secret (written where the webhook server reads it) and the
        readiness endpoint answers."""
        return self.site.kubectl.mount_secret(NAMESPACE, SECRET, self.certs) and answers(
            f"http://127.0.0.1:{self.probe_port}/readyz"
        )
