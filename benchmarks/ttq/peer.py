"""The Hugging Face peer: ``transformers.Trainer`` training ``BertForMaskedLM`` of our dimensions and
vocabulary, under the same budget mechanism as ours.

**Its data.** The singles job's training shards (``bertpretrain.data`` in one pass, so every row a
distinct segment of the training documents), masks undone, exact duplicates dropped, shuffled under
the replicate's seed; :data:`~ttq.settings.PEER_VALIDATION_SHARE` of those rows are carved off as
its validation split, masked once at 15% (BERT's 80/10/10, a fixed generator), on which its
settings are chosen: never the held-out sets. The rest it trains on as ``run_mlm.py`` does:
``DataCollatorForLanguageModeling`` masks each batch afresh and pads it to its longest row.

**Its budget** is ours: :class:`bertpretrain.training.budget.BudgetClock`. A calibration of
:attr:`~ttq.settings.Size.peer_calibration_steps` steps (thrown away, its seconds counted), a step
count fitted to what is left, re-fitted by the clock as our trainer re-fits (at the same fractions
of the budget and after the last planned steps, to the count that ends nearest the budget); the
linear schedule (10% warm-up) follows the run's progress, a piecewise line through the fits, so it
reaches 0 at the run's end; the Trainer stops at the fitted count, never mid-schedule. Its seconds
are the calibration's plus the run's (``on_train_begin`` to the last ``on_step_end``); model set-up
is outside, as ours.

**On CUDA** it compiles (``torch_compile``) and loads with one worker, as our trainer does there;
bf16 as ours.
"""

from __future__ import annotations

import math
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from bertjob_api.defaults import MODEL_PRESETS
from bertpretrain.training.budget import REFIT_AT, REFIT_LAST_STEPS, BudgetClock, Calibration, Fit, first_fit
from ttq.heldout import EvalSet, quiet_transformers, score_rows
from ttq.settings import EVAL_MASKING, PEER_VALIDATION_SHARE, SEQ_LEN, SINGLES_PREDICTIONS, Size

# How the step count is fitted again (our trainer's rules), for the run's record.
REFITS = {"fractions": list(REFIT_AT), "last_steps": REFIT_LAST_STEPS}
WARMUP = 0.1  # share of the schedule's progress in linear warm-up
_VALIDATION_SEED = 2024  # the validation rows' masks: the same for every run and replicate


class PeerRows(torch.utils.data.Dataset[dict[str, list[int]]]):
    """Unmasked rows cut to their length, for ``DataCollatorForLanguageModeling``."""

    def __init__(self, rows: list[np.ndarray], special_ids: np.ndarray):
        self.rows, self.special = rows, special_ids

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        row = self.rows[index]
        return {
            "input_ids": row.tolist(),
            "special_tokens_mask": np.isin(row, self.special).astype(int).tolist(),
        }


def read_unmasked(dataset: Path) -> list[np.ndarray]:
    """The training shards' (``shard_*.hdf5``) rows with their original tokens, cut to their length.

    Raises:
        ValueError: no training shard in ``dataset``.
    """
    files = sorted(dataset.glob("shard_*.hdf5"))
    if not files:
        raise ValueError(f"{dataset}: no shard_*.hdf5 training shards")
    rows: list[np.ndarray] = []
    for file in files:
        with h5py.File(file, "r") as shard:
            ids = shard["input_ids"][:].astype(np.int64)
            lengths = shard["input_mask"][:].sum(axis=1)
            positions = shard["masked_lm_positions"][:].astype(np.int64)
            labels = shard["masked_lm_ids"][:].astype(np.int64)
        hit_rows, slots = np.nonzero(positions)
        ids[hit_rows, positions[hit_rows, slots]] = labels[hit_rows, slots]
        rows.extend(ids[row, :length] for row, length in enumerate(lengths))
    return rows


