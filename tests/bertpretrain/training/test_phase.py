"""Whole phases on fixture shards: learning, checkpoints, phase 2 from phase 1, resumption."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import bertpretrain.training.accuracy
import bertpretrain.training.phase
from bertjob_api.plan import Plan
from bertjob_api.spec import JobSpec
from bertpretrain.data.format.prepared import PreparedData
from bertpretrain.runtime.engine import Engine
from bertpretrain.runtime.parallel.joining import join
from bertpretrain.training.checkpoint import CheckpointError, read_checkpoint
from bertpretrain.training.errors import DivergenceError
from bertpretrain.training.phase import Phase
from bertpretrain.training.preemption import Preempted

pytestmark = pytest.mark.usefixtures("one_thread")

LINE = re.compile(
    r"^phase (\d)/(\d) step (\d+)/(\d+) loss (\d+\.\d{3}) \(mlm (\d+\.\d{3}) nsp (\d+\.\d{3})\) "
    r"mlm_acc (0\.\d{3}|1\.000) lr (\d\.\d\de[+-]\d\d) seq/s (\d+\.\d) eta (\d+:\d\d:\d\d)"
    r"( skipped \d+ \(fp16 overflow\))?$"
)
EVAL_LINE = re.compile(
    r"^phase (\d)/(\d) step (\d+)/(\d+) held-out: mlm_acc (\d\.\d{4}) nsp_acc (\d\.\d{4}) "
    r"loss (\d+\.\d{3}) \(mlm \d+\.\d{3} nsp \d+\.\d{3}\), ([\d,]+) sequences in \d+\.\d s$"
)


def progress(output: str, pattern: re.Pattern[str] = LINE) -> list[re.Match[str]]:
    """The progress lines (or, with ``EVAL_LINE``, the evaluation lines) of a run's stdout, each
    checked against the documented format."""
    held_out = pattern is EVAL_LINE
    lines = [
        line
        for line in output.splitlines()
        if re.match(r"phase \d/\d step ", line) and ("held-out" in line) == held_out
    ]
    matches = [pattern.match(line) for line in lines]
    assert all(matches), lines
    return [match for match in matches if match]


def train_phase(
    spec: JobSpec,
    index: int,
    shard_dir: Path,
    vocab_size: int,
    init_from: Path | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Path:
    """Phase ``index`` of ``spec``'s plan (for its topology) on the shards in ``shard_dir``, in a
    process group of its own; a budget's time read from ``clock``."""
    data = PreparedData(shard_dir.parent / "vocab", vocab_size, [shard_dir] * len(spec.phases))
    with contextlib.closing(join(spec.accelerator, spec.tf32, spec.distributed)) as parallel:
        return Phase(Plan.resolve(spec), index, data, parallel, init_from, clock).train()


def log_records(spec: JobSpec) -> list[dict[str, Any]]:
    path = Path(spec.logging.path or "") / "train.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_phase_lowers_the_loss_and_keeps_checkpoints(
    make_spec, make_phase, shard_dir: Path, vocab_size: int, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = make_spec([make_phase(learningRate=2e-2)])
    final = train_phase(spec, 0, shard_dir, vocab_size)

    assert final == Path(spec.checkpoint.path) / "phase1" / "step_000020.pt"
    # and the lock its writers hold (see bertpretrain.common.files)
    assert sorted(p.name for p in final.parent.iterdir()) == [".lock", "step_000015.pt", "step_000020.pt"]
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
        assert torch.equal(resumed["model"][name], tensor), name

    assert train_phase(interrupted, 0, shard_dir, vocab_size) == final  # finished: nothing to do
    assert progress(capsys.readouterr().out) == []


