"""The operator as the chart runs it, on the real node: its image (built by hack/build-images.sh, as
tests/images builds it) imported into containerd with no registry, the chart's Deployment's pod
running it with in-cluster configuration and its ServiceAccount's mounted token, and the API server
calling its webhook through the chart's Service and the pod's endpoint (no ExternalName rewrite):
a job only the webhook refuses is refused at ``kubectl apply``, also at every moment of a
``helm upgrade`` that rolls both replicas; with the Deployment scaled to 0, the chart's
``failurePolicy: Fail`` refuses every job.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from typing import Any

import pytest

from bertjob_testing.admission_cases import JOB_CASES
from bertjob_testing.cluster.node import RealNode
from bertjob_testing.cluster.operator import CHART, NAMESPACE, OPERATOR, RELEASE, helm, is_paused, wait_until
from bertjob_testing.jobs import valid_job, with_value
from tests.node.conftest import ROLLOUT_S, rollout

WEBHOOK_DENIED = 'admission webhook "bertpretrainjobs.bertjob.dev" denied the request'
UNREACHABLE = 'failed calling webhook "bertpretrainjobs.bertjob.dev"'
# Jobs the CRD's schema and CEL rules let through and only the webhook refuses, and the field each
# refusal names: a checkpoint on no writable volume; the local example, whose volumes are this
# machine's directories.
WEBHOOK_ONLY = {
    "checkpoint-on-no-volume": (
        with_value(valid_job(), "spec.checkpoint.path", "/ckpt"),
        "spec.checkpoint.path",
    ),
    "the-local-example": (
        next(case for case in JOB_CASES if case["id"] == "example-bert-tiny-local")["document"],
        next(case for case in JOB_CASES if case["id"] == "example-bert-tiny-local")["fields"][0],
    ),
}


def apply(node: RealNode, document: dict[str, Any], namespace: str) -> subprocess.CompletedProcess[str]:
    """``kubectl apply`` of a job in ``namespace`` (whatever namespace it names), not checked."""
    document = {**document, "metadata": {**document["metadata"], "namespace": namespace}}
    return node.plane.kubectl("apply", "-f", "-", input=json.dumps(document), check=False)


def _operator_pods(node: RealNode) -> list[dict[str, Any]]:
    pods = node.plane.kubectl.get("pods", "-n", NAMESPACE)["items"]
    # Not those on their way out (a rolling update's old pods while they stop).
    return [
        p
        for p in pods
        if p["metadata"]["name"].startswith(OPERATOR) and not p["metadata"].get("deletionTimestamp")
    ]


def test_the_operator_runs_from_its_image_on_the_real_node(chart_on_node: RealNode) -> None:
    pods = _operator_pods(chart_on_node)
    assert len(pods) == 2, "the chart's two replicas"
    for pod in pods:
        assert pod["spec"]["nodeName"] == chart_on_node.name
        assert pod["status"]["phase"] == "Running"
        [status] = pod["status"]["containerStatuses"]
        assert status["ready"] and status["containerID"].startswith("containerd://")

    # One reconciles, the other has paused for it (kopf's peering: bertjob.replicas), once each
    # has seen the other's record.
    def logs() -> list[str]:
        kubectl = chart_on_node.plane.kubectl
        return [kubectl("logs", pod["metadata"]["name"], "-n", NAMESPACE).stdout for pod in pods]

    wait_until(
        "one replica to reconcile and the other to pause for it",
        lambda: [is_paused(log) for log in logs()].count(False) == 1 or None,
        wait_s=60,
    )
    assert [is_paused(log) for log in logs()].count(True) == 1, logs()


def test_a_bad_job_is_refused_at_every_moment_of_a_helm_upgrade(
    chart_on_node: RealNode, namespace: str
) -> None:
    plane = chart_on_node.plane
    secret = f"{OPERATOR}-webhook-tls"
    before = plane.kubectl.get("secret", secret, "-n", NAMESPACE)["data"]
    old_pods = {pod["metadata"]["name"] for pod in _operator_pods(chart_on_node)}
    document, field = WEBHOOK_ONLY["checkpoint-on-no-volume"]
    answers: list[str] = []
    upgraded = threading.Event()

    def apply_until_upgraded() -> None:
        # Server-side dry runs: the webhook answers each, nothing is stored.
        while not upgraded.is_set() or len(answers) < 5:
            document_in = {**document, "metadata": {**document["metadata"], "namespace": namespace}}
            result = plane.kubectl(
                "apply", "--dry-run=server", "-f", "-", input=json.dumps(document_in), check=False
            )
            answers.append(result.stderr if result.returncode else "stored")

    thread = threading.Thread(target=apply_until_upgraded)
    thread.start()
    try:
        # A new pod template: the Deployment rolls both replicas, one at a time.
        helm(
            plane,
            "upgrade",
            RELEASE,
            str(CHART),
            f"--namespace={NAMESPACE}",
            "--reuse-values",
            f"--set-string=podAnnotations.upgraded={time.time_ns()}",
            "--wait",
            f"--timeout={ROLLOUT_S}s",
        )
        rollout(chart_on_node)
    finally:
        upgraded.set()
        thread.join(timeout=120)
    assert not old_pods & {pod["metadata"]["name"] for pod in _operator_pods(chart_on_node)}, "no rollout"
    refused = [answer for answer in answers if WEBHOOK_DENIED in answer and field in answer]
    assert len(refused) == len(answers) >= 5, [a for a in answers if a not in refused][:3]
    print(f"\n{len(answers)} applies during the upgrade, each refused by the webhook")
    # The chart's own certificate is kept through the upgrade (its lookup), so the CA the API server
    # holds still verifies the new pods.
    assert plane.kubectl.get("secret", secret, "-n", NAMESPACE)["data"] == before


@pytest.mark.parametrize("case", sorted(WEBHOOK_ONLY))
def test_the_webhook_in_the_pod_refuses_a_bad_job_at_apply(
    chart_on_node: RealNode, namespace: str, case: str
) -> None:
    document, field = WEBHOOK_ONLY[case]
    refused = apply(chart_on_node, document, namespace)
    assert refused.returncode != 0, f"{case} was stored"
    assert WEBHOOK_DENIED in refused.stderr and field in refused.stderr, refused.stderr


def test_with_no_operator_pod_the_charts_failure_policy_refuses_every_job(
    chart_on_node: RealNode, namespace: str
) -> None:
    plane = chart_on_node.plane
    plane.kubectl("scale", f"deployment/{OPERATOR}", "-n", NAMESPACE, "--replicas=0")
    try:
        plane.kubectl(
            "wait",
            "--for=delete",
            "pod",
            "-l",
            "app.kubernetes.io/name=bertjob",
            "-n",
            NAMESPACE,
            "--timeout=60s",
            check=False,
            timeout_s=70,
        )
        refused = apply(chart_on_node, valid_job(), namespace)
        assert refused.returncode != 0 and UNREACHABLE in refused.stderr, refused.stderr
    finally:
        plane.kubectl("scale", f"deployment/{OPERATOR}", "-n", NAMESPACE, "--replicas=2")
        rollout(chart_on_node)
    allowed = apply(chart_on_node, valid_job(), namespace)
    assert allowed.returncode == 0, allowed.stderr


def test_the_metrics_endpoint_answers_through_its_service(chart_on_node: RealNode) -> None:
    # The API server's service proxy dials one of the Service's endpoints: the pod, on the node.
    path = f"/api/v1/namespaces/{NAMESPACE}/services/{OPERATOR}-metrics:metrics/proxy/metrics"
    metrics = chart_on_node.plane.kubectl("get", "--raw", path).stdout
    assert "# TYPE bertjob_reconcile_duration_seconds histogram" in metrics, metrics[:2000]
