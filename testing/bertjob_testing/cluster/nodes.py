"""kwok's fake nodes: CPU nodes and nodes with NVIDIA GPUs and Habana Gaudis, on which pods run
and end as a test chooses (:data:`EXIT_CODE_ANNOTATION`). They serve what a real node cannot do on
demand or at scale here: accelerators, node loss, a thousand pods.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertjob_testing.cluster.build import source
from bertjob_testing.cluster.kubectl import Kubectl
from bertjob_testing.cluster.process import StartError, tail

# Annotating a running pod with this (value: an exit code) ends it: Succeeded for 0, else Failed
# with every container terminated with that code (pod-end-stage.yaml).
EXIT_CODE_ANNOTATION = "bertjob.dev/kwok-exit-code"
# kwok manages the nodes that carry this annotation, and only those.
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
READY_TIMEOUT_S = 120.0
# The fake nodes' allocatable.
NODES: dict[str, dict[str, str]] = {
    "cpu-0": {"cpu": "64", "memory": "512Gi", "pods": "110"},
    "cpu-1": {"cpu": "64", "memory": "512Gi", "pods": "110"},
    "gpu-0": {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"},
    "gpu-1": {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"},
    "gaudi-0": {"cpu": "96", "memory": "1Ti", "pods": "110", "habana.ai/gaudi": "8"},
    "gaudi-1": {"cpu": "96", "memory": "1Ti", "pods": "110", "habana.ai/gaudi": "8"},
}


def stages() -> str:
    """kwok's own stages that make fake nodes Ready, pods Running and deleted pods gone (from
    kwok's module at the pinned version), and ours that ends a pod with a chosen exit code."""
    kwok = source("kwok") / "kustomize" / "stage"
    files = [
        kwok / "node" / "fast" / "node-initialize.yaml",
        kwok / "pod" / "fast" / "pod-ready.yaml",
        kwok / "pod" / "fast" / "pod-delete.yaml",
        Path(__file__).with_name("pod-end-stage.yaml"),
    ]
    return "\n---\n".join(path.read_text() for path in files)


def node(name: str) -> dict[str, object]:
    """The Node object of fake node ``name`` (of :data:`NODES`)."""
    allocatable = NODES[name]
    accelerator = next((key for key in allocatable if "/" in key), "")
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_NODE_ANNOTATION: "fake"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **({"bertjob.dev/test-accelerator": accelerator.split("/")[0]} if accelerator else {}),
            },
        },
        "status": {"allocatable": allocatable, "capacity": allocatable},
    }


def is_ready(node: dict[str, Any]) -> bool:
    """Whether Node object ``node`` has the condition Ready=True."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def lift_not_ready_taint(kubectl: Kubectl, name: str) -> None:
    """Remove the not-ready taint the API server puts on a new node (TaintNodesByCondition): the
    node lifecycle controller, which would lift it, is not run (it would also need kwok's lease
    heartbeats to keep the fake nodes Ready)."""
    kubectl("taint", "node", name, "node.kubernetes.io/not-ready:NoSchedule-", check=False)


def add_nodes(kubectl: Kubectl, kwok_log: Path, names: Sequence[str] = tuple(NODES)) -> float:
    """Create the fake nodes ``names`` and wait until kwok has made them Ready; then lift the
    not-ready taint the API server puts on a new node. The seconds it took.

    Raises:
        StartError: not all Ready in :data:`READY_TIMEOUT_S` (the last lines of ``kwok_log``).
    """
    for name in names:
        kubectl("apply", "-f", "-", input=json.dumps(node(name)))
    started = time.monotonic()
    ready: list[str] = []
    while time.monotonic() - started < READY_TIMEOUT_S:
        listed = (kubectl.get("nodes") or {"items": []})["items"]
        ready = [
            found["metadata"]["name"]
            for found in listed
            if found["metadata"]["name"] in names and is_ready(found)
        ]
        if len(ready) == len(names):
            for name in names:
                lift_not_ready_taint(kubectl, name)
            return time.monotonic() - started
        time.sleep(0.2)
    raise StartError(f"kwok made {len(ready)} of {len(names)} nodes Ready:\n{tail(kwok_log)}")
