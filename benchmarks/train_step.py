"""The training step on one device: sequences/s, model FLOP utilisation (MFU) and peak memory, ours
against transformers' ``BertForPreTraining``, then a short real run of the trainer.

    python benchmarks/train_step.py --device cpu                      # bert-tiny, fp32 (what CI runs)
    python benchmarks/train_step.py --device cuda                     # one GPU: bert-large, bert-base, bf16
    python benchmarks/train_step.py --device cuda --presets bert-base --seq 128 --json out.json
    python benchmarks/train_step.py --device cuda --micro-batch bert-large:128=64 --accumulation 4

The device defaults to ``cuda`` when one is present. In priority order, each group skippable, until
``--time-budget`` seconds (default 300) are spent (the rows left are printed as skipped):

1. **The GEMM ceiling** of this run: ``torch.mm`` of two n x n matrices (CUDA: 8192, bf16, or fp32
   with TF32 under ``--precision fp32``, 20 products; CPU: 1024, fp32, 50 products), each timed
   after 3 untimed ones (CUDA events on CUDA), the fastest, in TFLOP/s = 2 n^3 / s. Every row's
   share is of this figure, measured on the same device in the same run.
2. **The rows**, per sequence length (128 with 20 masked positions, 512 with 80: NVIDIA's recipe) and
   per preset (CUDA: bert-large then bert-base; CPU: bert-tiny), in this order:

   - ``hf eager``: ``transformers.BertForPreTraining`` (SDPA attention) with ``labels`` (-100 outside
     the masked positions) and ``next_sentence_label``: its MLM logits on every token;
   - ``ours eager``: :class:`bertpretrain.model.bert.BertForPreTraining` with ``masked_lm_positions``
     (the MLM head on the masked positions only) and :func:`bertpretrain.model.bert.pretraining_loss`;
   - ``ours compiled``: the trainer's compile path, :func:`bertpretrain.runtime.compiling.compile_regions`
     (each encoder layer, the embeddings and the MLM head compiled in place, after
     :func:`~bertpretrain.runtime.compiling.reset`) and LAMB's step compiled (``Lamb(compiled=True)``).

   Every row starts from the same weights (ours at seed 0, saved once per preset), trains on the same
   synthetic batch (``benchmarks/throughput.py``'s rows, ids folded into the vocabulary of 30522, no
   padding), in the same precision (CUDA: bf16 autocast, CPU: fp32), with the same optimizer: our LAMB
   (:class:`bertpretrain.training.optimizer.Lamb`, weight decay 0.01 on ``param_groups``), dropout on.
   A step is a whole optimizer step: ``--accumulation`` micro-batches of forward, loss and backward,
   then LAMB's step and ``zero_grad``, ending with a device synchronisation. The first 3 steps are
   not timed; the figures are of the median of ``--steps`` timed steps. Each row is measured in a
   fresh process (``spawn``), one after the other, so that its peak memory is its own.
3. **A short real run**, ``python -m bertpretrain local`` (``--local-preset``, CUDA: bert-base, bf16,
   ``accelerator: nvidia-gpu``, compiled unless ``--no-compiled``; CPU: bert-tiny, fp32, eager),
   phase 1 alone at seq 128 with the rows' micro-batch for ``--local-steps`` steps (CUDA 40, CPU 10),
   on the builtin corpus (its vocabulary padded to the rows' 30522 tokens), in a temporary
   directory; its sequences/s, read from the training log ``train.jsonl`` (median of the logging
   intervals after the first, which holds the start and any compilation), is printed beside the
   row of the same preset, sequence length, micro-batch and mode: the ratio is what the training
   loop (loader, logging, checkpoints) costs. ``--no-local`` skips it.
4. **One torchrun run**, ``python -m torch.distributed.run --standalone --nproc_per_node 1 --module
   bertpretrain run`` of the same job (its data reused), so that the launcher path starts once;
   whether it succeeded, its sequences/s and the trainer's world line. With one rank the trainer
   joins no process group (:func:`bertpretrain.runtime.parallel.joining.join` wraps in DDP only for more
   than one process), so this checks torchrun's start and the trainer's reading of its variables,
   not NCCL. ``--no-torchrun`` skips it.

FP8 (torchao float8 training of the encoder's Linear layers) was measured with this script at commit
af8c93e on an H200 at 0.86x the compiled bf16 step and left out of the trainer; see
``benchmarks/RESULTS.md`` and ``docs/design.md``.

Columns:

- ``seq/s``: sequences per second: micro-batch x accumulation over the median step time;
- ``TFLOP/s``: the model's matrix-product FLOPs per sequence (:func:`train_flops_per_sequence`)
  times ``seq/s``. Counted analytically, and the same count for ours and Hugging Face's: the
  encoder's Linear layers and attention's two products on every token, the MLM head (transform and
  decoder) on the masked positions only, the pooler and the NSP classifier; backward twice the
  forward. Hugging Face computes the decoder on every token, extra work that is not counted: its
  TFLOP/s is useful work, comparable with ours. Element-wise work, softmax, LayerNorm, the
  embeddings' gathers and the optimizer are not counted;
- ``% of GEMM``: ``TFLOP/s`` over this run's GEMM ceiling (MFU against what ``torch.mm`` reaches
  here, not against the datasheet);
- ``LAMB ms``: the median time of LAMB's step alone (CUDA events around ``optimizer.step()``, within
  the timed steps; it is part of the step time);
- ``peak MiB``: CUDA: ``torch.cuda.max_memory_allocated``; CPU: the process's peak resident set
  (``VmHWM``: the interpreter, torch and transformers included);
- ``vs hf``: ``seq/s`` over the ``hf eager`` row's of the same preset and sequence length, measured in
  this run (each group's hf row runs first);
- ``compile s``: compiled rows: the seconds the 3 warm-up steps took beyond 3 normal steps (the
  compilation, mostly in the first).

Output: lines in Markdown, flushed one per event; ``--json PATH`` writes every figure (rewritten after
each event, so that an interrupted run keeps what it measured).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from throughput import synthetic_rows

from bertjob_api.defaults import MODEL_PRESETS
from bertpretrain.data.load.loader import to_batch
from bertpretrain.model.bert import IGNORE_INDEX, BertConfig, BertForPreTraining, pretraining_loss
from bertpretrain.training.optimizer import Lamb, param_groups

REPO = Path(__file__).resolve().parents[1]
VOCAB_SIZE = 30522  # bert-base-uncased
WARMUP_STEPS = 3
LEARNING_RATE, WEIGHT_DECAY = 1e-3, 0.01
PREDICTIONS = {128: 20, 512: 80}  # masked positions per sequence length, NVIDIA's recipe
MODES = ("hf eager", "ours eager", "ours compiled")  # each group's order
COMPILED = ("ours compiled",)
DEFAULT_PRESETS = {"cuda": ["bert-large", "bert-base"], "cpu": ["bert-tiny"]}
# Micro-batches that fit an 80 GB GPU in bf16 (seen on an H200: bert-large at seq 128 x 128 peaks at
# 21.8 GiB ours eager, 25.7 GiB Hugging Face's; seq 512 costs 4-5x as much per sequence); on CPU,
# the throughput benchmark's.
DEFAULT_MICRO_BATCH = {
    ("cuda", "bert-large", 128): 128,
    ("cuda", "bert-large", 512): 32,
    ("cuda", 128): 256,
    ("cuda", 512): 64,
    ("cpu", 128): 32,
    ("cpu", 512): 8,
}
GEMM_SIZE = {"cuda": 8192, "cpu": 1024}
GEMM_WARMUP = 3
# Products timed, the fastest taken: more on a CPU, which other processes share.
GEMM_REPS = {"cuda": 20, "cpu": 50}
LOCAL_PRESET = {"cuda": "bert-base", "cpu": "bert-tiny"}
LOCAL_STEPS = {"cuda": 40, "cpu": 10}
COLUMNS = (
    "preset",
    "seq",
    "micro-batch",
    "mode",
    "seq/s",
    "TFLOP/s",
    "% of GEMM",
    "LAMB ms",
    "peak MiB",
    "vs hf",
    "compile s",
)


def train_flops_per_sequence(config: BertConfig, seq_length: int, predictions: int) -> float:
    """Matrix-product FLOPs of one training step per sequence (forward, and backward at twice the
    forward), counted analytically.

    Forward, per sequence of ``seq_length`` L tokens with ``predictions`` P masked positions, H the
    hidden size, I the intermediate size, V the vocabulary: 2 FLOPs per multiply-add of

    - each encoder layer's Linear layers, ``4 H^2 + 2 H I`` per token (query, key, value, attention
      output; intermediate and output), on L tokens;
    - each layer's attention products ``Q K^T`` and ``P V``, ``2 L^2 H``;
    - the MLM head's transform ``H^2`` and decoder ``H V`` on the P masked positions only;
    - the pooler ``H^2`` and the NSP classifier ``2 H`` on one token.

    The embeddings (gathers), element-wise work, softmax and LayerNorm are not counted.
    """
    hidden, intermediate = config.hidden_size, config.intermediate_size
    layer = seq_length * (4 * hidden * hidden + 2 * hidden * intermediate) + 2 * seq_length**2 * hidden
    heads = predictions * (hidden * hidden + hidden * config.vocab_size) + hidden * hidden + 2 * hidden
    forward = 2.0 * (config.num_hidden_layers * layer + heads)
    return 3 * forward


def make_batch(
    device: torch.device, micro_batch: int, seq_length: int, predictions: int, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A synthetic batch: ``to_batch`` tensors plus Hugging Face's ``labels`` [B, L] (the masked
    tokens' ids at their positions, -100 elsewhere)."""
    rows = synthetic_rows(micro_batch, seq_length, predictions, np.random.default_rng(seed))
    # throughput.py draws ids below NVIDIA's padded vocabulary (30528); fold them into 30522.
    rows["input_ids"] %= VOCAB_SIZE
    rows["masked_lm_ids"] %= VOCAB_SIZE
    batch = to_batch(rows)
    labels = torch.full_like(batch["input_ids"], IGNORE_INDEX)
    labels.scatter_(1, batch["masked_lm_positions"], batch["masked_lm_labels"])
    batch["labels"] = labels
    return {name: tensor.to(device) for name, tensor in batch.items()}


