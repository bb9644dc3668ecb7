"""The wall-clock budget (``spec.budget``): each phase's share of it, the step count its measured
speed fits into that share, the re-fits that keep the count honest while the phase trains, and the
record that lets every later run of the phase resume exactly.

A budget replaces ``phases[].steps``. The phases share it by time, each its ``budgetProportion``
(:func:`bertjob_api.defaults.budget_shares`). Before a phase trains, it calibrates: it times a few
optimizer steps of a throw-away copy of its run (:func:`bertpretrain.training.phase.Phase.train`),
then rank 0 fits the step count into what is left of the phase's share (:func:`first_fit`),
broadcasts it, and records it in ``budget.json`` in the phase's checkpoint directory
(:func:`write_calibration`, atomically) before step 1.

**The clock enforces it.** A count fitted once is only as good as the calibration: a machine that
slows down after it, a compile that happens again in the real run, or a batch ramp's cheaper steps
would end the phase early or late. So the phase re-fits its count when :data:`REFIT_AT` fractions
of its share have passed by the clock, and after each of the last :data:`REFIT_LAST_STEPS` steps
its count plans: the seconds per micro-batch measured since the last fit (over the last
:data:`MIN_TIMED_STEPS` steps when fewer have passed since it) predict how many more steps end
nearest the end of the share (:func:`refit`). Each fit is recorded as the first
is, so that a resumed run replays the fits made up to its checkpoint and then makes its own.

**The schedule follows the fits.** Learning-rate schedules read a phase's *progress*, a number from
0 at step 0 to 1 at its last step (:meth:`Calibration.progress`). Under one fit it is ``step /
steps``, exactly that of a job with ``steps`` written; a re-fit after step ``s`` spreads the
progress still to go over the new number of steps still to go, so the schedule bends without a
jump and reaches its end at the new last step. The batch ramp keeps the span in steps the first
fit gave it (a re-fit does not move data already read).

Cramming (Geiping and Goldstein 2022) reads the clock in its scheduler instead; recorded fits keep
NVIDIA's step-indexed checkpoints, the data position and exact resume as they are.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bertjob_api.files import TEMPORARY, write_atomically
from bertpretrain.common import files

BUDGET_FILE = "budget.json"
# Optimizer steps timed at least, after the first (which compiles and fills caches).
MIN_TIMED_STEPS = 3
# Fractions of a phase's share at which it re-fits its step count. The last ones are close to the
# end, so that what is left to predict is a few percent of the share: a 10% error in the speed
# measured then moves the end by well under 1%.
REFIT_AT = (0.25, 0.5, 0.75, 0.9, 0.95, 0.98)
# The phase also re-fits after each of the last steps its count plans: in a run of a few dozen
# steps one step is a few percent of the share, so the last fractions can all fall in its last
# step or two; these re-fits decide its end from the clock then, to within half a step.
REFIT_LAST_STEPS = 2


class BudgetError(ValueError):
    """A budget too short for what its phase measured, or a record made for another spec: the
    message is one line naming the field (a ValueError, so that the entry point exits with code 1
    and prints it)."""


@dataclass(frozen=True)
class Fit:
    """One fit of a phase's step count.

    ``steps`` optimizer steps in all, made when ``elapsed_seconds`` of the phase's share had passed,
    from ``micro_batch_seconds`` measured per micro-batch of each rank (wall-clock seconds). The fit
    sets the progress of the steps after ``from_step``: 0 for the calibration's fit, ``s + 1`` for
    a re-fit made after step ``s`` (step ``s + 1``'s learning rate was already set).
    """

    from_step: int
    steps: int
    elapsed_seconds: float
    micro_batch_seconds: float


@dataclass(frozen=True)
class Calibration:
    """A phase's budget as recorded: its share ``phase_seconds``, of which calibrating took
    ``calibration_seconds``; ``step_seconds`` per optimizer step measured at full gradient
    accumulation over ``timed_steps`` steps; the ``fits`` made since (the first the calibration's);
    ``spec``, the fields it was made for (:func:`budget_fields`), by their spec paths; and, once the
    last step's checkpoint is written, ``finished_seconds``: the phase's training time by the
    clock, its calibration included."""

    step_seconds: float
    timed_steps: int
    phase_seconds: float
    calibration_seconds: float
    fits: tuple[Fit, ...]
    spec: Mapping[str, object] = field(default_factory=dict)
    finished_seconds: float | None = None

    @property
    def steps(self) -> int:
        """The phase's optimizer steps, as the last fit has them."""
        return self.fits[-1].steps

    @property
    def ramp_steps(self) -> int:
        """The steps a batch ramp's span is a proportion of: the first fit's, fixed so that a
        re-fit never moves the data already read."""
        return self.fits[0].steps

    def progress(self, step: int) -> float:
        """The phase's progress after ``step`` optimizer steps, from 0 to 1 at :attr:`steps`: each
        fit a straight line from the progress its ``from_step`` had to 1 at its ``steps``.

        Under the first fit alone this is ``step / steps`` exactly (bit for bit); a re-fit that
        keeps the count changes nothing (its line is the same one), so a run whose speed holds
        trains bit for bit as a job with its steps written.
        """
        lines = [
            fit
            for index, fit in enumerate(self.fits)
            if index == 0 or fit.steps != self.fits[index - 1].steps
        ]
        start = 0.0
        for index, fit in enumerate(lines):
            following = lines[index + 1].from_step if index + 1 < len(lines) else None
            if following is None or step < following:
                return _line(start, fit, step)
            start = _line(start, fit, following)
        raise AssertionError("unreachable: the last line has no following one")

    def until(self, step: int) -> Calibration:
        """The record as it stood when the checkpoint of ``step`` was written: the fits made after
        it are dropped (a resumed run makes its own)."""
        kept = tuple(fit for fit in self.fits if fit.from_step <= step + 1)
        return dataclasses.replace(self, fits=kept or self.fits[:1], finished_seconds=None)

    def with_fit(self, fit: Fit) -> Calibration:
        """The record with ``fit`` added after the others."""
        return dataclasses.replace(self, fits=(*self.fits, fit))

    def describe(self, name: str) -> str:
        """One log line: what was measured and the count fixed."""
        return (
            f"{name}: budget {_clock(self.phase_seconds)} for this phase; calibrated "
            f"{self.step_seconds:.3f} s per optimizer step over {self.timed_steps} steps in "
            f"{self.calibration_seconds:.1f} s; {self.steps:,} steps fit in the "
            f"{_clock(self.phase_seconds - self.calibration_seconds)} left"
        )


def _line(start: float, fit: Fit, step: int) -> float:
    if fit.steps <= fit.from_step:
        return start
    # Written so that start 0 and from_step 0 give step / steps exactly.
    return start + (1.0 - start) * (step - fit.from_step) / (fit.steps - fit.from_step)


def first_fit(
    phase_seconds: float,
    spent_seconds: float,
    step_seconds: float,
    accumulation_steps: int,
    cost: Callable[[int, int], int],
    name: str,
) -> Fit:
    """The calibration's fit: the most optimizer steps whose micro-batches fit in what
    ``spent_seconds`` of calibrating left of the phase's ``phase_seconds``, at ``step_seconds`` per
    step of ``accumulation_steps`` micro-batches (all seconds wall-clock).

    ``cost(step, steps)`` is the micro-batches per rank that steps 1..``step`` of a phase of
    ``steps`` steps read (``step x accumulation_steps`` without a batch ramp; fewer with one,
    whose span depends on ``steps``).

    Raises:
        BudgetError: not one step fits; the message names ``spec.budget.time`` and ``name`` (the
            phase, as the logs name it).
    """
    left = phase_seconds - spent_seconds
    micro_batch_seconds = step_seconds / accumulation_steps
    steps = _most(
        lambda steps: cost(steps, steps) * micro_batch_seconds <= left, 0, _ceiling(left, micro_batch_seconds)
    )
    if steps < 1:
        raise BudgetError(
            f"spec.budget.time: {name} has {_clock(phase_seconds)} of the budget; calibrating took "
            f"{spent_seconds:.1f} s and one optimizer step takes {step_seconds:.3f} s, so no step fits: "
            "raise the budget or its share (phases[].budgetProportion)"
        )
    return Fit(0, steps, spent_seconds, micro_batch_seconds)


def refit(
    step: int,
    elapsed_seconds: float,
    phase_seconds: float,
    micro_batch_seconds: float,
    cost: Callable[[int], int],
) -> Fit:
    """A re-fit after optimizer step ``step``, ``elapsed_seconds`` into the phase's
    ``phase_seconds``: the count of steps after ``step`` (``cost(n) - cost(step)`` micro-batches
    per rank, ``cost(n)`` those of steps 1..n) whose end at ``micro_batch_seconds`` each falls
    nearest the end of the share, up to half a step before or after it (a count that always stopped
    short would end a run of 35 steps up to 3% early); at least ``step + 1``, since step
    ``step + 1``'s learning rate is already set (a run out of time ends one step late, not at a
    rate the schedule never reached).
    """
    left = phase_seconds - elapsed_seconds
    done = cost(step)

    def seconds(extra: int) -> float:
        return (cost(step + extra) - done) * micro_batch_seconds

    extra = _most(lambda n: seconds(n) <= left, 0, _ceiling(left, micro_batch_seconds))
    if seconds(extra + 1) - left < left - seconds(extra):
        extra += 1
    return Fit(step + 1, step + max(extra, 1), elapsed_seconds, micro_batch_seconds)


def _ceiling(seconds: float, micro_batch_seconds: float) -> int:
    """More steps than can fit: each step reads at least one micro-batch."""
    return max(0, math.floor(seconds / micro_batch_seconds)) + 1 if micro_batch_seconds > 0 else 0


def _most(fits: Callable[[int], bool], low: int, high: int) -> int:
    """The largest ``n`` in ``[low, high]`` with ``fits(n)`` (``fits`` true up to some point and
    false after it; ``fits(low)`` assumed), by bisection; ``low`` when none above it fits."""
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def budget_fields(spec: Any) -> dict[str, object]:
    """What a phase's budget record is made for, by spec path: the budget, every phase (their
    shares and sizes), and what sets a step's speed (model, objective, optimizer, precision,
    compilation, activation checkpointing, packing, masking, accelerator and topology).
    ``spec`` is a :class:`bertjob_api.spec.JobSpec`. The world size that runs is left out: an
    elastic job's changes between restarts, and the re-fits follow the speed it gives."""
    document = spec.model_dump(mode="json", by_alias=True)
    data = document["data"]
    chosen = {
        key: document[key]
        for key in (
            "budget", "phases", "model", "objective", "optimizer", "precision", "compile",
            "activationCheckpointing", "accelerator", "topology",
        )
    }  # fmt: skip
    chosen["data"] = {key: data.get(key) for key in ("packing", "masking", "maskedLmProb")}
    return dict(_flatten("spec", chosen))


def _flatten(path: str, value: object) -> list[tuple[str, object]]:
    if isinstance(value, dict):
        return [pair for key, item in value.items() for pair in _flatten(f"{path}.{key}", item)]
    if isinstance(value, list):
        return [pair for index, item in enumerate(value) for pair in _flatten(f"{path}[{index}]", item)]
    return [(path, value)]


def check_fields(recorded: Calibration, current: Mapping[str, object], directory: Path) -> None:
    """Refuse a record made for another spec than ``current`` (:func:`budget_fields`).

    Raises:
        BudgetError: a field differs; the message names each (at most three) with both values.
    """
    changed = sorted(key for key in {*recorded.spec, *current} if recorded.spec.get(key) != current.get(key))
    if not changed:
        return
    shown = "; ".join(f"{key} was {recorded.spec.get(key)!r}, is {current.get(key)!r}" for key in changed[:3])
    more = f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""
    raise BudgetError(
        f"{changed[0]}: {directory / BUDGET_FILE} was made for another spec: {shown}{more}; restore "
        "the spec, or delete the phase's checkpoint directory to train the phase again"
    )


def read_calibration(directory: Path) -> Calibration | None:
    """The calibration recorded in the phase's checkpoint ``directory``; None when there is none
    (or it cannot be read: the phase then calibrates again, which is safe before step 1)."""
    try:
        data = json.loads((directory / BUDGET_FILE).read_text())
        data.pop("steps", None)
        data["fits"] = tuple(Fit(**fit) for fit in data["fits"])
        calibration = Calibration(**data)
    except (OSError, ValueError, TypeError, KeyError):
        return None
    fits_ok = all(
        isinstance(fit.steps, int) and fit.steps >= max(fit.from_step, 1) for fit in calibration.fits
    )
    return calibration if calibration.fits and fits_ok else None


def write_calibration(directory: Path, calibration: Calibration) -> None:
    """Record ``calibration`` as ``budget.json`` in ``directory`` (made if missing), written to a
    temporary name, synced and renamed, so that a kill leaves the old state or the new one. The
    document also holds ``steps`` (the last fit's) for readers.

    Raises:
        bertjob_api.files.DiskFullError, OSError: it cannot be written.
    """
    document = json.dumps(calibration_document(calibration), indent=2, sort_keys=True) + "\n"
    # Under the lock the phase's checkpoint writers take, which also clears killed writers' temporaries.
    with files.writing(directory, TEMPORARY):
        write_atomically(directory / BUDGET_FILE, lambda file: file.write(document.encode()))


def calibration_document(calibration: Calibration) -> dict[str, Any]:
    """``calibration`` as ``budget.json`` holds it (JSON types)."""
    document = asdict(calibration)
    document["fits"] = [asdict(fit) for fit in calibration.fits]
    document["spec"] = dict(calibration.spec)
    document["steps"] = calibration.steps
    return document


def _clock(seconds: float) -> str:
    """``seconds`` as h:mm:ss (negative as 0:00:00)."""
    whole = max(0, round(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


class BudgetClock:
    """A phase's budget while it trains: its record, re-fitted as :data:`REFIT_AT` fractions of
    the phase's share pass, and the clock that measures them.

    ``cost(n)`` is the micro-batches per rank that steps 1..n read; ``clock()`` gives wall-clock
    seconds (:func:`time.perf_counter`; a test passes its own). The clock runs from :meth:`start`
    on, from the seconds the phase had already spent (its calibration, or a checkpoint's
    ``budget_seconds``); a run calls :meth:`ended` after each of its steps, and the seconds per
    micro-batch of each re-fit are measured from the end of its first (the warm-up's compile and
    the first step's caches count in the budget but would make a step look slower than the steps
    to come), over at least :data:`MIN_TIMED_STEPS` steps.
    """

    def __init__(self, calibration: Calibration, cost: Callable[[int], int], clock: Callable[[], float]):
        self.calibration = calibration
        self._cost = cost
        self._clock = clock
        self._spent = 0.0
        self._started = 0.0
        self._window = (0.0, 0)  # clock() and the step the speed is measured from
        self._recent: deque[tuple[float, int]] = deque(maxlen=MIN_TIMED_STEPS + 1)  # the last step ends

    def progress(self, step: int) -> float:
        """The phase's progress after ``step`` steps under the fits so far (:meth:`Calibration.progress`)."""
        return self.calibration.progress(step)

    def start(self, spent_seconds: float) -> None:
        """Start the clock at ``spent_seconds`` of the phase's share."""
        self._spent, self._started = spent_seconds, self._clock()

    def ended(self, step: int) -> None:
        """Note that optimizer ``step`` ended now; a run's first call starts the speed's measure."""
        now = self._clock()
        if not self._recent:
            self._window = (now, step)
        self._recent.append((now, step))

    def elapsed(self) -> float:
        """Seconds of the phase's share spent."""
        return self._spent + self._clock() - self._started

    def left(self) -> float:
        """Seconds of the phase's share left by the clock (negative once over)."""
        return self.calibration.phase_seconds - self.elapsed()

    def refit_due(self, step: int) -> bool:
        """Whether a :data:`REFIT_AT` fraction has passed since the last fit was made, or ``step``
        is one of the last :data:`REFIT_LAST_STEPS` the fits plan, once at least
        :data:`MIN_TIMED_STEPS` steps after a run's first were timed (a speed measured over one
        step, the first of a run among them, would cut the run short)."""
        share, last = self.calibration.phase_seconds, self.calibration.fits[-1].elapsed_seconds
        elapsed = self.elapsed()
        timed = len(self._recent) == self._recent.maxlen
        ending = self.calibration.steps - step <= REFIT_LAST_STEPS
        return timed and (ending or any(last < fraction * share <= elapsed for fraction in REFIT_AT))

    def refit(self, step: int) -> Fit:
        """The fit after ``step`` from the speed measured since the last fit (over the last
        :data:`MIN_TIMED_STEPS` steps when fewer have passed since it), the clock's time left and
        the cost of the steps to come (:func:`refit`)."""
        began, first = self._window
        if step - first < MIN_TIMED_STEPS and len(self._recent) == self._recent.maxlen:
            began, first = self._recent[0]
        now = self._clock()
        micro_batches = self._cost(step) - self._cost(first)
        speed = (
            (now - began) / micro_batches
            if micro_batches > 0
            else self.calibration.fits[-1].micro_batch_seconds
        )
        return refit(step, self.elapsed(), self.calibration.phase_seconds, speed, self._cost)

    def apply(self, fit: Fit) -> None:
        """Follow ``fit`` from now on (every rank applies rank 0's), measuring afresh from its step."""
        self.calibration = self.calibration.with_fit(fit)
        self._window = (self._clock(), fit.from_step - 1)
