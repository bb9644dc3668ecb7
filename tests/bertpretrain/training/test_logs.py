"""The training log's DLLogger format: lines NVIDIA's parsers read, from a real (tiny) phase."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bertpretrain.training.checkpoint import read_checkpoint
from bertpretrain.training.logs import LOG_FILE, TrainingLog
from tests.bertpretrain.training.test_phase import train_phase

pytestmark = pytest.mark.usefixtures("one_thread")

# The keys of DLLogger's JSONStreamBackend lines (github.com/NVIDIA/dllogger, dllogger/logger.py).
LOG_KEYS = ["timestamp", "datetime", "elapsedtime", "type", "step", "data"]
METADATA_KEYS = ["timestamp", "elapsedtime", "datetime", "type", "metric", "metadata"]


def nvidia_parse(path: Path) -> list[dict[str, Any]]:
    """Read a DLLogger file as parsers of NVIDIA's results do: the lines that start with
    ``DLLL ``, that prefix stripped, each a JSON object."""
    lines = path.read_text().splitlines()
    assert lines and all(line.startswith("DLLL {") for line in lines), lines[:3]
    return [json.loads(line[len("DLLL ") :]) for line in lines]


def test_a_dllogger_log_writes_nvidias_lines(tmp_path: Path) -> None:
    log = TrainingLog(tmp_path, tensorboard=False, format="dllogger")
    log.parameters({"micro_batch_size": 8, "learning_rate": 1e-3})
    log.log(1, 5, "train", {"loss": 7.5, "learning_rate": 1e-4, "mlm_accuracy": 0.1}, step_loss=7.25)
    log.log(1, 5, "eval", {"loss": math.nan, "mlm_accuracy": 0.2})
    log.summary(train_seconds=2.0, sequences=100.0, final_loss=7.0)
    log.close()

    records = nvidia_parse(tmp_path / "dllogger.json")
    assert not (tmp_path / LOG_FILE).exists()
    metadata = [record for record in records if record["type"] == "METADATA"]
    assert [list(record) for record in metadata] == [METADATA_KEYS] * 4
    assert {record["metric"]: record["metadata"]["unit"] for record in metadata} == {
        "e2e_train_time": "s",
        "training_sequences_per_second": "sequences/s",
        "final_loss": None,
        "raw_train_time": "s",
    }
    logs = [record for record in records if record["type"] == "LOG"]
    assert [list(record) for record in logs] == [LOG_KEYS] * 4
    # DLLogger writes the times as strings.
    for record in records:
        float(record["timestamp"]), float(record["elapsedtime"])
        assert isinstance(record["timestamp"], str) and isinstance(record["elapsedtime"], str)
    parameter, train, evaluation, summary = logs
    assert parameter["step"] == "PARAMETER"
    assert parameter["data"]["batch_size_per_gpu"] == 8 and parameter["data"]["learning_rate"] == 1e-3
    assert train["step"] == [1, 5]
    assert train["data"] == {
        "average_loss": 7.5,
        "step_loss": 7.25,
        "learning_rate": 1e-4,
        "mlm_accuracy": 0.1,
    }
    # A diverged value is JSON null, not Python's NaN.
    assert evaluation["data"] == {"eval_loss": None, "eval_mlm_accuracy": 0.2}
    assert summary["step"] == []
    assert summary["data"]["training_sequences_per_second"] == 50.0
    assert summary["data"]["raw_train_time"] == 2.0 and summary["data"]["final_loss"] == 7.0
    assert summary["data"]["e2e_train_time"] >= 0


def test_a_phase_logs_in_dllogger_format_with_its_scaled_learning_rate(
    make_spec, make_phase, make_shards, shard_dir: Path, vocab_size: int
) -> None:
    make_shards("phase1", num_shards=1, sequences_per_shard=10, prefix="heldout")
    # Global batch 16 against a reference of 4: sqrt scaling doubles the learning rate.
    spec = make_spec(
        [make_phase(steps=10, learningRate=2e-3, warmupProportion=0.0)],
        optimizer={"lrScaling": "sqrt", "referenceGlobalBatchSize": 4},
        logging={"everySteps": 5, "format": "dllogger", "tensorboard": False},
    )
    final = train_phase(spec, 0, shard_dir, vocab_size)

    logs = Path(spec.logging.path or "")
    assert not (logs / LOG_FILE).exists()
    records = [record for record in nvidia_parse(logs / "dllogger.json") if record["type"] == "LOG"]
    [parameter] = [record for record in records if record["step"] == "PARAMETER"]
    assert parameter["data"]["learning_rate"] == pytest.approx(4e-3, rel=1e-12)
    assert parameter["data"]["written_learning_rate"] == 2e-3
    assert parameter["data"]["lr_scaling"] == "sqrt"
    assert parameter["data"]["batch_size_per_gpu"] == 16
    train = [record for record in records if "average_loss" in record["data"]]
    assert [record["step"] for record in train] == [[1, 5], [1, 10]]
    for record in train:
        assert {"average_loss", "step_loss", "learning_rate"} <= set(record["data"])
        assert all(math.isfinite(record["data"][name]) for name in ("average_loss", "step_loss"))
    # No warm-up: the poly decay (power 0.5) from the scaled peak, half-way after 5 of 10 steps.
    assert train[0]["data"]["learning_rate"] == pytest.approx(4e-3 * 0.5**0.5, rel=1e-6)
    [evaluation] = [record for record in records if "eval_mlm_accuracy" in record["data"]]
    assert evaluation["step"] == [1, 10] and "eval_loss" in evaluation["data"]
    [summary] = [record for record in records if record["step"] == []]
    assert set(summary["data"]) == {
        "e2e_train_time",
        "training_sequences_per_second",
        "final_loss",
        "raw_train_time",
    }
    assert summary["data"]["final_loss"] == train[-1]["data"]["average_loss"]
    # 10 steps of 16 sequences.
    seconds = summary["data"]["raw_train_time"]
    assert summary["data"]["training_sequences_per_second"] == pytest.approx(160 / seconds, rel=1e-9)

    # The optimizer started from the scaled rate, and the checkpoint says how it was made.
    state = read_checkpoint(final)
    assert state["optimizer"]["param_groups"][0]["initial_lr"] == pytest.approx(4e-3, rel=1e-12)
    assert state["learning_rate"] == {
        "learning_rate": pytest.approx(4e-3, rel=1e-12),
        "written_learning_rate": 2e-3,
        "lr_scaling": "sqrt",
        "reference_global_batch_size": 4,
        "global_batch_size": 16,
        "lr_scale": 2.0,
    }
