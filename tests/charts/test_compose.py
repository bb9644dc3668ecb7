"""The chart as a platform team uses it: a dependency of an umbrella chart (whose ``global`` values
reach every subchart), and renamed with nameOverride or fullnameOverride, every object and every
reference between objects following the new name."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bertjob_api.contract import MPI_RUNTIME, TORCH_RUNTIME
from tests.charts.test_webhook_chart import CERT_MANAGER_SCHEMAS
from tests.helm_chart import CHART, KUBERNETES_VERSION, NAMESPACE, chart_metadata, one
from tests.k8s_schema import assert_valid

Helm = Callable[..., subprocess.CompletedProcess[str]]
Render = Callable[..., list[dict[str, Any]]]
Objects = list[dict[str, Any]]

UMBRELLA_RELEASE = "platform"
# What an umbrella chart passes down: globals that some other subchart reads.
GLOBALS = {"imageRegistry": "mirror.example.com", "storageClass": "fast"}
OURS = {"fullnameOverride": "ml-bertjob", "commonLabels": {"team": "nlp"}, "extraArgs": ["--log-format=json"]}
# Objects whose names the operator relies on.
FIXED_NAMES = {"CustomResourceDefinition", "ClusterTrainingRuntime"}
EVERYTHING_ON = {
    "webhook": {"enabled": True, "certManager": {"enabled": True}},
    "metrics": {"serviceMonitor": {"enabled": True}},
    "podDisruptionBudget": {"enabled": True},
    "networkPolicy": {"enabled": True},
    "trainingRuntimes": {"install": True},
    "commonLabels": {"team": "nlp"},
}


def _objects(result: subprocess.CompletedProcess[str]) -> Objects:
    assert result.returncode == 0, result.stderr
    return [obj for obj in yaml.safe_load_all(result.stdout) if obj]


@pytest.fixture(scope="module")
def umbrella(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An umbrella chart with ours as its one dependency (a file:// repository, packaged into its
    charts/ by `helm dependency build`), ours configured under its name and globals beside."""
    root = tmp_path_factory.mktemp("umbrella") / UMBRELLA_RELEASE
    root.mkdir()
    chart = {
        "apiVersion": "v2",
        "name": UMBRELLA_RELEASE,
        "version": "1.0.0",
        "dependencies": [
            {"name": "bertjob", "version": chart_metadata()["version"], "repository": f"file://{CHART}"}
        ],
    }
    (root / "Chart.yaml").write_text(yaml.safe_dump(chart))
    (root / "values.yaml").write_text(yaml.safe_dump({"global": GLOBALS, "bertjob": OURS}))
    # Only its dependencies' objects: so that what it renders is ours alone.
    (root / "templates").mkdir()
    built = helm("dependency", "build", str(root))
    assert built.returncode == 0, built.stdout + built.stderr
    assert [path.name for path in (root / "charts").iterdir()] == [
        f"bertjob-{chart['dependencies'][0]['version']}.tgz"
    ]
    return root


def test_the_umbrella_chart_lints(helm: Helm, umbrella: Path) -> None:
    result = helm("lint", "--strict", str(umbrella))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_umbrella_chart_renders_what_the_chart_renders_alone(
    helm: Helm, umbrella: Path, tmp_path: Path
) -> None:
    composed = _objects(helm("template", UMBRELLA_RELEASE, str(umbrella), f"--namespace={NAMESPACE}"))
    values = tmp_path / "values.yaml"
    values.write_text(json.dumps({**OURS, "global": GLOBALS}))
    alone = _objects(
        helm("template", UMBRELLA_RELEASE, str(CHART), f"--namespace={NAMESPACE}", f"--values={values}")
    )

    assert composed == alone
    deployment = one(composed, "Deployment")
    assert deployment["metadata"]["name"] == "ml-bertjob-operator"
    # The umbrella's registry reaches our image; its storageClass is read by no object of ours.
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith(f"{GLOBALS['imageRegistry']}/bertjob/operator:")
    for obj in composed:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_umbrella_chart_can_set_our_values_on_the_command_line(helm: Helm, umbrella: Path) -> None:
    composed = _objects(
        helm(
            "template",
            UMBRELLA_RELEASE,
            str(umbrella),
            f"--namespace={NAMESPACE}",
            "--set=bertjob.podSecurityContext.runAsUser=null",
            "--set=global.extra.deep=1",
        )
    )
    assert "runAsUser" not in one(composed, "Deployment")["spec"]["template"]["spec"]["securityContext"]


