"""Exact resumption of a real trainer process: killed with SIGKILL, or stopped with SIGTERM as
Kubernetes stops a pod, then started again, it logs the same loss at every later step as a run
that was never interrupted (bitwise, fp32 on the CPU). The job masks dynamically on a schedule
(15% falling to 5%), so the masks each step thins are part of what must come back exactly."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from bertjob_testing.jobs import small_training_job, with_value

pytestmark = pytest.mark.slow

STEPS = 64


@functools.cache
def _base(root: Path) -> dict[str, Any]:
    """The jobs' document, its corpus written under ``root`` once: rewriting it would change its
    files' times, which data preparation's cache key holds, and so remake the data."""
    return small_training_job(root, masking="dynamic", finalMaskedLmProb=0.05)


def _job(root: Path, data: Path, name: str) -> Path:
    """A one-phase job with dynamic masking, a checkpoint every 8 steps and a log line every step;
    all jobs of a test share the corpus and the shards."""
    document = _base(root)
    changes = {
        "spec.data.shards": str(data),
        "spec.phases": [
            {
                "maxSeqLength": 64,
                "maxPredictionsPerSeq": 10,
                "globalBatchSize": 32,
                "microBatchSize": 16,
                "learningRate": 0.01,
                "warmupProportion": 0.1,
                "steps": STEPS,
            }
        ],
        "spec.checkpoint": {"path": str(root / name), "everySteps": 8, "keep": 2},
        "spec.logging": {"everySteps": 1, "tensorboard": False},
    }
    for field, value in changes.items():
        document = with_value(document, field, value)
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def _command(job: Path) -> list[str]:
    return [sys.executable, "-m", "bertpretrain", "run", "--config", str(job)]


# One thread: the same reduction order in every run.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _losses(checkpoints: Path) -> dict[int, list[float]]:
    """The last logged [loss, mlm, nsp] of each step (a resumed run logs some steps twice)."""
    losses = {}
    for line in (checkpoints / "logs" / "train.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["type"] == "LOG" and record["data"]["split"] == "train":
            data = record["data"]
            losses[record["step"][1]] = [data["loss"], data["mlm_loss"], data["nsp_loss"]]
    return losses


def _start_and_stop(job: Path, checkpoints: Path, after_step: int, how: signal.Signals) -> tuple[int, str]:
    """Start a run, send it ``how`` once it has logged ``after_step``; its exit code and output."""
    process = subprocess.Popen(
        _command(job), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    log = checkpoints / "logs" / "train.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if log.exists() and max(_losses(checkpoints), default=0) >= after_step:
            process.send_signal(how)
            break
        time.sleep(0.05)
    output, _ = process.communicate(timeout=120)
    assert process.returncode != 0, f"the run ended before it could be stopped:\n{output}"
    return process.returncode, output


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[int, list[float]]]:
    root = tmp_path_factory.mktemp("resume")
    data = root / "data"
    job = _job(root, data, "uninterrupted")
    result = subprocess.run(_command(job), env=ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return root, data, _losses(root / "uninterrupted")


def _final_weights(checkpoints: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoints / "phase1" / f"step_{STEPS:06d}.pt", weights_only=True)["model"]


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_stopped_and_restarted_run_equals_the_uninterrupted_one(
    uninterrupted: tuple[Path, Path, dict[int, list[float]]], how: signal.Signals
) -> None:
    root, data, expected = uninterrupted
    name = how.name.lower()
    job, checkpoints = _job(root, data, name), root / name
    code, output = _start_and_stop(job, checkpoints, after_step=11, how=how)
    stopped_at = max(_losses(checkpoints))
    saved = sorted(path.name for path in (checkpoints / "phase1").glob("step_*.pt"))
    if how == signal.SIGKILL:
        assert code == -signal.SIGKILL
        assert saved[-1] == "step_000008.pt"  # the run repeats the steps after it
    else:
        assert code == 143, output
        assert f"SIGTERM received: stopped after step {stopped_at}" in output
        assert saved[-1] == f"step_{stopped_at:06d}.pt"  # saved on the way out

    result = subprocess.run(_command(job), env=ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "at step 8" in result.stdout if how == signal.SIGKILL else f"at step {stopped_at}" in result.stdout
    resumed = _losses(checkpoints)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    assert resumed == expected  # every step's losses, to the last bit
    final, reference = _final_weights(checkpoints), _final_weights(root / "uninterrupted")
    assert all(torch.equal(final[name], tensor) for name, tensor in reference.items())


def test_the_losses_would_show_a_difference(uninterrupted: tuple[Path, Path, dict[int, list[float]]]) -> None:
    """The comparison above can fail: another seed gives other losses from the first step on."""
    root, data, expected = uninterrupted
    job = _job(root, data, "reseeded")
    document: dict[str, Any] = yaml.safe_load(job.read_text())
    document["spec"]["seed"] = 1
    document["spec"]["phases"][0]["steps"] = 2
    job.write_text(yaml.safe_dump(document))
    subprocess.run(_command(job), env=ENV, capture_output=True, text=True, timeout=600, check=True)
    other = _losses(root / "reseeded")
    assert other[1] != expected[1]
