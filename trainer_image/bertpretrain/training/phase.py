"""One pretraining phase: build everything from the job's plan, run the optimizer steps, checkpoint.

NVIDIA's two-phase recipe (DeepLearningExamples BERT, after You et al. 2020): phase 1 trains
at sequence length 128, phase 2 continues from phase 1's final weights at 512 with a fresh
optimizer, step count and schedule. A phase that finds a checkpoint of its own resumes from the
newest one that can be read (model, optimizer, schedule, gradient scaler, data position and every
rank's RNG states) instead, and then computes exactly what the uninterrupted run would have
computed; if the evaluation due at that step was not recorded as made, it makes it first.

A :class:`Phase` is built from the plan (:class:`bertjob_api.plan.Plan`, which holds the batch
split for the world that runs), the phase's index, the prepared data and the process group. Each
optimizer step: ``accumulation_steps`` forward/backward passes (fewer during a batch ramp,
``batchRampProportion``), one optimizer step, the
statistics (:class:`bertpretrain.training.accuracy.StepStatistics`) summed over ranks in one
all-reduce; then, as due, a progress line, a checkpoint, an evaluation on the
held-out shards; and a stop if a rank got SIGTERM (:mod:`bertpretrain.training.preemption`).
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from bertjob_api import deepspeed
from bertjob_api.defaults import budget_shares
from bertjob_api.plan import PhasePlan, Plan
from bertjob_api.spec import JobSpec, PhaseSpec
from bertjob_api.spec.phases import duration_seconds
from bertpretrain.common.batch import Batch
from bertpretrain.data.format.prepared import PreparedData
from bertpretrain.data.load.loader import (
    HELDOUT_PATTERN,
    DynamicMasking,
    PretrainingBatches,
    Shard,
    build_loader,
    find_shards,
    heldout_batches,
)
from bertpretrain.data.load.mask_schedule import scheduled_rate, thin_masks
from bertpretrain.model.bert import BertForPreTraining
from bertpretrain.model.config import BertConfig
from bertpretrain.runtime import compiling
from bertpretrain.runtime.engine import Engine
from bertpretrain.runtime.parallel import DataParallel
from bertpretrain.runtime.sharding import parameter_count, whole_parameters
from bertpretrain.training.accuracy import StepStatistics, step_statistics
from bertpretrain.training.budget import (
    MIN_TIMED_STEPS,
    BudgetClock,
    BudgetError,
    Calibration,
    Fit,
    budget_fields,
    check_fields,
    first_fit,
    read_calibration,
    write_calibration,
)
from bertpretrain.training.checkpoint import (
    Resumable,
    ResumePoint,
    checkpoint_path,
    evaluated_step,
    latest,
    load_initial_weights,
    load_model_weights,
    load_training_state,
    newest_resumable,
    read_checkpoint,
    record_evaluation,
    rng_states,
    save_checkpoint,
)
from bertpretrain.training.errors import DivergenceError
from bertpretrain.training.evaluation import Evaluation, evaluate
from bertpretrain.training.logs import TrainingLog
from bertpretrain.training.optimizer import build_optimizer
from bertpretrain.training.preemption import Preempted, StopSignals
from bertpretrain.training.progress import StatusReporter
from bertpretrain.training.schedule import build_schedule, ramp_accumulation_steps, ramped_micro_batches

# With fp16, this many skipped steps in a row (the loss scale halved each time) means divergence.
MAX_CONSECUTIVE_SKIPS = 30


@dataclass(frozen=True)
class Phase:
    """Phase ``index`` (0-based) of ``plan``, on ``data`` (the vocabulary and each phase's shards),
    in ``parallel`` (the job's device and data parallelism, joined once by the entry point:
    :func:`bertpretrain.runtime.parallel.joining.join`); :meth:`train` runs it.

    The model starts from ``init_from``'s weights (phase 1's final checkpoint, for phase 2), else
    from ``spec.model.initFrom`` (a Hugging Face model, an NVIDIA DeepLearningExamples checkpoint or
    a training checkpoint: :func:`bertpretrain.training.checkpoint.load_initial_weights`), else from
    random initialisation, unless a checkpoint of this phase exists, which is resumed. ``plan`` must
    be for the world size that ``parallel`` joins (:meth:`bertjob_api.plan.Plan.for_world`).
    """

    plan: Plan
    index: int
    data: PreparedData
    parallel: DataParallel
    init_from: Path | None = None
    # Wall-clock seconds for spec.budget: its calibration, re-fits and end (a test passes its own).
    clock: Callable[[], float] = time.perf_counter

    @property
    def spec(self) -> JobSpec:
        """The job's spec, with its defaults."""
        return self.plan.spec

    @property
    def phase_plan(self) -> PhasePlan:
        """This phase's batch split, length and steps, for the world that runs it."""
        return self.plan.phases[self.index]

    @property
    def phase_spec(self) -> PhaseSpec:
        """This phase as the spec writes it (learning rate, warm-up)."""
        return self.spec.phases[self.index]

    @property
    def name(self) -> str:
        """``phase <n>/<phases>``, as the progress lines begin."""
        return f"phase {self.phase_plan.number}/{len(self.plan.phases)}"

    @property
    def root(self) -> Path:
        """The checkpoint directory of the job (each phase's in ``phase<n>`` below it)."""
        return self.plan.paths.checkpoints

    @property
    def checkpoint_dir(self) -> Path:
        """This phase's checkpoints, ``<checkpoint.path>/phase<n>``."""
        return self.plan.paths.phase_checkpoints[self.index]

    @property
    def shard_dir(self) -> Path:
        """This phase's shards."""
        return self.data.phase_dirs[self.index]

    def train(self) -> Path:
        """Train the phase; every rank calls this. Each reads its own part of the shards; rank 0
        prints progress to stdout, writes the log and the checkpoints, which must be on storage all
        ranks share. Held-out shards (``heldout_*.hdf5`` beside the training shards) are evaluated
        every ``evaluation.everySteps`` steps and at the end.

        Returns:
            The phase's final checkpoint, ``<checkpoint.path>/phase<n>/step_<steps:06d>.pt``.

        Raises:
            DivergenceError: the loss became NaN or infinite (a RuntimeError); the newest
                checkpoint on disk is from before.
            Preempted: SIGTERM arrived; a checkpoint of the last step was written.
            bertpretrain.data.load.loader.ShardError, bertpretrain.training.checkpoint.CheckpointError:
                bad input files.
            ValueError: the plan is for another world size than ``parallel``'s.
            RuntimeError: an accelerator that is missing or not supported.
        """
        spec, parallel = self.spec, self.parallel
        log = None
        try:
            if parallel.world.world_size != self.plan.world_size:
                raise ValueError(
                    f"{self.name}: the plan is for world size {self.plan.world_size}, but "
                    f"{parallel.world.world_size} processes train"
                )
            phase, calibration = (self, None) if self.phase_plan.steps is not None else _budgeted(self)
            engine = Engine(parallel, spec.precision, step_statistics)
            directory = self.plan.paths.logs if engine.is_main else None
            status = StatusReporter.from_environment(phase.steps) if directory else None
            log = TrainingLog(directory, spec.logging.tensorboard, status, spec.logging.format)
            run = _build(phase, engine, log, calibration)
            log.total_steps(run.steps)
            with StopSignals() as stop:
                _train(run, stop)
            engine.barrier()
            return checkpoint_path(self.root, self.index, run.steps)
        finally:
            if log is not None:
                log.close()

    @property
    def steps(self) -> int:
        """The phase's optimizer steps: ``phases[].steps``, or those its budget fixed.

        Raises:
            ValueError: under ``spec.budget``, on a phase not yet fixed (:func:`_budgeted`).
        """
        steps = self.phase_plan.steps
        if steps is None:
            raise ValueError(f"{self.name}: its steps come from spec.budget and are not fixed yet")
        return steps