def build_model(name: str, config: BertConfig, weights: Path) -> torch.nn.Module:
    """``name``'s model (``"ours"`` or ``"hf"``, SDPA attention) with the weights saved at ``weights``."""
    model: torch.nn.Module
    if name == "ours":
        model = BertForPreTraining(config)
    else:
        import transformers  # only where the hf rows run: it takes seconds to import

        hf_config = transformers.BertConfig(**config.to_hf_dict(), attn_implementation="sdpa")
        model = transformers.BertForPreTraining(hf_config)
    model.load_state_dict(torch.load(weights, weights_only=True))
    return model


def loss_of(name: str, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The pretraining loss (fp32 scalar, nats) of ``name``'s model on ``batch``, as each is called."""
    if name == "ours":
        mlm_logits, nsp_logits = model(
            batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["masked_lm_positions"]
        )
        return pretraining_loss(
            mlm_logits, batch["masked_lm_labels"], nsp_logits, batch["next_sentence_labels"]
        )[0]
    output = model(
        input_ids=batch["input_ids"],
        token_type_ids=batch["token_type_ids"],
        attention_mask=batch["attention_mask"],
        labels=batch["labels"],
        next_sentence_label=batch["next_sentence_labels"],
    )
    return output.loss


def max_rss_mb() -> float:
    """This process's peak resident set so far, MiB: ``VmHWM`` of ``/proc/self/status`` (Linux).

    Not ``ru_maxrss``: Linux carries the peak of the address space that ``exec`` replaces into
    it, so a spawned child's ``ru_maxrss`` starts at the parent's resident set at the fork.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**10  # kB
    raise RuntimeError("/proc/self/status has no VmHWM (not Linux?)")


def _open_device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda":
        # The trainer's default (spec.tf32: true); it matters for fp32 alone.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return device


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _autocast(device: torch.device, precision: str) -> Any:
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


class _Clock:
    """Marks on the device's timeline: CUDA events on CUDA (read after a synchronisation), else
    ``perf_counter``."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def seconds(start: Any, end: Any) -> float:
        return end - start if isinstance(start, float) else start.elapsed_time(end) / 1000


def gemm_ceiling(device_name: str, precision: str, size: int) -> dict[str, Any]:
    """``torch.mm`` of two ``size`` x ``size`` matrices (bf16 under ``precision`` bf16, else fp32),
    ``GEMM_REPS`` products each timed after ``GEMM_WARMUP``, the fastest (what the device can do,
    also on a shared CPU); run in a fresh process. Returns ``tflops`` and what the device is
    (``device``, ``capability``)."""
    device = _open_device(device_name)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    generator = torch.Generator(device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    for _ in range(GEMM_WARMUP):
        torch.mm(a, b)
    _synchronize(device)
    clock = _Clock(device)
    marks = [clock.mark()]
    for _ in range(GEMM_REPS[device.type]):
        torch.mm(a, b)
        marks.append(clock.mark())
    _synchronize(device)
    seconds = min(clock.seconds(start, end) for start, end in itertools.pairwise(marks))
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        capability: list[int] | None = list(torch.cuda.get_device_capability(device))
    else:
        name = f"cpu, {torch.get_num_threads()} threads"
        capability = None
    return {
        "tflops": 2 * size**3 / seconds / 1e12,
        "size": size,
        "dtype": str(dtype).removeprefix("torch."),
        "device": name,
        "capability": capability,
    }


def _prepare(
    mode: str, config: BertConfig, weights: Path, device: torch.device
) -> tuple[torch.nn.Module, torch.optim.Optimizer, list[str]]:
    """The model of ``mode`` on ``device`` (compiled as the mode says, nothing compiled yet) and its
    LAMB; with notes on what differs from the mode's description."""
    name = mode.split()[0]
    model = build_model(name, config, weights).to(device)
    notes = []
    compiled = mode in COMPILED
    if compiled:
        from bertpretrain.runtime import compiling

        compiling.reset()
        regions = compiling.compile_regions(model, compiling.backend_for(device))
        notes.append(f"{len(regions)} regions compiled")
    groups = param_groups(model, WEIGHT_DECAY)
    optimizer: torch.optim.Optimizer
    if compiled:
        try:
            optimizer = Lamb(groups, lr=LEARNING_RATE, compiled=True)
        except TypeError as error:  # a Lamb without the keyword
            optimizer = Lamb(groups, lr=LEARNING_RATE)
            notes.append(f"LAMB eager: {_first_line(error)}")
    else:
        optimizer = Lamb(groups, lr=LEARNING_RATE)
    return model, optimizer, notes


def measure(task: dict[str, Any]) -> dict[str, Any]:
    """Train ``task["mode"]``'s model for ``WARMUP_STEPS + task["steps"]`` optimizer steps; run in a
    fresh process.

    Returns:
        ``seq_per_s`` and ``step_ms`` (the median timed step), ``lamb_ms`` (the median of LAMB's
        step alone), ``peak_mib`` (see the module's docstring), ``warmup_extra_s`` (the warm-up
        steps' seconds beyond as many median steps), ``initial_loss`` (eager modes: evaluation mode,
        before any step; equal losses show the models start from the same weights and compute the
        same thing), ``final_loss`` and ``notes``.
    """
    device = _open_device(task["device"])
    torch.manual_seed(1)  # dropout's masks; the initial weights come from ``weights``
    config = BertConfig.from_dims(MODEL_PRESETS[task["preset"]], VOCAB_SIZE)
    mode, name = task["mode"], task["mode"].split()[0]
    model, optimizer, notes = _prepare(mode, config, Path(task["weights"]), device)
    batch = make_batch(device, task["micro_batch"], task["seq"], PREDICTIONS[task["seq"]])
    autocast = _autocast(device, task["precision"])
    initial_loss = None
    if mode.endswith("eager"):  # an evaluation forward would compile graphs of its own
        model.eval()
        with torch.no_grad(), autocast:
            initial_loss = loss_of(name, model, batch).item()
    model.train()
    clock = _Clock(device)
    accumulation = task["accumulation"]
    seconds, lamb = [], []
    loss = torch.zeros(())
    for _ in range(WARMUP_STEPS + task["steps"]):
        started = time.perf_counter()
        for _ in range(accumulation):
            with autocast:
                loss = loss_of(name, model, batch) / accumulation
            loss.backward()
        before = clock.mark()
        optimizer.step()
        after = clock.mark()
        optimizer.zero_grad(set_to_none=True)
        _synchronize(device)
        seconds.append(time.perf_counter() - started)
        lamb.append(clock.seconds(before, after))
    median = statistics.median(seconds[WARMUP_STEPS:])
    on_cuda = device.type == "cuda"
    return {
        "seq_per_s": task["micro_batch"] * accumulation / median,
        "step_ms": median * 1000,
        "lamb_ms": statistics.median(lamb[WARMUP_STEPS:]) * 1000,
        "peak_mib": torch.cuda.max_memory_allocated(device) / 2**20 if on_cuda else max_rss_mb(),
        "warmup_extra_s": sum(seconds[:WARMUP_STEPS]) - WARMUP_STEPS * median,
        "initial_loss": initial_loss,
        "final_loss": loss.item() * accumulation,
        "notes": notes,
    }


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else 'no message'}"[:300]


def _in_fresh_process(function: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``function(*args)`` in a spawned process; ``{"error": ...}`` if it raised or the process died."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        try:
            return pool.submit(function, *args).result()
        except Exception as error:
            return {"error": _first_line(error)}


def _format(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _tflops(value: float) -> str:
    """TFLOP/s to 3 significant digits or whole ones (0.0571, 4.12, 41.2, 412)."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _subprocess_env() -> dict[str, str]:
    """This environment with the repository's packages importable (where they are not installed)."""
    paths = [str(REPO / "api"), str(REPO / "trainer_image")]
    existing = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*paths, existing] if existing else paths),
        "PYTHONUNBUFFERED": "1",
    }


