"""The whole chain on the real node, as a platform team runs it: the chart's operator pod, the real
training-operator, and the Xeon trainer image in real pods.

``examples/bert-tiny-cluster.yaml`` is applied as its file says (its claim bound to a hostPath
PersistentVolume on the node, the node's toleration and hostname added, as a cluster's
administrator would add them for a tainted pool): the operator renders the PyTorchJob,
training-operator makes the Master pod, the kubelet runs the trainer image, which builds the shards
from its own Python documentation, trains both phases and writes the Hugging Face export to the
volume; the job ends Succeeded. The progress that ``kubectl get bertpretrainjobs`` showed was sent
by the trainer pod to the operator's progress endpoint (through its Service and CoreDNS, with the
pod's projected token) and written by the operator: the API server's audit log names who patched
the status, and no job has RBAC of its own. ``kubectl logs`` on the Master pod shows the trainer's
own lines.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from bertjob_api.jobfile import load_job
from bertjob_api.validation import cluster_job
from bertjob_testing.cluster.node import TOLERATION, RealNode
from bertjob_testing.cluster.operator import NAMESPACE, OPERATOR
from bertjob_testing.jobs import EXAMPLES
from tests.images.buildah_images import Built

EXAMPLE = EXAMPLES / "bert-tiny-cluster.yaml"
CLAIM = EXAMPLES / "storage" / "bert-tiny-data.yaml"
# The trainer image's user, who must be able to write the hostPath volume (a hostPath volume's
# ownership is not changed for the pod's fsGroup, as a provisioned volume's is).
TRAINER_UID = 10001
CONTAINER = "pytorch"
# The example's whole run took 38 s on 2 cores in the controllers tier, run as a process of this
# machine; here the same 2 cores also carry the node, the controllers and the operator's pod.
RUN_S = 900
PLURAL = "bertpretrainjobs"


def volume_for_claim(node: RealNode, namespace: str, claim: str) -> Path:
    """A hostPath PersistentVolume on ``node`` bound to claim ``namespace/claim`` (the cluster has no
    StorageClass, as one without a provisioner); its directory on this machine."""
    directory = node.workdir / "volumes" / namespace / claim
    directory.mkdir(parents=True)
    os.chown(directory, TRAINER_UID, TRAINER_UID)
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{namespace}-{claim}"},
        "spec": {
            "capacity": {"storage": "5Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": str(directory), "type": "Directory"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }
    node.plane.kubectl.apply(volume)
    return directory


def on_node(document: dict[str, Any], node: RealNode) -> dict[str, Any]:
    """``document`` (a BertPretrainJob) with its pods tolerating the node's taint and placed there."""
    pod = document["spec"].setdefault("pod", {})
    pod["tolerations"] = [*pod.get("tolerations", []), TOLERATION]
    pod["nodeSelector"] = {**pod.get("nodeSelector", {}), "kubernetes.io/hostname": node.name}
    return document