@dataclass
class _Run:
    """What the loop of one phase needs, built by :func:`_build`."""

    phase: Phase  # the phase trained: its plan, spec, index, name and checkpoint directory
    engine: Engine
    model: BertForPreTraining
    loader: DataLoader[Batch]
    heldout: list[Shard]
    masking: DynamicMasking | None  # the held-out rows' (at the phase's final rate)
    start: ResumePoint
    log: TrainingLog
    budget: BudgetClock | None = None  # under spec.budget

    @property
    def start_step(self) -> int:
        return self.start.step

    def progress(self, step: int) -> float:
        """The phase's progress after ``step`` steps, 0 to 1 (as the schedule reads it)."""
        return step / self.steps if self.budget is None else self.budget.progress(step)

    def masked_lm_prob(self, step: int) -> float | None:
        """The masking rate of optimizer step ``step`` under the phase's masking schedule (its rate
        at the step's start); None without a schedule."""
        data = self.phase.spec.data
        if data.final_masked_lm_prob is None:
            return None
        return scheduled_rate(data.masked_lm_prob, data.final_masked_lm_prob, self.progress(step - 1))

    def micro_batch(self, batches: Iterator[Batch], step: int, generator: torch.Generator | None) -> Batch:
        """The next micro-batch of optimizer step ``step``, its masks thinned to the rate of the
        phase's masking schedule (``generator`` seeded by the step) if it has one."""
        batch = next(batches)
        rate = self.masked_lm_prob(step)
        if generator is None or rate is None:
            return batch
        return thin_masks(batch, rate, generator)

    @property
    def steps(self) -> int:
        """The phase's optimizer steps: as written, or as the budget's last fit has them."""
        return self.phase.steps if self.budget is None else self.budget.calibration.steps

    @property
    def batches(self) -> PretrainingBatches:
        assert isinstance(self.loader.dataset, PretrainingBatches)
        return self.loader.dataset

    def accumulation(self, step: int) -> int:
        """Micro-batches each rank accumulates in optimizer step ``step`` (1-based): the phase's
        gradient accumulation steps, or fewer during its batch ramp."""
        planned, ramp = self.phase.phase_plan, self.phase.phase_spec.batch_ramp_proportion
        if ramp is None:
            return planned.accumulation_steps
        return ramp_accumulation_steps(step, self.ramp_steps, planned.accumulation_steps, ramp)

    def micro_batches(self, step: int) -> int:
        """Micro-batches each rank has consumed after ``step`` optimizer steps (where the data
        stands in a checkpoint of that step)."""
        return _micro_batches(self.phase, self.ramp_steps, step)

    @property
    def ramp_steps(self) -> int:
        """The steps a batch ramp's span is a proportion of (the budget's first fit's)."""
        return self.phase.steps if self.budget is None else self.budget.calibration.ramp_steps