def mask_rows(
    rows: list[np.ndarray], special_ids: np.ndarray, mask_id: int, vocab_size: int, seed: int
) -> EvalSet:
    """``rows`` masked once as BERT does (Devlin et al. 2019): max(1, round(0.15 x length))
    positions, at most :data:`SINGLES_PREDICTIONS`, drawn among the non-special tokens; 80% become
    ``[MASK]``, 10% a random token, 10% stay. Padded to :data:`SEQ_LEN` as our shards are."""
    rng = np.random.default_rng(seed)
    count = len(rows)
    ids = np.zeros((count, SEQ_LEN), np.int64)
    mask = np.zeros_like(ids)
    positions = np.zeros((count, SINGLES_PREDICTIONS), np.int64)
    labels = np.zeros_like(positions)
    for index, row in enumerate(rows):
        ids[index, : len(row)], mask[index, : len(row)] = row, 1
        candidates = np.flatnonzero(~np.isin(row, special_ids))
        want = min(SINGLES_PREDICTIONS, max(1, round(len(row) * EVAL_MASKING)), len(candidates))
        chosen = np.sort(rng.choice(candidates, size=want, replace=False))
        positions[index, :want], labels[index, :want] = chosen, row[chosen]
        draws = rng.random(want)
        ids[index, chosen[draws < 0.8]] = mask_id
        random_ones = chosen[(draws >= 0.8) & (draws < 0.9)]
        ids[index, random_ones] = rng.integers(0, vocab_size, size=len(random_ones))
    return EvalSet(ids, mask, np.zeros_like(ids), positions, labels, files=("validation",))


@dataclass
class PeerData:
    """The peer's tokenizer, training rows and validation split for one replicate."""

    tokenizer: Any
    train: PeerRows
    validation: EvalSet
    counts: dict[str, int]


def load_peer_data(vocab_dir: Path, dataset: Path, seed: int) -> PeerData:
    """The peer's data from the singles dataset ``dataset`` (see the module's docstring)."""
    from transformers import PreTrainedTokenizerFast

    quiet_transformers()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(vocab_dir / "tokenizer.json"),
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    rows = read_unmasked(dataset)
    unique: dict[bytes, np.ndarray] = {}
    for row in rows:
        unique.setdefault(row.tobytes(), row)
    distinct = list(unique.values())
    order = np.random.default_rng(seed).permutation(len(distinct))
    held = max(1, round(len(distinct) * PEER_VALIDATION_SHARE))
    special = np.array(sorted({tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id}))
    validation_rows = [distinct[i] for i in order[:held]]
    train_rows = [distinct[i] for i in order[held:]]
    validation = mask_rows(
        validation_rows, special, tokenizer.mask_token_id, len(tokenizer), _VALIDATION_SEED
    )
    counts = {"rows": len(rows), "distinct": len(distinct), "train": len(train_rows), "validation": held}
    return PeerData(tokenizer, PeerRows(train_rows, special), validation, counts)


