"""Faults, for real, on the real node: a training pod deleted mid-phase gets SIGTERM from the kubelet,
saves a checkpoint and exits 143; training-operator makes it again and the new pod resumes from
that checkpoint. A trainer that exits 1 (a corpus that is not there) fails the job, and the job's
message names the pod and its exit code.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from typing import Any

import pytest
import yaml

from bertjob_api.contract import EXIT_FAILURE, EXIT_PREEMPTED
from bertjob_testing.cluster.node import RealNode
from bertjob_testing.cluster.operator import wait_until
from tests.images.buildah_images import Built
from tests.node.test_training import CLAIM, CONTAINER, EXAMPLE, follow, on_node, volume_for_claim

pytestmark = pytest.mark.slow

RUN_S = 900


def job(node: RealNode, namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    """The cluster example named ``name``, ``spec``'s fields replacing the example's, placed on
    ``node``, with its claim and volume."""
    volume_for_claim(node, namespace, "bert-tiny-data")
    node.plane.kubectl("apply", "-n", namespace, "-f", str(CLAIM))
    document = yaml.safe_load(EXAMPLE.read_text())
    document["metadata"]["name"] = name
    document["spec"] |= spec
    return on_node(document, node)


def json_stream(text: str) -> list[dict[str, Any]]:
    """The JSON documents of ``text``, one after another (``kubectl get --watch -o json``); a last
    one cut short (the watch stopped mid-write) is left out."""
    decoder, found, at = json.JSONDecoder(), [], 0
    text = text.strip()
    while at < len(text):
        try:
            document, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            break
        found.append(document)
        while at < len(text) and text[at].isspace():
            at += 1
    return found


def pod_uid(node: RealNode, name: str, namespace: str) -> str | None:
    found = node.plane.kubectl.get("pod", name, "-n", namespace)
    return found["metadata"]["uid"] if found else None


def test_a_deleted_training_pod_checkpoints_and_its_replacement_resumes(
    chart_on_node: RealNode, controllers_on_node: object, trainer_on_node: Built, namespace: str
) -> None:
    node, kubectl = chart_on_node, chart_on_node.plane.kubectl
    name = "preempted"
    example = yaml.safe_load(EXAMPLE.read_text())["spec"]
    # A first phase long enough to be deleted in, logged often; no checkpoint of its own before
    # the SIGTERM one, so the resumed step can only come from that.
    first = {**example["phases"][0], "steps": 400}
    document = job(
        node,
        namespace,
        name,
        phases=[first, example["phases"][1]],
        checkpoint={**example["checkpoint"], "path": f"/data/checkpoints/{name}", "everySteps": 10_000},
        logging={"everySteps": 5},
    )
    kubectl.apply(document, "-n", namespace)
    pod = f"{name}-master-0"
    node.wait_for_pod(pod, namespace, wait_s=180)
    first_uid = pod_uid(node, pod, namespace)

    def training() -> bool:
        output = kubectl("logs", pod, "-c", CONTAINER, "-n", namespace, check=False).stdout
        return re.search(r"^phase 1/2 step (1[5-9]|[2-9]\d)/400 ", output, re.M) is not None

    wait_until("phase 1 to pass step 15", training, 300)
    # Follow the pod's status and log as it ends: it is gone once the kubelet reports it ended.
    watch = subprocess.Popen(
        kubectl.argv("get", "pod", pod, "-n", namespace, "--watch", "--output-watch-events", "-o", "json"),
        stdout=subprocess.PIPE,
        text=True,
    )
    log = subprocess.Popen(
        kubectl.argv("logs", "--follow", pod, "-c", CONTAINER, "-n", namespace),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        kubectl("delete", "pod", pod, "-n", namespace, "--wait=true", timeout_s=120)
        stopped, _ = log.communicate(timeout=60)
        time.sleep(2)  # the watch's last events (the pod's end, its deletion) written out
    finally:
        watch.terminate()
        log.kill()
    events, _ = watch.communicate(timeout=30)
    codes = [
        status["state"]["terminated"]["exitCode"]
        for event in json_stream(events)
        for status in (event["object"].get("status") or {}).get("containerStatuses") or []
        if (status.get("state") or {}).get("terminated")
    ]
    saved = re.search(r"SIGTERM received: stopped after step (\d+), saved (\S+\.pt)", stopped)
    assert saved, f"the deleted pod's trainer saved no checkpoint on SIGTERM:\n{stopped[-3000:]}"
    assert EXIT_PREEMPTED in codes, f"the trainer's exit codes as the kubelet reported them: {codes}"

    wait_until(
        "training-operator to make the pod again",
        lambda: pod_uid(node, pod, namespace) not in (None, first_uid),
        120,
    )
    status, _ = follow(node, name, namespace, RUN_S)
    output = kubectl("logs", pod, "-c", CONTAINER, "-n", namespace, check=False).stdout
    assert status["phase"] == "Succeeded", f"{json.dumps(status)}\n{output[-3000:]}"
    step = int(saved.group(1))
    resumed = re.search(r"; from (\S+) at step (\d+)$", output, re.M)
    assert resumed and (resumed.group(1), int(resumed.group(2))) == (saved.group(2), step), (
        f"the new pod did not resume from {saved.group(2)} at step {step}:\n{output[:3000]}"
    )
    assert not re.search(r"^phase 1/2 step 5/400 ", output, re.M), "the new pod began phase 1 again"


def test_a_trainer_that_exits_1_fails_the_job_naming_the_pod_and_its_code(
    chart_on_node: RealNode, controllers_on_node: object, trainer_on_node: Built, namespace: str
) -> None:
    node = chart_on_node
    name = "no-corpus"
    example = yaml.safe_load(EXAMPLE.read_text())["spec"]
    missing = "/data/corpus/not-there.txt"
    document = job(
        node,
        namespace,
        name,
        data={**example["data"], "sources": [{"path": missing}], "shards": f"/data/shards/{name}"},
    )
    node.plane.kubectl.apply(document, "-n", namespace)
    status, _ = follow(node, name, namespace, 300)
    pod = f"{name}-master-0"
    output = node.plane.kubectl("logs", pod, "-c", CONTAINER, "-n", namespace, check=False).stdout
    assert status["phase"] == "Failed", json.dumps(status)
    message = " ".join(c.get("message", "") for c in status.get("conditions", []))
    assert pod in message and f"exited with code {EXIT_FAILURE}" in message, (
        f"{json.dumps(status)}\n{output[-2000:]}"
    )
    assert missing in output, output[-2000:]