def _micro_batches(phase: Phase, ramp_steps: int, step: int) -> int:
    """Micro-batches per rank that steps 1..``step`` of ``phase`` read, its batch ramp's span a
    proportion of ``ramp_steps``."""
    planned, ramp = phase.phase_plan, phase.phase_spec.batch_ramp_proportion
    if ramp is None:
        return step * planned.accumulation_steps
    return ramped_micro_batches(step, ramp_steps, planned.accumulation_steps, ramp)


# The steps a calibrating run is built for: its schedule is never followed to an end.
_PROVISIONAL_STEPS = 1_000_000


def _budgeted(of: Phase) -> tuple[Phase, Calibration]:
    """``of`` with the optimizer steps its share of ``spec.budget`` fixes, and the budget's record
    (collective): the record in its checkpoint directory from an earlier run, else the one
    :func:`_calibrate` makes and writes before step 1 (see :mod:`bertpretrain.training.budget`).

    Raises:
        BudgetError: not one step fits in the phase's share, or the record was made for another
            spec (on every rank).
    """
    outcome: object = None
    if of.parallel.world.rank == 0:
        found = read_calibration(of.checkpoint_dir)
        try:
            if found is not None:
                check_fields(found, budget_fields(of.spec), of.checkpoint_dir)
            outcome = found
        except BudgetError as error:
            outcome = str(error)
    outcome = of.parallel.broadcast_object(outcome)
    if isinstance(outcome, str):
        raise BudgetError(outcome)
    if outcome is None:
        calibrated = _calibrate(of)
    else:
        assert isinstance(outcome, Calibration)
        calibrated = outcome
        if of.parallel.world.rank == 0:
            print(f"{of.name}: {calibrated.steps:,} steps, fixed by the budget's record", flush=True)
    return dataclasses.replace(of, plan=of.plan.with_steps(of.index, calibrated.steps)), calibrated


