"""Kubeflow's training-operator v1, PyTorchJob only (its v1 MPIJob would collide with
mpi-operator's v2beta1).

Its certificate rotator (cert-controller, ``pkg/cert/cert.go``) fills a Secret, then waits until a
``tls.crt`` exists in the fixed ``/tmp/k8s-webhook-server/serving-certs``, where a pod would mount
that Secret, and its webhook server reads the same directory. So it runs in a mount namespace of
its own (:mod:`bertjob_testing.cluster.namespaces`) where a directory of the run's is mounted on
``/tmp/k8s-webhook-server``, and the harness writes the filled Secret there as a kubelet mounts a
Secret volume: two runs on one machine never see each other's certificates. Without root (no mount
namespace) it uses the fixed directory itself, shared by every run of the machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from bertjob_testing.cluster.build import executable, source
from bertjob_testing.cluster.catalog import component
from bertjob_testing.cluster.oci import PAUSE_IMAGE
from bertjob_testing.cluster.process import answers, free_port, in_namespaces, with_testing_on_path
from bertjob_testing.cluster.webhooks import Site, Webhooks, empty_secret, register

# Where the rotator and the webhook server look for the mounted certificate (pkg/cert/cert.go).
FIXED_DIR = Path("/tmp/k8s-webhook-server")
NAMESPACE = "kubeflow"
SECRET = "training-operator-webhook-cert"
WEBHOOKS = Webhooks(
    "manifests/base/webhook",
    NAMESPACE,
    "training-operator",
    "",
    frozenset({"validator.pytorchjob.training-operator.kubeflow.org"}),
)


def own_mount_namespace() -> bool:
    """Whether it gets a mount namespace of its own (root, as CI runs the tests)."""
    return os.geteuid() == 0


# A Worker pod's init container, which waits until the Master's Service name resolves. Upstream's
# runs `nslookup` in a loop in alpine:3.10, pulled from Docker Hub; the real node pulls nothing, so
# it runs the tests' probe from the pause image instead, with the same tries two seconds apart (an
# air-gapped cluster sets the same two flags: docs/launchers.md). kwok's pods ignore it.
INIT_CONTAINER = """\
- name: init-pytorch
  image: {{.InitContainerImage}}
  imagePullPolicy: IfNotPresent
  resources:
    limits: {cpu: 100m, memory: 20Mi}
    requests: {cpu: 50m, memory: 10Mi}
  command: ['/probe', 'await', '{{.MasterAddr}}', '{{.MaxTries}}']
"""


@dataclass
class TrainingOperator:
    """training-operator with its webhook on a port of its own and its certificates in a
    directory of the run's (``site``'s ``training-operator``), seen by it at :data:`FIXED_DIR`."""

    site: Site
    extra_args: list[str] = field(default_factory=list)
    name: str = "training-operator"
    version: str = field(default_factory=lambda: component("training-operator").version)
    probe_port: int = 0

    @property
    def webhook_dir(self) -> Path:
        """What it sees as :data:`FIXED_DIR`."""
        return self.site.directory("training-operator") if own_mount_namespace() else FIXED_DIR

    def command(self) -> list[str]:
        """Register its webhook for a fresh port and make the Secret its rotator fills; its
        command, in a mount namespace of its own."""
        webhook, self.probe_port = free_port(), free_port()
        register(self.site, source("training-operator"), WEBHOOKS, webhook, ca=None)
        empty_secret(self.site.kubectl, NAMESPACE, SECRET)
        # A previous run's certificate would be served until the rotator's is written.
        for stale in (self.webhook_dir / "serving-certs").glob("*"):
            stale.unlink()
        init = self.site.directory("training-operator-init") / "init-pytorch.yaml"
        init.write_text(INIT_CONTAINER)
        wrapper = []
        if own_mount_namespace():
            wrapper = in_namespaces(f"--bind={self.webhook_dir}:{FIXED_DIR}")
        return [
            *wrapper,
            str(executable("training-operator", "training-operator")),
            "--enable-scheme=pytorchjob",
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            f"--health-probe-bind-address=127.0.0.1:{self.probe_port}",
            f"--webhook-server-port={webhook}",
            "--webhook-service-name=training-operator",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
            f"--pytorch-init-container-image={PAUSE_IMAGE}",
            f"--pytorch-init-container-template-file={init}",
        ]

    def environment(self) -> dict[str, str] | None:
        """Its namespace (the rotator's Secret's) and TMPDIR /tmp: its webhook server reads
        ``$TMPDIR/k8s-webhook-server``, the rotator the fixed path; both must be the mount."""
        return with_testing_on_path(self.site.environment(MY_POD_NAMESPACE=NAMESPACE, TMPDIR="/tmp"))

    def ready(self) -> bool:
        """The rotator filled the Secret (written where it reads it) and the readiness endpoint
        answers."""
        return self.site.kubectl.mount_secret(
            NAMESPACE, SECRET, self.webhook_dir / "serving-certs"
        ) and answers(f"http://127.0.0.1:{self.probe_port}/readyz")
