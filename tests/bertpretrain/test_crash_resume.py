"""A real trainer process SIGKILLed at a chosen point (data preparation, an optimizer step, a
checkpoint write, the final held-out evaluation, the export) and started again until it finishes
ends as a run that was never interrupted: the same exported weights, checkpoints and logged
figures to the last bit (fp32 on the CPU, one thread), each held-out evaluation logged and shown
once, the same files and nothing else (the restarted run removes, and names, what the killed
writer left), and no process of the killed run still alive. A SIGTERM once the export is done
(the pod deleted as the job ends) is a success, with the same outputs.

The crash or signal is planted from outside the trainer by ``crash_driver.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from bertjob_api.files import TEMPORARY
from bertjob_testing.jobs import small_training_job, with_value

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).with_name("crash_driver.py")
PHASE_1_STEPS, PHASE_2_STEPS, EVERY_STEPS = 12, 3, 5
# One thread: the same reduction order in every run.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TAG = "CRASH_RESUME_RUN"  # marks every process of a killed run, its workers included


def _base_job(root: Path) -> dict[str, Any]:
    """Two short phases with held-out shards evaluated at the end of each, a checkpoint every
    ``EVERY_STEPS`` steps, a log line every step; data made by two worker processes. Writes the
    corpus under ``root``, once: every job of the module reads it, and rewriting it would change
    its files' times and so remake the data."""
    document = small_training_job(root, heldoutFraction=0.1, workers=2)
    changes = {
        "spec.phases.0.steps": PHASE_1_STEPS,
        "spec.phases.0.microBatchSize": 8,
        "spec.phases.1.steps": PHASE_2_STEPS,
        "spec.logging": {"everySteps": 1, "tensorboard": False},
        "spec.evaluation": {"maxSequences": 64},
    }
    for field, value in changes.items():
        document = with_value(document, field, value)
    return document


def _job(base: dict[str, Any], root: Path, name: str, data: Path) -> Path:
    """``base`` with its data under ``data`` and its checkpoints, log and export under ``root/name``."""
    document = base
    changes = {
        "spec.data.shards": str(data),
        "spec.checkpoint": {"path": str(root / name), "everySteps": EVERY_STEPS, "keep": 2},
    }
    for field, value in changes.items():
        document = with_value(document, field, value)
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def _run(command: list[str], output: Path, env: dict[str, str] = ENV) -> tuple[int, str]:
    """Run ``command`` to its end; its exit code and output (stdout and stderr, also kept in
    ``output``: a pipe would keep the call waiting on any process of it left alive)."""
    with output.open("w") as file:
        code = subprocess.run(command, env=env, stdout=file, stderr=subprocess.STDOUT, timeout=300).returncode
    return code, output.read_text()


def _trainer(job: Path) -> list[str]:
    return [sys.executable, "-m", "bertpretrain", "run", "--config", str(job)]


def _tree(directory: Path) -> set[str]:
    """Every file and directory under ``directory``, relative to it."""
    return {str(path.relative_to(directory)) for path in directory.rglob("*")}


def _assert_same_tree(directory: Path, expected: set[str]) -> None:
    found = _tree(directory)
    assert found == expected, (
        f"{directory}: left over {sorted(found - expected)}, missing {sorted(expected - found)}"
    )