def _calibrate(of: Phase) -> Calibration:
    """Time optimizer steps of a throw-away run of ``of`` (at full gradient accumulation) until
    ``budget.calibrationProportion`` of the phase's share has passed and at least
    ``MIN_TIMED_STEPS`` steps after the first were timed; fit the steps into what is left; record
    them (rank 0) and return them (every rank)."""
    spec = of.spec
    assert spec.budget is not None
    shares = budget_shares(spec.phases)
    assert shares is not None  # validation refuses shares that do not add up
    phase_seconds = duration_seconds(spec.budget.time) * shares[of.index]
    engine = Engine(of.parallel, spec.precision, step_statistics)
    provisional = dataclasses.replace(of, plan=of.plan.with_steps(of.index, _PROVISIONAL_STEPS))
    run = _build(provisional, engine, TrainingLog(None, False, None, spec.logging.format), announce=False)
    batches, accumulation, times = iter(run.loader), of.phase_plan.accumulation_steps, []
    target = spec.budget.calibration_proportion * phase_seconds
    # The budget counts optimizer steps, the calibration's among them; building the model and the
    # loader (twice, here and for the run) is outside it, as a Trainer's set-up is.
    started = of.clock()
    while True:
        began = of.clock()
        stats = torch.zeros(StepStatistics.SIZE, device=engine.device)
        for _ in range(accumulation):
            stats += engine.forward_backward(next(batches), accumulation)
        engine.optimizer_step()
        engine.sum_over_ranks(stats).cpu()  # the step's all-reduce, and the device's work done
        times.append(of.clock() - began)
        # Rank 0's clock decides for every rank; the first step (compiling, caches) is not timed.
        done = len(times) > MIN_TIMED_STEPS and of.clock() - started >= target
        if engine.any_rank(done and engine.is_main):
            break
    del run, batches
    step_seconds = sum(times[1:]) / len(times[1:])
    outcome: object = None
    if engine.is_main:
        spent = of.clock() - started
        try:
            fit = first_fit(
                phase_seconds,
                spent,
                step_seconds,
                accumulation,
                lambda step, steps: _micro_batches(of, steps, step),
                of.name,
            )
            calibration = Calibration(
                step_seconds,
                len(times) - 1,
                phase_seconds,
                spent,
                (fit,),
                budget_fields(spec),
            )
            write_calibration(of.checkpoint_dir, calibration)
            print(calibration.describe(of.name), flush=True)
            outcome = calibration
        except BudgetError as error:
            outcome = str(error)
    outcome = of.parallel.broadcast_object(outcome)
    if isinstance(outcome, str):
        raise BudgetError(outcome)
    assert isinstance(outcome, Calibration)
    return outcome


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])


def _build(
    of: Phase, engine: Engine, log: TrainingLog, calibration: Calibration | None = None, announce: bool = True
) -> _Run:
    spec, index, phase, written = of.spec, of.index, of.phase_plan, of.phase_spec
    vocab_size, shard_dir = of.data.vocab_size, of.shard_dir
    torch.manual_seed(_seed(spec.seed, index))
    nsp = spec.objective == "mlm-nsp"
    model = BertForPreTraining(BertConfig.from_dims(of.plan.model, vocab_size), next_sentence_prediction=nsp)
    if spec.activation_checkpointing:
        model.set_activation_checkpointing(True)
    resume = _resumable(of, engine)
    origin = _initialise(spec, model, resume.path if resume else None, of.init_from, engine)
    budget = None
    if calibration is not None:
        # The fits made after the checkpoint resumed from are gone with the steps they were made at.
        kept = calibration.until(int(resume.state["step"]) if resume else 0)
        budget = BudgetClock(kept, lambda step: _micro_batches(of, kept.ramp_steps, step), of.clock)
        if kept != calibration and engine.is_main:
            write_calibration(of.checkpoint_dir, kept)
    if spec.compiles:
        compiling.reset()  # each phase compiles for its own shapes, not phase 1's made dynamic
    engine.prepare(model, compile=spec.compiles, required=spec.compile is not None)
    # Dropout differs between ranks; the initial weights above do not.
    torch.manual_seed(_seed(spec.seed, index, engine.rank + 1))

    optimizer = engine.wrap_optimizer(
        build_optimizer(model, spec.optimizer, phase.learning_rate, compiled=engine.compiled),
        phase.accumulation_steps,
        _deepspeed_config(spec, phase, engine.world_size),
    )
    scheduler = build_schedule(
        optimizer,
        spec.optimizer.schedule,
        of.steps if budget is None else budget.calibration.steps,
        written.warmup_proportion,
        spec.optimizer.poly_power,
        progress=None if budget is None else budget.progress,
    )
    engine.attach(
        optimizer, scheduler, None if spec.optimizer.name == "lamb" else spec.optimizer.max_grad_norm
    )
    start = ResumePoint(0, 0)
    if resume is not None:
        start = load_training_state(
            resume.path, model, optimizer, scheduler, engine.scaler, engine.rank, state=resume.state
        )
    engine.broadcast_state()

    micro_batch = phase.micro_batch_size
    # Under a masking schedule the loader masks at its start, the highest rate; each step keeps its
    # own share (validation refuses a rising schedule).
    final = spec.data.final_masked_lm_prob
    masking = _dynamic_masking(spec, of.data.vocab_dir)
    loader = build_loader(
        shard_dir,
        phase.max_seq_length,
        phase.max_predictions_per_seq,
        vocab_size,
        micro_batch,
        rank=engine.rank,
        world_size=engine.world_size,
        seed=_seed(spec.seed, index),
        skip_batches=start.sequences // micro_batch,
        num_workers=1 if engine.device.type == "cuda" else 0,
        pin_memory=engine.device.type == "cuda",
        masking=masking,
        next_sentence_prediction=nsp,
    )
    heldout = (
        find_shards(
            shard_dir,
            phase.max_seq_length,
            phase.max_predictions_per_seq,
            HELDOUT_PATTERN,
            next_sentence_prediction=nsp,
        )
        if any(shard_dir.glob(HELDOUT_PATTERN))
        else []
    )
    if masking is not None and final is not None:
        masking = dataclasses.replace(masking, masked_lm_prob=final)
    run = _Run(of, engine, model, loader, heldout, masking, start, log, budget)
    if announce:
        _announce(run, origin)
    return run


