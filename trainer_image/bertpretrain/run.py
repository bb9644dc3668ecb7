"""The whole job in one process group: prepare data -> phase 1 -> phase 2 -> export.

This is what the trainer container runs (``torchrun --module bertpretrain run --config FILE``)
and what ``bertjob run job.yaml`` runs on a laptop. Phase 2 starts from phase 1's final
checkpoint with a fresh optimizer and schedule, as NVIDIA's ``run_pretraining.py --phase2`` does;
both phases run in the same child job (see docs/design.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from bertjob.defaults import resolve_model, with_defaults
from bertjob.spec import BertPretrainJob, JobSpec, SpecError, load_job
from bertjob.validation import check
from bertpretrain.engine import DistributedEnv, init_process_group, select_device
from bertpretrain.export import export_hf, fill_mask
from bertpretrain.prepare import PreparedData, prepare
from bertpretrain.train import train_phase

# A sentence whose answer the standard library's documentation teaches well.
DEMO_SENTENCE = "the [MASK] statement exits a function and gives a value back to the caller."


@dataclass(frozen=True)
class JobOutputs:
    """Where a finished job put its results."""

    data: PreparedData
    checkpoints: list[Path]  # the final checkpoint of each phase, in order
    export_dir: Path
    seconds: float


def run_job(spec: JobSpec) -> JobOutputs:
    """Run every stage of a job whose spec has passed ``with_defaults`` and ``check``.

    Raises:
        FileNotFoundError, ValueError: bad corpus, vocabulary or shards (the message names the file).
        RuntimeError: the requested accelerator is not available, or the loss diverged.
    """
    started = time.perf_counter()
    env = DistributedEnv.from_environ()
    data = _prepare_on_rank_zero(spec, env)
    checkpoints: list[Path] = []
    for index in range(len(spec.phases)):
        init_from = checkpoints[-1] if checkpoints else None
        checkpoints.append(
            train_phase(spec, index, data.phase_dirs[index], data.vocab_size, init_from, data.vocab_dir)
        )
    assert spec.export.path is not None
    export_dir = Path(spec.export.path)
    if env.rank == 0:
        export_hf(checkpoints[-1], data.vocab_dir, export_dir, spec.data.lowercase)
    if dist.is_initialized():
        dist.destroy_process_group()
    return JobOutputs(data, checkpoints, export_dir, time.perf_counter() - started)


def _prepare_on_rank_zero(spec: JobSpec, env: DistributedEnv) -> PreparedData:
    """Prepare the data once: rank 0 does the work, the others receive its result.

    Concurrent preparations into one directory would collide, and each would train its own
    vocabulary (tokenizers' WordPiece trainer is not deterministic, huggingface/tokenizers#1794).
    The process group made here serves the training phases too, so it is made only once.
    """
    if env.world_size == 1:
        return prepare(spec)
    if not dist.is_initialized():
        init_process_group(select_device(spec.accelerator, env.local_rank))
    result = [prepare(spec) if env.rank == 0 else None]
    dist.broadcast_object_list(result, src=0, group=dist.new_group(backend="gloo"))
    assert isinstance(result[0], PreparedData)
    return result[0]


def _describe(job: BertPretrainJob, spec: JobSpec) -> str:
    dims = resolve_model(spec.model)
    phases = ", ".join(
        f"phase {i + 1}: seq {p.max_seq_length} x {p.steps} steps of {p.global_batch_size}"
        for i, p in enumerate(spec.phases)
    )
    return (
        f"BertPretrainJob {job.metadata.name!r}: {spec.model.preset} ({dims.num_hidden_layers} layers, "
        f"hidden {dims.hidden_size}), {phases}; {spec.optimizer.name}, {spec.precision}, "
        f"{spec.accelerator}, world size {spec.topology.world_size}"
    )


def run_local(job: BertPretrainJob, source: str) -> int:
    """``bertjob run``: the whole job on this machine, then a fill-mask demonstration.

    Returns the process exit code (0). Raises what :func:`run_job` raises.
    """
    spec = check(with_defaults(job.spec), source)
    print(f"bertjob: running {_describe(job, spec)}", flush=True)
    outputs = run_job(spec)
    print("\nOutputs:")
    print(f"  vocabulary       {outputs.data.vocab_dir}")
    for index, directory in enumerate(outputs.data.phase_dirs):
        print(f"  phase {index + 1} shards   {directory}")
    for index, checkpoint in enumerate(outputs.checkpoints):
        print(f"  phase {index + 1} final    {checkpoint}")
    print(f"  Hugging Face     {outputs.export_dir}")
    print(f'\nfill-mask with the exported model (transformers pipeline): "{DEMO_SENTENCE}"')
    for token, score in fill_mask(outputs.export_dir, DEMO_SENTENCE):
        print(f"  {score:6.3f}  {token}")
    print(f"\nbertjob: done in {outputs.seconds:.0f} s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bertpretrain run|prepare --config FILE``: the trainer container's entry point.

    ``run``: the whole job; every rank started by torchrun runs this. ``prepare``: the data stage
    alone (vocabulary and shards), in this process and its workers. Returns the exit code: 0
    done, 1 bad input data (the message names the file), 2 an invalid job file.
    """
    parser = argparse.ArgumentParser(prog="bertpretrain", description="Run a BertPretrainJob's trainer.")
    parser.add_argument("command", choices=["run", "prepare"])
    parser.add_argument("--config", required=True, help="the job file, mounted from its ConfigMap")
    args = parser.parse_args(argv)
    try:
        job = load_job(args.config)
        spec = check(with_defaults(job.spec), args.config, training=args.command == "run")
    except SpecError as error:
        print(error, file=sys.stderr)
        return 2
    if args.command == "prepare":
        try:
            prepare(spec)
        except (OSError, ValueError) as error:
            print(f"bertpretrain prepare: {error}", file=sys.stderr)
            return 1
        return 0
    is_main = DistributedEnv.from_environ().rank == 0
    if is_main:
        print(f"bertpretrain: {_describe(job, spec)}", flush=True)
    outputs = run_job(spec)
    if is_main:
        print(f"bertpretrain: exported {outputs.export_dir} in {outputs.seconds:.0f} s", flush=True)
    return 0