class BudgetPlan:
    """The peer's step count and schedule: our trainer's :class:`BudgetClock` over optimizer steps
    that each read one batch (``clock`` gives wall-clock seconds); the learning rate's factor is
    linear warm-up to 1 over :data:`WARMUP` of the run's progress, then linear to 0 at its end."""

    def __init__(self, calibration: Calibration, clock: Callable[[], float] = time.perf_counter):
        self.clock = BudgetClock(calibration, lambda step: step, clock)

    @classmethod
    def fitted(
        cls, budget: float, calibration_seconds: float, step_seconds: float, timed_steps: int, **kwargs: Any
    ) -> BudgetPlan:
        """The plan for ``budget`` seconds, ``calibration_seconds`` of them spent calibrating at
        ``step_seconds`` a step (over ``timed_steps``): the most steps that fit in the rest.

        Raises:
            bertpretrain.training.budget.BudgetError: not one step fits.
        """
        first = first_fit(budget, calibration_seconds, step_seconds, 1, lambda step, steps: step, "the peer")
        calibration = Calibration(step_seconds, timed_steps, budget, calibration_seconds, (first,))
        return cls(calibration, **kwargs)

    @classmethod
    def fixed(cls, steps: int) -> BudgetPlan:
        """A plan of ``steps`` steps and no budget (the calibration's run)."""
        return cls(Calibration(0.0, 0, math.inf, 0.0, (Fit(0, steps, 0.0, 0.0),)))

    @property
    def steps(self) -> int:
        """The fitted step count: the run ends there."""
        return self.clock.calibration.steps

    @property
    def fits(self) -> list[dict[str, float]]:
        """Every fit made, the first the calibration's (``bertpretrain.training.budget.Fit``'s fields)."""
        return [asdict(fit) for fit in self.clock.calibration.fits]

    def progress(self, done: int) -> float:
        """Progress in [0, 1] after ``done`` optimizer steps: 1 exactly from the last on."""
        return 1.0 if done >= self.steps else min(1.0, self.clock.progress(done))

    def factor(self, done: int) -> float:
        """The learning rate's share of its peak for the step after ``done`` steps (LambdaLR's)."""
        q = self.progress(done)
        return q / WARMUP if q < WARMUP else max(0.0, (1 - q) / (1 - WARMUP))

    def step_ended(self, done: int) -> None:
        """Optimizer step ``done`` ended now: re-fit the count when the clock says so."""
        budget = self.clock
        budget.ended(done)
        if done < budget.calibration.steps and budget.refit_due(done):
            budget.apply(budget.refit(done))


@dataclass
class PeerRun:
    """One training of the peer: its settings, the budget's record and what it took."""

    learning_rate: float
    beta2: float
    masking: float
    budget: float
    calibration_steps: int = 0
    calibration_seconds: float = 0.0
    step_seconds: float = 0.0  # the calibration's median step, its first left out
    fits: list[dict[str, float]] = field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0  # calibration + training, by the clock
    final_loss: float | None = None

    def record(self) -> dict[str, Any]:
        """The run as JSON-ready fields."""
        return asdict(self)


def _new_model(size: Size, tokenizer: Any, seed: int) -> Any:
    from transformers import BertConfig, BertForMaskedLM, set_seed

    dims = MODEL_PRESETS[size.preset]
    set_seed(seed)
    return BertForMaskedLM(
        BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=dims.hidden_size,
            num_hidden_layers=dims.num_hidden_layers,
            num_attention_heads=dims.num_attention_heads,
            intermediate_size=dims.intermediate_size,
            max_position_embeddings=dims.max_position_embeddings,
            pad_token_id=tokenizer.pad_token_id,
        )
    )


def _trainer(
    model: Any,
    data: PeerData,
    size: Size,
    device: str,
    run: PeerRun,
    plan: BudgetPlan,
    max_steps: int,
    scratch: Path,
    seed: int,
    callbacks: list[Any],
) -> Any:
    from transformers import DataCollatorForLanguageModeling, PrinterCallback, Trainer, TrainingArguments

    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=run.learning_rate,
        betas=(0.9, run.beta2),
        eps=1e-6,
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, plan.factor)
    cuda = device == "cuda"
    arguments = TrainingArguments(
        output_dir=str(scratch),
        per_device_train_batch_size=size.global_batch,
        max_steps=max_steps,
        max_grad_norm=1.0,
        logging_strategy="steps",
        logging_steps=max(1, max_steps // 10),
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=seed,
        data_seed=seed,
        bf16=cuda,
        use_cpu=not cuda,
        torch_compile=cuda,
        dataloader_num_workers=1 if cuda else 0,  # as our trainer's loader (training/phase.py)
        remove_unused_columns=False,
    )
    collator = DataCollatorForLanguageModeling(
        data.tokenizer, mlm_probability=run.masking, pad_to_multiple_of=8, seed=seed
    )
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=data.train,
        data_collator=collator,
        optimizers=(optimizer, schedule),
        callbacks=callbacks,
    )
    trainer.remove_callback(PrinterCallback)
    return trainer