def _resumable(of: Phase, engine: Engine) -> Resumable | None:
    """The checkpoint the phase resumes from, the same on every rank (collective): rank 0 picks the
    newest that can be read and says which newer ones it skipped and why; the others read the one
    it picked."""
    found = None
    if engine.is_main:
        found = newest_resumable(of.checkpoint_dir)
        if found is not None:
            for reason in found.skipped:
                print(f"{reason}; skipped, resuming from {found.path.name}", flush=True)
    picked = engine.parallel.broadcast_object(str(found.path) if found else None)
    if engine.is_main or picked is None:
        return found
    path = Path(str(picked))
    return Resumable(path, read_checkpoint(path), [])


def _initialise(
    spec: JobSpec, model: BertForPreTraining, resume: Path | None, init_from: Path | None, engine: Engine
) -> str:
    """Load the starting weights (a resumed checkpoint's are loaded later, with the rest of its
    state); returns where they come from, for the first log line."""
    if resume is not None:
        return str(resume)
    if init_from is not None:
        load_model_weights(init_from, model)  # the previous phase's: the same objective
        return str(init_from)
    if spec.model.init_from is None:
        return "random initialisation"
    source = Path(spec.model.init_from)
    initialised = load_initial_weights(source, model)
    if initialised.kept and engine.is_main:
        print(f"{source}: no weights for {', '.join(initialised.kept)}; they start from initialisation")
    return initialised.origin


def _dynamic_masking(spec: JobSpec, vocab_dir: Path | None) -> DynamicMasking | None:
    data = spec.data
    if data.masking != "dynamic":
        return None
    if vocab_dir is None:
        raise ValueError("data.masking is dynamic, but the trainer was given no vocabulary to mask with")
    return DynamicMasking.from_vocab(vocab_dir, data.masked_lm_prob, data.whole_word_mask)


def _announce(run: _Run, origin: str) -> None:
    phase, spec, engine = run.phase.phase_plan, run.phase.spec, run.engine
    description: dict[str, object] = {
        "phase": run.phase.index + 1,
        "model": spec.model.preset,
        "parameters": parameter_count(run.model),
        "steps": run.steps,
        "global_batch_size": phase.global_batch_size,
        "micro_batch_size": phase.micro_batch_size,
        "gradient_accumulation_steps": phase.accumulation_steps,
        "world_size": engine.world_size,
        "max_seq_length": phase.max_seq_length,
        "learning_rate": phase.learning_rate,
        "objective": spec.objective,
        "optimizer": spec.optimizer.name,
        "schedule": spec.optimizer.schedule,
        "precision": spec.precision,
        "device": str(engine.device),
        "packing": spec.data.packing,
        "heldout_shards": len(run.heldout),
        "start_step": run.start_step,
        "init_from": origin,
    }
    if spec.optimizer.lr_scaling != "none":
        description |= run.phase.plan.learning_rate(run.phase.index)
    ramp = run.phase.phase_spec.batch_ramp_proportion
    if ramp is not None:
        description["batch_ramp_proportion"] = ramp
    run.log.parameters(description)
    if not engine.is_main:
        return
    rows = "rows of packed sequences" if spec.data.packing != "none" else "sequences"
    ramped = f", ramped from 1 over the first {ramp:.0%} of the steps" if ramp is not None else ""
    print(
        f"{run.phase.name}: {spec.model.preset} ({description['parameters']:,} parameters), "
        f"{run.steps} steps x {phase.global_batch_size} {rows} of {phase.max_seq_length} tokens "
        f"(micro-batch {phase.micro_batch_size} x {phase.accumulation_steps} accumulation steps{ramped} x "
        f"world size {engine.world_size}), {engine.device} {spec.precision} {spec.optimizer.name}; "
        f"from {origin} at step {run.start_step}",
        flush=True,
    )


