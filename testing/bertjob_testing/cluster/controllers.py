"""The Kubeflow and Kueue controllers on a test control plane, built from source and run as local
processes: training-operator v1 (PyTorchJob), mpi-operator (MPIJob v2beta1), JobSet and Kubeflow
Trainer v2 (TrainJob), and Kueue. Our operator's children then run through the real controllers,
and kwok's stages make the pods they create run and end.

Each controller is a component module (:mod:`bertjob_testing.cluster.components`) with ports of its
own (their defaults, 8080, 8081, 8443 and 9443, collide), the control plane's admin kubeconfig,
leader election off where it can be, its CRDs from the catalog (its own module at the pinned
version), and its webhook configurations from the module's kustomize component, pointed at a
Service made ``type: ExternalName`` to ``localhost`` with the process's port
(:mod:`bertjob_testing.cluster.webhooks`). None writes to a fixed path or port shared by two runs
on one machine: see :mod:`~bertjob_testing.cluster.components.training_operator` and
:mod:`~bertjob_testing.cluster.components.mpi_operator` for the two that would.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from bertjob_testing.cluster import pki
from bertjob_testing.cluster.build import crds
from bertjob_testing.cluster.components import jobset, kueue, mpi_operator, trainer, training_operator
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.webhooks import Site

# The controllers whose CRDs the catalog lists, applied before any starts (Kueue's, with their
# conversion webhooks, come with Kueue).
CRD_COMPONENTS = ("training-operator", "mpi-operator", "trainer", "jobset")
NAMESPACES = (
    training_operator.NAMESPACE,
    mpi_operator.LOCK_NAMESPACE,
    trainer.NAMESPACE,
    jobset.NAMESPACE,
    kueue.NAMESPACE,
)


@dataclass
class Controllers:
    """The controllers started on ``plane``; :meth:`start` starts them, ``plane.stop()`` stops
    them with the rest (they are among its processes)."""

    plane: ControlPlane
    workdir: Path
    # Where the API server reaches their webhooks when it routes to endpoints
    # (:class:`bertjob_testing.cluster.webhooks.Site`): an address of this machine's, not loopback.
    address: str | None = None
    # Seconds from each controller's start to ready.
    timings: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        """Install the controllers' CRDs and namespaces, then start each (its webhooks
        registered) and wait until it is ready (its readiness endpoint, or mpi-operator's leader
        lease).

        Raises:
            bertjob_testing.cluster.process.StartError: a controller exited or was not ready in
                time (its name, version and log's last lines).
            AssertionError: kubectl failed.
        """
        started = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        kubectl = self.plane.kubectl
        site = Site(
            kubectl,
            self.workdir,
            pki.CertificateAuthority(self.workdir / "pki", "bertjob-test-webhook-ca"),
            self.address,
        )
        for namespace in NAMESPACES:
            kubectl("create", "namespace", namespace)
        files = [path for name in CRD_COMPONENTS for path in crds(name)]
        kubectl("apply", "--server-side", "--force-conflicts", *(f"--filename={path}" for path in files))
        kubectl.wait_established()
        self.timings["crds"] = time.monotonic() - started
        for controller in (
            training_operator.TrainingOperator(site),
            mpi_operator.MPIOperator(site, self.plane.server),
            jobset.JobSet(site),
            trainer.Trainer(site),
            kueue.Kueue(site),
        ):
            process = self.plane.start_component(controller)
            self.timings[controller.name] = process.ready_s
        self.timings["total"] = time.monotonic() - started


__all__ = ["Controllers"]
