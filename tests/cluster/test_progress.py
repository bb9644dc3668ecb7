"""Progress reports through the operator, on the real API server: a trainer pod's projected
token, the operator's TokenReview and pod check under the chart's RBAC, and the status write that
``kubectl get bertpretrainjobs`` shows; the reports that must be refused are, and change nothing.

Why kwok: the pods only need to exist for the API server to bind tokens to them (TokenRequest with
a Pod as the bound object); the reports are sent from here with the trainer's own client, as its
rank 0 sends them (tests/node/test_training.py sends them from a real pod).
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from bertjob_api.contract import PLURAL, PROGRESS_AUDIENCE, PROGRESS_CA_KEY, PROGRESS_URL_KEY
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.operator import NAMESPACE, PROGRESS_SECRET, RealCluster, wait_until
from bertpretrain.training.progress import StatusReporter
from tests.bertjob.e2e import named_job
from tests.cluster.test_operator import _stand_in_for_the_training_operator, forbidden

pytestmark = pytest.mark.timeout(300)


def _token(plane: ControlPlane, namespace: str, pod: str, audience: str = PROGRESS_AUDIENCE) -> str:
    """A token of the namespace's default account bound to ``pod``, as the kubelet projects it."""
    wait_until(
        "the namespace's default account",
        lambda: plane.kubectl.get("serviceaccount", "default", "-n", namespace),
    )
    return plane.kubectl(
        "create",
        "token",
        "default",
        "-n",
        namespace,
        f"--audience={audience}",
        "--bound-object-kind=Pod",
        f"--bound-object-name={pod}",
        "--duration=10m",
    ).stdout.strip()


def _launched(plane: ControlPlane, namespace: str, name: str) -> list[str]:
    plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(named_job(name)))
    wait_until(f"{name}'s PyTorchJob", lambda: plane.kubectl.get("pytorchjob", name, "-n", namespace))
    return _stand_in_for_the_training_operator(plane, namespace, name)


def _post(url: str, ca: Path, token: str, body: bytes) -> int:
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30, context=ssl.create_default_context(cafile=str(ca))):
            return 202
    except urllib.error.HTTPError as error:
        return error.code


def test_a_trainers_progress_reaches_kubectl_get_and_another_jobs_pod_is_refused(
    operator: RealCluster, namespace: str, tmp_path: Path
) -> None:
    plane = operator.plane
    assert plane is not None
    pods, others = _launched(plane, namespace, "reporter"), _launched(plane, namespace, "other")
    config = plane.kubectl.get("configmap", "reporter-job", "-n", namespace)["data"]
    url, ca = config[PROGRESS_URL_KEY], tmp_path / "ca.crt"
    ca.write_text(config[PROGRESS_CA_KEY])
    token = tmp_path / "token"
    token.write_text(_token(plane, namespace, pods[0]))

    reporter = StatusReporter(url, total_steps=100, token_file=token, ca_file=ca, min_interval_s=0)
    assert reporter.report(1, 40, {"loss": 7.25, "sequences_per_second": 512.0})

    def progress() -> Any:
        return (plane.kubectl.get(PLURAL, "reporter", "-n", namespace).get("status") or {}).get("progress")

    shown = wait_until("the report in the job's status", lambda: (p := progress()) and p["step"] == 40 and p)
    assert (shown["phase"], shown["totalSteps"], shown["loss"]) == (1, 100, 7.25)
    table = plane.kubectl("get", PLURAL, "reporter", "-n", namespace).stdout
    assert "40" in table.splitlines()[1], table

    # Refused, and nothing written: a token of another job's pod, a token for the API server's
    # own audience, junk, NaN, a body over 64 KiB.
    body = json.dumps({"progress": {**shown, "step": 99}}).encode()
    assert _post(url, ca, _token(plane, namespace, others[0]), body) == 403
    assert (
        _post(url, ca, _token(plane, namespace, pods[0], audience="https://kubernetes.default.svc"), body)
        == 401
    )
    assert _post(url, ca, token.read_text(), b"{junk") == 400
    assert _post(url, ca, token.read_text(), body.replace(b'"loss": 7.25', b'"loss": NaN')) == 400
    assert _post(url, ca, token.read_text(), b" " * (65 * 1024)) == 413
    assert progress()["step"] == 40

    # The certificate the operator made and keeps, and no request its RBAC refused.
    secret = plane.kubectl.get("secret", PROGRESS_SECRET, "-n", NAMESPACE)
    assert base64.b64decode(secret["data"]["ca.crt"]).decode() == config[PROGRESS_CA_KEY]
    assert not forbidden(operator), "\n".join(forbidden(operator))