def _records(checkpoints: Path) -> dict[tuple[str, int, int], dict[str, float]]:
    """The last logged figures of each (split, phase, step), timings left out (a resumed run
    logs some steps twice)."""
    records = {}
    for line in (checkpoints / "logs" / "train.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["type"] == "LOG":
            data = dict(record["data"])
            split = data.pop("split")
            figures = {name: value for name, value in data.items() if "second" not in name}
            records[(split, *record["step"])] = figures
    return records


def _evaluations(checkpoints: Path) -> list[list[int]]:
    """The (phase, step) of each held-out evaluation logged, in order, repeats included."""
    records = [json.loads(line) for line in (checkpoints / "logs" / "train.jsonl").read_text().splitlines()]
    return [
        record["step"] for record in records if record["type"] == "LOG" and record["data"]["split"] == "eval"
    ]


def _heldout_lines(output: str) -> list[str]:
    """The held-out evaluations' console lines, their timings left out."""
    return [line.rsplit(" in ", 1)[0] for line in output.splitlines() if " held-out: " in line]


def _removal_lines(output: str) -> set[str]:
    return {line for line in output.splitlines() if line.endswith(", left by a writer that was stopped")}


def _assert_same(found: Any, expected: Any, where: str) -> None:
    """Equal to the last bit: tensors by ``torch.equal``, containers item by item."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(found, torch.Tensor) and found.dtype == expected.dtype, where
        assert torch.equal(found, expected), f"{where} differs"
    elif isinstance(expected, dict):
        assert isinstance(found, dict) and found.keys() == expected.keys(), f"{where}: other keys"
        for key, value in expected.items():
            _assert_same(found[key], value, f"{where}.{key}")
    elif isinstance(expected, list | tuple):
        assert isinstance(found, list | tuple) and len(found) == len(expected), f"{where}: other length"
        for index, (item, value) in enumerate(zip(found, expected, strict=True)):
            _assert_same(item, value, f"{where}[{index}]")
    else:
        assert found == expected, f"{where}: {found!r} != {expected!r}"


def _checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint's contents but Python's ``random`` states: nothing in the trainer seeds or
    draws from that generator, so two uninterrupted runs save different ones."""
    state: dict[str, Any] = torch.load(path, weights_only=True)
    for rank in state["rng"]:
        del rank["python"]
    return state


def _survivors(tag: str) -> list[str]:
    """Live processes (not zombies) whose environment holds ``TAG=tag``, with their command lines."""
    marker = f"{TAG}={tag}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone, or not ours
            continue
        if state != "Z":
            found.append(f"{proc.name}: {command}")
    return found


def _assert_no_survivors(tag: str) -> None:
    """No process of the run tagged ``tag`` is left (those found are killed, then reported)."""
    # The kernel kills a dead process's workers at once; they may take a moment to exit.
    deadline = time.monotonic() + 15
    while (survivors := _survivors(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for survivor in survivors:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(survivor.split(":")[0]), signal.SIGKILL)
    assert not survivors, "processes of the killed run are still running:\n" + "\n".join(survivors)


class Reference:
    """The uninterrupted run: its job (``job``, the document every other job varies), its
    directories and what it logged."""

    def __init__(self, root: Path):
        self.root = root
        self.data = root / "data"
        self.checkpoints = root / "reference"
        self.job = _base_job(root)
        job = _job(self.job, root, "reference", self.data)
        code, output = _run(_trainer(job), root / "reference.log")
        assert code == 0, output
        self.data_tree = _tree(self.data)
        self.checkpoint_tree = _tree(self.checkpoints)
        self.records = _records(self.checkpoints)
        self.evaluations = _evaluations(self.checkpoints)
        self.heldout_lines = _heldout_lines(output)
        # Each phase ends with a held-out evaluation, which a run killed after its final
        # checkpoint must still make.
        assert self.evaluations == [[1, PHASE_1_STEPS], [2, PHASE_2_STEPS]]
        assert len(self.heldout_lines) == 2, output


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return Reference(tmp_path_factory.mktemp("crash"))


def _check_killed_at(point: str, checkpoints: Path, data: Path, reference: Reference) -> None:
    """What the killed run left shows that it died where it was meant to."""
    phase1 = checkpoints / "phase1"
    if point == "shards":
        shards = len([name for name in reference.data_tree if name.endswith(".hdf5")])
        assert 0 < len(list(data.glob("*/*.hdf5"))) < shards
    elif point == "step":
        assert max(step for split, phase, step in _records(checkpoints) if phase == 1) == 6
    elif point == "checkpoint":
        assert sorted(path.name for path in phase1.glob("step_*.pt"))[-1] == "step_000010.pt"
        assert [
            name
            for name in os.listdir(phase1)
            if not name.startswith("step_") and f"phase1/{name}" not in reference.checkpoint_tree
        ], "no partial checkpoint"
    elif point == "evaluation":
        assert (phase1 / f"step_{PHASE_1_STEPS:06d}.pt").is_file()
        assert not [key for key in _records(checkpoints) if key[0] == "eval"]
    elif point == "export":
        assert (checkpoints / "phase2" / f"step_{PHASE_2_STEPS:06d}.pt").is_file()
        assert not (checkpoints / "hf").exists()
        assert set(os.listdir(checkpoints)) - reference.checkpoint_tree, "no partial export"


def _leftovers(checkpoints: Path, reference: Reference) -> set[Path]:
    """The temporaries (hidden files and directories) the killed run left under ``checkpoints``
    that an uninterrupted run does not keep, their contents left out."""
    return {
        checkpoints / name
        for name in _tree(checkpoints) - reference.checkpoint_tree
        if Path(name).name.startswith(".") and str(Path(name).parent) in reference.checkpoint_tree | {"."}
    }


def _data_leftovers(data: Path, reference: Reference) -> set[Path]:
    """The temporaries of the data stage's writers (``files.TEMPORARY``) the killed run left
    under ``data``: whether a shard was half written when the kill came depends on timing."""
    return {
        data / name
        for name in _tree(data) - reference.data_tree
        if TEMPORARY.match(Path(name).name) and str(Path(name).parent) in reference.data_tree | {"."}
    }


def _assert_same_data(data: Path, reference: Reference) -> None:
    _assert_same_tree(data, reference.data_tree)
    for path in sorted(reference.data.glob("*/*.hdf5")):
        with h5py.File(path) as expected, h5py.File(data / path.relative_to(reference.data)) as found:
            assert found.keys() == expected.keys(), path.name
            for name in expected:
                assert np.array_equal(found[name][()], expected[name][()]), f"{path.name}: {name} differs"


def _assert_same_outputs(checkpoints: Path, data: Path, reference: Reference) -> None:
    """The files, data, logged figures, checkpoints and export of the uninterrupted run, to the bit."""
    _assert_same_tree(checkpoints, reference.checkpoint_tree)
    _assert_same_data(data, reference)
    assert _records(checkpoints) == reference.records  # every step's and evaluation's figures
    assert _evaluations(checkpoints) == reference.evaluations  # each evaluation logged once
    for path in sorted(reference.checkpoints.glob("phase*/step_*.pt")):
        expected = _checkpoint(path)
        found = _checkpoint(checkpoints / path.relative_to(reference.checkpoints))
        _assert_same(found, expected, str(path.relative_to(reference.checkpoints)))
    for path in sorted((reference.checkpoints / "hf").iterdir()):
        exported = checkpoints / "hf" / path.name
        if path.suffix == ".safetensors":
            _assert_same(load_file(exported), load_file(path), path.name)
        else:
            assert exported.read_bytes() == path.read_bytes(), f"{path.name} differs"


@pytest.mark.parametrize(
    ("point", "count"),
    [
        ("shards", 1),  # a shard in place, the other worker writing the next
        ("step", 7),  # after the backward passes of step 7; resumed from step 5
        ("checkpoint", 3),  # the final checkpoint of phase 1, half written
        ("evaluation", 1),  # after phase 1's final checkpoint, before its held-out figures
        ("export", 1),  # every file of the export written, but not yet moved into place
    ],
)
def test_killed_and_restarted_run_equals_the_uninterrupted_one(
    reference: Reference, point: str, count: int
) -> None:
    root = reference.root
    # Data preparation is killed in a directory of its own; the vocabulary is taken from the
    # uninterrupted run, since tokenizers' WordPiece trainer is not deterministic.
    data = root / f"{point}-data" if point == "shards" else reference.data
    if point == "shards":
        shutil.copytree(reference.data / "vocab", data / "vocab")
    job, checkpoints = _job(reference.job, root, point, data), root / point
    tag = uuid.uuid4().hex

    command = [sys.executable, str(DRIVER), point, str(count), "run", "--config", str(job)]
    code, killed = _run(command, root / f"{point}-killed.log", {**ENV, TAG: tag})
    assert code == -signal.SIGKILL, killed
    _assert_no_survivors(tag)
    _check_killed_at(point, checkpoints, data, reference)
    leftovers = _leftovers(checkpoints, reference)
    # A half-written checkpoint, an export not yet moved into place.
    assert bool(leftovers) == (point in ("checkpoint", "export")), leftovers
    # A shard being written when the kill came, if one was (the data stage's own clean-up).
    data_leftovers = _data_leftovers(data, reference) if point == "shards" else set()

    code, output = _run(_trainer(job), root / f"{point}-restarted.log")
    assert code == 0, output
    assert _removal_lines(output) == {
        f"bertpretrain: removed {path}, left by a writer that was stopped" for path in leftovers
    } | {f"data: removed {path}, left by a writer that was stopped" for path in data_leftovers}, output
    # Each evaluation shown once, by the run that made it: the one the kill cut short is made again.
    assert _heldout_lines(killed) + _heldout_lines(output) == reference.heldout_lines, output
    _assert_same_outputs(checkpoints, data, reference)


def test_sigterm_once_the_export_is_done_is_a_success(reference: Reference) -> None:
    root = reference.root
    job, checkpoints = _job(reference.job, root, "sigterm", reference.data), root / "sigterm"
    command = [sys.executable, str(DRIVER), "sigterm", "1", "run", "--config", str(job)]
    code, output = _run(command, root / "sigterm.log")
    assert code == 0, output
    assert "SIGTERM received once the training was done; the export is complete, exit 0" in output, output
    _assert_same_outputs(checkpoints, reference.data, reference)
