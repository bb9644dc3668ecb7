"""The Kubeflow and Kueue controllers on a test control plane, built from source and run as local
processes: training-operator v1 (PyTorchJob), mpi-operator (MPIJob v2beta1), JobSet and Kubeflow
Trainer v2 (TrainJob), and Kueue. Our operator's children then run through the real controllers,
and kwok's stages make the pods they create run and end.

Each controller gets ports of its own (their defaults, 8080, 8081, 8443 and 9443, collide), the
control plane's admin kubeconfig, leader election off where it can be (mpi-operator's is always
on: its lock namespace is created), its CRDs from its own module at the pinned version, and its
webhook configurations from the module's kustomize component (``kubectl kustomize``), pointed at
a Service of the controller's namespace made ``type: ExternalName`` to ``localhost`` with the
process's port, as the operator's own webhook is reached.

Webhook certificates: training-operator's rotator writes them to the fixed
``/tmp/k8s-webhook-server/serving-certs`` (``pkg/cert/cert.go``) and injects its CA into its
configuration itself; Trainer, JobSet and Kueue would write to the same path, so their certificate
management is turned off in their configuration files and each serves a certificate of
:class:`Controllers`' own CA from a directory of its own (Trainer reads ``$TMPDIR``, JobSet and
Kueue a ``certDir``), and the CA goes into their configurations' ``caBundle``.

What cannot be moved: mpi-operator's health endpoint listens on ``:8080`` (a constant), so two
runs of this tier on one machine at once collide there, and training-operator's certificates share
``/tmp/k8s-webhook-server`` with any other process that writes there.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bertjob_testing.cluster import pki
from bertjob_testing.cluster.controlplane import ControlPlane, environment_without_proxy
from bertjob_testing.cluster.process import Process, answers, free_port
from bertjob_testing.cluster.versions import ControllerBinaries, controller_binaries, module_dir, versions

START_TIMEOUT_S = 120.0
# mpi-operator's health endpoint: a constant of cmd/mpi-operator/app/server.go, on every address.
MPI_OPERATOR_HEALTH_PORT = 8080
# Where training-operator's certificate rotator expects its Secret mounted (pkg/cert/cert.go).
TRAINING_OPERATOR_CERTS = Path("/tmp/k8s-webhook-server/serving-certs")
# The Kueue integrations this tier enables (its configuration's integrations.frameworks).
KUEUE_FRAMEWORKS = (
    "batch/job",
    "kubeflow.org/pytorchjob",
    "kubeflow.org/mpijob",
    "trainer.kubeflow.org/trainjob",
    "jobset.x-k8s.io/jobset",
)
# Kueue's webhooks kept: its own kinds and the enabled integrations' (the others are not served
# when their integration is off, and with failurePolicy Fail would refuse every such object).
KUEUE_WEBHOOKS = frozenset(
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


@dataclass(frozen=True)
class Webhooks:
    """Where a controller's admission webhooks are: the kustomize component in its module, the
    Service they name (made ExternalName here), and which of them to register (all when None)."""

    component: str
    namespace: str
    service: str
    # Upstream's overlays prefix the component's placeholder configuration names; the
    # controllers that inject their CA themselves look for the prefixed names.
    prefix: str
    keep: frozenset[str] | None = None


@dataclass
class Controllers:
    """The controllers started on ``plane``; :meth:`start` starts them, ``plane.stop()`` stops
    them with the rest (they are among its processes)."""

    plane: ControlPlane
    workdir: Path
    binaries: ControllerBinaries = field(default_factory=controller_binaries)
    # Seconds from each controller's start to ready.
    timings: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        """Install the controllers' CRDs, namespaces and webhooks, then start each and wait until it
        is ready (its readiness endpoint, or mpi-operator's leader lease).

        Raises:
            bertjob_testing.cluster.process.StartError: a controller exited or was not ready in
                :data:`START_TIMEOUT_S` (its name, version and log's last lines).
            AssertionError: kubectl failed.
        """
        started = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._authority = pki.CertificateAuthority(self._dir("pki"), "bertjob-test-webhook-ca")
        for namespace in ("kubeflow", "mpi-operator", "kubeflow-system", "jobset-system", "kueue-system"):
            self.plane.kubectl("create", "namespace", namespace)
        self._apply_crds()
        self.timings["crds"] = time.monotonic() - started
        self._run("training-operator", self._training_operator)
        self._run("mpi-operator", self._mpi_operator)
        self._run("jobset", self._jobset)
        self._run("trainer", self._trainer)
        self._run("kueue", self._kueue)
        self.timings["total"] = time.monotonic() - started

    def _run(self, name: str, start: Callable[[], Process]) -> None:
        process = self.plane.start_component(name, start)
        self.timings[name] = process.ready_s

    def _dir(self, name: str) -> Path:
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    # --- CRDs and webhooks ---

    def _apply_crds(self) -> None:
        pinned = versions()
        files = [
            module_dir("github.com/kubeflow/training-operator", pinned["TRAINING_OPERATOR_VERSION"])
            / "manifests/base/crds/kubeflow.org_pytorchjobs.yaml",
            module_dir("github.com/kubeflow/mpi-operator", pinned["MPI_OPERATOR_VERSION"])
            / "manifests/base/kubeflow.org_mpijobs.yaml",
            *sorted(
                (
                    module_dir("github.com/kubeflow/trainer/v2", pinned["TRAINER_VERSION"])
                    / "manifests/base/crds"
                ).glob("*.yaml")
            ),
            module_dir("sigs.k8s.io/jobset", pinned["JOBSET_VERSION"])
            / "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",
        ]
        arguments = [f"--filename={path}" for path in files if path.name != "kustomization.yaml"]
        self.plane.kubectl("apply", "--server-side", "--force-conflicts", *arguments)
        self.plane.wait_established()

    def _register_webhooks(self, module: Path, webhooks: Webhooks, port: int, ca_bundle: bool) -> None:
        """Register the webhook configurations of ``webhooks.component`` (kustomized as upstream
        builds it) for a process listening on ``port``; with our CA as ``caBundle`` when
        ``ca_bundle`` (else the controller injects its own)."""
        rendered = self.plane.kubectl("kustomize", str(module / webhooks.component)).stdout
        bundle = base64.b64encode(self._authority.cert.read_bytes()).decode()
        for document in yaml.safe_load_all(rendered):
            if not document or not document["kind"].endswith("WebhookConfiguration"):
                continue
            kept = [w for w in document["webhooks"] if webhooks.keep is None or w["name"] in webhooks.keep]
            for webhook in kept:
                service = webhook["clientConfig"]["service"]
                service.update({"namespace": webhooks.namespace, "name": webhooks.service, "port": port})
                if ca_bundle:
                    webhook["clientConfig"]["caBundle"] = bundle
            document["webhooks"] = kept
            if document["metadata"]["name"].endswith("-webhook-configuration"):
                document["metadata"]["name"] = webhooks.prefix + document["metadata"]["name"]
            self.plane.kubectl(
                "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(document)
            )
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": webhooks.service, "namespace": webhooks.namespace},
            "spec": {"type": "ExternalName", "externalName": "localhost"},
        }
        self.plane.kubectl("apply", "-f", "-", input=json.dumps(service))

    def _serving_certs(self, name: str, service: str, namespace: str, directory: Path) -> Path:
        """A serving certificate of our CA for ``service.namespace.svc`` as ``tls.crt``/``tls.key``
        in ``directory`` (controller-runtime's file names)."""
        directory.mkdir(parents=True, exist_ok=True)
        pair = self._authority.issue(
            name, f"{service}.{namespace}.svc", hosts=(f"{service}.{namespace}.svc", "localhost"), server=True
        )
        (directory / "tls.crt").write_bytes(pair.cert.read_bytes())
        (directory / "tls.key").write_bytes(pair.key.read_bytes())
        return directory

    def _process(
        self, name: str, version: str, command: list[str], env: dict[str, str] | None = None
    ) -> Process:
        environment = {**environment_without_proxy(), "KUBECONFIG": str(self.plane.admin), **(env or {})}
        return Process(f"{name} {version}", command, self.plane.workdir / f"{name}.log", env=environment)

    # --- the controllers ---

    def _training_operator(self) -> Process:
        version = versions()["TRAINING_OPERATOR_VERSION"]
        module = module_dir("github.com/kubeflow/training-operator", version)
        webhook, probe = free_port(), free_port()
        webhooks = Webhooks(
            "manifests/base/webhook",
            "kubeflow",
            "training-operator",
            "",
            frozenset({"validator.pytorchjob.training-operator.kubeflow.org"}),
        )
        self._register_webhooks(module, webhooks, webhook, ca_bundle=False)
        # Its rotator fills this Secret and waits for its files in the fixed directory, where a
        # pod mounts it: ours are written when it is filled (:meth:`_mount_secret`), and a previous
        # run's are removed first, or the webhook would serve them.
        for stale in TRAINING_OPERATOR_CERTS.glob("*"):
            stale.unlink()
        secret = "training-operator-webhook-cert"
        self._empty_secret("kubeflow", secret)
        process = self._process(
            "training-operator",
            version,
            [
                str(self.binaries.training_operator),
                # Its v1 MPIJob would collide with mpi-operator's v2beta1.
                "--enable-scheme=pytorchjob",
                f"--metrics-bind-address=127.0.0.1:{free_port()}",
                f"--health-probe-bind-address=127.0.0.1:{probe}",
                f"--webhook-server-port={webhook}",
                "--webhook-service-name=training-operator",
                "--kube-api-qps=100",
                "--kube-api-burst=200",
            ],
            # Its certificate rotator writes to /tmp/k8s-webhook-server/serving-certs whatever
            # TMPDIR says; its webhook server reads os.TempDir(): both must be /tmp.
            env={"MY_POD_NAMESPACE": "kubeflow", "TMPDIR": "/tmp"},
        )
        process.wait_ready(
            lambda: (
                self.plane.mount_secret("kubeflow", secret, TRAINING_OPERATOR_CERTS)
                and answers(f"http://127.0.0.1:{probe}/readyz")
            ),
            START_TIMEOUT_S,
        )
        return process

    def _mpi_operator(self) -> Process:
        version = versions()["MPI_OPERATOR_VERSION"]
        process = self._process(
            "mpi-operator",
            version,
            [
                str(self.binaries.mpi_operator),
                f"--kubeConfig={self.plane.admin}",
                "--lock-namespace=mpi-operator",
                f"--monitoring-port={free_port()}",
                "--kube-api-qps=100",
                "--kube-api-burst=200",
            ],
        )
        process.wait_ready(lambda: self._lease_held("mpi-operator", "mpi-operator"), START_TIMEOUT_S)
        return process

    def _lease_held(self, namespace: str, name: str) -> bool:
        lease = self.plane.get("lease", name, "-n", namespace)
        return bool(lease and lease.get("spec", {}).get("holderIdentity"))

    def _jobset(self) -> Process:
        version = versions()["JOBSET_VERSION"]
        module = module_dir("sigs.k8s.io/jobset", version)
        webhook, probe = free_port(), free_port()
        certs = self._serving_certs(
            "jobset", "jobset-webhook-service", "jobset-system", self._dir("jobset-certs")
        )
        self._register_webhooks(
            module,
            Webhooks("config/components/webhook", "jobset-system", "jobset-webhook-service", "jobset-"),
            webhook,
            True,
        )
        config = self._config(
            "jobset",
            {
                "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
                "kind": "Configuration",
                "webhook": {"port": webhook, "host": "127.0.0.1", "certDir": str(certs)},
                "metrics": {"bindAddress": f"127.0.0.1:{free_port()}"},
                "health": {"healthProbeBindAddress": f"127.0.0.1:{probe}"},
                "leaderElection": {"leaderElect": False},
                "internalCertManagement": {"enable": False},
            },
        )
        process = self._process("jobset", version, [str(self.binaries.jobset), f"--config={config}"])
        process.wait_ready(lambda: answers(f"http://127.0.0.1:{probe}/readyz"), START_TIMEOUT_S)
        return process

    def _trainer(self) -> Process:
        version = versions()["TRAINER_VERSION"]
        module = module_dir("github.com/kubeflow/trainer/v2", version)
        webhook, probe = free_port(), free_port()
        service = "kubeflow-trainer-controller-manager"
        # Its webhook server reads os.TempDir()/k8s-webhook-server/serving-certs.
        tmpdir = self._dir("trainer-tmp")
        self._serving_certs(
            "trainer", service, "kubeflow-system", tmpdir / "k8s-webhook-server" / "serving-certs"
        )
        self._register_webhooks(
            module, Webhooks("manifests/base/webhook", "kubeflow-system", service, "trainer-"), webhook, True
        )
        config = self._config(
            "trainer",
            {
                "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
                "kind": "Configuration",
                "webhook": {"port": webhook, "host": "127.0.0.1"},
                "metrics": {"bindAddress": f"127.0.0.1:{free_port()}", "secureServing": False},
                "health": {"healthProbeBindAddress": f"127.0.0.1:{probe}"},
                "leaderElection": {"leaderElect": False},
                "certManagement": {"enable": False},
                "statusServer": {"port": free_port()},
            },
        )
        process = self._process(
            "trainer",
            version,
            [str(self.binaries.trainer), f"--config={config}"],
            env={"TMPDIR": str(tmpdir), "POD_NAMESPACE": "kubeflow-system"},
        )
        process.wait_ready(lambda: answers(f"http://127.0.0.1:{probe}/readyz"), START_TIMEOUT_S)
        return process

    def _kueue(self) -> Process:
        version = versions()["KUEUE_VERSION"]
        module = module_dir("sigs.k8s.io/kueue", version)
        webhook, probe = free_port(), free_port()
        service, namespace, secret = "kueue-webhook-service", "kueue-system", "kueue-webhook-server-cert"
        # Kueue's own certificate management stays on: off, it reads its metrics certificate from
        # the fixed /etc/kueue/metrics/certs. Its rotator writes to the configured certDir and
        # injects its CA into the webhook configurations and the CRDs' conversion webhooks.
        self._apply_kueue_crds(module, namespace, service, webhook)
        self._register_webhooks(
            module,
            Webhooks("config/components/webhook", namespace, service, "kueue-", KUEUE_WEBHOOKS),
            webhook,
            False,
        )
        self._empty_secret(namespace, secret)
        certs = self._dir("kueue-certs")
        config = self._config(
            "kueue",
            {
                "apiVersion": "config.kueue.x-k8s.io/v1beta2",
                "kind": "Configuration",
                "namespace": namespace,
                "webhook": {"port": webhook, "host": "127.0.0.1", "certDir": str(certs)},
                "metrics": {"bindAddress": f"127.0.0.1:{free_port()}"},
                "health": {"healthProbeBindAddress": f"127.0.0.1:{probe}"},
                "leaderElection": {"leaderElect": False},
                "internalCertManagement": {
                    "enable": True,
                    "webhookServiceName": service,
                    "webhookSecretName": secret,
                },
                "manageJobsWithoutQueueName": False,
                "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)},
            },
        )
        process = self._process(
            "kueue",
            version,
            [
                str(self.binaries.kueue),
                f"--config={config}",
                f"--visibility-server-port={free_port()}",
                "--feature-gates=VisibilityOnDemand=false",
            ],
        )
        process.wait_ready(
            lambda: (
                self.plane.mount_secret(namespace, secret, certs)
                and answers(f"http://127.0.0.1:{probe}/readyz")
            ),
            START_TIMEOUT_S,
        )
        return process

    def _apply_kueue_crds(self, module: Path, namespace: str, service: str, port: int) -> None:
        """Kueue's CRDs as its own kustomize component builds them (with conversion webhooks),
        the webhooks pointed at ``service`` in ``namespace`` on ``port``."""
        rendered = self.plane.kubectl("kustomize", str(module / "config/components/crd")).stdout
        documents = []
        for document in yaml.safe_load_all(rendered):
            conversion = (document.get("spec") or {}).get("conversion") or {}
            reference = ((conversion.get("webhook") or {}).get("clientConfig") or {}).get("service")
            if reference is not None:
                reference.update({"namespace": namespace, "name": service, "port": port})
            documents.append(document)
        self.plane.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}),
        )
        self.plane.wait_established()

    def _empty_secret(self, namespace: str, name: str) -> None:
        """The Secret a certificate rotator fills (upstream's manifests create it empty; the
        rotator fails without it)."""
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace}}
        self.plane.kubectl("apply", "-f", "-", input=json.dumps(secret))

    def _config(self, name: str, document: dict[str, Any]) -> Path:
        path = self.workdir / f"{name}-config.yaml"
        path.write_text(yaml.safe_dump(document))
        return path


__all__ = ["ControllerBinaries", "Controllers"]
