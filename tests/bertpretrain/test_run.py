"""The whole job: ``bertjob run`` and ``python -m bertpretrain`` (the Kubeflow pods' commands are
run in test_kubeflow_pods.py)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file

import bertpretrain.pipeline
import bertpretrain.run
import bertpretrain.runtime.compiling
from bertjob.cli import main as bertjob_main
from bertjob_api.contract import EXIT_DISK_FULL
from bertjob_api.files import DiskFullError
from bertjob_api.plan import Plan
from bertjob_testing.jobs import small_training_job, with_value
from bertpretrain.data.format.prepared import PreparedData
from bertpretrain.data.load.loader import ShardError
from bertpretrain.run import main as bertpretrain_main
from bertpretrain.training.errors import DivergenceError
from bertpretrain.training.preemption import Preempted


def _mlm_losses(output: str, phase: int) -> list[float]:
    return [float(v) for v in re.findall(rf"phase {phase}/2 step \d+/\d+ .*?\(mlm ([\d.]+)", output)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "data",
    [{}, {"masking": "dynamic", "wholeWordMask": True, "heldoutFraction": 0.1}, {"packing": "nnlshp"}],
    ids=["static", "dynamic-whole-word-heldout", "packed"],
)
def test_bertjob_run_trains_exports_and_fills_masks(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], data: dict[str, Any]
) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(small_training_job(tmp_path, processes=1, **data)))
    assert bertjob_main(["run", str(job_file)]) == 0  # the trainer in a process of its own
    output = capfd.readouterr().out
    assert output.startswith("bertjob: running BertPretrainJob 'demo'"), output[:500]
    assert output.splitlines()[1].startswith("bertpretrain: plan: world size 1; bert-tiny: 1 layers"), output
    if "heldoutFraction" in data:
        assert re.search(r"phase 2/2 step 4/4 held-out: mlm_acc 0\.\d{4}", output), output
    losses = _mlm_losses(output, 1)
    assert losses[-1] < losses[0] - 0.5, output
    assert _mlm_losses(output, 2), output
    predictions = re.findall(r"^\s+(\d\.\d{3})\s+(\S+)$", output.split("fill-mask", 1)[1], re.MULTILINE)
    assert len(predictions) == 5
    scores = [float(score) for score, _ in predictions]
    assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1.0001
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json"):
        assert (tmp_path / "checkpoints" / "hf" / name).exists(), name


@pytest.mark.slow
def test_export_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = small_training_job(tmp_path, processes=1)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(with_value(document, "spec.phases", document["spec"]["phases"][:1])))
    assert bertpretrain_main(["export", "--config", str(job_file)]) == 1
    assert "no checkpoint under" in capsys.readouterr().err
    assert bertpretrain_main(["run", "--config", str(job_file)]) == 0

    checkpoints = tmp_path / "checkpoints" / "phase1"
    middle = checkpoints / "step_000020.pt"
    out = tmp_path / "step20"
    assert (
        bertpretrain_main(
            ["export", "--config", str(job_file), "--checkpoint", str(middle), "--out", str(out)]
        )
        == 0
    )
    exported = load_file(out / "model.safetensors")
    trained = torch.load(middle, weights_only=True)["model"]
    assert all(torch.equal(exported[name], trained[name]) for name in exported)
    assert (out / "vocab.txt").read_text() == (tmp_path / "data" / "vocab" / "vocab.txt").read_text()
    # By default: the newest checkpoint, to spec.export.path.
    assert bertpretrain_main(["export", "--config", str(job_file)]) == 0
    final = torch.load(checkpoints / "step_000030.pt", weights_only=True)["model"]
    default = load_file(tmp_path / "checkpoints" / "hf" / "model.safetensors")
    assert all(torch.equal(default[name], final[name]) for name in default)


@pytest.mark.parametrize(
    ("error", "code", "message"),
    [
        (ShardError("/data/shard_0001.hdf5: not a readable HDF5 file"), 1, "shard_0001.hdf5: not a readable"),
        (DivergenceError("phase 1/2 step 7: loss is nan"), 1, "step 7: loss is nan"),
        (Preempted(signal.SIGTERM, 12, Path("/ckpt/phase1/step_000012.pt")), 143, "stopped after step 12"),
        (
            DiskFullError(Path("/ckpt/phase1/step_000012.pt"), 1024, 5 << 20),
            EXIT_DISK_FULL,
            "step_000012.pt: no space left on the device: 1.0 KiB free, 5.0 MiB needed",
        ),
        # A full disk under a write that does not name its file: the message names the outputs.
        (
            OSError(errno.ENOSPC, "No space left on device"),
            EXIT_DISK_FULL,
            "(free space: spec.data.shards ",
        ),
        (
            OSError(errno.EDQUOT, "Disk quota exceeded"),
            EXIT_DISK_FULL,
            "Disk quota exceeded (free space: ",
        ),
    ],
)
@pytest.mark.parametrize("command", ["run", "local"])
def test_run_exit_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    error: Exception, code: int, message: str, command: str,
) -> None:  # fmt: skip
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(small_training_job(tmp_path, processes=1)))

    def fail(_plan: Any, *_finishing: Any) -> None:
        raise error

    monkeypatch.setattr(bertpretrain.pipeline, "run_job", fail)
    assert bertpretrain_main([command, "--config", str(job_file)]) == code
    captured = capsys.readouterr()
    assert message in captured.err + captured.out


def _torchrun(world_size: int) -> dict[str, str]:
    size = str(world_size)
    return {
        "TORCHELASTIC_RUN_ID": "t",
        "RANK": "0",
        "WORLD_SIZE": size,
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": size,
    }


# (spec.topology's processes, the world the launcher started: None alone, the first line rank 0 prints)
PLANS = [
    (1, None, "plan: world size 1; bert-tiny: 1 layers, hidden 128, 2 heads; phase 1: seq 64, "
     "global batch 16 = 1 x 4 x 4 accumulation, 30 steps, lr 0.01; phase 2: seq 128, "
     "global batch 8 = 1 x 8 x 1 accumulation, 4 steps, lr 0.004; "),
    # Elastic, or by hand: the plan is for the world that runs; the micro-batches stay the spec's,
    # the global batches and learning rates too, and the line says so.
    (4, 2, "plan: world size 2 (the topology's is 4: each phase keeps its global batch, and so its "
     "learning rate; the gradient accumulation steps absorb the difference); bert-tiny: 1 layers, "
     "hidden 128, 2 heads; phase 1: seq 64, global batch 16 = 2 x 4 x 2 accumulation, 30 steps, "
     "lr 0.01; phase 2: seq 128, global batch 8 = 2 x 2 x 2 accumulation, 4 steps, lr 0.004; "),
]  # fmt: skip


@pytest.mark.parametrize(("processes", "world", "first"), PLANS)
def test_the_plan_is_made_for_the_world_that_runs_and_printed_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    processes: int, world: int | None, first: str,
) -> None:  # fmt: skip
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(small_training_job(tmp_path, processes=processes)))
    for name, value in _torchrun(world).items() if world else ():
        monkeypatch.setenv(name, value)
    plans: list[Plan] = []
    # No process group for a world that is not there: run_job, which would use it, is replaced too.
    monkeypatch.setattr(bertpretrain.run, "_joined", lambda plan: contextlib.nullcontext())
    monkeypatch.setattr(bertpretrain.pipeline, "run_job", lambda plan, *_: plans.append(plan) or _done(plan))
    assert bertpretrain_main(["run", "--config", str(job_file)]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith(f"bertpretrain: {first}")
    [plan] = plans
    assert plan.world_size == (world or 1)


def test_a_world_the_batch_does_not_split_over_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(small_training_job(tmp_path, processes=2)))
    for name, value in _torchrun(4).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(bertpretrain.pipeline, "run_job", lambda *_: pytest.fail("run_job called"))
    assert bertpretrain_main(["run", "--config", str(job_file)]) == 1
    # Phase 2's micro-batch is 8 // 2, for the topology's 2 processes.
    assert "globalBatchSize 8 is not divisible by world size 4 x microBatchSize 4" in capsys.readouterr().err


def _done(plan: Plan) -> Any:
    data = PreparedData(plan.paths.shards, 0, [])
    return bertpretrain.pipeline.JobOutputs(data, [], plan.paths.export, 0.0)


@pytest.mark.slow
@pytest.mark.parametrize(
    "shard",
    ["seq_len_64_max_pred_10/shard_00000.hdf5", "seq_len_128_max_pred_20/shard_00000.hdf5"],
    ids=["phase1", "phase2"],
)
def test_damaged_shard_stops_the_run_before_training(tmp_path: Path, damage_shard, shard: str) -> None:
    """Unchecked, both damaged shards cost work: phase 1's 30 steps read only the first shard of
    its order (shard_00001), so it exits 0 on a damaged shard_00000; phase 2's comes after phase 1's
    checkpoints."""
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(small_training_job(tmp_path, processes=1)))
    assert bertpretrain_main(["prepare", "--config", str(job_file)]) == 0
    damaged = tmp_path / "data" / shard
    damage_shard(damaged)  # up to 64 KiB of garbage in the middle of input_ids' data
    result = subprocess.run(
        [sys.executable, "-m", "bertpretrain", "run", "--config", str(job_file)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert not list((tmp_path / "checkpoints").rglob("*.pt")), result.stdout
    assert f"{damaged}: dataset input_ids cannot be read, the file is damaged" in result.stderr


def test_prepare_command_makes_the_data_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = small_training_job(tmp_path, processes=1, packing="nnlshp")
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(document))
    assert bertpretrain_main(["prepare", "--config", str(job_file)]) == 0
    assert sorted(p.name for p in (tmp_path / "data").glob("seq_len_*")) == [
        "seq_len_128_max_pred_20_packed_nnlshp",
        "seq_len_64_max_pred_10_packed_nnlshp",
    ]
    assert not (tmp_path / "checkpoints").exists()
    document["spec"]["data"]["sources"] = [{"path": str(tmp_path / "missing")}]
    job_file.write_text(yaml.safe_dump(document))
    capsys.readouterr()
    assert bertpretrain_main(["prepare", "--config", str(job_file)]) == 1
    assert "missing" in capsys.readouterr().err


@pytest.mark.parametrize(
    "field", ["spec.data.shards", "spec.checkpoint.path", "spec.export.path", "spec.logging.path"]
)
def test_an_unwritable_output_is_named_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str
) -> None:
    blocker = tmp_path / "a-file"  # root may write anywhere, but not under a file
    blocker.write_text("")
    document = small_training_job(tmp_path, processes=1)
    document["spec"].setdefault("export", {})
    document = with_value(document, field, str(blocker / "out"))
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(document))
    assert bertpretrain_main(["run", "--config", str(job_file)]) == 1
    error = capsys.readouterr().err
    assert error == f"bertpretrain run: {field} {blocker}/out: cannot write there (Not a directory)\n"
    assert not (tmp_path / "data" / "vocab").exists()  # checked before any work

    if field == "spec.export.path":  # the export command checks its target as well
        assert bertpretrain_main(["export", "--config", str(job_file)]) == 1
        assert f"{field} {blocker}/out: cannot write there" in capsys.readouterr().err
        assert bertpretrain_main(["export", "--config", str(job_file), "--out", str(blocker / "x")]) == 1
        assert f"--out {blocker}/x: cannot write there" in capsys.readouterr().err


def test_the_entry_point_imports_no_torch_until_a_command_trains() -> None:
    """``prepare`` (a data-preparation Job, the data benchmark) starts without torch and the training
    stack, seconds and hundreds of MB it would not use."""
    probe = (
        "import sys, bertpretrain.run; "
        "print(sorted(m for m in ('torch', 'bertpretrain.pipeline') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_compile_true_that_fails_stops_before_training_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``compile: true`` where compiling fails: exit code 1 and one message naming spec.compile and
    the cause, before the first step (no checkpoint), not a traceback."""

    def no_compiler(graph: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> None:
        raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found")

    monkeypatch.setattr(bertpretrain.runtime.compiling, "backend_for", lambda device: no_compiler)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(with_value(small_training_job(tmp_path), "spec.compile", True)))
    assert bertpretrain_main(["run", "--config", str(job_file)]) == 1
    captured = capsys.readouterr()
    assert (
        "bertpretrain run: spec.compile: true, but torch.compile failed on the first micro-batch: "
        "RuntimeError: InvalidCxxCompiler: no working C++ compiler found"
    ) in captured.err
    assert "Traceback" not in captured.err
    assert not list(tmp_path.rglob("step_*.pt"))
