"""Data-parallel scaling of the trainer's step on CPU: 1 process against 2, under torchrun or horovodrun.

    python benchmarks/scaling.py                          # bert-tiny, seq 128, micro-batch 32, torchrun
    python benchmarks/scaling.py --launcher horovodrun    # the same under horovodrun --gloo
    python benchmarks/scaling.py --launcher deepspeed --zero-stage 2   # torchrun, DeepSpeed ZeRO-2
    python benchmarks/scaling.py --accelerator nvidia-gpu # also single-GPU figures (needs CUDA)

Weak scaling: every process runs the same micro-batch (no gradient accumulation), and the gradients
are averaged over the processes at every optimizer step (DDP under torchrun, Horovod under
horovodrun). Each run is a fresh process tree of this script in its worker mode (``--worker``),
joined by :func:`bertpretrain.runtime.parallel.joining.join` as the trainer joins its job; rank 0
writes its rate.
Both runs use the same cores in total: ``OMP_NUM_THREADS`` is the core count for 1 process and
half of it for each of 2. The figures are sequences/s of the whole job (all ranks' sequences per
second of wall time, after warm-up steps). The scaling efficiency is seq/s(2) / (2 x seq/s(1)):
with the cores fixed, 0.5 means 2 processes train as fast as 1. A third run, 1 process on half
the cores, gives the per-process efficiency seq/s(2) / (2 x that rate): what the all-reduce and
two processes sharing one machine cost (on one machine, with no network).

Every run also reports the optimizer state one rank holds (rank 0, after the last step): LAMB's
two moments, and under DeepSpeed ZeRO (``--launcher deepspeed``) the fp32 master partition ZeRO
keeps beside them; 1 process holds the moments of every parameter, each of 2 ZeRO ranks about half.

With CUDA (``--accelerator nvidia-gpu``, the default where CUDA is available) it also prints one
GPU's rate in this process for fp32 without TF32, TF32 and bf16 autocast (and with
``--gpu-compile`` bf16 under ``torch.compile``), on ``--gpu-preset``. Rows are synthetic, as in
``throughput.py``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from throughput import VOCAB_SIZE, synthetic_rows

from bertjob_api.defaults import MODEL_PRESETS
from bertjob_api.spec import DistributedSpec, OptimizerSpec, Precision
from bertpretrain.data.load.loader import to_batch
from bertpretrain.model.bert import BertConfig, BertForPreTraining
from bertpretrain.runtime.engine import Engine
from bertpretrain.runtime.parallel.joining import join
from bertpretrain.training.accuracy import step_statistics
from bertpretrain.training.optimizer import build_optimizer
from bertpretrain.training.schedule import poly_warmup_schedule

SCRIPT = Path(__file__).resolve()
PREDICTIONS = {128: 20, 512: 80}  # NVIDIA's max_predictions_per_seq; 15% of other lengths
# (label, precision, TF32, torch.compile) of the single-GPU rows.
GPU_SETTINGS: tuple[tuple[str, Precision, bool, bool], ...] = (
    ("fp32 (no TF32)", "fp32", False, False),
    ("fp32 + TF32", "fp32", True, False),
    ("bf16 autocast", "bf16", True, False),
)
GPU_COMPILED: tuple[str, Precision, bool, bool] = ("bf16 + torch.compile", "bf16", True, True)


def predictions_for(seq_length: int) -> int:
    """Masked positions per sequence of ``seq_length`` tokens."""
    return PREDICTIONS.get(seq_length, max(1, round(0.15 * seq_length)))


def deepspeed_config(zero_stage: int, micro_batch: int, world_size: int) -> dict[str, Any]:
    """DeepSpeed's config for one micro-batch per step with LAMB in fp32: what
    :func:`bertjob_api.deepspeed.phase_config` makes for such a job."""
    return {
        "train_batch_size": micro_batch * world_size,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": zero_stage, "compute_grad_norm": True},
        "fp16": {"enabled": False},
        "bf16": {"enabled": False},
        "gradient_clipping": 0.0,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,
    }


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of optimizer state this rank holds: ``moments`` (the optimizer's per-parameter
    state tensors) and, under ZeRO, ``master`` (its fp32 partition of the parameters)."""
    moments = sum(
        value.numel() * value.element_size()
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    )
    zero = getattr(optimizer, "zero", None)
    master = sum(p.numel() * p.element_size() for p in zero.single_partition_of_fp32_groups) if zero else 0
    return {"moments": moments, "master": master}