def test_a_bad_value_under_the_dependency_is_still_refused(helm: Helm, umbrella: Path) -> None:
    result = helm("template", UMBRELLA_RELEASE, str(umbrella), "--set=bertjob.replicas=2")
    assert result.returncode != 0
    assert "'replicas' not allowed" in result.stderr, result.stderr


def _validate(obj: dict[str, Any]) -> None:
    if obj["kind"] in CERT_MANAGER_SCHEMAS:
        assert_valid(obj, CERT_MANAGER_SCHEMAS[obj["kind"]])
    elif obj["kind"] not in ("ServiceMonitor", "ClusterTrainingRuntime"):
        # test_chart.py and test_trainingruntimes.py check these two against their CRDs.
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def _subset(small: dict[str, str], large: dict[str, str]) -> bool:
    return small.items() <= large.items()


@pytest.mark.parametrize(
    ("names", "prefix", "label"),
    [
        ({"fullnameOverride": "ml-bertjob"}, "ml-bertjob", "bertjob"),
        ({"nameOverride": "pretrain"}, "bertjob-pretrain", "pretrain"),
        ({"nameOverride": "pretrain", "fullnameOverride": "ml"}, "ml", "pretrain"),
    ],
    ids=["fullnameOverride", "nameOverride", "both"],
)
def test_every_object_and_every_reference_follows_the_name(
    render: Render, names: dict[str, str], prefix: str, label: str
) -> None:
    objects = render({**EVERYTHING_ON, **names})

    for obj in objects:
        kind, metadata = obj["kind"], obj["metadata"]
        if kind not in FIXED_NAMES:
            assert metadata["name"].startswith(f"{prefix}-"), (kind, metadata["name"])
        assert metadata["labels"]["app.kubernetes.io/name"] == label, (kind, metadata["name"])
        assert metadata["labels"]["team"] == "nlp", (kind, metadata["name"])
        _validate(obj)
    assert sorted(
        obj["metadata"]["name"] for obj in objects if obj["kind"] == "ClusterTrainingRuntime"
    ) == sorted([TORCH_RUNTIME, MPI_RUNTIME])

    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]
    pod_labels = pod["metadata"]["labels"]
    account = one(objects, "ServiceAccount")["metadata"]["name"]
    operator_role = one(objects, "ClusterRole", f"{prefix}-operator")
    binding = one(objects, "ClusterRoleBinding")
    assert pod["spec"]["serviceAccountName"] == account
    assert binding["roleRef"]["name"] == operator_role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]

    # Every selector still finds the operator's pod (and the ServiceMonitor its Service).
    assert _subset(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    services = {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == "Service"}
    assert sorted(services) == [
        f"{prefix}-operator-metrics",
        f"{prefix}-operator-progress",
        f"{prefix}-operator-webhook",
    ]
    for service in services.values():
        assert _subset(service["spec"]["selector"], pod_labels), service["metadata"]["name"]
    assert _subset(one(objects, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"], pod_labels)
    assert _subset(one(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"], pod_labels)
    monitor = one(objects, "ServiceMonitor")
    assert _subset(
        monitor["spec"]["selector"]["matchLabels"],
        services[f"{prefix}-operator-metrics"]["metadata"]["labels"],
    )

    # The webhook: configuration -> Service; Certificate -> Issuer, Secret mounted, CA injected.
    configuration = one(objects, "ValidatingWebhookConfiguration")
    certificate, issuer = one(objects, "Certificate"), one(objects, "Issuer")
    assert configuration["webhooks"][0]["clientConfig"]["service"]["name"] == f"{prefix}-operator-webhook"
    assert certificate["spec"]["issuerRef"]["name"] == issuer["metadata"]["name"]
    assert configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{NAMESPACE}/{certificate['metadata']['name']}"
    )
    assert certificate["spec"]["dnsNames"][0] == f"{prefix}-operator-webhook"
    [tls] = [volume for volume in pod["spec"]["volumes"] if "secret" in volume]
    assert tls["secret"]["secretName"] == certificate["spec"]["secretName"]


def test_the_chart_made_webhook_secret_follows_the_name(render: Render) -> None:
    objects = render({"webhook": {"enabled": True}, "fullnameOverride": "ml"})
    [tls] = [
        volume
        for volume in one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]
        if "secret" in volume
    ]
    assert (
        one(objects, "Secret")["metadata"]["name"] == tls["secret"]["secretName"] == "ml-operator-webhook-tls"
    )
