"""The validating admission webhook end to end: `kopf run` of the operator against kmock's
Kubernetes emulator, configured as the chart configures it (``$BERTJOB_WEBHOOK_CERT_DIR`` with a
certificate for 127.0.0.1 made here), answering AdmissionReview v1 requests POSTed over HTTPS
by a client that trusts only the test's CA, for the whole admission table
(:mod:`bertjob_testing.admission_cases`).

The emulator: what is tested is the operator's HTTPS endpoint itself, sent AdmissionReviews that a
real API server never sends (malformed ones, a spec of the wrong shape, which its schema refuses
before any webhook); tests/cluster/test_operator.py has the real server call the webhook over TLS
for the same table."""

from __future__ import annotations

import http.client
import json
import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml
from kubernetes.client import CoreV1Api

from bertjob import certificates
from bertjob.admission import ADDRESS_ENV, CERT_DIR_ENV, PORT_ENV, REFUSED_CODE, WEBHOOK_ID
from bertjob_api.contract import GROUP, JOB_FILE, KIND, PLURAL, VERSION
from bertjob_api.validation import KUEUE_TRAINJOB_UNTESTED
from bertjob_testing.admission_cases import CHANGE_CASES, JOB_CASES
from bertjob_testing.jobs import valid_job, with_value
from bertjob_testing.kube_emulator import Cluster, cluster_crds, free_port, running_cluster

pytestmark = pytest.mark.timeout(180)


def _certificates(directory: Path) -> Path:
    """A CA (returned, as ca.crt) and a server certificate for localhost and 127.0.0.1 signed by
    it (tls.crt, tls.key), as the chart's genSignedCert or cert-manager would mount them: the
    operator's own maker (bertjob.certificates), which the progress endpoint serves with."""
    made = certificates.make(["localhost", "127.0.0.1"], days=1)
    for name, text in (
        (certificates.CA_KEY, made.ca),
        (certificates.CERT_KEY, made.cert),
        (certificates.PRIVATE_KEY, made.key),
    ):
        (directory / name).write_text(text)
    return directory / certificates.CA_KEY


@attrs.define
class Webhook:
    """The operator's webhook server, and a client of it that trusts the test's CA only."""

    cluster: Cluster
    port: int
    context: ssl.SSLContext

    def post(self, body: bytes, path: str = f"/{WEBHOOK_ID}") -> tuple[int, bytes]:
        """POST ``body`` as JSON; the HTTP status and the answer's body."""
        connection = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=10)
        try:
            connection.request("POST", path, body, {"Content-Type": "application/json"})
            answer = connection.getresponse()
            return answer.status, answer.read()
        finally:
            connection.close()

    def review(self, operation: str, obj: Any, old: Any = None, **request: Any) -> dict[str, Any]:
        """Send an AdmissionReview v1 request as the API server does and return its response."""
        review = admission_review(operation, obj, old, **request)
        status, body = self.post(json.dumps(review).encode())
        assert status == 200, body
        answer = json.loads(body)
        assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
        assert answer["response"]["uid"] == review["request"]["uid"]
        return dict(answer["response"])

    def answers(self) -> bool:
        """Whether the server completes a TLS handshake and answers an AdmissionReview."""
        try:
            return self.review("CREATE", {"metadata": {"name": "probe"}, "spec": {}})["uid"] != ""
        except OSError:
            return False


def admission_review(operation: str, obj: Any, old: Any = None, **request: Any) -> dict[str, Any]:
    """An AdmissionReview v1 request for a BertPretrainJob, as kube-apiserver sends it."""
    meta = (obj or old or {}).get("metadata") or {}
    resource = {"group": GROUP, "version": VERSION, "resource": PLURAL}
    kind = {"group": GROUP, "version": VERSION, "kind": KIND}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": kind,
            "resource": resource,
            "requestKind": kind,
            "requestResource": resource,
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "operation": operation,
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
            "object": obj,
            "oldObject": old,
            "dryRun": False,
            **request,
        },
    }


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    """The operator with its webhook on, as the chart's Deployment runs it."""
    certs = tmp_path_factory.mktemp("webhook-certs")
    context = ssl.create_default_context(cafile=str(_certificates(certs)))
    port = free_port()
    with pytest.MonkeyPatch.context() as env:
        env.setenv(CERT_DIR_ENV, str(certs))
        env.setenv(PORT_ENV, str(port))
        env.setenv(ADDRESS_ENV, "127.0.0.1")
        with running_cluster(tmp_path_factory.mktemp("webhook"), cluster_crds()) as cluster:
            served = Webhook(cluster, port, context)
            # kopf opens the port once it has scanned the cluster's resources, after liveness.
            cluster.wait_for("the webhook's port", served.answers)
            yield served


