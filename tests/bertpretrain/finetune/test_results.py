"""Fine-tuning results: a task's summary over seeds and inits, its status.results entry (checked
against the CRD's schema, and landing in the job's status through the API emulator beside the
trainer's progress), finetune.json and the log lines."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

import pytest

from bertjob_api.contract import FINETUNE_RESULTS
from bertjob_api.crd import resource_schema
from bertjob_api.defaults import with_defaults
from bertjob_api.spec import parse_job
from bertjob_testing.jobs import valid_job, with_value
from bertpretrain.finetune import results
from bertpretrain.finetune.task_files import TaskFiles
from bertpretrain.finetune.train import RunResult
from bertpretrain.training.progress import StatusReporter
from tests.bertpretrain.training.test_progress import Recorder
from tests.k8s_schema import assert_valid

TASK = {
    "name": "mrpc",
    "type": "classification",
    "train": "/d/train.tsv",
    "validation": "/d/dev.tsv",
    "metrics": ["f1", "accuracy"],
    "seeds": 3,
    "baseline": True,
}


def _summary() -> dict[str, Any]:
    spec = with_defaults(parse_job(with_value(valid_job(), "spec.finetune", [TASK])).spec)
    runs = [
        RunResult(
            "pretrained", 1, {"f1": 0.80, "accuracy": 0.70}, 10, 1.0, 0.3, [{"row": 2, "prediction": "1"}]
        ),
        RunResult("pretrained", 2, {"f1": 0.90, "accuracy": 0.75}, 10, 1.0, 0.2),
        RunResult("pretrained", 3, {"f1": 0.60, "accuracy": 0.72}, 10, 1.0, math.nan),
        RunResult("random", 1, {"f1": 0.50, "accuracy": 0.60}, 10, 1.0, 0.6),
        RunResult("random", 2, {"f1": 0.40, "accuracy": 0.55}, 10, 1.0, 0.6),
        RunResult("random", 3, {"f1": 0.30, "accuracy": 0.65}, 10, 1.0, 0.6),
    ]
    files = TaskFiles(Path("/d/train.tsv"), Path("/d/dev.tsv"), "auto")
    return results.task_summary(spec.finetune[0], runs, files, Path("/ckpt/hf"))


def test_the_summary_holds_median_and_best_per_init() -> None:
    summary = _summary()
    assert summary["summary"]["pretrained"]["f1"]["median"] == 0.80
    assert summary["summary"]["pretrained"]["f1"]["best"] == 0.90
    assert summary["summary"]["pretrained"]["accuracy"]["median"] == 0.72
    assert summary["summary"]["random"]["f1"]["median"] == 0.40
    # Predictions go to their own files, not into finetune.json.
    assert all("predictions" not in run for run in summary["runs"])


def test_the_status_entry_is_the_headline_metric_and_fits_the_crd() -> None:
    entry = results.status_entry(_summary())
    assert entry == {
        "task": "mrpc",
        "metric": "f1",
        "median": 0.8,
        "best": 0.9,
        "seeds": 3,
        "metrics": {"f1": 0.8, "accuracy": 0.72},
        "baseline": 0.4,
        "summary": "mrpc f1 0.8000 (median of 3), random init 0.4000",
    }
    assert_valid({"results": [entry]}, resource_schema()["properties"]["status"])


def test_results_are_reported_to_the_operator_as_the_status_field(tmp_path: Path) -> None:
    server = Recorder()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        (tmp_path / "progress-url").write_text(server.url)
        (tmp_path / "token").write_text("a-pods-token")
        reporter = StatusReporter.from_environment(1, tmp_path, tmp_path)
        assert reporter is not None
        assert reporter.send_status({"results": [results.status_entry(_summary())]})
    finally:
        server.shutdown()
        server.server_close()
    [(_, _, body)] = server.requests
    assert [(entry["task"], entry["median"]) for entry in body["results"]] == [("mrpc", 0.8)]
    # What the operator's endpoint takes (bertjob.progress.parse): the CRD's status schema.
    assert_valid(body, resource_schema()["properties"]["status"])


def test_outside_a_cluster_nothing_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "x")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    assert results.report([_summary()]) is False


def test_finetune_json_holds_every_task_and_a_diverged_loss_as_null(tmp_path: Path) -> None:
    summary = _summary()
    path = results.write(tmp_path, [summary])
    assert path == tmp_path / FINETUNE_RESULTS
    data = json.loads(path.read_text())
    assert [task["task"] for task in data["tasks"]] == ["mrpc"]
    assert data["tasks"][0]["runs"][2]["final_loss"] is None
    assert not [entry for entry in tmp_path.iterdir() if entry.name.startswith(".")]  # no temporary left


def test_the_log_compares_pretrained_with_random_weights() -> None:
    summary = _summary()
    assert results.compare([summary]) == [
        "mrpc f1: pretrained 0.8000, random init 0.4000 (median of 3 seeds)",
        "mrpc accuracy: pretrained 0.7200, random init 0.6000 (median of 3 seeds)",
    ]
    lines = results.describe(summary)
    assert lines[0] == "finetune mrpc pretrained seed 1: f1 0.8000 accuracy 0.7000 (10 steps in 1.0 s)"
    assert lines[-1].startswith("finetune mrpc random: median of 3 seed(s): f1 0.4000 (best 0.5000)")