def _micro_batches(values: Sequence[str]) -> dict[tuple[str, int] | None, int]:
    """``--micro-batch`` values: ``N`` (every row) or ``PRESET:SEQ=N``."""
    chosen: dict[tuple[str, int] | None, int] = {}
    for value in values:
        key, _, size = value.rpartition("=")
        if not key:
            chosen[None] = int(size)
            continue
        preset, _, seq = key.partition(":")
        if preset not in MODEL_PRESETS or not seq.isdigit():
            raise ValueError(f"--micro-batch {value}: expected N or PRESET:SEQ=N")
        chosen[(preset, int(seq))] = int(size)
    return chosen


def micro_batch_for(chosen: dict[tuple[str, int] | None, int], device: str, preset: str, seq: int) -> int:
    """The micro-batch of ``preset`` at ``seq``: ``--micro-batch``'s, else the device's default."""
    if (preset, seq) in chosen:
        return chosen[(preset, seq)]
    if None in chosen:
        return chosen[None]
    return DEFAULT_MICRO_BATCH.get((device, preset, seq), DEFAULT_MICRO_BATCH[(device, seq)])


class Report:
    """What is printed, line by line (flushed), and the same figures for ``--json``."""

    def __init__(self, json_path: str | None):
        self.json_path = Path(json_path) if json_path else None
        self.figures: dict[str, Any] = {"rows": [], "skipped": []}

    def line(self, text: str = "") -> None:
        print(text, flush=True)

    def record(self, key: str, value: Any) -> None:
        if isinstance(self.figures.get(key), list):
            self.figures[key].append(value)
        else:
            self.figures[key] = value
        if self.json_path is not None:
            self.json_path.write_text(json.dumps(self.figures, indent=1, default=str) + "\n")

    def skip(self, what: str, why: str) -> None:
        self.line(f"skipped {what}: {why}")
        self.record("skipped", {"what": what, "why": why})

    def row(self, cells: dict[str, Any], figures: dict[str, Any]) -> None:
        # An error message's "|" escaped, so that it stays in its cell.
        text = (str(cells.get(column, "-")).replace("|", "\\|") for column in COLUMNS)
        self.line("| " + " | ".join(text) + " |")
        self.record("rows", figures)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="The training step: sequences/s, MFU against this run's GEMM ceiling, peak memory; "
        "ours against transformers' BertForPreTraining; then a short real run of the trainer."
    )
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu"
    )
    parser.add_argument(
        "--presets",
        nargs="+",
        choices=list(MODEL_PRESETS),
        help="default: cuda bert-large bert-base, cpu bert-tiny",
    )
    parser.add_argument("--seq", nargs="+", type=int, default=[128, 512], choices=sorted(PREDICTIONS))
    parser.add_argument(
        "--micro-batch",
        nargs="+",
        default=[],
        metavar="N|PRESET:SEQ=N",
        help="default: cuda bert-large 128 at seq 128 and 32 at 512, others 256 and 64; cpu 32 and 8",
    )
    parser.add_argument("--accumulation", type=int, default=1, help="micro-batches per LAMB step")
    parser.add_argument("--precision", choices=["bf16", "fp32"], help="default: cuda bf16, cpu fp32")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per row, after 3 warm-up ones")
    parser.add_argument(
        "--time-budget",
        type=float,
        default=300,
        metavar="SECONDS",
        help="skip what is left once this many seconds are spent",
    )
    parser.add_argument("--gemm-size", type=int, help="default: cuda 8192, cpu 1024")
    parser.add_argument("--no-hf", action="store_true", help="no hf eager rows")
    parser.add_argument("--no-eager", action="store_true", help="no ours eager rows")
    parser.add_argument(
        "--no-compiled", action="store_true", help="no ours compiled rows; the local run eager"
    )
    parser.add_argument("--no-local", action="store_true", help="no `python -m bertpretrain local` run")
    parser.add_argument("--no-torchrun", action="store_true", help="no torchrun run")
    parser.add_argument("--local-steps", type=int, help="default: cuda 40, cpu 10")
    parser.add_argument(
        "--local-preset", choices=list(MODEL_PRESETS), help="default: cuda bert-base, cpu bert-tiny"
    )
    parser.add_argument("--job-timeout", type=float, default=600, help="seconds each trainer run may take")
    parser.add_argument("--json", metavar="PATH", help="write every figure here as JSON")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.accumulation < 1:
        parser.error("--steps and --accumulation must be >= 1")
    try:
        args.micro_batches = _micro_batches(args.micro_batch)
    except ValueError as error:
        parser.error(str(error))
    args.presets = args.presets or DEFAULT_PRESETS[args.device]
    args.precision = args.precision or ("bf16" if args.device == "cuda" else "fp32")
    args.gemm_size = args.gemm_size or GEMM_SIZE[args.device]
    args.local_steps = args.local_steps or LOCAL_STEPS[args.device]
    args.local_preset = args.local_preset or LOCAL_PRESET[args.device]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Print the GEMM ceiling, the table and the runs (Markdown); returns the exit code: 0, or 1
    when a measurement or a run failed (its row or line says why)."""
    args = _parse(argv)
    began = time.monotonic()
    report = Report(args.json)
    failures = 0

    def over_budget() -> bool:
        return time.monotonic() - began > args.time_budget

    budget_note = f"--time-budget {args.time_budget:g} s spent"
    import transformers  # its version, for the header (the rows import it in their own processes)

    report.line(
        f"{args.device}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{args.precision}{' autocast' if args.precision == 'bf16' else ''}; our LAMB for every row; "
        f"{WARMUP_STEPS} warm-up + {args.steps} timed optimizer steps of {args.accumulation} micro-batch(es) "
        f"per row, each in a fresh process; load average {_load_average()}"
    )
    report.record(
        "environment",
        {
            "device": args.device,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "precision": args.precision,
            "accumulation": args.accumulation,
            "steps": args.steps,
            "warmup_steps": WARMUP_STEPS,
            "vocab_size": VOCAB_SIZE,
        },
    )
    gemm = _in_fresh_process(gemm_ceiling, args.device, args.precision, args.gemm_size)
    report.record("gemm", gemm)
    if "error" in gemm:
        report.line(f"GEMM ceiling failed: {gemm['error']}")
        return 1
    report.line(
        f"GEMM ceiling: {_tflops(gemm['tflops'])} TFLOP/s (torch.mm {args.gemm_size}^3 {gemm['dtype']}, "
        f"{gemm['device']}{_capability(gemm)}); every row's share is of this figure"
    )
    report.line()
    report.line("| " + " | ".join(COLUMNS) + " |")
    report.line("|" + " --- |" * len(COLUMNS))
    modes = [
        mode
        for mode, off in zip(MODES, (args.no_hf, args.no_eager, args.no_compiled), strict=True)
        if not off
    ]
    results: dict[tuple[str, int, str], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="train_step.") as tmp:
        weights: dict[str, Path] = {}
        for seq in args.seq:
            for preset in args.presets:
                micro_batch = micro_batch_for(args.micro_batches, args.device, preset, seq)
                config = BertConfig.from_dims(MODEL_PRESETS[preset], VOCAB_SIZE)
                flops = train_flops_per_sequence(config, seq, PREDICTIONS[seq])
                for mode in modes:
                    cells = {"preset": preset, "seq": seq, "micro-batch": micro_batch, "mode": mode}
                    figures: dict[str, Any] = {**cells, "train_flops_per_sequence": flops}
                    if over_budget():
                        report.row(
                            {**cells, "seq/s": f"skipped: {budget_note}"}, {**figures, "skipped": budget_note}
                        )
                        continue
                    if preset not in weights:
                        weights[preset] = _save_weights(preset, Path(tmp))
                    task = {
                        "mode": mode,
                        "preset": preset,
                        "seq": seq,
                        "micro_batch": micro_batch,
                        "accumulation": args.accumulation,
                        "device": args.device,
                        "precision": args.precision,
                        "steps": args.steps,
                        "weights": str(weights[preset]),
                    }
                    result = _in_fresh_process(measure, task)
                    figures |= result
                    if "error" in result:
                        failures += 1
                        report.row({**cells, "seq/s": f"failed: {result['error']}"}, figures)
                        continue
                    results[(preset, seq, mode)] = result
                    tflops = flops * result["seq_per_s"] / 1e12
                    hf = results.get((preset, seq, "hf eager"))
                    figures |= {
                        "tflops": tflops,
                        "gemm_share": tflops / gemm["tflops"],
                        "vs_hf": result["seq_per_s"] / hf["seq_per_s"] if hf else None,
                    }
                    report.row(
                        {
                            **cells,
                            "seq/s": _format(result["seq_per_s"], 1),
                            "TFLOP/s": _tflops(tflops),
                            "% of GEMM": _format(100 * tflops / gemm["tflops"], 1),
                            "LAMB ms": _format(result["lamb_ms"], 2),
                            "peak MiB": _format(result["peak_mib"], 0),
                            "vs hf": _format(figures["vs_hf"], 2),
                            "compile s": _format(result["warmup_extra_s"], 1) if mode in COMPILED else "-",
                        },
                        figures,
                    )
        report.line()
        _initial_losses(report, results)
        failures += _trainer_runs(args, report, results, Path(tmp), over_budget, budget_note)
    report.line(
        f"load average (1, 5, 15 min) at the end: {_load_average()}; {time.monotonic() - began:.0f} s in all"
    )
    return 1 if failures else 0


def _capability(gemm: dict[str, Any]) -> str:
    return (
        f", compute capability {gemm['capability'][0]}.{gemm['capability'][1]}" if gemm["capability"] else ""
    )


def _save_weights(preset: str, directory: Path) -> Path:
    """Our model of ``preset`` at seed 0, saved once for every row of the preset."""
    path = directory / f"{preset}.pt"
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_dims(MODEL_PRESETS[preset], VOCAB_SIZE))
    torch.save(model.state_dict(), path)
    return path


def _initial_losses(report: Report, results: dict[tuple[str, int, str], dict[str, Any]]) -> None:
    """One line per group: the eager rows' losses before training (evaluation mode), which agree
    when the models start from the same weights and compute the same thing."""
    groups: dict[tuple[str, int], list[str]] = {}
    for (preset, seq, mode), result in results.items():
        if result.get("initial_loss") is not None:
            groups.setdefault((preset, seq), []).append(f"{mode} {result['initial_loss']:.6f}")
        for note in result.get("notes", []):
            report.line(f"{preset} seq {seq} {mode}: {note}")
    for (preset, seq), losses in groups.items():
        report.line(
            f"{preset} seq {seq}: initial loss (evaluation mode, before training): {', '.join(losses)}"
        )


def local_job(
    directory: Path,
    device: str,
    preset: str,
    micro_batch: int,
    accumulation: int,
    steps: int,
    precision: str,
    compile: bool,
) -> dict[str, Any]:
    """A one-phase job (seq 128) on the builtin corpus whose files all lie under ``directory``."""
    every = max(1, steps // 4)
    return {
        "apiVersion": "bertjob.dev/v1alpha1",
        "kind": "BertPretrainJob",
        "metadata": {"name": "train-step-benchmark"},
        "spec": {
            "image": "ghcr.io/bertjob/trainer:0.1.0",
            "accelerator": "nvidia-gpu" if device == "cuda" else "xeon-cpu",
            "topology": {"nodes": 1, "processesPerNode": 1},
            "model": {"preset": preset},
            "data": {
                "sources": [{"path": "builtin:python-docs"}],
                "shards": str(directory / "data"),
                # The rows' size: trained on the corpus (some 14,000 tokens), then padded.
                "vocab": {"trainSize": VOCAB_SIZE, "padToMultipleOf": VOCAB_SIZE},
                "lowercase": True,
                "numShards": 2,
            },
            "phases": [
                {
                    "maxSeqLength": 128,
                    "maxPredictionsPerSeq": PREDICTIONS[128],
                    "globalBatchSize": micro_batch * accumulation,
                    "microBatchSize": micro_batch,
                    "learningRate": LEARNING_RATE,
                    "warmupProportion": 0.1,
                    "steps": steps,
                }
            ],
            "optimizer": {"name": "lamb", "weightDecay": WEIGHT_DECAY},
            "precision": precision,
            "compile": compile,
            "checkpoint": {"path": str(directory / "checkpoints"), "everySteps": steps, "keep": 1},
            "logging": {"everySteps": every},
        },
    }


def logged_rate(log: Path) -> tuple[float | None, int]:
    """Sequences/s from a ``train.jsonl``: the median of its training lines after the first (the
    first interval holds the start), or the only one; with the number of intervals it is of."""
    if not log.is_file():
        return None, 0
    rates = []
    for line in log.read_text().splitlines():
        record = json.loads(line)
        data = record.get("data", {})
        if record.get("type") == "LOG" and data.get("split") == "train" and data.get("sequences_per_second"):
            rates.append(float(data["sequences_per_second"]))
    if not rates:
        return None, 0
    used = rates[1:] or rates
    return statistics.median(used), len(used)


def _run_trainer(command: list[str], cwd: Path, timeout: float) -> tuple[int | None, str, float]:
    """Run a trainer command; its exit code (None after ``timeout``), output and seconds."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            command,
            cwd=cwd,
            env=_subprocess_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        code = None
        output = "".join(
            part.decode(errors="replace") if isinstance(part, bytes) else part or ""
            for part in (expired.stdout, expired.stderr)
        )
    return code, output, time.monotonic() - started


