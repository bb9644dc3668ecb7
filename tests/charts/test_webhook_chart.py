"""The chart's admission webhook, both ways (a certificate the chart makes; cert-manager's): every
piece points at the next (configuration -> Service -> container port -> the operator's env and
mounted Secret -> the handler's path), the certificate is one the API server would trust, the
rules leave the status subresource out, and the matchConditions expression, evaluated by a CEL
library, sends exactly the requests that create a job or change its spec."""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bertjob.admission import CERT_DIR_ENV, CERT_FILE, KEY_FILE, PORT, PORT_ENV, WEBHOOK_ID
from bertjob_api.contract import GROUP, PLURAL, VERSION
from bertjob_testing.admission_cases import CHANGE_CASES, JOB_CASES
from bertjob_testing.cluster.catalog import versions
from tests.helm_chart import CHART, NAMESPACE, RELEASE, one, operator_container
from tests.k8s_schema import assert_valid

Render = Callable[..., list[dict[str, Any]]]

OPERATOR = f"{RELEASE}-operator"
SERVICE = f"{OPERATOR}-webhook"
SECRET = f"{OPERATOR}-webhook-tls"
SELF_SIGNED = {"webhook": {"enabled": True}}
CERT_MANAGER = {"webhook": {"enabled": True, "certManager": {"enabled": True}}}
HOSTS = [
    SERVICE,
    f"{SERVICE}.{NAMESPACE}",
    f"{SERVICE}.{NAMESPACE}.svc",
    f"{SERVICE}.{NAMESPACE}.svc.cluster.local",
]

# A Go duration, as cert-manager's Certificate takes it.
GO_DURATION = "^([0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"
_META = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": {"type": "object"}},
    "additionalProperties": False,
}
# What cert-manager's CRDs (cert-manager.io/v1) require of the fields this chart sets; any other
# field fails, as under strict field validation.
CERT_MANAGER_SCHEMAS: dict[str, dict[str, Any]] = {
    "Issuer": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"enum": ["cert-manager.io/v1"]},
            "kind": {"enum": ["Issuer"]},
            "metadata": _META,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["selfSigned"],
                "properties": {"selfSigned": {"type": "object", "additionalProperties": False}},
            },
        },
    },
    "Certificate": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"enum": ["cert-manager.io/v1"]},
            "kind": {"enum": ["Certificate"]},
            "metadata": _META,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["secretName", "issuerRef"],
                "properties": {
                    "secretName": {"type": "string", "minLength": 1},
                    "commonName": {"type": "string", "maxLength": 64},
                    "dnsNames": {"type": "array", "items": {"type": "string"}},
                    "duration": {"type": "string", "pattern": GO_DURATION},
                    "renewBefore": {"type": "string", "pattern": GO_DURATION},
                    "issuerRef": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string"},
                            "kind": {"type": "string"},
                            "group": {"type": "string"},
                        },
                    },
                },
            },
        },
    },
}


def _webhook(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [webhook] = one(objects, "ValidatingWebhookConfiguration")["webhooks"]
    return dict(webhook)


def _env(objects: list[dict[str, Any]]) -> dict[str, str]:
    return {item["name"]: item.get("value") for item in operator_container(objects)["env"]}


def test_off_by_default(render: Render) -> None:
    objects = render()
    kinds = {obj["kind"] for obj in objects}
    assert not kinds & {"ValidatingWebhookConfiguration", "Secret", "Issuer", "Certificate"}
    assert CERT_DIR_ENV not in _env(objects)
    assert "webhook" not in [port["name"] for port in operator_container(objects)["ports"]]


@pytest.mark.parametrize("values", [SELF_SIGNED, CERT_MANAGER], ids=["self-signed", "cert-manager"])
@pytest.mark.parametrize("kube_version", [versions()["KUBERNETES_FLOOR_VERSION"].lstrip("v"), "1.33.0"])
def test_every_object_passes_strict_validation(
    helm: Callable[..., Any], tmp_path: Path, values: dict[str, Any], kube_version: str
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(json.dumps(values))
    result = helm(
        "template",
        RELEASE,
        str(CHART),
        f"--namespace={NAMESPACE}",
        f"--values={path}",
        f"--kube-version={kube_version}",
    )
    assert result.returncode == 0, result.stderr
    objects = [obj for obj in yaml.safe_load_all(result.stdout) if obj]
    for obj in objects:
        if obj["kind"] in CERT_MANAGER_SCHEMAS:
            assert_valid(obj, CERT_MANAGER_SCHEMAS[obj["kind"]])
        elif obj["kind"] != "CustomResourceDefinition":
            kubernetes_validate.validate(obj, kube_version.rsplit(".", 1)[0], strict=True)
    # matchConditions are beta from 1.28: left out for an older API server, which would drop them.
    assert ("matchConditions" in _webhook(objects)) == (kube_version >= "1.28")


@pytest.mark.parametrize("values", [SELF_SIGNED, CERT_MANAGER], ids=["self-signed", "cert-manager"])
def test_the_configuration_reaches_the_operators_handler(render: Render, values: dict[str, Any]) -> None:
    objects = render(values)
    webhook = _webhook(objects)
    service = one(objects, "Service", SERVICE)
    assert webhook["clientConfig"]["service"] == {
        "name": SERVICE,
        "namespace": NAMESPACE,
        "path": f"/{WEBHOOK_ID}",
        "port": service["spec"]["ports"][0]["port"],
    }
    [port] = service["spec"]["ports"]
    assert (
        service["spec"]["selector"].items()
        <= one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    )
    container = operator_container(objects)
    [container_port] = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    env = _env(objects)
    assert int(env[PORT_ENV]) == container_port["containerPort"] == PORT
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == env[CERT_DIR_ENV]]
    assert mount["readOnly"] is True
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == SECRET
    assert webhook["admissionReviewVersions"] == ["v1"] and webhook["sideEffects"] == "None"
    assert webhook["failurePolicy"] == "Fail" and 1 <= webhook["timeoutSeconds"] <= 30
    # The main resource only: the operator's and the trainer's status writes never wait on it.
    assert webhook["rules"] == [
        {
            "apiGroups": [GROUP],
            "apiVersions": [VERSION],
            "operations": ["CREATE", "UPDATE"],
            "resources": [PLURAL],
            "scope": "Namespaced",
        }
    ]


def test_the_chart_made_certificate_is_trusted_for_the_service(render: Render) -> None:
    objects = render(SELF_SIGNED)
    secret = one(objects, "Secret", SECRET)
    assert secret["type"] == "kubernetes.io/tls"
    files = {name: base64.b64decode(value) for name, value in secret["data"].items()}
    assert {CERT_FILE, KEY_FILE, "ca.crt"} <= files.keys()
    assert base64.b64decode(_webhook(objects)["clientConfig"]["caBundle"]) == files["ca.crt"]
    ca = x509.load_pem_x509_certificate(files["ca.crt"])
    cert = x509.load_pem_x509_certificate(files[CERT_FILE])
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(names.get_values_for_type(x509.DNSName)) == sorted(HOSTS)
    assert cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC) > datetime.timedelta(days=3000)
    key = serialization.load_pem_private_key(files[KEY_FILE], password=None)
    assert isinstance(key, rsa.RSAPrivateKey) and key.public_key() == cert.public_key()
    assert "cert-manager.io/inject-ca-from" not in (
        one(objects, "ValidatingWebhookConfiguration")["metadata"].get("annotations") or {}
    )


