"""examples/gitops/argocd's ``argocd-cm`` on the real API server, applied as the example's README says
(``kubectl apply --server-side --field-manager=bertjob-health``): it adds the health check and keeps
every key of Argo CD's settings that another field manager owns (Argo CD's own install and its
settings are applied server-side; ``kubectl edit`` is a manager too). Two cases show why the README
says what it says: a client-side apply of the example removes the keys that the last client-side
apply held; and keys that a client-side apply still owns are handed by kubectl to the manager of the
first server-side apply, so the settings' owner applies them server-side first.

Why kwok: no pod needs to run: the API server alone merges each apply of the one ConfigMap and
records its field managers; no node, fake or real, takes part."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from bertjob_testing.cluster.controlplane import ControlPlane

ARGOCD = Path(__file__).resolve().parents[2] / "examples" / "gitops" / "argocd"
HEALTH_KEY = "resource.customizations.health.bertjob.dev_BertPretrainJob"
FIELD_MANAGER = "bertjob-health"
# A user's Argo CD settings, as its own install or a `kubectl apply` of them left them.
SETTINGS = {"url": "https://argocd.example.com", "dex.config": "connectors: []\n"}


def _health_configmap(plane: ControlPlane, namespace: str) -> dict[str, Any]:
    """The argocd-cm that `kubectl kustomize examples/gitops/argocd` builds, in ``namespace``."""
    built = plane.kubectl("kustomize", str(ARGOCD)).stdout
    [configmap] = [obj for obj in yaml.safe_load_all(built) if obj and obj["kind"] == "ConfigMap"]
    assert configmap["metadata"]["name"] == "argocd-cm" and set(configmap["data"]) == {HEALTH_KEY}
    configmap["metadata"]["namespace"] = namespace
    return dict(configmap)


def _settings(namespace: str) -> str:
    """Argo CD's argocd-cm with the user's keys."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "argocd-cm",
                "namespace": namespace,
                "labels": {"app.kubernetes.io/name": "argocd-cm", "app.kubernetes.io/part-of": "argocd"},
            },
            "data": SETTINGS,
        }
    )


def _apply_ours(plane: ControlPlane, ours: dict[str, Any], server_side: bool = True) -> None:
    side = ["--server-side", f"--field-manager={FIELD_MANAGER}"] if server_side else []
    plane.kubectl("apply", *side, "-f", "-", input=json.dumps(ours))


def _data(plane: ControlPlane, namespace: str) -> dict[str, str]:
    return dict(plane.kubectl.get("configmap", "argocd-cm", "-n", namespace)["data"])


def _owned(plane: ControlPlane, namespace: str) -> dict[str, set[str]]:
    """{field manager: the data keys it owns}."""
    live = plane.kubectl.get("configmap", "argocd-cm", "-n", namespace, "--show-managed-fields")
    return {
        entry["manager"]: {key.removeprefix("f:") for key in entry.get("fieldsV1", {}).get("f:data", {})}
        for entry in live["metadata"]["managedFields"]
    }


def test_server_side_apply_adds_the_health_check_and_keeps_another_managers_keys(
    control_plane: ControlPlane, namespace: str
) -> None:
    control_plane.kubectl(
        "apply", "--server-side", "--field-manager=platform-team", "-f", "-", input=_settings(namespace)
    )
    ours = _health_configmap(control_plane, namespace)

    _apply_ours(control_plane, ours)

    data = _data(control_plane, namespace)
    assert {key: data.get(key) for key in SETTINGS} == SETTINGS
    assert data[HEALTH_KEY] == ours["data"][HEALTH_KEY]
    owned = _owned(control_plane, namespace)
    assert owned[FIELD_MANAGER] == {HEALTH_KEY} and owned["platform-team"] == set(SETTINGS)


def test_a_kubectl_edit_keeps_its_keys_too(control_plane: ControlPlane, namespace: str) -> None:
    control_plane.kubectl("create", "-f", "-", input=_settings(namespace))  # an Update, as kubectl edit's
    _apply_ours(control_plane, _health_configmap(control_plane, namespace))
    data = _data(control_plane, namespace)
    assert {key: data.get(key) for key in SETTINGS} == SETTINGS and HEALTH_KEY in data


def test_client_side_apply_would_remove_the_keys_of_the_last_client_side_apply(
    control_plane: ControlPlane, namespace: str
) -> None:
    control_plane.kubectl("apply", "-f", "-", input=_settings(namespace))

    _apply_ours(control_plane, _health_configmap(control_plane, namespace), server_side=False)

    data = _data(control_plane, namespace)
    assert HEALTH_KEY in data and not set(SETTINGS) & set(data)


def test_keys_a_client_side_apply_owns_go_to_the_first_server_side_manager(
    control_plane: ControlPlane, namespace: str
) -> None:
    """kubectl moves what its client-side apply owns to the manager of the first server-side apply:
    ours, if ours came first, which then drops the keys it does not hold. The settings' owner applies
    them server-side once first (the README's step), and they stay theirs."""
    control_plane.kubectl("apply", "-f", "-", input=_settings(namespace))
    _apply_ours(control_plane, _health_configmap(control_plane, namespace))
    assert not set(SETTINGS) & set(_data(control_plane, namespace))

    control_plane.kubectl("delete", "configmap", "argocd-cm", "-n", namespace)
    control_plane.kubectl("apply", "-f", "-", input=_settings(namespace))
    control_plane.kubectl(
        "apply", "--server-side", "--field-manager=platform-team", "-f", "-", input=_settings(namespace)
    )
    _apply_ours(control_plane, _health_configmap(control_plane, namespace))
    data = _data(control_plane, namespace)
    assert {key: data.get(key) for key in SETTINGS} == SETTINGS and HEALTH_KEY in data
