"""Job documents shared by the tests: a valid one, and a way to vary it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def valid_job() -> dict[str, Any]:
    """A complete, valid BertPretrainJob document (two phases, one node)."""
    return {
        "apiVersion": "bertjob.dev/v1alpha1",
        "kind": "BertPretrainJob",
        "metadata": {"name": "demo"},
        "spec": {
            "image": "ghcr.io/bertjob/trainer:0.1.0",
            "topology": {"nodes": 1, "processesPerNode": 1},
            "data": {"sources": [{"path": "builtin:python-docs"}], "shards": "/data/shards"},
            "phases": [
                {"maxSeqLength": 128, "maxPredictionsPerSeq": 20, "globalBatchSize": 64,
                 "learningRate": 0.006, "steps": 100},
                {"maxSeqLength": 512, "maxPredictionsPerSeq": 80, "globalBatchSize": 32,
                 "learningRate": 0.004, "steps": 20},
            ],
            "checkpoint": {"path": "/data/checkpoints"},
        },
    }


def with_value(document: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``document`` with the field at ``dotted`` (``spec.phases.0.steps``) set;
    the sentinel ``DELETE`` removes it instead."""
    result = copy.deepcopy(document)
    *parents, last = dotted.split(".")
    node: Any = result
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value is DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return result


DELETE = object()


def example(name: str) -> dict[str, Any]:
    """An example job from ``examples/`` as a dict."""
    return yaml.safe_load((EXAMPLES / name).read_text())