def train_rate(
    engine: Engine,
    preset: str,
    seq_length: int,
    micro_batch: int,
    steps: int,
    warmup: int,
    compile: bool = False,
    zero_stage: int | None = None,
    memory: dict[str, int] | None = None,
) -> float:
    """Sequences/s of the whole job (all ranks) over ``steps`` optimizer steps after ``warmup``.

    Builds the preset's model (vocabulary 30528), LAMB and the poly schedule on ``engine``, gives
    every rank rank 0's weights, then runs one micro-batch per step, so gradients are averaged
    over ranks every step. The clock starts and stops at a barrier, and on a GPU after a
    synchronize; a collective: every rank calls it. ``zero_stage``: under DeepSpeed, its ZeRO
    stage. ``memory``: filled with :func:`optimizer_state_bytes` after the last step.
    """
    model = engine.prepare(
        BertForPreTraining(BertConfig.from_dims(MODEL_PRESETS[preset], VOCAB_SIZE)), compile=compile
    )
    config = deepspeed_config(zero_stage, micro_batch, engine.world_size) if zero_stage else None
    optimizer = engine.wrap_optimizer(build_optimizer(model, OptimizerSpec(), lr=1e-3), 1, config)
    engine.attach(optimizer, poly_warmup_schedule(optimizer, steps + warmup, 0.1), clip_grad_norm=None)
    engine.broadcast_state()
    rng = np.random.default_rng(engine.rank)
    batch = to_batch(synthetic_rows(micro_batch, seq_length, predictions_for(seq_length), rng))
    batch = {name: tensor.to(engine.device) for name, tensor in batch.items()}

    def settle() -> float:
        if engine.device.type == "cuda":
            torch.cuda.synchronize(engine.device)
        engine.barrier()
        return time.perf_counter()

    started = settle()
    for step in range(steps + warmup):
        if step == warmup:
            started = settle()
        engine.forward_backward(batch, accumulation_steps=1)
        engine.optimizer_step()
    elapsed = settle() - started
    if memory is not None:
        memory.update(optimizer_state_bytes(optimizer))
    return engine.world_size * micro_batch * steps / elapsed


def worker(args: argparse.Namespace) -> int:
    """One rank of a CPU run (started alone, by torchrun or by horovodrun): rank 0 writes its
    rate, the world and the collectives to ``args.worker`` as JSON."""
    distributed = DistributedSpec.model_validate(
        {"deepspeed": {"zeroStage": args.zero_stage}} if args.launcher == "deepspeed" else {}
    )
    parallel = join(args.scale_on, spec=distributed)
    engine = Engine(parallel, "fp32", step_statistics)
    memory: dict[str, int] = {}
    zero_stage = args.zero_stage if parallel.owns_step else None
    rate = train_rate(
        engine,
        args.preset,
        args.seq_length,
        args.micro_batch,
        args.steps,
        args.warmup,
        False,
        zero_stage,
        memory,
    )
    if engine.is_main:
        Path(args.worker).write_text(
            json.dumps(
                {
                    "rate": rate,
                    "world_size": engine.world_size,
                    "threads": torch.get_num_threads(),
                    "collectives": parallel.description,
                    "placement": parallel.device.placement,
                    "optimizer_state": memory,
                }
            )
        )
    parallel.close()
    return 0


def launch(processes: int, launcher: str, threads: int, args: argparse.Namespace) -> dict:
    """Run this script's worker mode as ``processes`` processes (1: alone, no launcher) with
    ``OMP_NUM_THREADS=threads`` each; returns rank 0's JSON report.

    Raises:
        RuntimeError: the run failed (its output is in the message), or horovodrun is missing.
    """
    with tempfile.TemporaryDirectory(prefix="bertjob-scaling-") as scratch:
        out = Path(scratch) / "rank0.json"
        script = [
            str(SCRIPT),
            "--worker",
            str(out),
            "--scale-on",
            args.scale_on,
            "--preset",
            args.preset,
            "--seq-length",
            str(args.seq_length),
            "--micro-batch",
            str(args.micro_batch),
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
            "--launcher",
            launcher if launcher != "none" else args.launcher,
            "--zero-stage",
            str(args.zero_stage),
        ]
        if processes == 1:
            command = [sys.executable, *script]
        elif launcher in ("torchrun", "deepspeed"):
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={processes}",
                *script,
            ]
        else:
            horovodrun = shutil.which("horovodrun", path=str(Path(sys.executable).parent)) or shutil.which(
                "horovodrun"
            )
            if horovodrun is None:
                raise RuntimeError("horovodrun is not installed: trainer_image/build_horovod.sh builds it")
            np_ = str(processes)
            command = [horovodrun, "-np", np_, "-H", f"localhost:{np_}", "--gloo", sys.executable, *script]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if result.returncode != 0 or not out.exists():
            output = result.stdout[-4000:] + result.stderr[-4000:]
            raise RuntimeError(f"{' '.join(command)} exited {result.returncode}:\n{output}")
        report: dict = json.loads(out.read_text())
        return report