def _assert_decided(response: dict[str, Any], case: dict[str, Any]) -> None:
    if case["allowed"]:
        assert response["allowed"] is True, response
        return
    assert response["allowed"] is False, response
    assert response["status"]["code"] == REFUSED_CODE
    message = response["status"]["message"]
    for field in case["fields"]:
        assert f"{field}: " in message, (field, message)


@pytest.mark.parametrize("case", JOB_CASES, ids=[case["id"] for case in JOB_CASES])
def test_a_created_job_is_allowed_or_refused_naming_each_field(
    webhook: Webhook, case: dict[str, Any]
) -> None:
    _assert_decided(webhook.review("CREATE", case["document"]), case)


@pytest.mark.parametrize("case", CHANGE_CASES, ids=[case["id"] for case in CHANGE_CASES])
def test_a_change_is_allowed_where_the_operator_applies_it(webhook: Webhook, case: dict[str, Any]) -> None:
    if case["accepted"] is not None:
        # The ConfigMap the operator rendered the children from, which the webhook compares with.
        meta = case["old"]["metadata"]
        config_map = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": case["old"]["status"]["configMap"], "namespace": meta["namespace"]},
            "data": {JOB_FILE: yaml.safe_dump(case["accepted"])},
        }
        CoreV1Api(webhook.cluster.api).create_namespaced_config_map(meta["namespace"], config_map)
    _assert_decided(webhook.review("UPDATE", case["new"], case["old"]), case)


@pytest.mark.parametrize(
    "launcher, warnings",
    [("trainjob", [f"spec.queueName: {KUEUE_TRAINJOB_UNTESTED}"]), ("pytorchjob", None)],
)
def test_a_queued_trainjob_is_allowed_with_a_warning_for_kubectl(
    webhook: Webhook, launcher: str, warnings: list[str] | None
) -> None:
    """The AdmissionReview's response.warnings, which kubectl apply prints as "Warning: ...":
    Kueue v0.17 to v0.19 queue no Trainer v2.3 TrainJob (docs/launchers.md)."""
    document = with_value(with_value(valid_job(), "spec.launcher", launcher), "spec.queueName", "team-a")
    response = webhook.review("CREATE", document)
    assert response["allowed"] is True, response
    assert response.get("warnings") == warnings


def test_a_refused_change_set_back_is_refused_without_the_accepted_spec(webhook: Webhook) -> None:
    """The case above passes because the webhook reads the ConfigMap: compared with the stored
    object alone, setting the image back looks like an image change."""
    [case] = [case for case in CHANGE_CASES if case["id"] == "refused-change-set-back"]
    old = json.loads(json.dumps(case["old"]))
    old["metadata"]["name"] = old["status"]["configMap"] = "reverted-without-config-map"
    new = {**case["new"], "metadata": old["metadata"]}
    response = webhook.review("UPDATE", new, old)
    assert response["allowed"] is False and "spec.image: " in response["status"]["message"]


def test_the_status_subresource_is_not_judged(webhook: Webhook) -> None:
    """A status write (the operator's, the trainer's progress) passes whatever the spec holds:
    the handler is for the main resource only, as the chart's rules route it."""
    [case] = [case for case in CHANGE_CASES if case["id"] == "image-changed-with-children"]
    response = webhook.review("UPDATE", case["new"], case["old"], subResource="status")
    assert response["allowed"] is True


@pytest.mark.parametrize(
    "body, status",
    [
        (b"{not json", 400),
        (json.dumps(admission_review("CREATE", None)).encode(), 400),
        (json.dumps(admission_review("CREATE", {"spec": {}}, userInfo=None)).encode(), 400),
        (
            json.dumps(
                admission_review(
                    "CREATE", {"spec": {}}, resource={"group": "x", "version": "v1", "resource": "ys"}
                )
            ).encode(),
            404,
        ),
    ],
    ids=["not-json", "no-object", "no-user", "another-resource"],
)
def test_a_malformed_request_is_answered_and_the_operator_serves_on(
    webhook: Webhook, body: bytes, status: int
) -> None:
    assert webhook.post(body)[0] == status
    assert webhook.cluster.operator is not None and webhook.cluster.operator.poll() is None
    assert webhook.review("CREATE", JOB_CASES[0]["document"])["allowed"] is True


@pytest.mark.parametrize("spec", ["a string", ["a", "list"], None, {"phases": "many"}])
def test_a_spec_of_the_wrong_shape_is_refused_naming_it(webhook: Webhook, spec: Any) -> None:
    document = {**JOB_CASES[0]["document"], "spec": spec}
    response = webhook.review("CREATE", document)
    assert response["allowed"] is False and response["status"]["code"] == REFUSED_CODE
    assert "spec" in response["status"]["message"]
