"""The engine: precision, accumulation, clipping, the statistics function it is given, and DDP
under torchrun; and the step statistics that travel through it as one tensor."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import bertpretrain.runtime.engine
from bertpretrain.model.bert import BertForPreTraining
from bertpretrain.model.config import BertConfig
from bertpretrain.runtime.engine import Engine
from bertpretrain.runtime.parallel.joining import join
from bertpretrain.training.accuracy import StepStatistics, step_statistics
from bertpretrain.training.checkpoint import read_checkpoint
from bertpretrain.training.optimizer import build_optimizer
from bertpretrain.training.schedule import poly_warmup_schedule
from tests.bertpretrain.runtime.data_parallel_worker import synthetic_batch

pytestmark = pytest.mark.usefixtures("one_thread")


def test_emulated_cpu_precision_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bertpretrain.runtime.engine, "_cpu_has_native", lambda precision: False)
    with pytest.warns(UserWarning, match="bf16 autocast on a CPU without AVX512-BF16"):
        Engine(join("xeon-cpu"), "bf16", step_statistics)


def make_engine(model: BertForPreTraining, precision: str = "fp32") -> Engine:
    engine = Engine(join("xeon-cpu"), precision, step_statistics)  # type: ignore[arg-type]
    engine.prepare(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    engine.attach(optimizer, poly_warmup_schedule(optimizer, 10, 0.0), clip_grad_norm=None)
    return engine


def test_accumulation_equals_one_large_batch(tiny_config: BertConfig) -> None:
    config = BertConfig(
        **{**tiny_config.to_dict(), "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    )
    whole_model = BertForPreTraining(config)
    split_model = copy.deepcopy(whole_model)
    batch = synthetic_batch(8, config.vocab_size, seed=8)

    whole = StepStatistics.from_tensor(make_engine(whole_model).forward_backward(batch, accumulation_steps=1))
    split = make_engine(split_model)
    halves = [{name: tensor[rows] for name, tensor in batch.items()} for rows in (slice(0, 4), slice(4, 8))]
    summed = StepStatistics.from_tensor(
        sum(split.forward_backward(half, accumulation_steps=2) for half in halves)
    )

    # Equal-sized halves with the same number of masked tokens: the mean of means is the mean,
    # and the hits and totals add up.
    mean_losses = [torch.tensor(stats.mean_losses(n)) for stats, n in ((summed, 2), (whole, 1))]
    torch.testing.assert_close(*mean_losses)  # fp32 tensors: fp32's tolerance, as summed
    torch.testing.assert_close(summed.counts(), whole.counts())
    assert whole.mlm_total == 8 * 3 and whole.nsp_total == 8  # masked positions, NSP labels
    for (name, a), b in zip(whole_model.named_parameters(), split_model.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


@pytest.mark.filterwarnings("ignore:.*autocast on a CPU without:UserWarning")
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_step(tiny_config: BertConfig, precision: str) -> None:
    model = BertForPreTraining(tiny_config)
    engine = make_engine(model, precision)
    before = copy.deepcopy(model.state_dict())
    losses = engine.forward_backward(synthetic_batch(4, tiny_config.vocab_size, seed=4), accumulation_steps=1)
    assert losses.dtype == torch.float32 and torch.isfinite(losses).all()
    engine.optimizer_step()
    assert all(p.grad is None for p in model.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    changed = [name for name, tensor in model.state_dict().items() if not torch.equal(tensor, before[name])]
    assert "bert.encoder.layer.0.attention.self.query.weight" in changed


def test_adamw_gradients_are_clipped(tiny_config: BertConfig) -> None:
    from bertjob_api.spec import OptimizerSpec

    model = BertForPreTraining(tiny_config)
    engine = Engine(join("xeon-cpu"), "fp32", step_statistics)
    engine.prepare(model)
    optimizer = build_optimizer(model, OptimizerSpec(name="adamw", max_grad_norm=1e-3), lr=0.0)
    engine.attach(optimizer, poly_warmup_schedule(optimizer, 10, 0.0), clip_grad_norm=1e-3)
    engine.forward_backward(synthetic_batch(4, tiny_config.vocab_size, seed=4), accumulation_steps=1)
    engine.scaler.unscale_(optimizer)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])) > 1e-3
    norms: list[float] = []
    hook = optimizer.register_step_pre_hook(
        lambda *_: norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))
    )
    engine.optimizer_step()
    hook.remove()
    assert norms == [pytest.approx(1e-3, rel=1e-4)]


WORKER = """
import contextlib, json, os, sys
from pathlib import Path
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from bertjob_api.spec import parse_spec
from bertjob_api.defaults import with_defaults
from bertpretrain.runtime.engine import Engine
from bertpretrain.data.load.loader import build_loader
from bertpretrain.runtime.parallel.joining import join
from bertpretrain.model.bert import BertForPreTraining
from bertpretrain.model.config import BertConfig
from bertpretrain.data.format.prepared import PreparedData
from bertpretrain.training.accuracy import step_statistics
from bertpretrain.training.phase import Phase
from bertjob_api.plan import Plan