def _train(run: _Run, stop: StopSignals) -> None:
    engine, spec, budget = run.engine, run.phase.spec, run.budget
    if budget is not None:
        # The clock goes on from the checkpoint's count (set-up since is outside the budget).
        recorded = run.start.budget_seconds
        budget.start(recorded if recorded is not None else budget.calibration.fits[-1].elapsed_seconds)
    if run.heldout and _evaluation_owed(run):
        _evaluate(run, run.start_step)
    batches: Iterator[Batch] = iter(run.loader)
    if run.start_step < run.steps:
        batches = _warm_up(run, batches)
    progress = _Progress(run)
    step = run.start_step
    while step < run.steps:
        step += 1
        stats = torch.zeros(StepStatistics.SIZE, device=engine.device)
        accumulation = run.accumulation(step)
        thinning = None
        if spec.data.final_masked_lm_prob is not None:
            thinning = torch.Generator().manual_seed(_seed(spec.seed, run.phase.index, 2, engine.rank, step))
        for _ in range(accumulation):
            stats += engine.forward_backward(run.micro_batch(batches, step, thinning), accumulation)
        lr, skipped = engine.optimizer_step()
        # The step's one all-reduce, of every statistic at once.
        progress.record(
            step, StepStatistics.from_tensor(engine.sum_over_ranks(stats).cpu()), lr, skipped, accumulation
        )
        stopping = engine.any_rank(stop.received is not None)
        if budget is not None:
            budget.ended(step)
            if not stopping and step < run.steps:
                _refit_if_due(run, budget, step)
        last = step == run.steps
        if stopping or last or step % spec.checkpoint.every_steps == 0:
            saved = _save(run, step)
            if stopping:
                raise Preempted(stop.received or signal.SIGTERM, step, saved)
        if last and budget is not None and engine.is_main:
            _finish(run, budget)
        if run.heldout and _evaluation_due(run, step):
            _evaluate(run, step)
    progress.summary()


def _refit_if_due(run: _Run, budget: BudgetClock, step: int) -> None:
    """Re-fit the phase's steps after ``step`` when rank 0's clock says a fraction of the budget
    has passed (collective): rank 0 fits, records and says so; every rank follows its fit."""
    engine = run.engine
    if not engine.any_rank(engine.is_main and budget.refit_due(step)):
        return
    fit = engine.parallel.broadcast_object(budget.refit(step) if engine.is_main else None)
    assert isinstance(fit, Fit)
    before = run.steps
    budget.apply(fit)
    run.log.total_steps(fit.steps)
    if engine.is_main:
        write_calibration(run.phase.checkpoint_dir, budget.calibration)
        print(
            f"{run.phase.name} step {step}/{before}: re-fitted to {fit.steps:,} steps at "
            f"{fit.elapsed_seconds / budget.calibration.phase_seconds:.0%} "
            f"of the budget ({fit.micro_batch_seconds:.4f} s per micro-batch since the last fit), "
            f"{datetime.timedelta(seconds=round(max(budget.left(), 0.0)))} left",
            flush=True,
        )


def _finish(run: _Run, budget: BudgetClock) -> None:
    """Record the phase's training time by the clock, once its last step's checkpoint is written,
    and say how it compares with its share (rank 0)."""
    seconds, share = budget.elapsed(), budget.calibration.phase_seconds
    budget.calibration = dataclasses.replace(budget.calibration, finished_seconds=seconds)
    write_calibration(run.phase.checkpoint_dir, budget.calibration)
    print(
        f"{run.phase.name}: trained {seconds:.1f} s of its {share:.1f} s budget "
        f"({seconds / share - 1:+.1%}), in {len(budget.calibration.fits)} fits",
        flush=True,
    )


def _warm_up(run: _Run, batches: Iterator[Batch]) -> Iterator[Batch]:
    """Compile on the first micro-batch before the first step (:meth:`Engine.warm_up`), saying how
    long it took; the batches to train on, that one first."""
    first = next(batches)
    seconds = run.engine.warm_up(first)
    if seconds is not None and run.engine.is_main:
        planned = run.phase.phase_plan
        print(
            f"{run.phase.name}: compiled the model and the optimizer step for micro-batch "
            f"{planned.micro_batch_size} x {planned.max_seq_length} tokens in {seconds:.1f} s",
            flush=True,
        )
    return itertools.chain([first], batches)


