"""Job documents shared by the tests: a valid one, and a way to vary it."""

from __future__ import annotations

import copy
from pathlib import Path
from pydoc_data.topics import topics
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
# Text that would become structure if pasted into YAML, a jinja2 template or a shell line; a job
# must carry each verbatim as a string (tests/bertjob/test_render.py, test_fuzz.py).
INJECTIONS = [
    "x\n  evil: true",
    "{{ 7*7 }}",
    "{% raw %}x{% endraw %}",
    "!!python/object/apply:os.system ['true']",
    '"; kind: Secret\n---\napiVersion: v1',
    "${HOME} $(id) `id`",
]


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
                {
                    "maxSeqLength": 128,
                    "maxPredictionsPerSeq": 20,
                    "globalBatchSize": 64,
                    "learningRate": 0.006,
                    "steps": 100,
                },
                {
                    "maxSeqLength": 512,
                    "maxPredictionsPerSeq": 80,
                    "globalBatchSize": 32,
                    "learningRate": 0.004,
                    "steps": 20,
                },
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


def small_training_job(tmp_path: Path, processes: int = 1, **data: Any) -> dict[str, Any]:
    """A two-phase CPU job on real text (40 topics of the language reference, written to
    ``tmp_path/corpus``) that trains in seconds; ``data`` adds fields to ``spec.data``."""
    corpus = tmp_path / "corpus"
    corpus.mkdir(exist_ok=True)
    for name in sorted(topics)[:40]:
        (corpus / f"{name}.txt").write_text(topics[name], encoding="utf-8")
    document = valid_job()
    changes = {
        "spec.accelerator": "xeon-cpu",
        "spec.precision": "fp32",
        "spec.topology": {"nodes": 1, "processesPerNode": processes},
        "spec.model": {"preset": "bert-tiny", "numHiddenLayers": 1},
        "spec.data": {
            "sources": [{"path": str(corpus), "format": "text"}],
            "shards": str(tmp_path / "data"),
            "vocab": {"trainSize": 600},
            "numShards": 2,
            "workers": 1,
            **data,
        },
        "spec.phases": [
            {
                "maxSeqLength": 64,
                "maxPredictionsPerSeq": 10,
                "globalBatchSize": 16,
                "microBatchSize": 4,
                "learningRate": 0.01,
                "warmupProportion": 0.1,
                "steps": 30,
            },
            {
                "maxSeqLength": 128,
                "maxPredictionsPerSeq": 20,
                "globalBatchSize": 8,
                "learningRate": 0.004,
                "steps": 4,
            },
        ],
        "spec.checkpoint": {"path": str(tmp_path / "checkpoints"), "everySteps": 10, "keep": 2},
        "spec.logging": {"everySteps": 5},
    }
    for field, value in changes.items():
        document = with_value(document, field, value)
    return document