def train_peer(
    data: PeerData, size: Size, device: str, run: PeerRun, scratch: Path, seed: int, label: str
) -> Any:
    """Train a fresh ``BertForMaskedLM`` (initialised and fed under ``seed``) under ``run``'s budget
    (see the module's docstring); fills ``run`` in and returns the model."""
    from transformers import TrainerCallback

    quiet_transformers()

    class Clock(TrainerCallback):
        """Step ends; with a plan, its re-fits and its stop."""

        def __init__(self, plan: BudgetPlan | None, offset: float):
            self.plan, self.offset = plan, offset
            self.started = 0.0
            self.ends: list[float] = []

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            self.started = time.perf_counter()
            if self.plan is not None:
                self.plan.clock.start(self.offset)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            now = time.perf_counter() - self.started
            self.ends.append(now)
            plan, done = self.plan, state.global_step
            if plan is None:
                return control
            plan.step_ended(done)
            if done >= plan.steps:
                control.should_training_stop = True
            return control

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
            if logs and "loss" in logs:
                run.final_loss = float(logs["loss"])
                steps = self.plan.steps if self.plan else "?"
                print(
                    f"time_to_quality: {label}: step {state.global_step}/{steps} loss {logs['loss']:.3f} "
                    f"lr {logs.get('learning_rate', 0):.2e} "
                    f"{self.offset + time.perf_counter() - self.started:.1f} s",
                    flush=True,
                )

    # The calibration: thrown away, its seconds counted.
    run.calibration_steps = size.peer_calibration_steps
    calibration = Clock(None, 0.0)
    throwaway = BudgetPlan.fixed(size.peer_calibration_steps)
    model = _new_model(size, data.tokenizer, seed)
    _trainer(
        model, data, size, device, run, throwaway, size.peer_calibration_steps, scratch, seed, [calibration]
    ).train()
    run.calibration_seconds = calibration.ends[-1]
    intervals = np.diff(calibration.ends) if len(calibration.ends) >= 2 else np.array(calibration.ends)
    run.step_seconds = float(statistics.median(intervals.tolist()))

    plan = BudgetPlan.fitted(run.budget, run.calibration_seconds, run.step_seconds, len(intervals))
    clock = Clock(plan, run.calibration_seconds)
    # The Trainer's own cap, far beyond any fit: the plan stops it.
    cap = 4 * plan.steps + 100
    model = _new_model(size, data.tokenizer, seed)
    _trainer(model, data, size, device, run, plan, cap, scratch, seed, [clock]).train()
    run.steps = len(clock.ends)
    run.seconds = run.calibration_seconds + (clock.ends[-1] if clock.ends else 0.0)
    run.fits = plan.fits
    shutil.rmtree(scratch, ignore_errors=True)
    return model


def validation_accuracy(model: Any, data: PeerData, device: str) -> float:
    """The model's masked-LM accuracy on the peer's validation split."""
    correct, total = score_rows(model, data.validation, device)
    return float(correct.sum() / max(int(total.sum()), 1))


def save_export(model: Any, tokenizer: Any, vocab_dir: Path, export: Path) -> Path:
    """``model`` as a Hugging Face directory with the vocabulary as our data stage wrote it."""
    model.save_pretrained(str(export))
    tokenizer.save_pretrained(str(export))
    for name in ("vocab.txt", "tokenizer.json"):
        shutil.copyfile(vocab_dir / name, export / name)
    return export


def random_init_export(size: Size, vocab_dir: Path, export: Path, seed: int) -> Path:
    """An untrained ``BertForMaskedLM`` of the size's dimensions (initialised under ``seed``) as a
    Hugging Face directory: fine-tuned by the same protocol, the no-pretraining reference."""
    from transformers import PreTrainedTokenizerFast

    quiet_transformers()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(vocab_dir / "tokenizer.json"),
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    return save_export(_new_model(size, tokenizer, seed), tokenizer, vocab_dir, export)