def test_a_batch_ramp_accumulates_as_its_formula_and_resumes_mid_ramp(
    make_spec,
    make_phase,
    shard_dir: Path,
    vocab_size: int,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """Global batch 16 as 4 micro-batches of 4, ramped over 60% of 10 steps: steps 1-10 accumulate
    1, 1, 2, 2, 3, 4, 4, 4, 4, 4 micro-batches (ramp_accumulation_steps), 29 in all. A run stopped
    after step 5's checkpoint (9 micro-batches in) ends with the uninterrupted run's weights."""
    phase = make_phase(steps=10, microBatchSize=4, batchRampProportion=0.6)
    logged = {"everySteps": 1}
    uninterrupted = make_spec(
        [phase], checkpoint={"path": str(tmp_path / "a"), "everySteps": 5}, logging=logged
    )
    interrupted = make_spec(
        [phase], checkpoint={"path": str(tmp_path / "b"), "everySteps": 5}, logging=logged
    )
    expected = read_checkpoint(train_phase(uninterrupted, 0, shard_dir, vocab_size))
    assert "4 accumulation steps, ramped from 1 over the first 60% of the steps" in capsys.readouterr().out
    train = [record["data"] for record in log_records(uninterrupted) if record["type"] == "LOG"]
    assert [record["sequences"] for record in train] == [4 * n for n in (1, 1, 2, 2, 3, 4, 4, 4, 4, 4)]
    assert expected["data_position"]["sequences"] == 29 * 4

    final = train_phase(interrupted, 0, shard_dir, vocab_size)
    assert read_checkpoint(final.parent / "step_000005.pt")["data_position"]["sequences"] == 9 * 4
    final.unlink()
    assert train_phase(interrupted, 0, shard_dir, vocab_size) == final
    resumed = read_checkpoint(final)
    assert all(torch.equal(resumed["model"][name], tensor) for name, tensor in expected["model"].items())


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


def test_log_file_and_tensorboard(make_spec, make_phase, shard_dir: Path, vocab_size: int) -> None:
    spec = make_spec([make_phase(steps=10)])
    train_phase(spec, 0, shard_dir, vocab_size)
    records = log_records(spec)
    assert records[0]["type"] == "PARAMETER" and records[0]["data"]["global_batch_size"] == 16
    train = [record for record in records if record["type"] == "LOG"]
    assert [record["step"] for record in train] == [[1, 5], [1, 10]]
    assert set(train[0]["data"]) >= {"loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "learning_rate"}
    assert train[0]["data"]["sequences_per_second"] > 0 and train[0]["data"]["split"] == "train"
    events = list((Path(spec.logging.path or "") / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0


def test_heldout_evaluation(
    make_spec, make_phase, make_shards, shard_dir: Path, vocab_size: int, capsys: pytest.CaptureFixture[str]
) -> None:
    make_shards("phase1", num_shards=2, sequences_per_shard=10, prefix="heldout")
    spec = make_spec([make_phase(learningRate=2e-2)], evaluation={"everySteps": 8, "maxSequences": 15})
    train_phase(spec, 0, shard_dir, vocab_size)
    lines = progress(capsys.readouterr().out, EVAL_LINE)
    assert [int(line[3]) for line in lines] == [8, 16, 20]  # every 8 steps and at the end
    assert all(line[8] == "15" for line in lines)
    accuracies = [float(line[5]) for line in lines]
    assert 0 < accuracies[0] <= accuracies[-1] < 1  # the model learns token frequencies
    evaluations = [record["data"] for record in log_records(spec) if record["data"].get("split") == "eval"]
    assert [round(e["mlm_accuracy"], 4) for e in evaluations] == accuracies


def test_evaluation_does_not_change_training(
    make_spec, make_phase, make_shards, shard_dir: Path, vocab_size: int, tmp_path: Path
) -> None:
    plain = make_spec([make_phase(steps=6)], checkpoint={"path": str(tmp_path / "a")})
    final = train_phase(plain, 0, shard_dir, vocab_size)
    make_shards("phase1", num_shards=1, sequences_per_shard=10, prefix="heldout")
    evaluated = make_spec(
        [make_phase(steps=6)], checkpoint={"path": str(tmp_path / "b")}, evaluation={"everySteps": 2}
    )
    other = train_phase(evaluated, 0, shard_dir, vocab_size)
    expected, found = read_checkpoint(final)["model"], read_checkpoint(other)["model"]
    assert all(torch.equal(found[name], tensor) for name, tensor in expected.items())


def test_packed_shards_train(
    make_spec, make_phase, packed_shard_dir: Path, vocab_size: int, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = make_spec([make_phase(learningRate=2e-2, globalBatchSize=8)])
    train_phase(spec, 0, packed_shard_dir, vocab_size)
    losses = [float(line[5]) for line in progress(capsys.readouterr().out)]
    assert losses[-1] < losses[0] - 0.3, losses
    train = [record["data"] for record in log_records(spec) if record["type"] == "LOG"]
    # Sequences are counted one by one, not by rows: more than 8 per step.
    assert sum(record["sequences"] for record in train) > 20 * 8


MLM_LINE = re.compile(
    r"^phase 1/1 step (\d+)/20 loss (\d+\.\d{3}) mlm_acc (0\.\d{3}|1\.000) lr \d\.\d\de[+-]\d\d "
    r"seq/s \d+\.\d eta \d+:\d\d:\d\d$"
)
MLM_EVAL_LINE = re.compile(
    r"^phase 1/1 step (\d+)/20 held-out: mlm_acc (\d\.\d{4}) loss \d+\.\d{3}, "
    r"([\d,]+) sequences in \d+\.\d s$"
)


def test_objective_mlm_trains_without_nsp(
    make_spec, make_phase, make_shards, shard_dir: Path, vocab_size: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """On shards with NSP labels (ignored) as on shards without: no NSP figures in the lines or
    the log, a model without pooler or NSP head in the checkpoint, the loss falling."""
    make_shards("phase1", num_shards=1, sequences_per_shard=10, prefix="heldout")
    spec = make_spec([make_phase(learningRate=2e-2)], objective="mlm", evaluation={"everySteps": 10})
    final = train_phase(spec, 0, shard_dir, vocab_size)
    output = capsys.readouterr().out
    lines = [line for line in output.splitlines() if re.match(r"phase 1/1 step ", line)]
    trained = [MLM_LINE.match(line) for line in lines if "held-out" not in line]
    evaluated = [MLM_EVAL_LINE.match(line) for line in lines if "held-out" in line]
    assert all(trained) and all(evaluated) and len(trained) == 4 and len(evaluated) == 2, lines
    losses = [float(match[2]) for match in trained if match]
    assert losses[-1] < losses[0] - 0.3, losses
    assert [match[3] for match in evaluated if match] == ["10", "10"]
    records = [record["data"] for record in log_records(spec) if record["type"] == "LOG"]
    assert records and not any(key.startswith("nsp") for record in records for key in record)
    assert sum(record["sequences"] for record in records if record.get("split") != "eval") == 20 * 16
    weights = read_checkpoint(final)["model"]
    assert not [name for name in weights if name.startswith(("bert.pooler.", "cls.seq_relationship."))]


def test_sigterm_saves_and_stops(
    make_spec, make_phase, shard_dir: Path, vocab_size: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    step = Engine.optimizer_step
    calls = []

    def signalled_step(self: Engine) -> tuple[float, bool]:
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # what the kubelet sends on preemption
        return step(self)

    monkeypatch.setattr(Engine, "optimizer_step", signalled_step)
    spec = make_spec([make_phase(steps=10)], checkpoint={"path": str(tmp_path / "b"), "everySteps": 5})
    with pytest.raises(Preempted, match=r"SIGTERM received: stopped after step 3") as stopped:
        train_phase(spec, 0, shard_dir, vocab_size)
    assert stopped.value.exit_code == 143
    assert stopped.value.checkpoint == Path(spec.checkpoint.path) / "phase1" / "step_000003.pt"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the phase's handler is gone
    monkeypatch.undo()

    resumed = read_checkpoint(train_phase(spec, 0, shard_dir, vocab_size))["model"]
    plain = make_spec([make_phase(steps=10)], checkpoint={"path": str(tmp_path / "a"), "everySteps": 5})
    expected = read_checkpoint(train_phase(plain, 0, shard_dir, vocab_size))["model"]
    assert all(torch.equal(resumed[name], tensor) for name, tensor in expected.items())


def nan_loss_at(monkeypatch: pytest.MonkeyPatch, micro_batch: int) -> None:
    """Make the loss of the ``micro_batch``-th micro-batch (from 1) NaN, as an overflow would."""
    loss = bertpretrain.training.accuracy.pretraining_loss
    calls = []

    def sometimes_nan(*tensors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        calls.append(1)
        losses = loss(*tensors)
        return tuple(value * float("nan") for value in losses) if len(calls) == micro_batch else losses  # type: ignore[return-value]

    monkeypatch.setattr(bertpretrain.training.accuracy, "pretraining_loss", sometimes_nan)


def test_nan_loss_stops_training_and_keeps_the_last_good_checkpoint(
    make_spec, make_phase, shard_dir: Path, vocab_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    nan_loss_at(monkeypatch, 7)
    spec = make_spec([make_phase()])
    good = Path(spec.checkpoint.path) / "phase1" / "step_000005.pt"
    with pytest.raises(
        DivergenceError, match=rf"phase 1/1 step 7: loss is nan .*last good checkpoint is {good}"
    ):
        train_phase(spec, 0, shard_dir, vocab_size)
    assert sorted(good.parent.iterdir()) == [good.parent / ".lock", good]


@pytest.mark.filterwarnings("ignore:.*autocast on a CPU without:UserWarning")
def test_fp16_skips_a_step_that_overflows(
    make_spec, make_phase, shard_dir: Path, vocab_size: int, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    nan_loss_at(monkeypatch, 3)
    spec = make_spec([make_phase(steps=6)], precision="fp16")
    final = read_checkpoint(train_phase(spec, 0, shard_dir, vocab_size))
    lines = progress(capsys.readouterr().out)
    assert lines[0][12] == " skipped 1 (fp16 overflow)" and lines[1][12] is None
    assert all(torch.isfinite(tensor).all() for tensor in final["model"].values())
    assert final["optimizer"]["param_groups"][0]["step"] == 5  # LAMB took 5 of the 6 steps


def test_bad_shards_stop_before_training(make_spec, make_phase, shard_dir: Path, vocab_size: int) -> None:
    spec = make_spec([make_phase(maxSeqLength=48)])
    with pytest.raises(ValueError, match=r"shard_0000\.hdf5: dataset input_ids has width 32"):
        train_phase(spec, 0, shard_dir, vocab_size)


def _hf_model(directory: Path, vocab_size: int, hidden_size: int = 32) -> dict[str, torch.Tensor]:
    """A transformers BertForMaskedLM of the fixtures' tiny shape saved to ``directory``."""
    import transformers

    config = transformers.BertConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(3)
    model = transformers.BertForMaskedLM(config)
    model.save_pretrained(directory)
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def init_from(spec: JobSpec, directory: Path) -> JobSpec:
    return spec.model_copy(update={"model": spec.model.model_copy(update={"init_from": str(directory)})})


def test_continues_pretraining_a_hugging_face_model(
    make_spec,
    make_phase,
    shard_dir: Path,
    vocab_size: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    weights = _hf_model(tmp_path / "hf-bert", vocab_size)
    spec = init_from(make_spec([make_phase(steps=1, learningRate=1e-12)]), tmp_path / "hf-bert")
    final = read_checkpoint(train_phase(spec, 0, shard_dir, vocab_size))["model"]
    output = capsys.readouterr().out
    assert "(Hugging Face) at step 0" in output
    assert "bert.pooler.dense.weight" in output  # BertForMaskedLM has no pooler: initialised
    for name in ("bert.encoder.layer.1.output.dense.weight", "cls.predictions.transform.dense.weight"):
        torch.testing.assert_close(final[name], weights[name], atol=1e-6, rtol=0)


def test_hugging_face_model_of_another_shape_is_named(
    make_spec, make_phase, shard_dir: Path, vocab_size: int, tmp_path: Path
) -> None:
    _hf_model(tmp_path / "hf-bert", vocab_size, hidden_size=64)
    spec = init_from(make_spec([make_phase(steps=1)]), tmp_path / "hf-bert")
    with pytest.raises(
        CheckpointError,
        match=r"hf-bert/config.json: a model of another shape: hidden_size 64 \(the model has 32\)",
    ):
        train_phase(spec, 0, shard_dir, vocab_size)


def test_a_torn_newest_checkpoint_resumes_from_the_one_before(
    make_spec, make_phase, shard_dir: Path, vocab_size: int, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = make_spec([make_phase(steps=10)])  # checkpoints after steps 5 and 10
    final = train_phase(spec, 0, shard_dir, vocab_size)
    expected = read_checkpoint(final)["model"]
    final.write_bytes(final.read_bytes()[: final.stat().st_size // 2])  # lost in a power cut
    capsys.readouterr()

    assert train_phase(spec, 0, shard_dir, vocab_size) == final
    output = capsys.readouterr().out
    assert re.search(
        rf"^{final}: not a readable checkpoint \(.+\); skipped, resuming from step_000005\.pt$", output, re.M
    ), output
    assert "step_000005.pt at step 5" in output
    resumed = read_checkpoint(final)["model"]
    assert all(torch.equal(resumed[name], tensor) for name, tensor in expected.items())


class Killed(BaseException):
    """What SIGKILL does to a run, in-process: nothing after it runs (no ``except Exception``)."""


def test_the_final_evaluation_is_made_by_the_run_after_a_kill_before_it_ended(
    make_spec, make_phase, make_shards, shard_dir: Path, vocab_size: int, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    make_shards("phase1", num_shards=1, sequences_per_shard=10, prefix="heldout")
    spec = make_spec([make_phase(steps=6)])

    def killed(*_args: Any, **_kwargs: Any) -> None:
        raise Killed

    monkeypatch.setattr(bertpretrain.training.phase, "evaluate", killed)
    with pytest.raises(Killed):
        train_phase(spec, 0, shard_dir, vocab_size)
    assert (Path(spec.checkpoint.path) / "phase1" / "step_000006.pt").exists()  # after the checkpoint
    monkeypatch.undo()
    capsys.readouterr()

    train_phase(spec, 0, shard_dir, vocab_size)
    assert [int(line[3]) for line in progress(capsys.readouterr().out, EVAL_LINE)] == [6]
    evaluations = [record for record in log_records(spec) if record["data"].get("split") == "eval"]
    assert [record["step"] for record in evaluations] == [[1, 6]]
    train_phase(spec, 0, shard_dir, vocab_size)  # made once: not again
    assert progress(capsys.readouterr().out, EVAL_LINE) == []


def test_an_evaluation_due_when_sigterm_stopped_the_run_is_made_on_resume(
    make_spec, make_phase, make_shards, shard_dir: Path, vocab_size: int, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    make_shards("phase1", num_shards=1, sequences_per_shard=10, prefix="heldout")
    step = Engine.optimizer_step
    calls = []

    def signalled_step(self: Engine) -> tuple[float, bool]:
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return step(self)

    monkeypatch.setattr(Engine, "optimizer_step", signalled_step)
    spec = make_spec([make_phase(steps=6)], evaluation={"everySteps": 3})
    with pytest.raises(Preempted, match="stopped after step 3"):
        train_phase(spec, 0, shard_dir, vocab_size)
    monkeypatch.undo()
    train_phase(spec, 0, shard_dir, vocab_size)
    assert [int(line[3]) for line in progress(capsys.readouterr().out, EVAL_LINE)] == [3, 6]


def test_a_plan_for_another_world_is_refused(make_spec, make_phase, shard_dir: Path, vocab_size: int) -> None:
    spec = make_spec([make_phase(globalBatchSize=16, microBatchSize=4)])
    data = PreparedData(shard_dir.parent / "vocab", vocab_size, [shard_dir])
    with (
        contextlib.closing(join(spec.accelerator)) as parallel,
        pytest.raises(ValueError, match="the plan is for world size 2, but 1 processes train"),
    ):
        Phase(Plan.resolve(spec, 2), 0, data, parallel).train()
    assert not list(Path(spec.checkpoint.path).rglob("*.pt"))
