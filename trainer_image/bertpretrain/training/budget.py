"""The wall-clock budget (``spec.budget``): each phase's share of it, the step count its measured
speed fits into that share, and the record that fixes the count for every later run of the phase.

A budget replaces ``phases[].steps``. The phases share it by time, each its ``budgetProportion``
(:func:`bertjob_api.defaults.budget_shares`). Before a phase trains, it calibrates: it times a few
optimizer steps of a throw-away copy of its run (:func:`bertpretrain.training.phase.Phase.train`),
then rank 0 fits the step count into what is left of the phase's share
(:func:`fitted_steps`), broadcasts it, and writes it to ``budget.json`` in the phase's checkpoint
directory (:func:`write_calibration`, atomically) before step 1. The learning-rate schedule is
then that of a job with ``steps`` set to the count, and ends when the budget does; a later run of
the phase reads the count instead of calibrating again, so that resuming stays exact. A run killed
before the record was written calibrates again.

Cramming (Geiping and Goldstein 2022) ties its schedule to the elapsed time instead; a fixed count
keeps NVIDIA's step-indexed schedules, checkpoints and exact resume as they are.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from bertjob_api.files import TEMPORARY, write_atomically
from bertpretrain.common import files

BUDGET_FILE = "budget.json"
# Optimizer steps timed at least, after the first (which compiles and fills caches).
MIN_TIMED_STEPS = 3


class BudgetError(ValueError):
    """A budget too short for what its phase measured: the message is one line naming the field
    (a ValueError, so that the entry point exits with code 1 and prints it)."""


@dataclass(frozen=True)
class Calibration:
    """A phase's step count fixed from its budget: ``steps`` optimizer steps, from a measured
    ``step_seconds`` per step (over ``timed_steps`` steps); the phase's share was ``phase_seconds``,
    of which calibrating took ``calibration_seconds`` (all wall-clock seconds)."""

    steps: int
    step_seconds: float
    timed_steps: int
    phase_seconds: float
    calibration_seconds: float

    def describe(self, name: str) -> str:
        """One log line: what was measured and the count fixed."""
        return (
            f"{name}: budget {_clock(self.phase_seconds)} for this phase; calibrated "
            f"{self.step_seconds:.3f} s per optimizer step over {self.timed_steps} steps in "
            f"{self.calibration_seconds:.1f} s; "
            f"{self.steps:,} steps fit in the {_clock(self.phase_seconds - self.calibration_seconds)} left"
        )


def fitted_steps(phase_seconds: float, spent_seconds: float, step_seconds: float, name: str) -> int:
    """The optimizer steps of ``step_seconds`` each that fit in what ``spent_seconds`` of
    calibrating left of the phase's ``phase_seconds`` (rounded down).

    Raises:
        BudgetError: not one step fits; the message names ``spec.budget.time`` and ``name`` (the
            phase, as the logs name it).
    """
    left = phase_seconds - spent_seconds
    steps = math.floor(left / step_seconds) if step_seconds > 0 else 0
    if steps < 1:
        raise BudgetError(
            f"spec.budget.time: {name} has {_clock(phase_seconds)} of the budget; calibrating took "
            f"{spent_seconds:.1f} s and one optimizer step takes {step_seconds:.3f} s, so no step fits: "
            "raise the budget or its share (phases[].budgetProportion)"
        )
    return steps


def read_calibration(directory: Path) -> Calibration | None:
    """The calibration recorded in the phase's checkpoint ``directory``; None when there is none
    (or it cannot be read: the phase then calibrates again, which is safe before step 1)."""
    try:
        data = json.loads((directory / BUDGET_FILE).read_text())
        calibration = Calibration(**data)
    except (OSError, ValueError, TypeError):
        return None
    return calibration if isinstance(calibration.steps, int) and calibration.steps >= 1 else None


def write_calibration(directory: Path, calibration: Calibration) -> None:
    """Record ``calibration`` as ``budget.json`` in ``directory`` (made if missing), written to a
    temporary name, synced and renamed, so that a kill leaves the old state or the new one.

    Raises:
        bertjob_api.files.DiskFullError, OSError: it cannot be written.
    """
    document = json.dumps(asdict(calibration), indent=2, sort_keys=True) + "\n"
    # Under the lock the phase's checkpoint writers take, which also clears killed writers' temporaries.
    with files.writing(directory, TEMPORARY):
        write_atomically(directory / BUDGET_FILE, lambda file: file.write(document.encode()))


def _clock(seconds: float) -> str:
    """``seconds`` as h:mm:ss."""
    whole = max(0, round(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"
