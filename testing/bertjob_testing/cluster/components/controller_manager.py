"""kube-controller-manager for the test control plane: only the controllers the tests need."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bertjob_testing.cluster import pki
from bertjob_testing.cluster.build import executable
from bertjob_testing.cluster.catalog import component
from bertjob_testing.cluster.process import answers, free_port, insecure

POD_CIDR = "10.244.0.0/16"
# The controllers the tests need (--controllers).
CONTROLLERS = (
    "garbage-collector-controller",
    "job-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "pod-garbage-collector-controller",
    # Binds a claim to a matching PersistentVolume (the examples' claims), without which the
    # scheduler leaves a pod that mounts one Pending.
    "persistentvolume-binder-controller",
    # Publishes kube-root-ca.crt in every namespace, which every pod's service-account token volume
    # mounts (the real node's pods do not start without it).
    "root-ca-certificate-publisher-controller",
    # A Service's EndpointSlices, which kube-proxy and CoreDNS read on the real node, and its
    # Endpoints, through which the API server reaches a webhook's pod there.
    "endpointslice-controller",
    "endpoints-controller",
    # The chart's Deployment: its pods run on the real node.
    "deployment-controller",
    "replicaset-controller",
)


def secure_flags(kubeconfig: Path, ca: Path, port: int) -> list[str]:
    """What the controller-manager and the scheduler share: the kubeconfig for the API and for
    checking their own clients, a secure port on 127.0.0.1, no leader election."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        # Clients authenticate with certificates of our CA only: no front-proxy CA to look up
        # (the lookup logs an error every few seconds without one).
        "--authentication-skip-lookup=true",
        f"--client-ca-file={ca}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--leader-elect=false",
    ]


@dataclass
class ControllerManager:
    """kube-controller-manager as ``kubeconfig``'s user, signing service-account tokens with
    ``keys`` and giving pods ``ca`` as the cluster's CA."""

    kubeconfig: Path
    ca: Path
    keys: pki.KeyPair
    extra_args: list[str] = field(default_factory=list)
    name: str = "kube-controller-manager"
    version: str = field(default_factory=lambda: component("kubernetes").version)
    port: int = 0

    def command(self) -> list[str]:
        """Its command with a fresh secure port."""
        self.port = free_port()
        return [
            str(executable("kubernetes", "kube-controller-manager")),
            *secure_flags(self.kubeconfig, self.ca, self.port),
            f"--controllers={','.join(CONTROLLERS)}",
            f"--service-account-private-key-file={self.keys.key}",
            f"--root-ca-file={self.ca}",
            f"--cluster-cidr={POD_CIDR}",
            "--v=1",
        ]

    def environment(self) -> dict[str, str] | None:
        """The caller's."""
        return None

    def ready(self) -> bool:
        """Its /healthz answers."""
        return answers(f"https://127.0.0.1:{self.port}/healthz", insecure())
