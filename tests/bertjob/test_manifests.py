"""manifests/ as `kubectl kustomize` builds it (`kubectl apply -k manifests/`, the install without Helm).

manifests/ is the chart's output with default values (tests/charts/test_generate.py holds it to
that); these tests read what a user applies.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from bertjob.monitoring import PORT_ENV as METRICS_PORT_ENV
from bertjob.render import kustomize_build
from bertjob_testing.jobs import REPO

KUBERNETES_VERSION = "1.33"
NAMESPACE = "bertjob-system"
OPERATOR = "bertjob-operator"

# Every (apiGroup, resource) the operator touches, with exactly the verbs it uses; test_rbac_e2e.py
# derives the same from the requests the operator makes against the emulator.
OPERATOR_RULES = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("", "events"): {"create"},
    ("bertjob.dev", "bertpretrainjobs"): {"get", "list", "watch", "patch"},
    ("bertjob.dev", "bertpretrainjobs/status"): {"patch"},
    ("bertjob.dev", "bertpretrainjobs/finalizers"): {"update"},
    ("", "configmaps"): {"create", "get"},
    ("authentication.k8s.io", "tokenreviews"): {"create"},
    ("batch", "jobs"): {"create", "get", "list", "watch", "patch"},
    ("kubeflow.org", "pytorchjobs"): {"create", "get", "list", "watch", "patch"},
    ("kubeflow.org", "mpijobs"): {"create", "get", "list", "watch", "patch"},
    ("trainer.kubeflow.org", "trainjobs"): {"create", "get", "list", "watch", "patch"},
    ("", "pods"): {"get", "list"},
    ("kopf.dev", "clusterkopfpeerings"): {"create", "list", "watch", "patch"},
}


def _build(directory: str) -> list[dict[str, Any]]:
    return [obj for obj in yaml.safe_load_all(kustomize_build(REPO / directory)) if obj]


Manifests = dict[tuple[str, str], dict[str, Any]]


@pytest.fixture(scope="module")
def built() -> list[dict[str, Any]]:
    return _build("manifests")


@pytest.fixture(scope="module")
def manifests(built: list[dict[str, Any]]) -> Manifests:
    """The objects by (kind, name), and each of the operator's by its kind alone."""
    found: Manifests = {(obj["kind"], obj["metadata"]["name"]): obj for obj in built}
    assert len(found) == len(built), "two objects of one kind and name"
    return found


def _operator(manifests: Manifests, kind: str) -> dict[str, Any]:
    return manifests[(kind, OPERATOR)]


def test_the_manifests_build_and_validate(manifests: Manifests) -> None:
    assert sorted(manifests) == [
        ("ClusterRole", "bertjob-edit"),
        ("ClusterRole", OPERATOR),
        ("ClusterRole", "bertjob-view"),
        ("ClusterRoleBinding", OPERATOR),
        ("CustomResourceDefinition", "bertpretrainjobs.bertjob.dev"),
        ("CustomResourceDefinition", "clusterkopfpeerings.kopf.dev"),
        ("Deployment", OPERATOR),
        ("Namespace", NAMESPACE),
        ("PodDisruptionBudget", OPERATOR),
        ("Role", f"{OPERATOR}-progress-tls"),
        ("RoleBinding", f"{OPERATOR}-progress-tls"),
        ("Service", f"{OPERATOR}-metrics"),
        ("Service", f"{OPERATOR}-progress"),
        ("ServiceAccount", OPERATOR),
    ]
    for obj in manifests.values():
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_every_namespaced_object_is_in_the_operators_namespace(built: list[dict[str, Any]]) -> None:
    cluster_scoped = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
    for obj in built:
        assert obj["metadata"].get("namespace") == (None if obj["kind"] in cluster_scoped else NAMESPACE), (
            obj["kind"]
        )


def test_the_cluster_role_grants_only_the_verbs_used(manifests: Manifests) -> None:
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in _operator(manifests, "ClusterRole")["rules"]:
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs"), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])

    assert granted == OPERATOR_RULES


def test_the_binding_gives_the_role_to_the_operators_account(manifests: Manifests) -> None:
    binding, account = _operator(manifests, "ClusterRoleBinding"), _operator(manifests, "ServiceAccount")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": _operator(manifests, "ClusterRole")["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]
    deployment = _operator(manifests, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert account["metadata"]["namespace"] == deployment["metadata"]["namespace"] == NAMESPACE


def test_the_operator_runs_locked_down(manifests: Manifests) -> None:
    deployment = _operator(manifests, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    labels = manifests[("Namespace", NAMESPACE)]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_operator_command_and_its_liveness_probe_agree(manifests: Manifests) -> None:
    [container] = _operator(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:2] == ["kopf", "run"]
    assert "--all-namespaces" in command and "--standalone" not in command  # peering: bertjob.replicas
    assert command[command.index("-m") + 1] == "bertjob.handlers"
    [liveness] = [arg.removeprefix("--liveness=") for arg in command if arg.startswith("--liveness=")]
    probe = container["livenessProbe"]["httpGet"]
    [port] = [port["containerPort"] for port in container["ports"] if port["name"] == probe["port"]]
    assert liveness == f"http://0.0.0.0:{port}{probe['path']}"


def test_the_metrics_port_serves_the_readiness_probe(manifests: Manifests) -> None:
    pod = _operator(manifests, "Deployment")["spec"]["template"]
    [container] = pod["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    [port] = [port["containerPort"] for port in container["ports"] if port["name"] == "metrics"]
    assert env[METRICS_PORT_ENV] == str(port)
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    annotations = pod["metadata"]["annotations"]
    assert (annotations["prometheus.io/port"], annotations["prometheus.io/path"]) == (str(port), "/metrics")


def test_the_metrics_service_selects_the_operator_pod_on_the_metrics_port(manifests: Manifests) -> None:
    service, deployment = manifests[("Service", f"{OPERATOR}-metrics")], _operator(manifests, "Deployment")
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    [port] = service["spec"]["ports"]
    [container] = pod["spec"]["containers"]
    [target] = [p["containerPort"] for p in container["ports"] if p["name"] == port["targetPort"]]
    assert (port["name"], port["port"], str(target)) == (
        "metrics",
        target,
        pod["metadata"]["annotations"]["prometheus.io/port"],
    )