def gpu_rates(args: argparse.Namespace) -> list[tuple[str, float]]:
    """One GPU's sequences/s for each of :data:`GPU_SETTINGS` (and the compiled row with
    ``--gpu-compile``), in this process, on ``--gpu-preset`` with ``--gpu-micro-batch``."""
    settings = GPU_SETTINGS + ((GPU_COMPILED,) if args.gpu_compile else ())
    rates = []
    for label, precision, tf32, compile in settings:
        engine = Engine(join("nvidia-gpu", tf32=tf32), precision, step_statistics)
        rate = train_rate(
            engine, args.gpu_preset, args.seq_length, args.gpu_micro_batch, args.steps, args.warmup, compile
        )
        rates.append((label, rate))
        print(f"  {label:22s} {rate:9.1f} sequences/s", flush=True)
        del engine
        gc.collect()
        torch.cuda.empty_cache()
    return rates


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; see the module's docstring."""
    parser = argparse.ArgumentParser(description="Data-parallel scaling, 1 vs 2 processes.")
    parser.add_argument("--preset", default="bert-tiny", choices=MODEL_PRESETS)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=32, help="sequences per process and step")
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed optimizer steps first")
    parser.add_argument(
        "--launcher",
        default="torchrun",
        choices=["torchrun", "horovodrun", "deepspeed"],
        help="deepspeed: torchrun with DeepSpeed ZeRO (--zero-stage) for the 2-process run",
    )
    parser.add_argument("--zero-stage", type=int, default=1, choices=[1, 2], help="with --launcher deepspeed")
    parser.add_argument(
        "--accelerator",
        choices=["xeon-cpu", "nvidia-gpu"],
        default="nvidia-gpu" if torch.cuda.is_available() else "xeon-cpu",
        help="nvidia-gpu adds single-GPU figures (default where CUDA is available)",
    )
    parser.add_argument("--gpu-preset", default="bert-base", choices=MODEL_PRESETS)
    parser.add_argument("--gpu-micro-batch", type=int, default=64)
    parser.add_argument("--gpu-compile", action="store_true", help="add a bf16 row under torch.compile")
    # Worker mode, as the runs re-invoke this script: write rank 0's report to this file.
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--scale-on", default="xeon-cpu", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the scaling table (and the single-GPU rows with CUDA); returns the exit code."""
    args = parse(argv)
    if args.worker:
        return worker(args)
    if args.accelerator == "nvidia-gpu" and not torch.cuda.is_available():
        print("scaling.py: --accelerator nvidia-gpu, but torch.cuda is not available", file=sys.stderr)
        return 2
    cores = len(os.sched_getaffinity(0))
    half = max(1, cores // 2)
    print(
        f"{args.preset}, seq {args.seq_length}, micro-batch {args.micro_batch} per process, fp32 on CPU, "
        f"{args.steps} timed steps after {args.warmup} warm-up; torch {torch.__version__}"
    )
    print(
        f"{cores} cores: OMP_NUM_THREADS={cores} for 1 process and {half} per process for 2, so both use "
        f"the same cores; gradients averaged every step; a third run, 1 process on {half} thread(s), "
        f"is the per-process baseline"
    )
    runs = []
    for processes, launcher, threads in ((1, "none", cores), (1, "none", half), (2, args.launcher, half)):
        try:
            report = launch(processes, launcher, threads, args)
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            print(f"scaling.py: {processes} process(es) under {launcher} failed: {error}", file=sys.stderr)
            return 1
        runs.append((processes, launcher, report))
    print(
        "| processes | launcher | collectives | threads each | sequences/s (all ranks) | per process "
        "| optimizer moments per rank | ZeRO fp32 master per rank |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for processes, launcher, report in runs:
        collectives = report["collectives"] if processes > 1 else "-"
        state = report["optimizer_state"]
        print(
            f"| {processes} | {launcher} | {collectives} | {report['threads']} | {report['rate']:.1f} "
            f"| {report['rate'] / processes:.1f} | {state['moments'] / 2**20:.2f} MiB "
            f"| {state['master'] / 2**20:.2f} MiB |"
        )
    alone, alone_half, pair = (report["rate"] for _, _, report in runs)
    print(
        f"scaling efficiency seq/s(2) / (2 x seq/s(1)) = {pair:.1f} / (2 x {alone:.1f}) = "
        f"{pair / (2 * alone):.2f} (1 process on all {cores} cores; with the cores fixed, 0.5 is the "
        f"rate of 1 process)"
    )
    print(
        f"per-process efficiency seq/s(2) / (2 x seq/s(1 process, {half} thread(s))) = {pair:.1f} / "
        f"(2 x {alone_half:.1f}) = {pair / (2 * alone_half):.2f} (the cost of the all-reduce and of sharing "
        f"the machine)"
    )
    if args.accelerator == "nvidia-gpu":
        print(
            f"one GPU ({torch.cuda.get_device_name(0)}): {args.gpu_preset}, seq {args.seq_length}, "
            f"micro-batch {args.gpu_micro_batch}, {args.steps} timed steps after {args.warmup} warm-up"
        )
        gpu_rates(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
