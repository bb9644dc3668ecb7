"""The wall-clock budget: a phase fixes its steps once from its measured speed, records them before
step 1, trains exactly as a job with those steps would, and a later run reads the record."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from bertjob_api.defaults import budget_shares
from bertjob_api.spec import PhaseSpec
from bertjob_api.spec.phases import duration_seconds
from bertpretrain.training.budget import (
    BUDGET_FILE,
    BudgetError,
    Calibration,
    fitted_steps,
    read_calibration,
    write_calibration,
)
from bertpretrain.training.checkpoint import read_checkpoint
from tests.bertpretrain.training.test_phase import log_records, train_phase

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    ("text", "seconds"), [("2h", 7200), ("90m", 5400), ("1h30m", 5400), ("600s", 600), ("1h0m5s", 3605)]
)
def test_durations(text: str, seconds: int) -> None:
    assert duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "2", "1d", "h", "1m1h"])
def test_what_is_no_duration(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        duration_seconds(text)


def _phases(*shares: float | None) -> list[PhaseSpec]:
    return [
        PhaseSpec.model_validate(
            {"maxSeqLength": 128, "maxPredictionsPerSeq": 20, "globalBatchSize": 8, "learningRate": 1e-3}
            | ({} if share is None else {"budgetProportion": share})
        )
        for share in shares
    ]


def test_phases_share_the_budget_by_time() -> None:
    assert budget_shares(_phases(None)) == [1.0]
    assert budget_shares(_phases(None, None)) == [0.5, 0.5]
    assert budget_shares(_phases(0.7, None)) == pytest.approx([0.7, 0.3])
    assert budget_shares(_phases(0.1, 0.2)) is None
    assert budget_shares(_phases(1.0, None)) is None


def test_the_steps_that_fit() -> None:
    # 100 s of the phase, 10 of them spent calibrating, 0.7 s a step: floor(90 / 0.7) = 128.
    assert fitted_steps(100.0, 10.0, 0.7, "phase 1/1") == 128
    with pytest.raises(BudgetError, match=r"^spec\.budget\.time: phase 2/2 has 0:00:05 .* no step fits"):
        fitted_steps(5.0, 4.9, 0.2, "phase 2/2")


def test_the_record_round_trips_and_a_damaged_one_is_none(tmp_path: Path) -> None:
    calibration = Calibration(
        steps=42, step_seconds=0.5, timed_steps=4, phase_seconds=30.0, calibration_seconds=9.0
    )
    write_calibration(tmp_path / "phase1", calibration)
    assert read_calibration(tmp_path / "phase1") == calibration
    assert [path.name for path in (tmp_path / "phase1").iterdir() if path.name != ".lock"] == [BUDGET_FILE]
    (tmp_path / "phase1" / BUDGET_FILE).write_text('{"steps": 0}')
    assert read_calibration(tmp_path / "phase1") is None
    assert read_calibration(tmp_path / "absent") is None


def test_a_budgeted_phase_trains_as_the_steps_it_fixed_and_keeps_them(
    make_spec,
    make_phase,
    shard_dir: Path,
    vocab_size: int,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    phase = {key: value for key, value in make_phase(learningRate=2e-2).items() if key != "steps"}
    budget = {"time": "3s", "calibrationProportion": 0.2}
    budgeted = make_spec(
        [phase], budget=budget, checkpoint={"path": str(tmp_path / "a"), "everySteps": 5, "keep": 2}
    )
    final = train_phase(budgeted, 0, shard_dir, vocab_size)
    output = capsys.readouterr().out
    recorded = json.loads((final.parent / BUDGET_FILE).read_text())
    steps = recorded["steps"]
    assert final.name == f"step_{steps:06d}.pt" and steps >= 1
    assert recorded["timed_steps"] >= 3 and recorded["calibration_seconds"] >= 0.6  # 20% of 3 s
    assert math.floor((3.0 - recorded["calibration_seconds"]) / recorded["step_seconds"]) == steps
    assert "phase 1/1: budget 0:00:03 for this phase; calibrated " in output
    assert f"{steps:,} steps fit in the" in output
    train = [record["data"] for record in log_records(budgeted) if record["type"] == "LOG"]
    assert train[-1]["budget_left_seconds"] == 0.0 and train[0]["budget_left_seconds"] > 0
    assert " budget left 0:00:00" in next(
        line for line in output.splitlines() if f"step {steps}/{steps} loss" in line
    )

    # The same job with those steps written: the same weights, bit for bit.
    fixed = make_spec(
        [make_phase(learningRate=2e-2, steps=steps)],
        checkpoint={"path": str(tmp_path / "b"), "everySteps": 5, "keep": 2},
    )
    expected = read_checkpoint(train_phase(fixed, 0, shard_dir, vocab_size))["model"]
    found = read_checkpoint(final)["model"]
    assert all(torch.equal(found[name], tensor) for name, tensor in expected.items())

    # A run killed after the record and a checkpoint resumes with the recorded steps, exactly.
    final.unlink()
    capsys.readouterr()
    assert train_phase(budgeted, 0, shard_dir, vocab_size) == final
    output = capsys.readouterr().out
    assert f"phase 1/1: {steps:,} steps, fixed by the budget's calibration" in output
    assert "calibrated" not in output
    resumed = read_checkpoint(final)["model"]
    assert all(torch.equal(resumed[name], tensor) for name, tensor in expected.items())


def test_a_budget_too_short_stops_naming_the_field(
    make_spec, make_phase, shard_dir: Path, vocab_size: int, tmp_path: Path
) -> None:
    phase = {key: value for key, value in make_phase().items() if key != "steps"}
    # 0.1 ms left after the calibration: no step of any model fits, however fast the machine.
    spec = make_spec([phase], budget={"time": "1s", "calibrationProportion": 0.9999})
    with pytest.raises(BudgetError, match=r"^spec\.budget\.time: phase 1/1 has 0:00:01 of the budget"):
        train_phase(spec, 0, shard_dir, vocab_size)
    assert not (Path(spec.checkpoint.path) / "phase1" / BUDGET_FILE).exists()