spec = with_defaults(parse_spec(json.loads(sys.argv[1])))
shard_dir, vocab_size, out = Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
rank = os.environ["RANK"]
dist.init_process_group("gloo")  # shared by both engines below, which then leave it open

# Gradient all-reduces of 2 optimizer steps of 3 micro-batches each: one per step with no_sync.
engine = Engine(join("xeon-cpu"), "fp32", step_statistics)
config = BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=64)
engine.prepare(BertForPreTraining(config))
reductions = []
def counting_hook(state, bucket):
    reductions.append(bucket.index())
    return allreduce_hook(state, bucket)
engine.wrapped.register_comm_hook(None, counting_hook)
batches = iter(build_loader(shard_dir, 32, 5, vocab_size, 4, rank=int(rank), world_size=2))
for _ in range(6):
    engine.forward_backward(next(batches), accumulation_steps=3)
(out / f"reductions{rank}").write_text(str(len([index for index in reductions if index == 0])))

data = PreparedData(shard_dir.parent / "vocab", vocab_size, [shard_dir])
with contextlib.closing(join(spec.accelerator, spec.tf32, spec.distributed)) as parallel:
    final = Phase(Plan.resolve(spec), 0, data, parallel).train()
(out / f"final{rank}").write_text(str(final))
dist.destroy_process_group()
"""


def test_two_ranks_under_torchrun(
    make_spec, make_phase, shard_dir: Path, vocab_size: int, tmp_path: Path
) -> None:
    spec = make_spec(
        [make_phase(steps=4, globalBatchSize=16, microBatchSize=4)],
        topology={"nodes": 1, "processesPerNode": 2},
    )
    document = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(script),
            json.dumps(document),
            str(shard_dir),
            str(vocab_size),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    # Only rank 0 prints progress; both ranks return the same final checkpoint.
    assert sum(line.startswith("phase 1/1:") for line in lines) == 1
    assert "world size 2" in lines[0] and "micro-batch 4 x 2 accumulation steps" in lines[0]
    assert sum(line.startswith("phase 1/1 step 4/4") for line in lines) == 1
    assert [(tmp_path / f"reductions{rank}").read_text() for rank in range(2)] == ["2", "2"]
    finals = [(tmp_path / f"final{rank}").read_text() for rank in range(2)]
    assert finals[0] == finals[1]
    state = read_checkpoint(Path(finals[0]))
    assert state["step"] == 4
    assert all(torch.isfinite(tensor).all() for tensor in state["model"].values())
    # Each rank's dropout draws differ, and the checkpoint keeps both, for an exact resume.
    assert len(state["rng"]) == 2 and not torch.equal(state["rng"][0]["torch"], state["rng"][1]["torch"])


def test_the_engine_minimises_what_it_is_given(tiny_config: BertConfig) -> None:
    """The engine knows no loss of its own: element 0 of the statistics function's result is
    back-propagated, and the whole result comes back, detached."""
    model = BertForPreTraining(tiny_config)
    engine = Engine(
        join("xeon-cpu"), "fp32", lambda batch, outputs: torch.stack([outputs[1].sum(), torch.tensor(2.0)])
    )
    engine.prepare(model)
    stats = engine.forward_backward(synthetic_batch(4, tiny_config.vocab_size, seed=4), accumulation_steps=2)
    assert stats.shape == (2,) and stats[1] == 2.0 and not stats.requires_grad
    gradients = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    # Only the NSP head and what feeds it get gradients; the masked-LM head's own bias gets none.
    assert "cls.seq_relationship.weight" in gradients and "cls.predictions.bias" not in gradients
    torch.testing.assert_close(gradients["cls.seq_relationship.bias"], torch.full((2,), 4 / 2))


def test_step_statistics_travel_as_one_tensor() -> None:
    # The last figure, the sequences, is not the NSP total: packed rows hold more than their labels.
    values = torch.tensor([7.5, 6.75, 0.75, 3.0, 12.0, 5.0, 8.0, 9.0])
    stats = StepStatistics.from_tensor(values)
    assert (float(stats.loss), float(stats.nsp_loss), float(stats.mlm_total), float(stats.nsp_correct)) == (
        7.5,
        0.75,
        12.0,
        5.0,
    )
    assert torch.equal(stats.to_tensor(), values) and len(values) == StepStatistics.SIZE
    assert stats.mean_losses(3) == (2.5, 2.25, 0.25) and stats.finite()
    accuracy = stats.accuracy()
    assert (accuracy.mlm, accuracy.nsp, accuracy.sequences) == (0.25, 5 / 8, 9)
    assert not StepStatistics.from_tensor(values * torch.tensor([1, float("nan"), 1, 1, 1, 1, 1, 1])).finite()
    assert all(map(math.isnan, stats.mean_losses(0)))
