"""Each value of the chart, one at a time: changing it changes what it should, and nothing else.

A case renders the chart twice, with ``base`` and with ``base`` plus ``change``, and compares every
leaf of every object: each difference must lie under one of the paths the case expects (an object
appearing or disappearing is the path ""; kind and name "*" stand for any), and each expected path
must see one; a case that renames objects computes its paths from what ``base`` rendered. ``read`` then
reads what the change rendered. Each case runs twice: over the defaults, and with every optional
object switched on (ServiceMonitor, PodDisruptionBudget, NetworkPolicy), so that a value leaking
into an object the defaults leave out is seen too.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from bertjob.monitoring import PORT_ENV
from bertjob_api.contract import MPI_RUNTIME, TORCH_RUNTIME
from tests.helm_chart import (
    NAMESPACE,
    RELEASE,
    by_key,
    chart_metadata,
    default_values,
    leaves,
    merged,
    one,
    operator_container,
    settings,
    values_schema,
)

Render = Callable[..., list[dict[str, Any]]]
Objects = list[dict[str, Any]]

OPERATOR = f"{RELEASE}-operator"
POD = "spec.template.spec"
CONTAINER = f"{POD}.containers[0]"
DIGEST = "sha256:" + "ab" * 32
APP_VERSION = chart_metadata()["appVersion"]


@dataclass(frozen=True)
class Case:
    """One value changed: the (kind, name, path) of each difference expected, and what ``read``
    must find in the objects rendered with the change."""

    id: str
    change: dict[str, Any]
    changes: set[tuple[str, str, str]] | Callable[[Objects], set[tuple[str, str, str]]]
    read: Callable[[Objects], Any]
    expected: Any
    base: dict[str, Any] = field(default_factory=dict)


def _image(objects: Objects) -> str:
    return str(operator_container(objects)["image"])


def _runtime_images(objects: Objects) -> list[str]:
    return sorted(
        {
            container["image"]
            for obj in objects
            if obj["kind"] == "ClusterTrainingRuntime"
            for job in obj["spec"]["template"]["spec"]["replicatedJobs"]
            for container in job["template"]["spec"]["template"]["spec"]["containers"]
        }
    )


def _pod(objects: Objects) -> dict[str, Any]:
    return dict(one(objects, "Deployment")["spec"]["template"]["spec"])


def _pod_metadata(objects: Objects) -> dict[str, Any]:
    return dict(one(objects, "Deployment")["spec"]["template"]["metadata"])


def _added_to_command(objects: Objects) -> list[str]:
    default = ["kopf", "run", "--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz"]
    return [arg for arg in operator_container(objects)["command"][:-2] if arg not in default]


def _kinds(objects: Objects) -> list[tuple[str, str]]:
    return sorted((obj["kind"], obj["metadata"]["name"]) for obj in objects)


def _account(objects: Objects) -> tuple[str, list[str]]:
    subjects = [subject["name"] for subject in one(objects, "ClusterRoleBinding")["subjects"]]
    return _pod(objects)["serviceAccountName"], subjects


# Objects whose names the operator relies on: no name value changes them.
FIXED_NAMES = {"CustomResourceDefinition", "ClusterTrainingRuntime"}
NAME_LABEL = "app.kubernetes.io/name"


def _renamed(prefix: str, label_changes: bool) -> Callable[[Objects], set[tuple[str, str, str]]]:
    """Every object but those of FIXED_NAMES appears under ``prefix`` in place of the release's
    prefix (and disappears under the old name); with ``label_changes``, the name label changes on
    the objects that keep their names."""

    def changes(before: Objects) -> set[tuple[str, str, str]]:
        found: set[tuple[str, str, str]] = set()
        for obj in before:
            kind, name = obj["kind"], obj["metadata"]["name"]
            if kind in FIXED_NAMES:
                if label_changes:
                    found.add((kind, name, f"metadata.labels.{NAME_LABEL}"))
                continue
            assert name.startswith(f"{RELEASE}-"), name
            found |= {(kind, name, ""), (kind, prefix + name.removeprefix(RELEASE), "")}
        return found

    return changes


def _prefixed(prefix: str) -> Callable[[Objects], tuple[list[str], str, list[str]]]:
    """The names lacking ``prefix`` (those of FIXED_NAMES aside), the Deployment's name, and the
    name labels of all objects."""

    def read(objects: Objects) -> tuple[list[str], str, list[str]]:
        names = [obj["metadata"]["name"] for obj in objects if obj["kind"] not in FIXED_NAMES]
        return (
            [name for name in names if not name.startswith(f"{prefix}-")],
            one(objects, "Deployment")["metadata"]["name"],
            sorted({obj["metadata"]["labels"][NAME_LABEL] for obj in objects}),
        )

    return read


def _common_label(objects: Objects) -> tuple[list[str | None], str]:
    return (
        sorted({obj["metadata"]["labels"].get("team") for obj in objects}, key=str),
        _pod_metadata(objects)["labels"]["team"],
    )


CA_VOLUME = {"name": "corporate-ca", "configMap": {"name": "corporate-ca"}}
CA_MOUNT = {"name": "corporate-ca", "mountPath": "/etc/ssl/corporate", "readOnly": True}

TOLERATIONS = [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}]
AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ops"]}]}
            ]
        }
    }
}
EGRESS = [{"to": [{"ipBlock": {"cidr": "10.0.0.10/32"}}], "ports": [{"port": 6443, "protocol": "TCP"}]}]
ENV = [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
IMAGE = ("Deployment", OPERATOR, f"{CONTAINER}.image")
SERVICE_MONITOR = {"metrics": {"serviceMonitor": {"enabled": True}}}
# The webhook's certificate from cert-manager: the chart's own would differ on every render.
WEBHOOK = {"webhook": {"enabled": True, "certManager": {"enabled": True}}}
WEBHOOK_NAME = f"{OPERATOR}-webhook"
WEBHOOK_SERVICE = f"{OPERATOR}-webhook"
# The progress endpoint's Service, and the Role and RoleBinding for its certificate's Secret.
PROGRESS_SERVICE = f"{OPERATOR}-progress"
PROGRESS_TLS = f"{OPERATOR}-progress-tls"
PROGRESS_ENV = ["BERTJOB_PROGRESS_URL", "BERTJOB_PROGRESS_SECRET", "BERTJOB_PROGRESS_PORT"]
# A pod of a ClusterTrainingRuntime's replicated job {0}.
RUNTIME_POD = "spec.template.spec.replicatedJobs[{0}].template.spec.template.spec"
# Where the ClusterTrainingRuntimes name their image.
RUNTIME_IMAGES = {
    ("ClusterTrainingRuntime", TORCH_RUNTIME, f"{RUNTIME_POD.format(0)}.containers[0].image"),
    ("ClusterTrainingRuntime", MPI_RUNTIME, f"{RUNTIME_POD.format(0)}.containers[0].image"),
    ("ClusterTrainingRuntime", MPI_RUNTIME, f"{RUNTIME_POD.format(1)}.containers[0].image"),
}

CASES = [
    # An umbrella chart's globals reach every subchart: the registry replaces that of every image
    # the chart names (the runtimes' too, with trainingRuntimes.install on).
    Case(
        "global.imageRegistry",
        {"global": {"imageRegistry": "mirror.example.com:5000"}},
        {IMAGE, *RUNTIME_IMAGES},
        lambda o: (_image(o), _runtime_images(o)),
        (
            f"mirror.example.com:5000/bertjob/operator:{APP_VERSION}",
            ["mirror.example.com:5000/bertjob/trainer:0.1.0-xeon"],
        ),
        base={"trainingRuntimes": {"install": True}},
    ),
    # A runtime image without a registry (Docker Hub's short form) gets the global one in front.
    Case(
        "global.imageRegistry-over-a-short-name",
        {"global": {"imageRegistry": "mirror.example.com"}},
        {IMAGE, *RUNTIME_IMAGES},
        _runtime_images,
        ["mirror.example.com/bertjob/trainer:1.2.3"],
        base={"trainingRuntimes": {"install": True, "image": "bertjob/trainer:1.2.3"}},
    ),
    Case(
        "global.imagePullSecrets",
        {"global": {"imagePullSecrets": ["mirror"]}},
        {("Deployment", OPERATOR, f"{POD}.imagePullSecrets")},
        lambda o: _pod(o)["imagePullSecrets"],
        [{"name": "mirror"}, {"name": "one"}],
        base={"imagePullSecrets": ["one", "mirror"]},
    ),
    # The release is "bertjob": a name it does not contain is added to the prefix.
    Case(
        "nameOverride",
        {"nameOverride": "pretrain"},
        _renamed(f"{RELEASE}-pretrain", label_changes=True),
        _prefixed(f"{RELEASE}-pretrain"),
        ([], f"{RELEASE}-pretrain-operator", ["pretrain"]),
    ),
    Case(
        "fullnameOverride",
        {"fullnameOverride": "ml-bertjob"},
        _renamed("ml-bertjob", label_changes=False),
        _prefixed("ml-bertjob"),
        ([], "ml-bertjob-operator", ["bertjob"]),
    ),
    Case(
        "commonLabels",
        {"commonLabels": {"team": "nlp"}},
        {("*", "*", "metadata.labels.team"), ("Deployment", OPERATOR, "spec.template.metadata.labels.team")},
        _common_label,
        (["nlp"], "nlp"),
    ),
    Case(
        "podSecurityContext",
        {"podSecurityContext": {"runAsUser": None, "runAsGroup": None}},
        {
            ("Deployment", OPERATOR, f"{POD}.securityContext.runAsUser"),
            ("Deployment", OPERATOR, f"{POD}.securityContext.runAsGroup"),
        },
        lambda o: _pod(o)["securityContext"],
        {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    ),
    Case(
        "podSecurityContext-fsGroup",
        {"podSecurityContext": {"fsGroup": 10001}},
        {("Deployment", OPERATOR, f"{POD}.securityContext.fsGroup")},
        lambda o: _pod(o)["securityContext"]["fsGroup"],
        10001,
    ),
    Case(
        "securityContext",
        {"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}},
        {("Deployment", OPERATOR, f"{CONTAINER}.securityContext.seccompProfile.type")},
        lambda o: operator_container(o)["securityContext"],
        merged(default_values()["securityContext"], {"seccompProfile": {"type": "RuntimeDefault"}}),
    ),
    Case(
        "extraArgs",
        {"extraArgs": ["--log-format=json", "--log-refkey=job"]},
        {("Deployment", OPERATOR, f"{CONTAINER}.command")},
        _added_to_command,
        ["--log-format=json", "--log-refkey=job"],
    ),
    Case(
        "extraVolumes",
        {"extraVolumes": [CA_VOLUME]},
        {("Deployment", OPERATOR, f"{POD}.volumes[1]")},
        lambda o: _pod(o)["volumes"][1:],
        [CA_VOLUME],
    ),
    Case(
        "extraVolumeMounts",
        {"extraVolumeMounts": [CA_MOUNT]},
        {("Deployment", OPERATOR, f"{CONTAINER}.volumeMounts[1]")},
        lambda o: operator_container(o)["volumeMounts"][1:],
        [CA_MOUNT],
        base={"extraVolumes": [CA_VOLUME]},
    ),
    Case(
        "image.registry",
        {"image": {"registry": "registry.example.com:5000"}},
        {IMAGE},
        _image,
        f"registry.example.com:5000/bertjob/operator:{APP_VERSION}",
    ),
    Case(
        "image.registry-empty",
        {"image": {"registry": ""}},
        {IMAGE},
        _image,
        f"bertjob/operator:{APP_VERSION}",
    ),
    Case(
        "image.repository",
        {"image": {"repository": "mirror/operator"}},
        {IMAGE},
        _image,
        f"ghcr.io/mirror/operator:{APP_VERSION}",
    ),
    Case("image.tag", {"image": {"tag": "1.2.3"}}, {IMAGE}, _image, "ghcr.io/bertjob/operator:1.2.3"),
    Case(
        "image.digest",
        {"image": {"digest": DIGEST}},
        {IMAGE},
        _image,
        f"ghcr.io/bertjob/operator@{DIGEST}",
        base={"image": {"tag": "1.2.3"}},
    ),
    Case(
        "image.pullPolicy",
        {"image": {"pullPolicy": "Always"}},
        {("Deployment", OPERATOR, f"{CONTAINER}.imagePullPolicy")},
        lambda o: operator_container(o)["imagePullPolicy"],
        "Always",
    ),
    Case(
        "imagePullSecrets",
        {"imagePullSecrets": ["one", "two"]},
        {("Deployment", OPERATOR, f"{POD}.imagePullSecrets")},
        lambda o: _pod(o)["imagePullSecrets"],
        [{"name": "one"}, {"name": "two"}],
    ),
    Case(
        "crds.install",
        {"crds": {"install": False}},
        {("CustomResourceDefinition", "bertpretrainjobs.bertjob.dev", "")},
        lambda o: [obj["metadata"]["name"] for obj in o if obj["kind"] == "CustomResourceDefinition"],
        ["clusterkopfpeerings.kopf.dev"],
    ),
    Case(
        "crds.keep",
        {"crds": {"keep": False}},
        {("CustomResourceDefinition", "bertpretrainjobs.bertjob.dev", "metadata.annotations")},
        lambda o: one(o, "CustomResourceDefinition", "bertpretrainjobs.bertjob.dev")["metadata"].get(
            "annotations"
        ),
        None,
    ),
    # Two replicas by default (one reconciles); one, with the budget that would block drains off.
    Case(
        "replicaCount",
        {"replicaCount": 3},
        {("Deployment", OPERATOR, "spec.replicas")},
        lambda o: one(o, "Deployment")["spec"]["replicas"],
        3,
    ),
    # Another kopf-based operator's release installed it: this one uses it as it is.
    Case(
        "peering.installCRD",
        {"peering": {"installCRD": False}},
        {("CustomResourceDefinition", "clusterkopfpeerings.kopf.dev", "")},
        lambda o: [obj["metadata"]["name"] for obj in o if obj["kind"] == "CustomResourceDefinition"],
        ["bertpretrainjobs.bertjob.dev"],
    ),
    Case(
        "serviceAccount.create",
        {"serviceAccount": {"create": False, "name": "existing"}},
        {
            ("ServiceAccount", OPERATOR, ""),
            ("ClusterRoleBinding", OPERATOR, "subjects[0].name"),
            ("RoleBinding", PROGRESS_TLS, "subjects[0].name"),
            ("Deployment", OPERATOR, f"{POD}.serviceAccountName"),
        },
        _account,
        ("existing", ["existing"]),
    ),
    Case(
        "serviceAccount.name",
        {"serviceAccount": {"name": "custom"}},
        {
            ("ServiceAccount", OPERATOR, ""),
            ("ServiceAccount", "custom", ""),
            ("ClusterRoleBinding", OPERATOR, "subjects[0].name"),
            ("RoleBinding", PROGRESS_TLS, "subjects[0].name"),
            ("Deployment", OPERATOR, f"{POD}.serviceAccountName"),
        },
        _account,
        ("custom", ["custom"]),
    ),
    Case(
        "serviceAccount.annotations",
        {"serviceAccount": {"annotations": {"iam.gke.io/gcp-service-account": "ops@example.iam"}}},
        {("ServiceAccount", OPERATOR, "metadata.annotations")},
        lambda o: one(o, "ServiceAccount")["metadata"]["annotations"],
        {"iam.gke.io/gcp-service-account": "ops@example.iam"},
    ),
    Case(
        "rbac.create",
        {"rbac": {"create": False}},
        {
            ("ClusterRole", OPERATOR, ""),
            ("ClusterRoleBinding", OPERATOR, ""),
            ("ClusterRole", f"{RELEASE}-view", ""),
            ("ClusterRole", f"{RELEASE}-edit", ""),
            ("Role", PROGRESS_TLS, ""),
            ("RoleBinding", PROGRESS_TLS, ""),
        },
        lambda o: [obj for obj in o if obj["apiVersion"].startswith("rbac.")],
        [],
    ),
    Case(
        "rbac.aggregateToDefaultRoles",
        {"rbac": {"aggregateToDefaultRoles": False}},
        {("ClusterRole", f"{RELEASE}-view", ""), ("ClusterRole", f"{RELEASE}-edit", "")},
        lambda o: [obj["metadata"]["name"] for obj in o if obj["kind"] == "ClusterRole"],
        [OPERATOR],
    ),
    Case(
        "watchNamespaces",
        {"watchNamespaces": ["a", "b"]},
        {
            ("Deployment", OPERATOR, f"{CONTAINER}.command"),
            ("ClusterRole", OPERATOR, "rules"),
            ("Role", OPERATOR, ""),
            ("RoleBinding", OPERATOR, ""),
        },
        lambda o: (
            _added_to_command(o),
            sorted(
                (obj["kind"], obj["metadata"]["namespace"])
                for obj in o
                if obj["kind"].startswith("Role") and obj["metadata"]["name"] == OPERATOR
            ),
        ),
        (
            ["--namespace=a", "--namespace=b"],
            [("Role", "a"), ("Role", "b"), ("RoleBinding", "a"), ("RoleBinding", "b")],
        ),
    ),
    # Off: no endpoint, its Service, its certificate's Role, its rules and variables go.
    Case(
        "progress.enabled",
        {"progress": {"enabled": False}},
        {
            ("Service", PROGRESS_SERVICE, ""),
            ("Role", PROGRESS_TLS, ""),
            ("RoleBinding", PROGRESS_TLS, ""),
            ("ClusterRole", OPERATOR, "rules"),
            ("Deployment", OPERATOR, f"{CONTAINER}.env"),
            ("Deployment", OPERATOR, f"{CONTAINER}.ports"),
            ("NetworkPolicy", OPERATOR, "spec.ingress"),
        },
        lambda o: [var["name"] for var in operator_container(o)["env"] if var["name"] in PROGRESS_ENV],
        [],
        base={"networkPolicy": {"enabled": True}},
    ),
    Case(
        "progress.port",
        {"progress": {"port": 10444}},
        {
            ("Service", PROGRESS_SERVICE, "spec.ports[0].port"),
            ("Deployment", OPERATOR, f"{CONTAINER}.env"),
            ("Deployment", OPERATOR, f"{CONTAINER}.ports"),
        },
        lambda o: (
            [e["value"] for e in operator_container(o)["env"] if e["name"] in PROGRESS_ENV],
            [p["containerPort"] for p in operator_container(o)["ports"] if p["name"] == "progress"],
        ),
        (
            [
                f"https://{PROGRESS_SERVICE}.{NAMESPACE}.svc:10444",
                f"{NAMESPACE}/{PROGRESS_TLS}",
                "10444",
            ],
            [10444],
        ),
    ),
    Case(
        "logLevel",
        {"logLevel": "warning"},
        {("Deployment", OPERATOR, f"{CONTAINER}.command")},
        _added_to_command,
        ["--quiet"],
    ),
    Case(
        "logLevel-debug",
        {"logLevel": "debug"},
        {("Deployment", OPERATOR, f"{CONTAINER}.command")},
        _added_to_command,
        ["--verbose"],
    ),
    Case(
        "resources",
        {"resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}}},
        {("Deployment", OPERATOR, f"{CONTAINER}.resources")},
        lambda o: operator_container(o)["resources"],
        # Helm merges maps: the request for memory stays the default's.
        merged(default_values()["resources"], {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}}),
    ),
    Case(
        "nodeSelector",
        {"nodeSelector": {"kubernetes.io/os": "linux"}},
        {("Deployment", OPERATOR, f"{POD}.nodeSelector")},
        lambda o: _pod(o)["nodeSelector"],
        {"kubernetes.io/os": "linux"},
    ),
    Case(
        "tolerations",
        {"tolerations": TOLERATIONS},
        {("Deployment", OPERATOR, f"{POD}.tolerations")},
        lambda o: _pod(o)["tolerations"],
        TOLERATIONS,
    ),
    Case(
        "affinity",
        {"affinity": AFFINITY},
        {("Deployment", OPERATOR, f"{POD}.affinity")},
        lambda o: _pod(o)["affinity"],
        AFFINITY,
    ),
    Case(
        "priorityClassName",
        {"priorityClassName": "ops-critical"},
        {("Deployment", OPERATOR, f"{POD}.priorityClassName")},
        lambda o: _pod(o)["priorityClassName"],
        "ops-critical",
    ),
    Case(
        "podLabels",
        {"podLabels": {"team": "nlp"}},
        {("Deployment", OPERATOR, "spec.template.metadata.labels.team")},
        lambda o: _pod_metadata(o)["labels"]["team"],
        "nlp",
    ),
    Case(
        "podAnnotations",
        {"podAnnotations": {"example.com/owner": "ops"}},
        {("Deployment", OPERATOR, "spec.template.metadata.annotations.example.com/owner")},
        lambda o: _pod_metadata(o)["annotations"]["example.com/owner"],
        "ops",
    ),
    Case(
        "extraEnv",
        {"extraEnv": ENV},
        {("Deployment", OPERATOR, f"{CONTAINER}.env[6]")},
        lambda o: [var.get("name") for var in operator_container(o)["env"]],
        [PORT_ENV, "BERTJOB_PEERING", "POD_ID", *PROGRESS_ENV, "NODE_NAME"],
    ),
    Case(
        "metrics.serviceMonitor.enabled",
        SERVICE_MONITOR,
        {("ServiceMonitor", OPERATOR, "")},
        lambda o: [(obj["kind"], obj["metadata"]["name"]) for obj in o if obj["kind"] == "ServiceMonitor"],
        [("ServiceMonitor", OPERATOR)],
    ),
    Case(
        "metrics.serviceMonitor.interval",
        {"metrics": {"serviceMonitor": {"interval": "1m"}}},
        {("ServiceMonitor", OPERATOR, "spec.endpoints[0].interval")},
        lambda o: one(o, "ServiceMonitor")["spec"]["endpoints"][0]["interval"],
        "1m",
        base=SERVICE_MONITOR,
    ),
    Case(
        "metrics.serviceMonitor.labels",
        {"metrics": {"serviceMonitor": {"labels": {"release": "prometheus"}}}},
        {("ServiceMonitor", OPERATOR, "metadata.labels.release")},
        lambda o: one(o, "ServiceMonitor")["metadata"]["labels"]["release"],
        "prometheus",
        base=SERVICE_MONITOR,
    ),
    Case(
        "podDisruptionBudget.enabled",
        {"podDisruptionBudget": {"enabled": False}},
        {("PodDisruptionBudget", OPERATOR, "")},
        lambda o: [obj for obj in o if obj["kind"] == "PodDisruptionBudget"],
        [],
    ),
    Case(
        "podDisruptionBudget.minAvailable",
        {"podDisruptionBudget": {"minAvailable": "100%"}},
        {("PodDisruptionBudget", OPERATOR, "spec.minAvailable")},
        lambda o: one(o, "PodDisruptionBudget")["spec"]["minAvailable"],
        "100%",
        base={"podDisruptionBudget": {"enabled": True}},
    ),
    Case(
        "networkPolicy.enabled",
        {"networkPolicy": {"enabled": True}},
        {("NetworkPolicy", OPERATOR, "")},
        lambda o: one(o, "NetworkPolicy")["spec"]["egress"],
        [{}],
    ),
    Case(
        "networkPolicy.egress",
        {"networkPolicy": {"egress": EGRESS}},
        {("NetworkPolicy", OPERATOR, "spec.egress")},
        lambda o: one(o, "NetworkPolicy")["spec"]["egress"],
        EGRESS,
        base={"networkPolicy": {"enabled": True}},
    ),
    Case(
        "webhook.enabled",
        {"webhook": {"enabled": True}},
        {
            ("Issuer", WEBHOOK_NAME, ""),
            ("Certificate", WEBHOOK_NAME, ""),
            ("Service", WEBHOOK_SERVICE, ""),
            ("ValidatingWebhookConfiguration", OPERATOR, ""),
            ("Deployment", OPERATOR, f"{CONTAINER}.env"),
            ("Deployment", OPERATOR, f"{CONTAINER}.ports"),
            ("Deployment", OPERATOR, f"{CONTAINER}.volumeMounts"),
            ("Deployment", OPERATOR, f"{POD}.volumes"),
            ("NetworkPolicy", OPERATOR, "spec.ingress[0].ports"),
        },
        lambda o: one(o, "ValidatingWebhookConfiguration")["webhooks"][0]["clientConfig"]["service"]["path"],
        "/validate-bertpretrainjob",
        base={"webhook": {"certManager": {"enabled": True}}, "networkPolicy": {"enabled": True}},
    ),
    Case(
        "webhook.port",
        {"webhook": {"port": 10443}},
        {("Deployment", OPERATOR, f"{CONTAINER}.env"), ("Deployment", OPERATOR, f"{CONTAINER}.ports")},
        lambda o: (
            [e["value"] for e in operator_container(o)["env"] if e["name"] == "BERTJOB_WEBHOOK_PORT"],
            [p["containerPort"] for p in operator_container(o)["ports"] if p["name"] == "webhook"],
        ),
        (["10443"], [10443]),
        base=WEBHOOK,
    ),
    Case(
        "webhook.failurePolicy",
        {"webhook": {"failurePolicy": "Ignore"}},
        {("ValidatingWebhookConfiguration", OPERATOR, "webhooks[0].failurePolicy")},
        lambda o: one(o, "ValidatingWebhookConfiguration")["webhooks"][0]["failurePolicy"],
        "Ignore",
        base=WEBHOOK,
    ),
    Case(
        "webhook.certManager.enabled",
        {"webhook": {"certManager": {"enabled": True}}},
        {
            ("Secret", f"{OPERATOR}-webhook-tls", ""),
            ("Issuer", WEBHOOK_NAME, ""),
            ("Certificate", WEBHOOK_NAME, ""),
            ("ValidatingWebhookConfiguration", OPERATOR, "webhooks[0].clientConfig.caBundle"),
            ("ValidatingWebhookConfiguration", OPERATOR, "metadata.annotations"),
        },
        lambda o: sorted(obj["kind"] for obj in o if obj["kind"] in ("Secret", "Issuer", "Certificate")),
        ["Certificate", "Issuer"],
        base={"webhook": {"enabled": True}},
    ),
    Case(
        "trainingRuntimes.install",
        {"trainingRuntimes": {"install": True}},
        {("ClusterTrainingRuntime", TORCH_RUNTIME, ""), ("ClusterTrainingRuntime", MPI_RUNTIME, "")},
        lambda o: sorted(obj["metadata"]["name"] for obj in o if obj["kind"] == "ClusterTrainingRuntime"),
        sorted([TORCH_RUNTIME, MPI_RUNTIME]),
    ),
    Case(
        "trainingRuntimes.image",
        {"trainingRuntimes": {"image": "registry.example.com/mirror/trainer:1.2.3"}},
        RUNTIME_IMAGES,
        _runtime_images,
        ["registry.example.com/mirror/trainer:1.2.3"],
        base={"trainingRuntimes": {"install": True}},
    ),
]


def _flat(objects: Objects) -> dict[tuple[str, str, str | None], dict[str, Any]]:
    return {
        (kind, name, namespace): dict(leaves(obj)) for (kind, namespace, name), obj in by_key(objects).items()
    }


def _under(path: str, prefix: str) -> bool:
    return prefix == "" or path == prefix or path.startswith((f"{prefix}.", f"{prefix}["))


def differences(before: Objects, after: Objects) -> set[tuple[str, str, str]]:
    """(kind, name, path) of every leaf that differs; path "" for an object only one side has."""
    old, new = _flat(before), _flat(after)
    found: set[tuple[str, str, str]] = set()
    for key in old.keys() | new.keys():
        kind, name, _ = key
        if key not in old or key not in new:
            found.add((kind, name, ""))
            continue
        for path in old[key].keys() | new[key].keys():
            if old[key].get(path, KeyError) != new[key].get(path, KeyError):
                found.add((kind, name, path))
    return found


@pytest.fixture(scope="module")
def rendered(render: Render) -> Callable[[dict[str, Any]], Objects]:
    cache: dict[str, Objects] = {}

    def get(values: dict[str, Any]) -> Objects:
        key = json.dumps(values, sort_keys=True)
        if key not in cache:
            cache[key] = render(values)
        return cache[key]

    return get


EVERYTHING_ON = {
    "metrics": {"serviceMonitor": {"enabled": True}},
    "podDisruptionBudget": {"enabled": True},
    "networkPolicy": {"enabled": True},
}


def _everything_on_but(change: dict[str, Any]) -> dict[str, Any]:
    # The settings the case changes keep their defaults, so that switching one on still changes it.
    values = copy.deepcopy(EVERYTHING_ON)
    defaults = default_values()
    for key, _, _ in settings(change, values_schema()):
        *parents, last = key.split(".")
        node, default = values, defaults
        for part in parents:
            node, default = node.setdefault(part, {}), default[part]
        node[last] = default[last]
    return values


@pytest.mark.parametrize("everything_on", [False, True], ids=["over-defaults", "everything-on"])
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_value_changes_what_it_should_and_only_that(
    rendered: Callable[[dict[str, Any]], Objects], case: Case, everything_on: bool
) -> None:
    base = merged(_everything_on_but(case.change), case.base) if everything_on else case.base
    before = rendered(base)
    after = rendered(merged(base, case.change))

    found = differences(before, after)
    expected = case.changes(before) if callable(case.changes) else case.changes

    def matches(kind: str, name: str, path: str, pattern: tuple[str, str, str]) -> bool:
        k, n, prefix = pattern
        return k in ("*", kind) and n in ("*", name) and _under(path, prefix)

    unexpected = {change for change in found if not any(matches(*change, pattern) for pattern in expected)}
    missing = {pattern for pattern in expected if not any(matches(*change, pattern) for change in found)}
    assert (unexpected, missing) == (set(), set())
    assert case.read(after) == case.expected


def test_every_value_has_a_case() -> None:
    schema = values_schema()
    changed = {key for case in CASES for key, _, _ in settings(case.change, schema)}
    every = {key for key, _, _ in settings(default_values(), schema)}
    assert sorted(every - changed) == []
