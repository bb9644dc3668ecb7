"""Whole phases on fixture shards: learning, checkpoints, phase 2 from phase 1, resumption."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import bertpretrain.engine
from bertpretrain.checkpoint import read_checkpoint
from bertpretrain.train import DivergenceError, train_phase

pytestmark = pytest.mark.usefixtures("one_thread")

LINE = re.compile(
    r"^phase (\d)/(\d) step (\d+)/(\d+) loss (\d+\.\d{3}) \(mlm (\d+\.\d{3}) nsp (\d+\.\d{3})\) "
    r"lr (\d\.\de[+-]\d\d) seq/s (\d+\.\d) eta (\d+:\d\d:\d\d)$"
)


def progress(output: str) -> list[re.Match[str]]:
    """The progress lines of a run's stdout, each checked against the documented format."""
    lines = [line for line in output.splitlines() if re.match(r"phase \d/\d step ", line)]
    matches = [LINE.match(line) for line in lines]
    assert all(matches), lines
    return [match for match in matches if match]


def test_phase_lowers_the_loss_and_keeps_checkpoints(
    make_spec, make_phase, shard_dir: Path, vocab_size: int, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = make_spec([make_phase(learningRate=2e-2)])
    final = train_phase(spec, 0, shard_dir, vocab_size)

    assert final == Path(spec.checkpoint.path) / "phase1" / "step_000020.pt"
    assert sorted(p.name for p in final.parent.iterdir()) == ["step_000015.pt", "step_000020.pt"]
    lines = progress(capsys.readouterr().out)
    assert [int(line[3]) for line in lines] == [5, 10, 15, 20]
    losses = [float(line[6]) for line in lines]
    assert losses[-1] < losses[0] - 0.3, losses
    state = read_checkpoint(final)
    assert state["step"] == 20 and state["phase_index"] == 0


def test_phase_two_starts_from_phase_one(
    make_spec, make_phase, make_shards, shard_dir: Path, vocab_size: int, capsys: pytest.CaptureFixture[str]
) -> None:
    phase2_dir = make_shards("phase2", max_seq_length=64, max_predictions_per_seq=10)
    phase2 = make_phase(maxSeqLength=64, maxPredictionsPerSeq=10, learningRate=1e-9, steps=3)
    spec = make_spec([make_phase(learningRate=2e-2, steps=10), phase2], logging={"everySteps": 1})
    phase1_final = train_phase(spec, 0, shard_dir, vocab_size)
    capsys.readouterr()

    phase2_final = train_phase(spec, 1, phase2_dir, vocab_size, init_from=phase1_final)

    output = capsys.readouterr().out
    assert "phase 2/2: bert-tiny" in output and f"from {phase1_final} at step 0" in output
    assert [int(line[3]) for line in progress(output)] == [1, 2, 3]
    before, after = read_checkpoint(phase1_final), read_checkpoint(phase2_final)
    assert phase2_final.parent.name == "phase2"
    # A learning rate of 1e-9 leaves phase 1's weights in place; the schedule and steps start afresh.
    for name, tensor in before["model"].items():
        torch.testing.assert_close(after["model"][name], tensor, atol=1e-6, rtol=0)
    assert after["optimizer"]["param_groups"][0]["step"] == 3
    assert after["scheduler"]["last_epoch"] == 3


def test_resume_continues_as_if_never_stopped(
    make_spec,
    make_phase,
    shard_dir: Path,
    vocab_size: int,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    # Micro-batches of 8 with 2 accumulation steps, and dropout on: the data position and the RNG
    # state must both be restored for the weights to come out the same.
    phase = make_phase(steps=10, microBatchSize=8)
    uninterrupted = make_spec([phase], checkpoint={"path": str(tmp_path / "a"), "everySteps": 5, "keep": 3})
    interrupted = make_spec([phase], checkpoint={"path": str(tmp_path / "b"), "everySteps": 5, "keep": 3})
    expected = read_checkpoint(train_phase(uninterrupted, 0, shard_dir, vocab_size))
    final = train_phase(interrupted, 0, shard_dir, vocab_size)
    final.unlink()  # as if the pod had died after step 5's checkpoint
    capsys.readouterr()

    assert train_phase(interrupted, 0, shard_dir, vocab_size) == final
    output = capsys.readouterr().out
    assert "step_000005.pt at step 5" in output
    assert [int(line[3]) for line in progress(output)] == [10]
    resumed = read_checkpoint(final)
    for name, tensor in expected["model"].items():
        torch.testing.assert_close(resumed["model"][name], tensor, atol=1e-6, rtol=0)

    assert train_phase(interrupted, 0, shard_dir, vocab_size) == final  # finished: nothing to do
    assert progress(capsys.readouterr().out) == []


@pytest.mark.filterwarnings("ignore:.*autocast on a CPU without:UserWarning")
@pytest.mark.parametrize(("optimizer", "precision"), [("adamw", "bf16"), ("lamb", "fp16")])
def test_other_optimizer_and_precisions(
    make_spec,
    make_phase,
    shard_dir: Path,
    vocab_size: int,
    capsys: pytest.CaptureFixture[str],
    optimizer: str,
    precision: str,
) -> None:
    spec = make_spec(
        [make_phase(steps=10, microBatchSize=8, learningRate=5e-3)],
        optimizer={"name": optimizer},
        precision=precision,
    )
    train_phase(spec, 0, shard_dir, vocab_size)
    losses = [float(line[5]) for line in progress(capsys.readouterr().out)]
    assert len(losses) == 2 and losses[1] < losses[0]


def test_nan_loss_stops_training(
    make_spec, make_phase, shard_dir: Path, vocab_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def nan_loss(*tensors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        nan = tensors[0].float().sum() * float("nan")
        return nan, nan, nan

    monkeypatch.setattr(bertpretrain.engine, "pretraining_loss", nan_loss)
    with pytest.raises(DivergenceError, match=r"phase 1/1 step 1: loss is nan"):
        train_phase(make_spec([make_phase()]), 0, shard_dir, vocab_size)


def test_bad_shards_stop_before_training(make_spec, make_phase, shard_dir: Path, vocab_size: int) -> None:
    spec = make_spec([make_phase(maxSeqLength=48)])
    with pytest.raises(ValueError, match=r"shard_0000\.hdf5: dataset input_ids has width 32"):
        train_phase(spec, 0, shard_dir, vocab_size)
