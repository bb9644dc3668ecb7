"""One rank of the DeepSpeed tests (tests/bertpretrain/runtime/test_deepspeed.py), run under
torchrun or mpirun with 2 processes, or alone for the reference (without DeepSpeed: one process
has nothing to shard).

    python deepspeed_worker.py OUT_DIR ACCUMULATION_STEPS CASE [CASE ...]

A case is ``<optimizer>-<zero stage>[x<factor>]`` (``adamw-1``, ``lamb-2x2``, ...; the factor
multiplies ACCUMULATION_STEPS for that case): train as
tests/bertpretrain/runtime/data_parallel_worker.py does (optimizer step ``s`` on the synthetic
micro-batches that 1 process with 2 accumulation steps sees), save the whole parameters (gathered
under ZeRO-3) to ``OUT_DIR/<case>-rank<r>.pt`` and their count to
``OUT_DIR/parameters-<case>-rank<r>.txt``. A case followed by ``resume`` is also checkpointed after
``CHECKPOINT_STEP`` steps through the trainer's checkpoint functions (into
``OUT_DIR/checkpoints-<case>``), rebuilt from that file in a fresh model, optimizer and DeepSpeed
engine, and run to the end again: its parameters go to ``OUT_DIR/resumed-<case>-rank<r>.pt`` (to
equal the uninterrupted run bitwise); for the first case, loading the file into a world of another
size must fail (``OUT_DIR/other-world-rank<r>.txt`` holds the message). The cases in
:data:`EVALUATED` then evaluate held-out batches, a different number on each rank
(``OUT_DIR/eval-<case>.json``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from bertjob_api.deepspeed import phase_config
from bertjob_api.spec import JobSpec, parse_job
from bertjob_testing.jobs import valid_job
from bertpretrain.model.bert import BertForPreTraining
from bertpretrain.runtime.engine import Engine
from bertpretrain.runtime.parallel import DataParallel
from bertpretrain.runtime.parallel.joining import join
from bertpretrain.runtime.sharding import parameter_count, whole_parameters
from bertpretrain.training.accuracy import step_statistics
from bertpretrain.training.checkpoint import load_training_state, save_checkpoint
from bertpretrain.training.evaluation import evaluate
from bertpretrain.training.optimizer import build_optimizer
from bertpretrain.training.schedule import poly_warmup_schedule
from tests.bertpretrain.runtime.data_parallel_worker import SEQ_LENGTH, VOCAB_SIZE, synthetic_batch

STEPS, MICRO_BATCH, CHECKPOINT_STEP = 4, 4, 2
# Cases whose trained model also evaluates held-out batches (evaluation).
EVALUATED = ("lamb-1", "lamb-3")


def job_spec(optimizer: str, zero_stage: int) -> JobSpec:
    """A job with DeepSpeed at ``zero_stage`` and ``optimizer`` (fp32, CPU)."""
    document = valid_job()
    spec = document["spec"]
    spec |= {"accelerator": "xeon-cpu", "precision": "fp32"}
    spec["optimizer"] = {"name": optimizer, "maxGradNorm": 0.05}  # small enough to clip
    # User keys passed through: small buckets (several reductions per step) and, at stage 2,
    # DeepSpeed's round-robin order of the tensors in the flat buffer (LAMB's layout must follow it).
    zero: dict[str, Any] = {"reduce_bucket_size": 5000, "round_robin_gradients": zero_stage == 2}
    if zero_stage == 3:
        # Every parameter partitioned (by default ZeRO-3 keeps those under 1e5 elements, all of
        # this model's, whole on every rank).
        zero["stage3_param_persistence_threshold"] = 0
    spec["distributed"] = {"deepspeed": {"zeroStage": zero_stage, "config": {"zero_optimization": zero}}}
    return parse_job(document).spec


def model() -> BertForPreTraining:
    from bertpretrain.model.config import BertConfig

    config = BertConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=SEQ_LENGTH,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForPreTraining(config)


def train(
    parallel: DataParallel, spec: JobSpec, accumulation_steps: int, steps: range, out: Path | None = None
) -> tuple[Engine, BertForPreTraining]:
    """Build and train ``steps`` of the case; with ``out``, load the checkpoint there first."""
    world = parallel.world
    engine = Engine(parallel, spec.precision, step_statistics)
    torch.manual_seed(world.rank)  # different initial weights: rank 0's must reach every rank
    bert = model()
    engine.prepare(bert)
    config = phase_config(spec, MICRO_BATCH, accumulation_steps, world.world_size)
    optimizer = engine.wrap_optimizer(
        build_optimizer(bert, spec.optimizer, lr=1e-3), accumulation_steps, config
    )
    scheduler = poly_warmup_schedule(optimizer, STEPS, 0.25)
    engine.attach(
        optimizer, scheduler, None if spec.optimizer.name == "lamb" else spec.optimizer.max_grad_norm
    )
    if out is not None:
        load_training_state(out, bert, optimizer, scheduler, engine.scaler, world.rank)
    engine.broadcast_state()
    per_step = accumulation_steps * world.world_size
    for step in steps:
        for micro in range(accumulation_steps):
            index = step * per_step + micro * world.world_size + world.rank
            engine.forward_backward(
                synthetic_batch(MICRO_BATCH, VOCAB_SIZE, 1000 + index), accumulation_steps
            )
        engine.optimizer_step()
    return engine, bert


def save_weights(bert: BertForPreTraining, path: Path) -> None:
    """Save the model's whole parameters (gathered from every rank under ZeRO-3: a collective) to
    ``path``, and their count beside it (``parameters-<name>.txt``)."""
    with whole_parameters(bert):
        state = {name: tensor.detach().clone() for name, tensor in bert.state_dict().items()}
    torch.save(state, path)
    (path.parent / f"parameters-{path.stem}.txt").write_text(str(parameter_count(bert)))


def evaluation(engine: Engine, out: Path, case: str) -> None:
    """Evaluate three held-out batches, all on rank 0 (the other ranks have none, as where the
    held-out set has fewer rows than ranks: under ZeRO-3 rank 0's forward cannot gather the
    parameters from them); the result goes to ``OUT_DIR/eval-<case>.json`` (rank 0)."""
    world = engine.world
    indices = [5000, 5001, 5002] if world.rank == 0 else []
    result = evaluate(engine, [synthetic_batch(MICRO_BATCH, VOCAB_SIZE, index) for index in indices])
    if engine.is_main:
        (out / f"eval-{case}.json").write_text(json.dumps(result.values()))


def save(engine: Engine, bert: BertForPreTraining, root: Path, step: int) -> Path:
    engine.gather_optimizer_state()
    path = root / "phase1" / f"step_{step:06d}.pt"
    with whole_parameters(bert):
        if engine.is_main:
            save_checkpoint(
                root,
                0,
                step,
                model=bert,
                optimizer=engine.optimizer,
                scheduler=engine.scheduler,
                scaler=engine.scaler,
                keep=2,
                data_position={"sequences": 0},
            )
    engine.barrier()
    return path


def parse_case(case: str, accumulation_steps: int) -> tuple[str, int, int]:
    """``<optimizer>-<stage>[x<factor>]``: the optimizer, the ZeRO stage, and the accumulation steps
    (``accumulation_steps`` times the factor)."""
    name, rest = case.split("-")
    stage, _, factor = rest.partition("x")
    return name, int(stage), accumulation_steps * int(factor or 1)


def main(out: Path, base_accumulation_steps: int, cases: list[str]) -> None:
    torch.set_num_threads(1)
    # "resume" after a case: that case is also checkpointed and resumed.
    resumed = {case for case, after in zip(cases, [*cases[1:], ""], strict=True) if after == "resume"}
    cases = [case for case in cases if case != "resume"]
    first = parse_case(cases[0], base_accumulation_steps)
    parallel = join("xeon-cpu", spec=job_spec(first[0], first[1]).distributed)
    world = parallel.world
    (out / f"world{world.rank}.txt").write_text(
        f"{world.describe(deepspeed=parallel.owns_step)}; {parallel.description}"
    )
    for number, case in enumerate(cases):
        name, stage, accumulation_steps = parse_case(case, base_accumulation_steps)
        spec = job_spec(name, stage)
        if parallel.owns_step:
            parallel.zero_stage = stage  # type: ignore[attr-defined]
        if case in resumed:
            engine, bert = train(parallel, spec, accumulation_steps, range(CHECKPOINT_STEP))
            checkpoint = save(engine, bert, out / f"checkpoints-{case}", CHECKPOINT_STEP)
            train_rest(engine, bert, accumulation_steps)
            save_weights(bert, out / f"{case}-rank{world.rank}.pt")
            if case in EVALUATED:
                evaluation(engine, out, case)
            _, again = train(parallel, spec, accumulation_steps, range(CHECKPOINT_STEP, STEPS), checkpoint)
            save_weights(again, out / f"resumed-{case}-rank{world.rank}.pt")
            if number == 0:
                other_world(parallel, spec, checkpoint, out)
            continue
        engine, bert = train(parallel, spec, accumulation_steps, range(STEPS))
        save_weights(bert, out / f"{case}-rank{world.rank}.pt")
        if case in EVALUATED:
            evaluation(engine, out, case)
    parallel.close()


def train_rest(engine: Engine, bert: BertForPreTraining, accumulation_steps: int) -> None:
    world = engine.world
    per_step = accumulation_steps * world.world_size
    for step in range(CHECKPOINT_STEP, STEPS):
        for micro in range(accumulation_steps):
            index = step * per_step + micro * world.world_size + world.rank
            engine.forward_backward(
                synthetic_batch(MICRO_BATCH, VOCAB_SIZE, 1000 + index), accumulation_steps
            )
        engine.optimizer_step()


def other_world(parallel: DataParallel, spec: JobSpec, checkpoint: Path, out: Path) -> None:
    """Load the checkpoint as if the world had 3 ranks: the optimizer must refuse it."""
    from bertpretrain.model.config import CheckpointError

    state: Any = torch.load(checkpoint, weights_only=True)
    state["optimizer"]["zero"]["world_size"] = parallel.world.world_size + 1
    engine = Engine(parallel, spec.precision, step_statistics)
    bert = model()
    engine.prepare(bert)
    config = phase_config(spec, MICRO_BATCH, 1, parallel.world.world_size)
    optimizer = engine.wrap_optimizer(build_optimizer(bert, spec.optimizer, lr=1e-3), 1, config)
    scheduler = poly_warmup_schedule(optimizer, STEPS, 0.25)
    try:
        load_training_state(checkpoint, bert, optimizer, scheduler, engine.scaler, parallel.world.rank, state)
    except CheckpointError as error:
        (out / f"other-world-rank{parallel.world.rank}.txt").write_text(str(error))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