def _evaluation_due(run: _Run, step: int) -> bool:
    every = run.phase.spec.evaluation.every_steps
    return step == run.steps or bool(every and step % every == 0)


def _evaluation_owed(run: _Run) -> bool:
    """Whether the evaluation due at the step the phase resumes at was not made: the run before
    was stopped between that step's checkpoint and the end of its evaluation (collective: every
    rank gets rank 0's answer)."""
    step = run.start_step
    owed = step > 0 and _evaluation_due(run, step) and evaluated_step(run.phase.root, run.phase.index) < step
    return run.engine.any_rank(run.engine.is_main and owed)


def _deepspeed_config(spec: JobSpec, phase: PhasePlan, world_size: int) -> dict[str, Any] | None:
    """The phase's DeepSpeed config, with ``spec.distributed.deepspeed``."""
    if spec.distributed.deepspeed is None:
        return None
    return deepspeed.phase_config(spec, phase.micro_batch_size, phase.accumulation_steps, world_size)


def _save(run: _Run, step: int) -> Path:
    """Write the checkpoint of ``step`` on rank 0, with every rank's RNG states and, under ZeRO,
    optimizer state (collective)."""
    rng = run.engine.gather(rng_states())
    run.engine.gather_optimizer_state()
    path = checkpoint_path(run.phase.root, run.phase.index, step)
    # Whole weights in the file (ZeRO-3 gathers them from every rank), for export and phase 2.
    with whole_parameters(run.model):
        if run.engine.is_main:
            save_checkpoint(
                run.phase.root,
                run.phase.index,
                step,
                model=run.model,
                optimizer=run.engine.optimizer,
                scheduler=run.engine.scheduler,
                scaler=run.engine.scaler,
                keep=run.phase.spec.checkpoint.keep,
                data_position=run.batches.position(run.micro_batches(step)).to_dict(),
                rng=rng,  # type: ignore[arg-type]
                learning_rate=run.phase.plan.learning_rate(run.phase.index),
                budget_seconds=None if run.budget is None else run.budget.elapsed(),
            )
    return path


def _evaluate(run: _Run, step: int) -> Evaluation:
    phase, engine = run.phase.phase_plan, run.engine
    result = evaluate(
        engine,
        heldout_batches(
            run.heldout,
            run.model.config.vocab_size,
            phase.micro_batch_size,
            engine.rank,
            engine.world_size,
            seed=_seed(run.phase.spec.seed, run.phase.index, 1),
            masking=run.masking,
            max_predictions_per_seq=phase.max_predictions_per_seq,
            max_sequences=run.phase.spec.evaluation.max_sequences,
            next_sentence_prediction=run.model.next_sentence_prediction,
        ),
    )
    run.log.log(run.phase.index + 1, step, "eval", result.values())
    if engine.is_main:
        record_evaluation(run.phase.root, run.phase.index, step, result.values())
        accuracy = f"mlm_acc {result.accuracy.mlm:.4f}"
        losses = f"loss {result.loss:.3f}"
        if result.accuracy.has_nsp:
            accuracy += f" nsp_acc {result.accuracy.nsp:.4f}"
            losses += f" (mlm {result.mlm_loss:.3f} nsp {result.nsp_loss:.3f})"
        print(
            f"{run.phase.name} step {step}/{run.steps} held-out: {accuracy} {losses}, "
            f"{result.accuracy.sequences:,} sequences in {result.seconds:.1f} s",
            flush=True,
        )
    return result