def _trainer_runs(
    args: argparse.Namespace,
    report: Report,
    results: dict[tuple[str, int, str], dict[str, Any]],
    tmp: Path,
    over_budget: Callable[[], bool],
    budget_note: str,
) -> int:
    """The local run and the torchrun run of one small job; returns the number of failures."""
    if args.no_local and args.no_torchrun:
        return 0
    preset, seq = args.local_preset, 128
    micro_batch = micro_batch_for(args.micro_batches, args.device, preset, seq)
    compile = args.device == "cuda" and not args.no_compiled
    mode = "ours compiled" if compile else "ours eager"
    job_dir = tmp / "job"
    job_dir.mkdir()
    job = local_job(
        job_dir,
        args.device,
        preset,
        micro_batch,
        args.accumulation,
        args.local_steps,
        args.precision,
        compile,
    )
    what = (
        f"{preset}, seq {seq}, micro-batch {micro_batch} x {args.accumulation}, {args.local_steps} steps, "
        f"{args.precision}, {'compiled' if compile else 'eager'}, builtin corpus"
    )
    benchmark = results.get((preset, seq, mode))
    failures = 0
    runs = [
        (
            "local",
            "python -m bertpretrain local",
            [sys.executable, "-m", "bertpretrain", "local"],
            args.no_local,
        ),
        (
            "torchrun",
            "torchrun --standalone --nproc_per_node 1 -m bertpretrain run",
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                "1",
                "--module",
                "bertpretrain",
                "run",
            ],
            args.no_torchrun,
        ),
    ]
    for key, shown, command, off in runs:
        name = f"{key} run"
        if off:
            continue
        if over_budget():
            report.skip(name, budget_note)
            continue
        checkpoints = job_dir / f"checkpoints-{key}"  # the data is made once, then reused
        spec = {**job["spec"], "checkpoint": {**job["spec"]["checkpoint"], "path": str(checkpoints)}}
        job_file = job_dir / f"{key}.yaml"
        job_file.write_text(yaml.safe_dump({**job, "spec": spec}, sort_keys=False))
        code, output, seconds = _run_trainer([*command, "--config", str(job_file)], job_dir, args.job_timeout)
        (job_dir / f"{key}.log").write_text(output)
        rate, intervals = logged_rate(checkpoints / "logs" / "train.jsonl")
        ok = code == 0 and rate is not None
        failures += not ok
        status = f"exit {code}" if code is not None else f"timed out after {args.job_timeout:g} s"
        line = f"{name} (`{shown}`, {what}): {'succeeded' if ok else 'FAILED'}, {status} in {seconds:.0f} s"
        if rate is not None:
            line += (
                f"; train.jsonl {rate:.1f} seq/s (median of {intervals} logging interval(s) after the first)"
            )
            if benchmark:
                line += (
                    f" vs the benchmark's {mode} {benchmark['seq_per_s']:.1f} seq/s: "
                    f"{rate / benchmark['seq_per_s']:.2f}x"
                )
            else:
                line += f"; no {preset} seq {seq} {mode} row in this run to compare with"
        report.line(line)
        world = [
            text for text in output.splitlines() if "world:" in text or text.startswith("bertpretrain: one ")
        ]
        for text in world[:2]:
            report.line(f"  {text.strip()}")
        if not ok:
            for text in output.strip().splitlines()[-8:]:
                report.line(f"  {text.rstrip()}")
        report.record(
            key,
            {
                "ok": ok,
                "exit_code": code,
                "seconds": seconds,
                "seq_per_s": rate,
                "benchmark_seq_per_s": benchmark["seq_per_s"] if benchmark else None,
                "job": {**job, "spec": spec},
            },
        )
    return failures


def _load_average() -> str:
    return ", ".join(f"{load:.2f}" for load in os.getloadavg())


if __name__ == "__main__":
    raise SystemExit(main())
