"""The Kubeflow and Kueue controllers' admission webhooks on the test cluster: registered from
each controller's own kustomize component in its module, pointed at the controller's local port
through a Service made ``type: ExternalName`` to ``localhost`` (as kwokctl reaches local
processes), with serving certificates of the controllers' test CA.

An API server that routes webhook calls to a Service's endpoints (``--enable-aggregator-routing``,
as the real node's plane runs, so that it reaches a webhook served by a pod) refuses an
ExternalName Service. On such a plane the :class:`Site` has an ``address`` of this machine's, not
loopback (an EndpointSlice may not hold a loopback address): the controllers listen there, and
their Service has that address as its one endpoint.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bertjob_testing.cluster import pki
from bertjob_testing.cluster.kubectl import Kubectl, endpoint_slice


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


def register(site: Site, module: Path, webhooks: Webhooks, port: int, ca: Path | None) -> None:
    """Register the webhook configurations of ``webhooks.component`` (kustomized as upstream
    builds it) for a process listening on ``port`` at ``site.host``; with ``ca`` as their
    ``caBundle`` when given (else the controller injects its own)."""
    kubectl = site.kubectl
    rendered = kubectl("kustomize", str(module / webhooks.component)).stdout
    bundle = base64.b64encode(ca.read_bytes()).decode() if ca else ""
    for document in yaml.safe_load_all(rendered):
        if not document or not document["kind"].endswith("WebhookConfiguration"):
            continue
        kept = [w for w in document["webhooks"] if webhooks.keep is None or w["name"] in webhooks.keep]
        for webhook in kept:
            service = webhook["clientConfig"]["service"]
            service.update({"namespace": webhooks.namespace, "name": webhooks.service, "port": port})
            if bundle:
                webhook["clientConfig"]["caBundle"] = bundle
        document["webhooks"] = kept
        if document["metadata"]["name"].endswith("-webhook-configuration"):
            document["metadata"]["name"] = webhooks.prefix + document["metadata"]["name"]
        kubectl.apply(document, "--server-side", "--force-conflicts")
    metadata = {"name": webhooks.service, "namespace": webhooks.namespace}
    if site.address is None:
        spec: dict[str, Any] = {"type": "ExternalName", "externalName": "localhost"}
        kubectl.apply({"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec})
        return
    spec = {"type": "ClusterIP", "ports": [{"name": "https", "port": port, "targetPort": port}]}
    kubectl.apply({"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec})
    manager = "test-controllers.bertjob.dev"
    kubectl.apply(endpoint_slice(webhooks.service, webhooks.namespace, site.address, port, manager))


def serving_certs(
    authority: pki.CertificateAuthority, name: str, service: str, namespace: str, directory: Path
) -> Path:
    """A serving certificate of ``authority`` for ``service.namespace.svc`` as ``tls.crt`` and
    ``tls.key`` in ``directory`` (controller-runtime's file names); the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    pair = authority.issue(
        name, f"{service}.{namespace}.svc", hosts=(f"{service}.{namespace}.svc", "localhost"), server=True
    )
    (directory / "tls.crt").write_bytes(pair.cert.read_bytes())
    (directory / "tls.key").write_bytes(pair.key.read_bytes())
    return directory


def empty_secret(kubectl: Kubectl, namespace: str, name: str) -> None:
    """The Secret a certificate rotator fills (upstream's manifests create it empty; the rotator
    fails without it)."""
    kubectl.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace}})


def write_config(path: Path, document: dict[str, Any]) -> Path:
    """A controller's configuration file (YAML) at ``path``."""
    path.write_text(yaml.safe_dump(document))
    return path


@dataclass(frozen=True)
class Site:
    """What every controller of :mod:`bertjob_testing.cluster.controllers` is started with: the
    control plane's admin ``kubectl`` (and its kubeconfig, which the controllers use), a
    ``workdir`` for their files, and the ``authority`` that signs their webhooks' certificates."""

    kubectl: Kubectl
    workdir: Path
    authority: pki.CertificateAuthority
    # Where the API server reaches the controllers' webhooks, when not through ExternalName to
    # localhost (see the module's docstring).
    address: str | None = None

    @property
    def host(self) -> str:
        """The address the controllers' webhook servers listen on."""
        return self.address or "127.0.0.1"

    def directory(self, name: str) -> Path:
        """``workdir/name``, made if missing."""
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def environment(self, **more: str) -> dict[str, str]:
        """A controller's environment: this process's, loopback exempted from any proxy, the
        admin kubeconfig as ``KUBECONFIG``, and ``more``."""
        return {
            **os.environ,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "KUBECONFIG": str(self.kubectl.kubeconfig),
            **more,
        }
