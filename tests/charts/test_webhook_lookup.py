"""The certificate the chart makes is kept across upgrades: helm reads the Secret of the release
back (``lookup``) from a cluster, here kmock's emulator, reached by ``helm template
--dry-run=server`` as ``helm upgrade`` reaches the API server."""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml
from kubernetes.client import CoreV1Api
from kubernetes.config import new_client_from_config

from bertjob_testing import kube_emulator
from bertjob_testing.kube_emulator import cluster_crds, emulator, kubeconfig
from tests.helm_chart import CHART, NAMESPACE, RELEASE, one

SECRET = f"{RELEASE}-operator-webhook-tls"
# What the chart renders besides what the emulator declares already, for helm's object mapping.
RENDERED_KINDS = [
    ("v1/secrets", "Secret", True),
    ("v1/services", "Service", True),
    ("apps/v1/deployments", "Deployment", True),
    ("policy/v1/poddisruptionbudgets", "PodDisruptionBudget", True),
    ("rbac.authorization.k8s.io/v1/clusterroles", "ClusterRole", False),
    ("rbac.authorization.k8s.io/v1/clusterrolebindings", "ClusterRoleBinding", False),
    (
        "admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        False,
    ),
]


async def _version(self: kube_emulator.ApiServer, request: Any) -> dict[str, str]:
    # kmock answers v1.26.4, below the chart's kubeVersion.
    return {"major": "1", "minor": "33", "gitVersion": "v1.33.0", "platform": "linux/amd64"}


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[CoreV1Api, Path]]:
    """The emulator as helm needs it, a client of it, and a kubeconfig for helm."""
    original = kube_emulator.ApiServer._serve_version

    async def discovery(self: kube_emulator.ApiServer, request: Any) -> Any:
        # kmock names the core group's version "/v1", which helm's object mapping cannot find.
        found = await original(self, request)
        found["groupVersion"] = found["groupVersion"].lstrip("/")
        return found

    monkeypatch.setattr(kube_emulator.ApiServer, "_serve_server_version", _version)
    monkeypatch.setattr(kube_emulator.ApiServer, "_serve_version", discovery)
    with emulator(cluster_crds()) as (url, server):
        for path, kind, namespaced in RENDERED_KINDS:
            server.resources[path] = kmock.ResourceInfo(
                kind=kind, namespaced=namespaced, verbs=kube_emulator.VERBS
            )
        config = kubeconfig(tmp_path / "kubeconfig", url, "tester-token")
        yield CoreV1Api(new_client_from_config(config_file=str(config))), config


def _upgrade(helm: Callable[..., subprocess.CompletedProcess[str]], config: Path) -> list[dict[str, Any]]:
    result = helm(
        "template",
        RELEASE,
        str(CHART),
        f"--namespace={NAMESPACE}",
        "--set=webhook.enabled=true",
        # The emulator holds the CRD already, owned by no release.
        "--set=crds.install=false",
        "--dry-run=server",
        "--disable-openapi-validation",
        f"--kubeconfig={config}",
    )
    assert result.returncode == 0, result.stderr
    return [obj for obj in yaml.safe_load_all(result.stdout) if obj]


def _store(api: CoreV1Api, data: dict[str, str]) -> None:
    """The Secret as an earlier release of the chart left it."""
    meta = {
        "name": SECRET,
        "namespace": NAMESPACE,
        "labels": {"app.kubernetes.io/managed-by": "Helm"},
        "annotations": {"meta.helm.sh/release-name": RELEASE, "meta.helm.sh/release-namespace": NAMESPACE},
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": meta,
        "data": data,
    }
    api.create_namespaced_secret(NAMESPACE, secret)


def _encoded(*names: str) -> dict[str, str]:
    return {name: base64.b64encode(f"kept {name}".encode()).decode() for name in names}


def test_an_upgrade_keeps_the_certificate(
    helm: Callable[..., subprocess.CompletedProcess[str]], cluster: tuple[CoreV1Api, Path]
) -> None:
    api, config = cluster
    kept = _encoded("ca.crt", "tls.crt", "tls.key")
    _store(api, kept)
    objects = _upgrade(helm, config)
    assert one(objects, "Secret", SECRET)["data"] == kept
    [webhook] = one(objects, "ValidatingWebhookConfiguration")["webhooks"]
    assert webhook["clientConfig"]["caBundle"] == kept["ca.crt"]


def test_a_secret_without_every_file_is_made_anew(
    helm: Callable[..., subprocess.CompletedProcess[str]], cluster: tuple[CoreV1Api, Path]
) -> None:
    api, config = cluster
    _store(api, _encoded("ca.crt", "tls.crt"))
    objects = _upgrade(helm, config)
    data = one(objects, "Secret", SECRET)["data"]
    assert set(data) == {"ca.crt", "tls.crt", "tls.key"}
    assert base64.b64decode(data["tls.key"]).startswith(b"-----BEGIN RSA PRIVATE KEY-----")
    [webhook] = one(objects, "ValidatingWebhookConfiguration")["webhooks"]
    assert webhook["clientConfig"]["caBundle"] == data["ca.crt"] != _encoded("ca.crt")["ca.crt"]
