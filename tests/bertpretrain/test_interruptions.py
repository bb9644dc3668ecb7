"""Real trainer processes stopped where work was lost: SIGKILL inside the final evaluation, in
the middle of a checkpoint's write and of the export, and SIGTERM once the export is done. Each
run is ``python -m bertpretrain run`` with one function replaced to send the signal (a driver
passed to ``python -c``); the next run is the plain command, as a restarted pod runs it."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobs import small_training_job, with_value

pytestmark = pytest.mark.slow

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
# Replaces ``module.name`` by ``patched``, whose body is BODY, then runs the trainer.
DRIVER = """
import os, signal, sys
import {module} as target
original = getattr(target, {name!r})
def patched(*args, **kwargs):
{body}
setattr(target, {name!r}, patched)
from bertpretrain.run import main
sys.exit(main(sys.argv[1:]))
"""
KILL = "    os.kill(os.getpid(), signal.SIGKILL)"


def _run(
    job: Path, module: str | None = None, name: str = "", body: str = ""
) -> subprocess.CompletedProcess[str]:
    command = ["run", "--config", str(job)]
    program = (
        ["-c", DRIVER.format(module=module, name=name, body=body), *command]
        if module
        else ["-m", "bertpretrain", *command]
    )
    return subprocess.run(
        [sys.executable, *program], env=ENV, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shards with held-out documents, made once for the module's jobs."""
    root = tmp_path_factory.mktemp("interruptions")
    job = _job(root, root / "data", "prepare")
    result = subprocess.run(
        [sys.executable, "-m", "bertpretrain", "prepare", "--config", str(job)],
        env=ENV, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return root / "data"


@functools.cache
def _base(root: Path) -> dict[str, Any]:
    """The jobs' document, its corpus written under ``root`` once: rewriting it would change its
    files' times, which data preparation's cache key holds, and so remake the data."""
    return small_training_job(root, processes=1, heldoutFraction=0.1)


def _job(root: Path, data: Path, name: str) -> Path:
    """One phase of 4 steps, a checkpoint every 2, evaluated at the end; checkpoints in ``root/name``."""
    document = _base(root)
    changes: dict[str, Any] = {
        "spec.data.shards": str(data),
        "spec.phases": [{**document["spec"]["phases"][0], "steps": 4}],
        "spec.checkpoint": {"path": str(root / name), "everySteps": 2, "keep": 2},
        "spec.logging": {"everySteps": 1, "tensorboard": False},
    }
    for field, value in changes.items():
        document = with_value(document, field, value)
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_the_final_evaluation_lost_to_a_kill_is_made_by_the_next_run(data: Path) -> None:
    root = data.parent
    job = _job(root, data, "evaluation")
    killed = _run(job, "bertpretrain.train", "evaluate", KILL)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert (root / "evaluation" / "phase1" / "step_000004.pt").exists()  # killed after it
    assert "held-out" not in killed.stdout

    restarted = _run(job)
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert "phase 1/1 step 4/4 held-out: mlm_acc " in restarted.stdout, restarted.stdout
    records = [json.loads(line) for line in (root / "evaluation" / "logs" / "train.jsonl").open()]
    assert [record["step"] for record in records if record["data"].get("split") == "eval"] == [[1, 4]]


def test_the_next_run_removes_what_killed_writers_left(data: Path) -> None:
    root = data.parent
    job = _job(root, data, "writers")
    phase1 = root / "writers" / "phase1"
    half_a_checkpoint = "    args[1].write(b'\\0' * 65536)\n    args[1].flush()\n" + KILL
    killed = _run(job, "torch", "save", half_a_checkpoint)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    [leftover] = phase1.glob(".step_000002.pt.tmp*")

    # The next run starts afresh (there is no checkpoint) and is killed as its export is renamed.
    killed = _run(job, "bertpretrain.export", "_replace_dir", KILL)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert f"removed {leftover}, left by a writer that was stopped" in killed.stdout, killed.stdout
    assert not leftover.exists()
    [staging] = (root / "writers").glob(".hf.partial-*")
    assert staging.is_dir() and (staging / "model.safetensors").exists()

    restarted = _run(job)
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert f"removed {staging}, left by a writer that was stopped" in restarted.stdout, restarted.stdout
    assert sorted(path.name for path in (root / "writers").iterdir()) == [
        ".hf.lock", "hf", "logs", "phase1"
    ]  # fmt: skip
    assert not [path for path in phase1.iterdir() if ".tmp" in path.name]


def test_sigterm_once_the_export_is_done_is_a_success(data: Path) -> None:
    root = data.parent
    job = _job(root, data, "done")
    then_sigterm = (
        "    exported = original(*args, **kwargs)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return exported"
    )
    result = _run(job, "bertpretrain.run", "export_hf", then_sigterm)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SIGTERM received once the training was done; the export is complete" in result.stdout
    assert (root / "done" / "hf" / "model.safetensors").exists()