def test_cert_manager_issues_the_secret_and_injects_its_ca(render: Render) -> None:
    objects = render(CERT_MANAGER)
    assert not [obj for obj in objects if obj["kind"] == "Secret"]
    issuer, certificate = one(objects, "Issuer"), one(objects, "Certificate")
    assert issuer["spec"] == {"selfSigned": {}}
    assert certificate["spec"]["secretName"] == SECRET
    assert certificate["spec"]["issuerRef"] == {
        "name": issuer["metadata"]["name"],
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    assert sorted(certificate["spec"]["dnsNames"]) == sorted(HOSTS)
    configuration = one(objects, "ValidatingWebhookConfiguration")
    namespace, name = configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")
    assert (namespace, name) == (certificate["metadata"]["namespace"], certificate["metadata"]["name"])
    assert "caBundle" not in _webhook(objects)["clientConfig"]


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
def test_the_failure_policy_is_the_values(render: Render, policy: str) -> None:
    assert (
        _webhook(render({"webhook": {"enabled": True, "failurePolicy": policy}}))["failurePolicy"] == policy
    )


def test_the_network_policy_admits_the_webhook_port(render: Render) -> None:
    objects = render({**CERT_MANAGER, "networkPolicy": {"enabled": True}})
    rule, _ = one(objects, "NetworkPolicy")["spec"]["ingress"]
    assert {"port": "webhook", "protocol": "TCP"} in rule["ports"]
    assert "from" not in rule  # the API server's address differs between clusters


def test_the_network_policy_admits_progress_reports_from_trainer_pods_only(render: Render) -> None:
    objects = render({"networkPolicy": {"enabled": True}})
    [_, progress] = one(objects, "NetworkPolicy")["spec"]["ingress"]
    assert progress["ports"] == [{"port": "progress", "protocol": "TCP"}]
    [peer] = progress["from"]
    assert peer == {
        "namespaceSelector": {},
        "podSelector": {"matchExpressions": [{"key": "bertjob.dev/job", "operator": "Exists"}]},
    }


def test_listed_namespaces_only(render: Render) -> None:
    webhook = _webhook(render({**CERT_MANAGER, "watchNamespaces": ["team-a", "team-b"]}))
    assert webhook["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
        ]
    }
    assert "namespaceSelector" not in _webhook(render(CERT_MANAGER))


def _sent(expression: str, operation: str, obj: dict[str, Any], old: dict[str, Any] | None) -> bool:
    program = celpy.Environment().program(celpy.Environment().compile(expression))
    activation = {
        "request": celpy.json_to_cel({"operation": operation}),
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(old),
    }
    return bool(program.evaluate(activation))


@pytest.mark.parametrize("case", CHANGE_CASES, ids=[case["id"] for case in CHANGE_CASES])
def test_the_match_condition_sends_each_spec_change_and_nothing_else(
    render: Render, case: dict[str, Any]
) -> None:
    [condition] = _webhook(render(CERT_MANAGER))["matchConditions"]
    changes_spec = case["old"]["spec"] != case["new"]["spec"]
    assert _sent(condition["expression"], "UPDATE", case["new"], case["old"]) is changes_spec
    assert _sent(condition["expression"], "CREATE", JOB_CASES[0]["document"], None) is True