class _Progress:
    """Checks each step's loss, prints one line per ``logging.every_steps`` steps (rank 0) and
    logs it.

    The losses shown are means over the steps since the last line (skipped fp16 steps left out);
    mlm_acc is the training masked-LM accuracy over those steps; seq/s counts the sequences of
    all ranks (packed ones one by one) per second of wall-clock time over those steps.
    """

    def __init__(self, run: _Run):
        self.run = run
        self.consecutive_skips = 0
        # For the phase's summary: since the first step this process trains.
        self.began = time.perf_counter()
        self.trained_sequences = 0.0
        self.last_loss = float("nan")  # the last line's
        self.step_loss = float("nan")  # the last finite step's alone
        self._reset()

    def _reset(self) -> None:
        self.sums = torch.zeros(StepStatistics.SIZE)
        self.steps = 0
        self.micro_batches = 0  # of the finite steps since the last line, over all ranks
        self.skipped = 0
        self.start = time.perf_counter()

    def record(self, step: int, stats: StepStatistics, lr: float, skipped: bool, accumulation: int) -> None:
        """Take the statistics of one optimizer step, summed over its ``accumulation`` micro-batches
        per rank and over ranks.

        Raises:
            DivergenceError: a non-finite loss that the fp16 gradient scaler did not skip, or
                ``MAX_CONSECUTIVE_SKIPS`` skipped steps in a row.
        """
        finite = stats.finite()
        self.consecutive_skips = self.consecutive_skips + 1 if skipped else 0
        micro_batches = accumulation * self.run.engine.world_size
        if (not finite and not skipped) or self.consecutive_skips >= MAX_CONSECUTIVE_SKIPS:
            self._diverged(step, stats, skipped, micro_batches)
        if skipped:
            self.skipped += 1
        if finite:
            self.sums += stats.to_tensor()
            self.steps += 1
            self.micro_batches += micro_batches
            self.step_loss = stats.mean_losses(micro_batches).loss
        run = self.run
        if step % run.phase.spec.logging.every_steps == 0 or step == run.steps:
            self._emit(step, lr)
            self._reset()

    def summary(self) -> None:
        """Log the phase's end: the sequences trained, in how long, and the last loss."""
        seconds = time.perf_counter() - self.began
        self.run.log.summary(seconds, self.trained_sequences, self.last_loss)

    def _diverged(self, step: int, stats: StepStatistics, skipped: bool, micro_batches: int) -> None:
        run = self.run
        losses = stats.mean_losses(micro_batches)
        newest = latest(run.phase.checkpoint_dir)
        kept = (
            f"the last good checkpoint is {newest}" if newest else "no checkpoint of this phase was written"
        )
        overflowed = f"{self.consecutive_skips} fp16 steps in a row overflowed"
        cause = overflowed if skipped else f"loss is {losses.loss}"
        raise DivergenceError(
            f"{run.phase.name} step {step}: {cause} (mlm {losses.mlm_loss} nsp {losses.nsp_loss}); "
            f"stopping, {kept}. Lower the learning rate, or use bf16 or fp32 instead of fp16."
        )

    def _emit(self, step: int, lr: float) -> None:
        run = self.run
        elapsed = time.perf_counter() - self.start
        # NaN when every step since the last line was skipped.
        micro_batches = self.micro_batches
        total = StepStatistics.from_tensor(self.sums)
        loss, mlm, nsp = total.mean_losses(micro_batches)
        accuracy = total.accuracy()
        steps_done = self.steps + self.skipped
        rate = accuracy.sequences / elapsed
        has_nsp = self.run.model.next_sentence_prediction
        values = {"loss": loss, "mlm_loss": mlm, "mlm_accuracy": accuracy.mlm}
        if has_nsp:
            values |= {"nsp_loss": nsp, "nsp_accuracy": accuracy.nsp}
        values |= {"learning_rate": lr, "sequences_per_second": rate}
        budget_left = ""
        if run.budget is not None:
            left = max(run.budget.left(), 0.0)
            values["budget_left_seconds"] = left
            budget_left = f" budget left {datetime.timedelta(seconds=round(left))}"
        masking, masked_lm_prob = "", run.masked_lm_prob(step)
        if masked_lm_prob is not None:
            values["masked_lm_prob"] = masked_lm_prob
            masking = f" mask {masked_lm_prob:.1%}"
        values["sequences"] = float(accuracy.sequences)
        if self.skipped:
            values["skipped_steps"] = float(self.skipped)
        run.log.log(run.phase.index + 1, step, "train", values, step_loss=self.step_loss)
        self.trained_sequences += accuracy.sequences
        self.last_loss = loss
        if not run.engine.is_main:
            return
        eta = datetime.timedelta(seconds=round((run.steps - step) * elapsed / max(steps_done, 1)))
        skipped = f" skipped {self.skipped} (fp16 overflow)" if self.skipped else ""
        parts = f" (mlm {mlm:.3f} nsp {nsp:.3f})" if has_nsp else ""
        print(
            f"{run.phase.name} step {step}/{run.steps} loss {loss:.3f}{parts} "
            f"mlm_acc {accuracy.mlm:.3f} lr {lr:.2e}{masking} seq/s {rate:.1f} "
            f"eta {eta}{budget_left}{skipped}",
            flush=True,
        )
