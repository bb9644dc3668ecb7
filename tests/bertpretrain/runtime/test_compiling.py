"""Compiling: compiled and eager train alike, the warm-up compiles everything before the first step,
evaluation and a new phase's shapes compile once and not on every call (TorchDynamo's counters),
and a compile that fails stops a job that asked for it and falls back to eager for one that did not.

The compiled test runs TorchInductor's CPU backend on a two-layer model (about a minute here, most
of it the C++ compiler); the failure tests give ``torch.compile`` a backend that raises, so they
compile nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch
from torch._dynamo.utils import counters

import bertpretrain.runtime.compiling
from bertjob_api.spec import OptimizerSpec
from bertpretrain.common.batch import Batch
from bertpretrain.model.bert import BertForPreTraining
from bertpretrain.model.config import BertConfig
from bertpretrain.runtime import compiling
from bertpretrain.runtime.engine import Engine
from bertpretrain.runtime.parallel.joining import join
from bertpretrain.training.accuracy import step_statistics
from bertpretrain.training.optimizer import Lamb, build_optimizer
from bertpretrain.training.schedule import poly_warmup_schedule
from tests.bertpretrain.runtime.data_parallel_worker import synthetic_batch

pytestmark = pytest.mark.usefixtures("one_thread")


def graphs() -> int:
    """Graphs TorchDynamo has compiled in this process so far."""
    return counters["stats"]["unique_graphs"]


@pytest.fixture
def fresh_compiler() -> Iterator[None]:
    compiling.reset()
    yield
    compiling.reset()


def dropout_free(config: BertConfig) -> BertConfig:
    # Compiled dropout draws its masks with its own generator, so only a model without dropout
    # can give the eager model's losses.
    return BertConfig(**{**config.to_dict(), "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})


def engine_for(model: BertForPreTraining, compile: bool, required: bool = True) -> Engine:
    engine = Engine(join("xeon-cpu"), "fp32", step_statistics)
    engine.prepare(model, compile=compile, required=required)
    optimizer = build_optimizer(model, OptimizerSpec(), lr=1e-2, compiled=engine.compiled)
    engine.attach(optimizer, poly_warmup_schedule(optimizer, 10, 0.0), clip_grad_norm=None)
    return engine


def longer(batch: Batch) -> Batch:
    """``batch`` with each row twice as long (a phase 2 of the same model)."""
    return {
        name: torch.cat([tensor, tensor], dim=1)
        if name in ("input_ids", "token_type_ids", "attention_mask")
        else tensor
        for name, tensor in batch.items()
    }


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_compiler")
def test_compiled_trains_as_eager_and_compiles_only_in_the_warm_up(tiny_config: BertConfig) -> None:
    torch.manual_seed(0)
    eager_model = BertForPreTraining(dropout_free(tiny_config))
    compiled_model = copy.deepcopy(eager_model)
    eager, compiled = engine_for(eager_model, compile=False), engine_for(compiled_model, compile=True)
    assert compiled.compiled and not eager.compiled
    assert eager.warm_up(synthetic_batch(4, tiny_config.vocab_size, seed=0)) is None
    batches = [synthetic_batch(4, tiny_config.vocab_size, seed=seed) for seed in range(3)]

    before = graphs()
    assert isinstance(compiled.warm_up(batches[0]), float)
    warmed = graphs()
    # The layers share one graph: embeddings, layer and MLM head, forward and backward, and
    # LAMB's two groups; the warm-up changed no weight and left no gradient or optimizer state.
    assert warmed > before
    for (name, a), b in zip(compiled_model.named_parameters(), eager_model.parameters(), strict=True):
        assert torch.equal(a, b), name
        assert a.grad is None, name
    assert not compiled.optimizer.state

    for batch in batches:
        losses = [engine.forward_backward(batch, accumulation_steps=1)[0] for engine in (eager, compiled)]
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=0)
        for engine in (eager, compiled):
            engine.optimizer_step()
    assert graphs() == warmed, "a training step compiled again after the warm-up"
    for (name, a), b in zip(compiled_model.named_parameters(), eager_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)

    compiled_model.eval()
    compiled.evaluate(batches[0])
    evaluated = graphs()
    assert evaluated > warmed  # evaluation mode compiles once...
    for batch in batches:
        compiled.evaluate(batch)
    assert graphs() == evaluated  # ...and not on every call

    compiled_model.train()
    compiled.forward_backward(longer(batches[0]), accumulation_steps=1)
    new_shape = graphs()
    assert new_shape > evaluated
    for batch in batches:
        compiled.forward_backward(longer(batch), accumulation_steps=1)
    assert graphs() == new_shape


def failing_backend(graph: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> None:
    raise RuntimeError("no C compiler found\nsecond line")


@pytest.fixture
def broken_compiler(monkeypatch: pytest.MonkeyPatch, fresh_compiler: None) -> None:
    monkeypatch.setattr(bertpretrain.runtime.compiling, "backend_for", lambda device: failing_backend)


@pytest.mark.usefixtures("broken_compiler")
def test_a_failed_compile_stops_a_job_that_asked_for_it(tiny_config: BertConfig) -> None:
    model = BertForPreTraining(tiny_config)
    engine = engine_for(model, compile=True, required=True)
    with pytest.raises(compiling.CompileError) as raised:
        engine.warm_up(synthetic_batch(4, tiny_config.vocab_size, seed=0))
    assert str(raised.value).startswith(
        "spec.compile: true, but torch.compile failed on the first micro-batch"
    )
    assert "no C compiler found" in str(raised.value) and "second line" not in str(raised.value)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.usefixtures("broken_compiler")
def test_a_failed_compile_falls_back_to_eager_when_compile_is_unset(tiny_config: BertConfig) -> None:
    model = BertForPreTraining(tiny_config)
    engine = engine_for(model, compile=True, required=False)
    assert isinstance(engine.optimizer, Lamb) and engine.optimizer.param_groups[0]["compiled"]
    batch = synthetic_batch(4, tiny_config.vocab_size, seed=0)
    rng = torch.get_rng_state()
    with pytest.warns(
        UserWarning,
        match=r"spec.compile unset: torch.compile failed \(.*no C compiler found\); training eagerly",
    ):
        assert engine.warm_up(batch) is None
    assert torch.equal(torch.get_rng_state(), rng)  # the warm-up leaves dropout's draws alone
    assert not engine.compiled and not compiling.is_compiled(model)
    assert not any(group["compiled"] for group in engine.optimizer.param_groups)
    losses = engine.forward_backward(batch, accumulation_steps=1)
    engine.optimizer_step()
    assert torch.isfinite(losses).all()


def test_regions_are_the_layers_the_embeddings_and_the_mlm_head(tiny_config: BertConfig) -> None:
    model = BertForPreTraining(tiny_config)
    names = compiling.compile_regions(model)
    assert names == ["bert.embeddings", "bert.encoder.layer.0", "bert.encoder.layer.1", "cls.predictions"]
    assert compiling.is_compiled(model)
    compiling.uncompile(model)
    assert not compiling.is_compiled(model)
    assert compiling.backend_for(torch.device("hpu")) == "hpu_backend"
    assert compiling.backend_for(torch.device("cuda", 0)) == "inductor"