def follow(
    node: RealNode, name: str, namespace: str, wait_s: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Poll job ``namespace/name`` until it ends (Succeeded or Failed); its last status and every
    distinct ``status.progress`` seen on the way."""
    deadline = time.monotonic() + wait_s
    seen: list[dict[str, Any]] = []
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = (node.plane.kubectl.get(PLURAL, name, "-n", namespace) or {}).get("status") or {}
        progress = status.get("progress")
        if progress and progress not in seen:
            seen.append(progress)
        if status.get("phase") in ("Succeeded", "Failed"):
            return status, seen
        time.sleep(1)
    raise AssertionError(f"job {namespace}/{name} did not end in {wait_s:.0f} s: {json.dumps(status)}")


def mlm_losses(output: str, phase: int) -> list[float]:
    """The masked-LM losses of phase ``phase``'s logged steps in the trainer's ``output``."""
    return [float(v) for v in re.findall(rf"phase {phase}/2 step \d+/\d+ loss .*?\(mlm ([\d.]+)", output)]


def master_pod(node: RealNode, name: str, namespace: str) -> dict[str, Any]:
    """The job's Master pod (``<name>-master-0``)."""
    pod = node.plane.kubectl.get("pod", f"{name}-master-0", "-n", namespace)
    assert pod is not None, f"no pod {name}-master-0 in {namespace}"
    return pod


@pytest.mark.slow
def test_the_cluster_example_trains_on_the_node_and_reports_through_the_operator(
    chart_on_node: RealNode,
    controllers_on_node: object,
    trainer_on_node: Built,
    namespace: str,
) -> None:
    node = chart_on_node
    kubectl = node.plane.kubectl
    name = "bert-tiny-cluster"
    data = volume_for_claim(node, namespace, "bert-tiny-data")
    kubectl("apply", "-n", namespace, "-f", str(CLAIM))
    document = on_node(yaml.safe_load(EXAMPLE.read_text()), node)
    assert document["spec"]["image"] == trainer_on_node.name, "the example runs the image built here"
    kubectl.apply(document, "-n", namespace)
    node.wait_for_pod(f"{name}-master-0", namespace, ("Running", "Succeeded", "Failed"), wait_s=180)

    status, progress = follow(node, name, namespace, RUN_S)
    output = kubectl("logs", f"{name}-master-0", "-c", CONTAINER, "-n", namespace, check=False).stdout
    assert status["phase"] == "Succeeded", f"{json.dumps(status)}\n{output[-4000:]}"

    # kubectl logs: the trainer's own lines, one per logged step with its rate, no progress bar.
    assert "world size 1" in output
    steps = [line for line in output.splitlines() if re.match(r"phase \d/2 step \d+/\d+ loss ", line)]
    spec = cluster_job(load_job(EXAMPLE)).spec
    assert spec.phases[0].steps and spec.logging.path and spec.export.path, "the example sets them"
    assert (
        len([s for s in steps if s.startswith("phase 1/2")])
        == spec.phases[0].steps // spec.logging.every_steps
    )
    assert all(" seq/s " in line for line in steps), steps
    assert "\r" not in output, "a carriage-return progress bar in kubectl logs"
    first, second = mlm_losses(output, 1), mlm_losses(output, 2)
    assert first[-1] < first[0] - 1.0, f"phase 1's masked-LM loss did not fall: {first}"
    assert second, output[-4000:]

    # Who sent the progress, and what kubectl showed of it, live: the operator wrote what the
    # trainer pod reported to it; the pod's own account wrote nothing and holds no Role.
    master = master_pod(node, name, namespace)
    assert master["spec"]["nodeName"] == node.name
    trainer = f"system:serviceaccount:{namespace}:{master['spec'].get('serviceAccountName', 'default')}"
    operator = f"system:serviceaccount:{NAMESPACE}:{OPERATOR}"
    patches = node.plane.audited_changes(PLURAL, namespace, name, subresource="status")
    reported = [p for p in patches if "progress" in p["requestObject"].get("status", {})]
    said = [line for line in output.splitlines() if "progress" in line and "report" in line]
    assert reported, (
        f"no progress reached {namespace}/{name}'s status (patches by "
        f"{sorted({p['user']['username'] for p in patches})}); the trainer said: {said}"
    )
    assert {p["user"]["username"] for p in reported} == {operator}, reported
    assert not [p for p in patches if p["user"]["username"] == trainer]
    assert not kubectl.get("roles", "-n", namespace)["items"]
    assert len(progress) >= 2 and progress[-1]["step"] == progress[-1]["totalSteps"], progress

    # The export and the logs, on the volume; the export loads in transformers.
    import transformers  # the dev environment's; slow to import, so only here

    assert (data / Path(spec.logging.path).relative_to("/data") / "train.jsonl").is_file()
    export = data / Path(spec.export.path).relative_to("/data")
    for file in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json"):
        assert (export / file).is_file(), f"{file} is not in the export {export}"
    model = transformers.BertForMaskedLM.from_pretrained(export)
    tokenizer = transformers.AutoTokenizer.from_pretrained(export)
    logits = model(**tokenizer("the python documentation", return_tensors="pt")).logits
    assert logits.shape[-1] == model.config.vocab_size
