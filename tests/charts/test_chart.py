"""charts/bertjob through the real helm: lint, what each values file renders, and the schema."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from bertjob.monitoring import PORT_ENV
from bertjob_api.contract import MPI_RUNTIME, TORCH_RUNTIME
from bertjob_api.crd import chart_template, crd
from bertjob_testing.cluster.build import upstream_crd
from bertjob_testing.cluster.catalog import versions
from bertjob_testing.jobs import REPO
from tests.charts.test_webhook_chart import CERT_MANAGER_SCHEMAS
from tests.helm_chart import (
    BAD_VALUES,
    CHART,
    CI_VALUES,
    KUBERNETES_VERSION,
    NAMESPACE,
    RELEASE,
    chart_metadata,
    default_values,
    merged,
    one,
    operator_container,
    schema_type,
    settings,
    values_schema,
)
from tests.k8s_schema import assert_valid, load_crd_schema

Helm = Callable[..., subprocess.CompletedProcess[str]]
Render = Callable[..., list[dict[str, Any]]]

CLUSTER_TRAINING_RUNTIMES = "trainer.kubeflow.org_clustertrainingruntimes.yaml"
VALUES_FILES = [None, *CI_VALUES]
VALUES_IDS = ["defaults", *(path.name.removesuffix("-values.yaml") for path in CI_VALUES)]

# The Prometheus Operator's Duration.
DURATION = "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
# What the Prometheus Operator's CRD requires of a ServiceMonitor, and the fields this chart sets
# (monitoring.coreos.com/v1); unknown fields fail, as under strict field validation.
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"type": "string", "enum": ["monitoring.coreos.com/v1"]},
        "kind": {"type": "string", "enum": ["ServiceMonitor"]},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["selector"],
            "properties": {
                "selector": {
                    "type": "object",
                    "properties": {
                        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}
                    },
                },
                "namespaceSelector": {
                    "type": "object",
                    "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}},
                },
                "endpoints": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "interval": {
                                "type": "string",
                                "pattern": DURATION,
                            },
                        },
                    },
                },
            },
        },
    },
}


def _files(path: Path | None) -> list[Path]:
    return [] if path is None else [path]


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=VALUES_IDS)
def test_helm_lint_strict_passes(helm: Helm, values_file: Path | None) -> None:
    result = helm("lint", "--strict", str(CHART), *(f"--values={path}" for path in _files(values_file)))
    assert result.returncode == 0, result.stdout + result.stderr


def _kinds(objects: list[dict[str, Any]]) -> set[str]:
    return {obj["kind"] for obj in objects}


def _pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(one(objects, "Deployment")["spec"]["template"]["spec"])


# What each file in charts/bertjob/ci/ is for, read from what it renders.
CI_INTENT: dict[str, Callable[[list[dict[str, Any]]], bool]] = {
    "namespaced": lambda o: (
        {"Role", "RoleBinding"} <= _kinds(o) and "--all-namespaces" not in operator_container(o)["command"]
    ),
    "servicemonitor": lambda o: "ServiceMonitor" in _kinds(o),
    "digest": lambda o: (
        "@sha256:" in operator_container(o)["image"] and bool(_pod_spec(o)["imagePullSecrets"])
    ),
    "ha": lambda o: (
        "PodDisruptionBudget" in _kinds(o)
        and bool(_pod_spec(o)["priorityClassName"])
        and bool(_pod_spec(o)["affinity"])
    ),
    "locked-down": lambda o: one(o, "NetworkPolicy")["spec"]["egress"] != [{}],
    "no-rbac": lambda o: not {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} & _kinds(o),
    "existing-serviceaccount": lambda o: (
        "ServiceAccount" not in _kinds(o) and _pod_spec(o)["serviceAccountName"] != f"{RELEASE}-operator"
    ),
    "webhook": lambda o: (
        one(o, "Secret")["type"] == "kubernetes.io/tls"
        and one(o, "ValidatingWebhookConfiguration")["webhooks"][0]["failurePolicy"] == "Ignore"
        and "webhook" in [port["port"] for port in one(o, "NetworkPolicy")["spec"]["ingress"][0]["ports"]]
    ),
    "webhook-cert-manager": lambda o: (
        {"Issuer", "Certificate"} <= _kinds(o)
        and "Secret" not in _kinds(o)
        and "namespaceSelector" in one(o, "ValidatingWebhookConfiguration")["webhooks"][0]
    ),
    # The pod's user and group are OpenShift's to assign; the rest of the lock-down stays.
    "openshift": lambda o: (
        _pod_spec(o)["securityContext"]
        == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        and operator_container(o)["securityContext"]["readOnlyRootFilesystem"] is True
    ),
    # Every name and label the platform's, the CA bundle mounted, kopf's logs as JSON.
    "platform": lambda o: (
        all(
            obj["metadata"]["name"].startswith("ml-bertjob-")
            for obj in o
            if obj["kind"] != "CustomResourceDefinition"
        )
        and {obj["metadata"]["labels"].get("team") for obj in o} == {"nlp"}
        and {obj["metadata"]["labels"]["app.kubernetes.io/name"] for obj in o} == {"bert"}
        and [m["name"] for m in operator_container(o)["volumeMounts"]] == ["tmp", "corporate-ca"]
        and "--log-format=json" in operator_container(o)["command"]
    ),
    # Without helm seeing Trainer v2's CRD (no --api-versions here), so only because install is true.
    "trainingruntimes": lambda o: (
        sorted(obj["metadata"]["name"] for obj in o if obj["kind"] == "ClusterTrainingRuntime")
        == sorted([TORCH_RUNTIME, MPI_RUNTIME])
    ),
}


def test_every_ci_values_file_has_a_purpose() -> None:
    assert sorted(VALUES_IDS[1:]) == sorted(CI_INTENT)


@pytest.mark.parametrize("name", sorted(CI_INTENT))
def test_a_ci_values_file_renders_what_it_is_for(render: Render, name: str) -> None:
    assert CI_INTENT[name](render(files=[CHART / "ci" / f"{name}-values.yaml"]))


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=VALUES_IDS)
def test_every_rendered_object_validates(render: Render, values_file: Path | None) -> None:
    objects = render(files=_files(values_file))
    assert objects
    for obj in objects:
        if obj["kind"] == "ServiceMonitor":
            assert_valid(obj, SERVICE_MONITOR_SCHEMA)
        elif obj["kind"] in CERT_MANAGER_SCHEMAS:
            assert_valid(obj, CERT_MANAGER_SCHEMAS[obj["kind"]])
        elif obj["kind"] == "ClusterTrainingRuntime":
            assert_valid(obj, load_crd_schema(upstream_crd(CLUSTER_TRAINING_RUNTIMES), "v1alpha1"))
        else:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=VALUES_IDS)
def test_namespaced_objects_name_their_namespace(render: Render, values_file: Path | None) -> None:
    # `helm template` output is applied without Helm (manifests/): nothing may rely on -n.
    cluster_scoped = {
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "Namespace",
        "ClusterTrainingRuntime",
        "ValidatingWebhookConfiguration",
    }
    for obj in render(files=_files(values_file)):
        if obj["kind"] not in cluster_scoped:
            assert obj["metadata"].get("namespace"), f"{obj['kind']} {obj['metadata']['name']}"


def test_the_service_monitor_scrapes_the_metrics_service(render: Render) -> None:
    objects = render(files=[CHART / "ci" / "servicemonitor-values.yaml"])
    monitor, service = one(objects, "ServiceMonitor"), one(objects, "Service", f"{RELEASE}-operator-metrics")
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [service["metadata"]["namespace"]]}
    [endpoint] = monitor["spec"]["endpoints"]
    [port] = service["spec"]["ports"]
    assert (endpoint["port"], endpoint["path"]) == (port["name"], "/metrics")
    [container] = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert port["targetPort"] in [p["name"] for p in container["ports"]]
    user = yaml.safe_load((CHART / "ci" / "servicemonitor-values.yaml").read_text())["metrics"][
        "serviceMonitor"
    ]
    assert user["labels"].items() <= monitor["metadata"]["labels"].items()
    assert endpoint["interval"] == user["interval"]


def test_the_crd_is_the_one_generated_from_the_spec(render: Render) -> None:
    rendered = one(render(), "CustomResourceDefinition", "bertpretrainjobs.bertjob.dev")
    generated = crd()
    assert rendered["metadata"]["name"] == generated["metadata"]["name"]
    assert rendered["spec"] == generated["spec"]
    assert rendered["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert rendered["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


def test_chart_yaml(helm: Helm) -> None:
    chart = chart_metadata()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["version"] == "0.1.0"
    # The operator image is tagged with the project's version, and the image tag defaults to this.
    assert chart["appVersion"] == project["version"]
    # The floor is what tests/cluster/test_version_floor.py installs on.
    floor = versions()["KUBERNETES_FLOOR_VERSION"]
    assert helm("template", RELEASE, str(CHART), f"--kube-version={floor}").returncode == 0
    too_old = helm("template", RELEASE, str(CHART), "--kube-version=1.27.16")
    assert too_old.returncode != 0 and "kubeVersion" in too_old.stderr


BAD: list[tuple[str, Path | dict[str, Any], str, str]] = [
    ("wrong-type", BAD_VALUES / "wrong-type.yaml", "at '/image/tag'", "want string"),
    (
        "unknown-top-level-key",
        BAD_VALUES / "unknown-top-level-key.yaml",
        "at ''",
        "'replicas' not allowed",
    ),
    ("unknown-nested-key", {"crds": {"instal": True}}, "at '/crds'", "'instal' not allowed"),
    ("namespace-pattern", {"watchNamespaces": ["team-*"]}, "at '/watchNamespaces/0'", "does not match"),
    ("log-level", {"logLevel": "trace"}, "at '/logLevel'", "must be one of"),
    ("account-without-name", {"serviceAccount": {"create": False}}, "at '/serviceAccount/name'", "minLength"),
    ("digest-without-algorithm", {"image": {"digest": "0123abcd"}}, "at '/image/digest'", "does not match"),
    ("egress-denied", {"networkPolicy": {"egress": []}}, "at '/networkPolicy/egress'", "minItems"),
    (
        "quantity",
        {"resources": {"limits": {"memory": "lots"}}},
        "at '/resources/limits/memory'",
        "does not match",
    ),
    ("name-override-pattern", {"nameOverride": "Bert_Job"}, "at '/nameOverride'", "does not match"),
    ("fullname-override-length", {"fullnameOverride": "a" * 47}, "at '/fullnameOverride'", "maxLength"),
    (
        "extra-volume-misspelt",
        {"extraVolumes": [{"name": "ca", "configmap": {}}]},
        "at '/extraVolumes/0'",
        "'configmap' not allowed",
    ),
    (
        "extra-mount-without-path",
        {"extraVolumeMounts": [{"name": "x"}]},
        "at '/extraVolumeMounts/0'",
        "mountPath",
    ),
    (
        "run-as-user-text",
        {"podSecurityContext": {"runAsUser": "10001"}},
        "at '/podSecurityContext/runAsUser'",
        "want integer",
    ),
    (
        "pod-security-misspelt",
        {"podSecurityContext": {"runAsNonroot": True}},
        "at '/podSecurityContext'",
        "'runAsNonroot' not allowed",
    ),
    (
        "capabilities-misspelt",
        {"securityContext": {"capabilities": {"dropped": ["ALL"]}}},
        "at '/securityContext/capabilities'",
        "'dropped' not allowed",
    ),
    (
        "seccomp-type",
        {"securityContext": {"seccompProfile": {"type": "runtime/default"}}},
        "at '/securityContext/seccompProfile/type'",
        "must be one of",
    ),
    ("global-not-an-object", {"global": "x"}, "at '/global'", "want object"),
]


# What a values schema cannot word: Helm prints a refused "not" as "'not' failed", so the chart's
# templates refuse these, each naming the value and why.
REFUSED_BY_TEMPLATE: list[tuple[str, dict[str, Any], str]] = [
    ("metrics-port-env", {"extraEnv": [{"name": PORT_ENV, "value": "1"}]},
     "extraEnv[0].name: BERTJOB_METRICS_PORT is set by the chart (the metrics port, 9090)"),
    ("selector-label", {"podLabels": {"app.kubernetes.io/instance": "x"}},
     'podLabels: "app.kubernetes.io/instance" is a label of the Deployment\'s selector, which cannot change'),
    ("common-label-of-the-chart", {"commonLabels": {"app.kubernetes.io/name": "x"}},
     'commonLabels: "app.kubernetes.io/name" is a label the chart sets itself'),
    ("common-label-aggregating", {"commonLabels": {"rbac.authorization.k8s.io/aggregate-to-admin": "true"}},
     'commonLabels: "rbac.authorization.k8s.io/aggregate-to-admin" is a label the chart sets itself'),
    # It would put the operator's own ClusterRole into the role of every Kubeflow Profile's owner.
    ("common-label-aggregating-to-kubeflow",
     {"commonLabels": {"rbac.authorization.kubeflow.org/aggregate-to-kubeflow-admin": "true"}},
     'commonLabels: "rbac.authorization.kubeflow.org/aggregate-to-kubeflow-admin" is a label the chart sets '
     "itself"),
    ("extra-arg-of-the-chart", {"extraArgs": ["--log-format=json", "--namespace=other"]},
     'extraArgs[1]: "--namespace=other" is an argument the chart sets from other values'),
    ("extra-arg-short-form", {"extraArgs": ["-nother"]},
     'extraArgs[0]: "-nother" is an argument the chart sets from other values'),
    ("extra-volume-of-the-chart", {"extraVolumes": [{"name": "tmp", "emptyDir": {}}]},
     'extraVolumes[0].name: "tmp" is a volume of the chart\'s own; choose another name'),
    ("extra-mount-over-tmp", {"extraVolumeMounts": [{"name": "x", "mountPath": "/tmp/"}]},
     'extraVolumeMounts[0].mountPath: "/tmp/" is where the chart mounts a volume of its own'),
    ("webhook-port-of-health", {"webhook": {"port": 8080}},
     "webhook.port: 8080 is the health port of the operator; choose another (1024-65535)"),
    ("webhook-port-of-metrics", {"webhook": {"port": 9090}},
     "webhook.port: 9090 is the metrics port of the operator; choose another (1024-65535)"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("bad", "says"), [case[1:] for case in REFUSED_BY_TEMPLATE], ids=[case[0] for case in REFUSED_BY_TEMPLATE]
)
def test_what_the_schema_cannot_word_is_refused_with_its_reason(
    helm: Helm, tmp_path: Path, bad: dict[str, Any], says: str
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(json.dumps(bad))

    result = helm("template", RELEASE, str(CHART), f"--values={path}")

    assert result.returncode != 0
    assert says in result.stderr and "'not' failed" not in result.stderr, result.stderr
    # helm lint logs a template's fail at INFO and passes (Helm 4): the chart's README says so.
    lint = helm("lint", "--strict", str(CHART), f"--values={path}")
    assert lint.returncode == 0 and 'msg="funcMap fail"' in lint.stderr, lint.stderr


def test_the_schema_has_no_not_rule() -> None:
    # Helm's message for a refused "not" names no reason; REFUSED_BY_TEMPLATE words each instead.
    assert '"not"' not in (CHART / "values.schema.json").read_text()


@pytest.mark.parametrize(("bad", "where", "says"), [case[1:] for case in BAD], ids=[case[0] for case in BAD])
@pytest.mark.parametrize("command", ["lint", "template"])
def test_bad_values_are_refused_naming_the_key(
    helm: Helm, tmp_path: Path, command: str, bad: Path | dict[str, Any], where: str, says: str
) -> None:
    if isinstance(bad, dict):
        path = tmp_path / "values.yaml"
        path.write_text(json.dumps(bad))
    else:
        path = bad
    arguments = ["lint", "--strict", str(CHART)] if command == "lint" else ["template", RELEASE, str(CHART)]

    result = helm(*arguments, f"--values={path}")

    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "values don't meet the specifications of the schema" in output, output
    assert where in output and says in output, output


def test_the_schema_is_draft_07_and_closed_wherever_it_lists_properties() -> None:
    schema = values_schema()
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            # global alone stays open: an umbrella chart passes every subchart's globals to each.
            if node.get("type") == "object" and "properties" in node and path != "/properties/global":
                assert node.get("additionalProperties") is False, f"{path or '<root>'} is open"
            for key, sub in node.items():
                walk(sub, f"{path}/{key}")
        elif isinstance(node, list):
            for index, sub in enumerate(node):
                walk(sub, f"{path}/{index}")

    walk(schema, "")


def _without_nulls(values: Any) -> Any:
    # Helm drops a key whose value is null (a values file's way to remove a default) before it
    # validates.
    if isinstance(values, dict):
        return {key: _without_nulls(value) for key, value in values.items() if value is not None}
    return values


@pytest.mark.parametrize("values_file", [CHART / "values.yaml", *CI_VALUES], ids=lambda path: path.name)
def test_the_values_files_fit_the_schema(values_file: Path) -> None:
    # Helm validates the defaults with the file merged over them; so does this, with another validator.
    values = _without_nulls(merged(default_values(), yaml.safe_load(values_file.read_text())))
    jsonschema.Draft7Validator(values_schema()).validate(values)


def test_a_mount_of_no_extra_volume_is_refused_naming_it(helm: Helm, tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(
        json.dumps(
            {
                "extraVolumes": [{"name": "ca", "configMap": {"name": "ca"}}],
                "extraVolumeMounts": [
                    {"name": "ca", "mountPath": "/etc/ca"},
                    {"name": "cache", "mountPath": "/var/cache"},
                ],
            }
        )
    )

    result = helm("template", RELEASE, str(CHART), f"--values={path}")

    assert result.returncode != 0
    assert 'extraVolumeMounts[1].name: "cache" is no volume of extraVolumes (ca)' in result.stderr, (
        result.stderr
    )


def _readme_rows() -> dict[str, tuple[str, Any, str]]:
    rows: dict[str, tuple[str, Any, str]] = {}
    for line in (CHART / "README.md").read_text().splitlines():
        found = re.fullmatch(r"\| `([^`]+)` \| ([^|]+) \| `([^`]*)` \| (.+) \|", line)
        if found:
            key, type_, default, description = found.groups()
            assert key not in rows, f"{key} twice in the README"
            rows[key] = (type_.strip(), json.loads(default), description.strip())
    return rows


def test_the_readme_lists_every_value_with_its_type_and_default() -> None:
    rows = _readme_rows()
    values = {
        key: (schema_type(node), value) for key, value, node in settings(default_values(), values_schema())
    }

    assert sorted(set(values) - set(rows)) == [], "values missing from charts/bertjob/README.md"
    assert sorted(set(rows) - set(values)) == [], "README rows that are not values"
    for key, (type_, default, description) in rows.items():
        assert (type_, default) == values[key], key
        assert description, key


def test_the_schema_describes_every_value_and_allows_no_other() -> None:
    schema = values_schema()
    assert set(schema["properties"]) == set(default_values())
    for key, _, node in settings(default_values(), schema):
        assert node.get("description"), f"{key} has no description in values.schema.json"


def test_the_operator_runs_locked_down(render: Render) -> None:
    objects = render()
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    [container] = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    [mount] = container["volumeMounts"]
    [volume] = pod["volumes"]
    assert mount["mountPath"] == "/tmp" and volume == {"name": mount["name"], "emptyDir": {}}
    # The account mounts no token anywhere; the operator's pod asks for its own.
    assert one(objects, "ServiceAccount")["automountServiceAccountToken"] is False
    assert pod["automountServiceAccountToken"] is True


def test_two_replicas_roll_one_at_a_time_and_elect_their_reconciler(render: Render) -> None:
    objects = render()
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert "--standalone" not in container["command"]
    env = {var["name"]: var for var in container["env"]}
    assert env["BERTJOB_PEERING"]["value"] == f"{RELEASE}-operator"
    assert env["POD_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert (
        one(objects, "CustomResourceDefinition", "clusterkopfpeerings.kopf.dev")["spec"]["scope"] == "Cluster"
    )
    assert one(objects, "PodDisruptionBudget")["spec"]["minAvailable"] == 1


def test_a_budget_that_allows_no_eviction_is_refused(helm: Helm) -> None:
    result = helm("template", RELEASE, str(CHART), "--set=replicaCount=1")
    assert result.returncode != 0
    assert "podDisruptionBudget.minAvailable: 1 of 1 replicas" in result.stderr, result.stderr
    assert (
        helm(
            "template", RELEASE, str(CHART), "--set=replicaCount=1", "--set=podDisruptionBudget.enabled=false"
        ).returncode
        == 0
    )


def test_the_default_command_is_the_images(render: Render) -> None:
    # The operator image's CMD is this line (tests/bertjob/test_dockerfiles.py compares it with
    # manifests/deployment.yaml); the chart's defaults must not drift from it.
    assert operator_container(render())["command"] == [
        "kopf",
        "run",
        "--all-namespaces",
        "--liveness=http://0.0.0.0:8080/healthz",
        "-m",
        "bertjob.handlers",
    ]


def _granted(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    found: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                found.setdefault((group, resource), set()).update(rule["verbs"])
    return found


def test_every_namespace_one_cluster_role_and_only_the_certificates_role(render: Render) -> None:
    objects = render()
    # Only the progress endpoint's certificate Secret, in the release's own namespace.
    namespaced = [obj for obj in objects if obj["kind"] in ("Role", "RoleBinding")]
    assert {(obj["metadata"]["name"], obj["metadata"]["namespace"]) for obj in namespaced} == {
        (f"{RELEASE}-operator-progress-tls", NAMESPACE)
    }
    operator = one(objects, "ClusterRole", f"{RELEASE}-operator")
    assert ("bertjob.dev", "bertpretrainjobs") in _granted(operator["rules"])
    binding = one(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == operator["metadata"]["name"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": one(objects, "ServiceAccount")["metadata"]["name"],
            "namespace": NAMESPACE,
        }
    ]


def test_listed_namespaces_get_a_role_each_and_the_cluster_role_keeps_what_kopf_reads_cluster_wide(
    render: Render,
) -> None:
    listed = yaml.safe_load((CHART / "ci" / "namespaced-values.yaml").read_text())["watchNamespaces"]
    scoped, everywhere = render(files=[CHART / "ci" / "namespaced-values.yaml"]), render()
    all_rules = _granted(one(everywhere, "ClusterRole", f"{RELEASE}-operator")["rules"])
    cluster_rules = _granted(one(scoped, "ClusterRole", f"{RELEASE}-operator")["rules"])

    operator = f"{RELEASE}-operator"
    roles = [obj for obj in scoped if obj["kind"] == "Role" and obj["metadata"]["name"] == operator]
    bindings = [obj for obj in scoped if obj["kind"] == "RoleBinding" and obj["metadata"]["name"] == operator]
    assert [role["metadata"]["namespace"] for role in roles] == listed
    assert [binding["metadata"]["namespace"] for binding in bindings] == listed
    account = one(scoped, "ServiceAccount")["metadata"]
    for role, binding in zip(roles, bindings, strict=True):
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
        ]
        role_rules = _granted(role["rules"])
        # The Role holds every namespaced grant of the cluster-wide scope, and nothing cluster-scoped.
        assert role_rules == {key: verbs for key, verbs in all_rules.items() if key not in cluster_rules}
    assert set(cluster_rules) == {
        ("apiextensions.k8s.io", "customresourcedefinitions"),
        ("", "namespaces"),
        ("authentication.k8s.io", "tokenreviews"),
        ("kopf.dev", "clusterkopfpeerings"),
    }

    command = operator_container(scoped)["command"]
    assert "--all-namespaces" not in command
    assert [arg for arg in command if arg.startswith("--namespace")] == [f"--namespace={ns}" for ns in listed]


def _aggregated(
    objects: list[dict[str, Any]], role: str, domain: str = "rbac.authorization.k8s.io"
) -> dict[tuple[str, str], set[str]]:
    # What the API server's aggregation controller adds to the role that selects the label
    # <domain>/aggregate-to-<role>: a built-in role, or Kubeflow's (kubeflow-admin selects
    # rbac.authorization.kubeflow.org/aggregate-to-kubeflow-admin).
    label = f"{domain}/aggregate-to-{role}"
    rules = [
        rule
        for obj in objects
        if obj["kind"] == "ClusterRole" and obj["metadata"].get("labels", {}).get(label) == "true"
        for rule in obj["rules"]
    ]
    return _granted(rules)


def test_the_built_in_roles_get_bertpretrainjobs(render: Render) -> None:
    objects = render()
    reading = {"get", "list", "watch"}
    writing = {"create", "update", "patch", "delete", "deletecollection"}
    jobs, status = ("bertjob.dev", "bertpretrainjobs"), ("bertjob.dev", "bertpretrainjobs/status")

    assert _aggregated(objects, "view") == {jobs: reading, status: reading}
    for role in ("edit", "admin"):
        assert _aggregated(objects, role) == {jobs: reading | writing, status: reading}, role
    # Kubeflow's, which a Profile binds to its owner (kubeflow-admin) and contributors: the same,
    # without counting on Kubeflow's nesting of view into edit into admin.
    kubeflow = "rbac.authorization.kubeflow.org"
    assert _aggregated(objects, "kubeflow-view", kubeflow) == {jobs: reading, status: reading}
    for role in ("kubeflow-edit", "kubeflow-admin"):
        assert _aggregated(objects, role, kubeflow) == {jobs: reading | writing, status: reading}, role
    # The operator's own role aggregates into nothing.
    assert not [
        key
        for key in one(objects, "ClusterRole", f"{RELEASE}-operator")["metadata"]["labels"]
        if "aggregate" in key
    ]


@pytest.mark.parametrize(
    ("values", "says"),
    [
        (
            {},
            [
                "every namespace",
                f"kubectl -n {NAMESPACE} logs -f deployment/{RELEASE}-operator",
                "kubectl get bpj",
            ],
        ),
        (
            {"watchNamespaces": ["team-a", "team-b"]},
            ["the namespaces team-a, team-b", "kubectl apply -n team-a"],
        ),
        ({"crds": {"install": False}}, ["crds.install is false"]),
    ],
    ids=["defaults", "namespaced", "no-crd"],
)
def test_the_notes_say_what_to_run_next(
    helm: Helm, tmp_path: Path, values: dict[str, Any], says: list[str]
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(json.dumps(values))
    result = helm(
        "install", RELEASE, str(CHART), "--dry-run=client", f"--namespace={NAMESPACE}", f"--values={path}"
    )
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    for text in says:
        assert text in notes
    assert ("crds.install is false" in notes) == (values.get("crds") == {"install": False})


def test_template_syntax_in_the_spec_renders_as_text(helm: Helm, tmp_path: Path) -> None:
    # A description quoting Go template syntax (as a field's docs might) must reach the cluster as
    # written, not be run by Helm.
    chart = tmp_path / "bertjob"
    shutil.copytree(CHART, chart)
    definition = crd()
    text = "Use {{ .Release.Name }} or {{{ literally }}}."
    definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = text
    (chart / "templates" / "crd.yaml").write_text(chart_template(definition))

    result = helm("template", RELEASE, str(chart), "--show-only=templates/crd.yaml")

    assert result.returncode == 0, result.stderr
    [rendered] = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert rendered["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] == text
