"""One rank of the data-parallel equivalence test (tests/bertpretrain/runtime/test_data_parallel.py),
run alone, under torchrun, horovodrun or mpirun: whichever started it, the engine joins that
world (:func:`bertpretrain.runtime.parallel.joining.join`).

    python data_parallel_worker.py OUT_DIR ACCUMULATION_STEPS STEPS MICRO_BATCH [COMPRESSION]

Optimizer step ``s`` of the whole job trains on the synthetic micro-batches ``s * n`` to
``s * n + n - 1`` (``n`` = accumulation steps x world size), rank ``r`` taking those with index
``r`` modulo the world size; so 1 process with 2 accumulation steps sees what 2 processes with 1
each see. Dropout is off, so the only differences are in the order of floating-point sums. Every
rank writes its parameters to ``OUT_DIR/rank<r>.pt`` and its first log line to ``world<r>.txt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from bertjob_api.spec import DistributedSpec, OptimizerSpec
from bertpretrain.model.bert import BertForPreTraining
from bertpretrain.model.config import BertConfig
from bertpretrain.runtime.engine import Engine
from bertpretrain.runtime.parallel.joining import join
from bertpretrain.training.accuracy import step_statistics
from bertpretrain.training.optimizer import build_optimizer
from bertpretrain.training.schedule import poly_warmup_schedule

VOCAB_SIZE, SEQ_LENGTH, PREDICTIONS = 64, 16, 3


def synthetic_batch(size: int, vocab_size: int, seed: int) -> dict[str, torch.Tensor]:
    """A batch of ``size`` random sequences of ``SEQ_LENGTH`` tokens with ``PREDICTIONS`` masked
    positions each, the same for the same ``seed`` in every process (as ``to_batch`` makes one)."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab_size, (size, SEQ_LENGTH), generator=generator)
    positions = torch.randint(1, SEQ_LENGTH, (size, PREDICTIONS), generator=generator)
    return {
        "input_ids": input_ids,
        "token_type_ids": torch.zeros_like(input_ids),
        "attention_mask": torch.ones_like(input_ids),
        "masked_lm_positions": positions,
        "masked_lm_labels": torch.gather(input_ids, 1, positions),
        "next_sentence_labels": torch.randint(0, 2, (size,), generator=generator),
    }


def main(out: Path, accumulation_steps: int, steps: int, size: int, compression: str) -> None:
    torch.set_num_threads(1)
    parallel = join("xeon-cpu", spec=DistributedSpec.model_validate({"gradientCompression": compression}))
    world = parallel.world
    (out / f"world{world.rank}.txt").write_text(f"{world.describe()}; {parallel.description}")
    engine = Engine(parallel, "fp32", step_statistics)
    torch.manual_seed(world.rank)  # different initial weights: broadcast_state must align them
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
    model = engine.prepare(BertForPreTraining(config))
    optimizer = engine.wrap_optimizer(build_optimizer(model, OptimizerSpec(), lr=1e-3), accumulation_steps)
    engine.attach(optimizer, poly_warmup_schedule(optimizer, steps, 0.0), clip_grad_norm=None)
    engine.broadcast_state()
    per_step = accumulation_steps * world.world_size
    for step in range(steps):
        for micro in range(accumulation_steps):
            index = step * per_step + micro * world.world_size + world.rank
            engine.forward_backward(synthetic_batch(size, VOCAB_SIZE, 1000 + index), accumulation_steps)
        engine.optimizer_step()
    torch.save(model.state_dict(), out / f"rank{world.rank}.pt")
    parallel.close()


if __name__ == "__main__":
    compression = sys.argv[5] if len(sys.argv) > 5 else "none"
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), compression)
