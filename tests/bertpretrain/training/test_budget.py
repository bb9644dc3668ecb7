"""The wall-clock budget: a phase fits its steps from its measured speed, records the fit before step
1, re-fits as the clock runs, ends within 2% of its share whatever the speed does after the
calibration, trains exactly as a job with its steps written while the speed holds, and a later run
reads the record (and refuses one made for another spec).

Most tests run on a clock of their own (:class:`StepClock`) that advances by a fixed number of
seconds per micro-batch: the budget's arithmetic is then exact and the machine's load cannot move it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import bertpretrain.training.budget
import bertpretrain.training.phase
from bertjob_api.defaults import budget_shares
from bertjob_api.spec import PhaseSpec
from bertjob_api.spec.phases import duration_seconds
from bertjob_testing.jobs import small_training_job, with_value
from bertpretrain.runtime.engine import Engine
from bertpretrain.training.budget import (
    BUDGET_FILE,
    BudgetClock,
    BudgetError,
    Calibration,
    Fit,
    budget_fields,
    check_fields,
    first_fit,
    read_calibration,
    refit,
    write_calibration,
)
from bertpretrain.training.checkpoint import read_checkpoint
from bertpretrain.training.schedule import ramped_micro_batches
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
    assert first_fit(100.0, 10.0, 0.7, 1, lambda step, steps: step, "phase 1/1") == Fit(0, 128, 10.0, 0.7)
    # The same step in 4 micro-batches of 0.175 s: the same 128.
    assert first_fit(100.0, 10.0, 0.7, 4, lambda step, steps: 4 * step, "phase 1/1").steps == 128
    # A batch ramp over the first 30% reads fewer micro-batches: more steps fit in the same time.
    ramped = first_fit(
        100.0, 10.0, 0.7, 4, lambda step, steps: ramped_micro_batches(step, steps, 4, 0.3), "x"
    )
    assert ramped.steps > 128
    assert ramped_micro_batches(ramped.steps, ramped.steps, 4, 0.3) * 0.175 <= 90.0
    assert ramped_micro_batches(ramped.steps + 1, ramped.steps + 1, 4, 0.3) * 0.175 > 90.0
    with pytest.raises(BudgetError, match=r"^spec\.budget\.time: phase 2/2 has 0:00:05 .* no step fits"):
        first_fit(5.0, 4.9, 0.2, 1, lambda step, steps: step, "phase 2/2")


def test_a_refit_fits_what_is_left_at_the_speed_measured() -> None:
    # After step 50, 60 s of 100 gone, 0.5 s a micro-batch: 80 more steps.
    assert refit(50, 60.0, 100.0, 0.5, lambda n: n) == Fit(51, 130, 60.0, 0.5)
    assert refit(50, 60.0, 100.0, 0.5, lambda n: 2 * n).steps == 90
    # 88.9 steps are left: the 89th ends 0.05 s after the share, nearer than the 88th's 0.4 s before.
    assert refit(50, 60.0, 100.0, 0.45, lambda n: n).steps == 139
    # Out of time: one more step, whose rate is already set, then the end.
    assert refit(50, 101.0, 100.0, 0.5, lambda n: n).steps == 51


def test_progress_follows_the_fits_without_a_jump() -> None:
    one = Calibration(0.1, 3, 100.0, 2.0, (Fit(0, 100, 2.0, 0.1),))
    assert [one.progress(step) for step in (0, 37, 100)] == [0.0, 37 / 100, 1.0]
    # A re-fit after step 40 to 70 steps: the rest of the way, 0.6 at step 41 (already set), in 29 steps.
    bent = one.with_fit(Fit(41, 70, 40.0, 0.2))
    assert bent.progress(40) == one.progress(40) and bent.progress(41) == one.progress(41)
    assert bent.progress(70) == 1.0 and bent.progress(56) == pytest.approx(0.41 + 0.59 * 15 / 29)
    assert all(bent.progress(step) < bent.progress(step + 1) for step in range(70))
    # A re-fit that keeps the count keeps the line, bit for bit.
    kept = one.with_fit(Fit(41, 100, 40.0, 0.1))
    assert all(kept.progress(step) == step / 100 for step in range(101))
    # A resume from step 30's checkpoint drops the fit made after step 40.
    assert bent.until(30).fits == one.fits and bent.until(40).fits == bent.fits


def test_the_record_round_trips_and_a_damaged_one_is_none(tmp_path: Path) -> None:
    calibration = Calibration(
        step_seconds=0.5,
        timed_steps=4,
        phase_seconds=30.0,
        calibration_seconds=9.0,
        fits=(Fit(0, 42, 9.0, 0.5), Fit(11, 40, 16.0, 0.55)),
        spec={"spec.budget.time": "30s"},
    )
    write_calibration(tmp_path / "phase1", calibration)
    assert read_calibration(tmp_path / "phase1") == calibration
    assert json.loads((tmp_path / "phase1" / BUDGET_FILE).read_text())["steps"] == 40
    assert [path.name for path in (tmp_path / "phase1").iterdir() if path.name != ".lock"] == [BUDGET_FILE]
    (tmp_path / "phase1" / BUDGET_FILE).write_text('{"steps": 0}')
    assert read_calibration(tmp_path / "phase1") is None
    assert read_calibration(tmp_path / "absent") is None


def test_a_record_for_another_spec_is_refused_naming_the_field(make_spec, make_phase, tmp_path: Path) -> None:
    phase = {key: value for key, value in make_phase().items() if key != "steps"}
    spec = make_spec([phase], budget={"time": "3s"})
    recorded = Calibration(0.1, 3, 3.0, 0.1, (Fit(0, 20, 0.1, 0.1),), budget_fields(spec))
    check_fields(recorded, budget_fields(spec), tmp_path)
    bigger = make_spec([phase | {"globalBatchSize": 32}], budget={"time": "3s"})
    with pytest.raises(BudgetError, match=r"^spec\.phases\[0\]\.globalBatchSize: .* was 16, is 32;"):
        check_fields(recorded, budget_fields(bigger), tmp_path)
    wider = make_spec([phase], budget={"time": "3s"}, topology={"nodes": 2})
    with pytest.raises(BudgetError, match=r"made for another spec: .*spec\.topology\.nodes was 1, is 2;"):
        check_fields(recorded, budget_fields(wider), tmp_path)


class StepClock:
    """A clock that moves only when a micro-batch is trained, by ``seconds`` (``slow`` times that
    once the budget's calibration is recorded): powers of two keep its sums exact."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, seconds: float = 2.0**-5, slow: float = 1.0):
        self.now, self.seconds, self.slow, self.calibrated = 0.0, seconds, slow, False
        forward_backward, write = Engine.forward_backward, bertpretrain.training.phase.write_calibration

        def timed(engine: Engine, *args: Any, **kwargs: Any) -> Any:
            self.now += self.seconds * (self.slow if self.calibrated else 1.0)
            return forward_backward(engine, *args, **kwargs)

        def recorded(*args: Any, **kwargs: Any) -> None:
            self.calibrated = True
            write(*args, **kwargs)

        monkeypatch.setattr(Engine, "forward_backward", timed)
        monkeypatch.setattr(bertpretrain.training.phase, "write_calibration", recorded)

    def __call__(self) -> float:
        return self.now


def _budgeted(make_spec, make_phase, path: Path, time: str = "3s", **fields: Any):  # type: ignore[no-untyped-def]
    phase = {key: value for key, value in make_phase(learningRate=2e-2).items() if key != "steps"} | fields
    checkpoint = {"path": str(path), "everySteps": 5, "keep": 2}
    return make_spec([phase], budget={"time": time, "calibrationProportion": 0.02}, checkpoint=checkpoint)


def test_a_budgeted_phase_trains_as_the_steps_it_fixed_and_keeps_them(
    make_spec,
    make_phase,
    shard_dir: Path,
    vocab_size: int,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    budgeted = _budgeted(make_spec, make_phase, tmp_path / "a")
    final = train_phase(budgeted, 0, shard_dir, vocab_size, clock=StepClock(monkeypatch))
    output = capsys.readouterr().out
    recorded = json.loads((final.parent / BUDGET_FILE).read_text())
    # 4 calibration steps of 1/32 s (at least 3 timed after the first, and 2% of 3 s), then
    # (3 - 0.125) * 32 = 92 steps; every re-fit finds the same count at the same speed.
    steps = recorded["steps"]
    assert (steps, recorded["timed_steps"], recorded["calibration_seconds"]) == (92, 3, 0.125)
    assert [fit["steps"] for fit in recorded["fits"]] == [92] * 8 and recorded["finished_seconds"] == 3.0
    assert final.name == f"step_{steps:06d}.pt"
    assert "phase 1/1: budget 0:00:03 for this phase; calibrated " in output
    assert "92 steps fit in the" in output and "re-fitted to 92 steps at 25% of the budget" in output
    assert "phase 1/1: trained 3.0 s of its 3.0 s budget (+0.0%), in 8 fits" in output
    train = [record["data"] for record in log_records(budgeted) if record["type"] == "LOG"]
    assert train[-1]["budget_left_seconds"] == 0.0 and train[0]["budget_left_seconds"] == 3.0 - 0.125 - 5 / 32
    assert " budget left 0:00:00" in next(line for line in output.splitlines() if "step 92/92 loss" in line)

    # The same job with those steps written: the same weights, bit for bit.
    fixed = make_spec(
        [make_phase(learningRate=2e-2, steps=steps)],
        checkpoint={"path": str(tmp_path / "b"), "everySteps": 5, "keep": 2},
    )
    expected = read_checkpoint(train_phase(fixed, 0, shard_dir, vocab_size))["model"]
    found = read_checkpoint(final)["model"]
    assert all(torch.equal(found[name], tensor) for name, tensor in expected.items())

    # A run killed after step 90's checkpoint resumes with the fits made by then, and its clock goes
    # on from that checkpoint's count: it ends as the first run did.
    final.unlink()
    capsys.readouterr()
    assert train_phase(budgeted, 0, shard_dir, vocab_size, clock=StepClock(monkeypatch)) == final
    output = capsys.readouterr().out
    assert "phase 1/1: 92 steps, fixed by the budget's record" in output
    assert "calibrated" not in output and "trained 3.0 s of its 3.0 s budget" in output
    resumed = read_checkpoint(final)["model"]
    assert all(torch.equal(resumed[name], tensor) for name, tensor in expected.items())


@pytest.mark.parametrize(
    "fields", [{}, {"microBatchSize": 4, "batchRampProportion": 0.3}], ids=["plain", "ramp"]
)
def test_steps_twice_as_slow_after_the_calibration_still_end_within_2_percent(
    make_spec,
    make_phase,
    shard_dir: Path,
    vocab_size: int,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fields: dict[str, Any],
) -> None:
    budgeted = _budgeted(make_spec, make_phase, tmp_path / "a", **fields)
    per_micro_batch = 2.0**-5 / (4 if fields else 1)
    final = train_phase(
        budgeted, 0, shard_dir, vocab_size, clock=StepClock(monkeypatch, per_micro_batch, 2.0)
    )
    recorded = json.loads((final.parent / BUDGET_FILE).read_text())
    assert abs(recorded["finished_seconds"] - 3.0) <= 0.02 * 3.0, recorded
    first, *refits = recorded["fits"]
    assert refits and recorded["steps"] < first["steps"] * 0.6, recorded["fits"]
    # The schedule ends where the run does: the last step's learning rate is 0, and none before.
    rates = [record["data"]["learning_rate"] for record in log_records(budgeted) if record["type"] == "LOG"]
    assert rates[-1] == 0.0 and min(rates[:-1]) > 0.0
    assert f"step {recorded['steps']}/{recorded['steps']} loss" in capsys.readouterr().out


def test_a_ramp_ends_at_its_budget(
    make_spec, make_phase, shard_dir: Path, vocab_size: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No re-fit: the first fit alone, which counts the ramp's cheaper steps, ends the phase on time.
    monkeypatch.setattr(bertpretrain.training.budget, "REFIT_AT", ())
    monkeypatch.setattr(bertpretrain.training.budget, "REFIT_LAST_STEPS", 0)
    budgeted = _budgeted(make_spec, make_phase, tmp_path / "a", microBatchSize=4, batchRampProportion=0.3)
    final = train_phase(budgeted, 0, shard_dir, vocab_size, clock=StepClock(monkeypatch, 2.0**-7))
    recorded = json.loads((final.parent / BUDGET_FILE).read_text())
    assert len(recorded["fits"]) == 1 and abs(recorded["finished_seconds"] - 3.0) <= 0.02 * 3.0, recorded


def test_a_record_made_for_another_spec_stops_the_phase(
    make_spec, make_phase, shard_dir: Path, vocab_size: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _budgeted(make_spec, make_phase, tmp_path / "a", time="1s")
    train_phase(first, 0, shard_dir, vocab_size, clock=StepClock(monkeypatch))
    longer = _budgeted(make_spec, make_phase, tmp_path / "a", time="2s")
    with pytest.raises(BudgetError, match=r"^spec\.budget\.time: .*budget\.json was made for another spec"):
        train_phase(longer, 0, shard_dir, vocab_size, clock=StepClock(monkeypatch))


def test_a_budget_too_short_stops_naming_the_field(
    make_spec, make_phase, shard_dir: Path, vocab_size: int, tmp_path: Path
) -> None:
    phase = {key: value for key, value in make_phase().items() if key != "steps"}
    # 0.1 ms left after the calibration: no step of any model fits, however fast the machine.
    spec = make_spec([phase], budget={"time": "1s", "calibrationProportion": 0.9999})
    with pytest.raises(BudgetError, match=r"^spec\.budget\.time: phase 1/1 has 0:00:01 of the budget"):
        train_phase(spec, 0, shard_dir, vocab_size)
    assert not (Path(spec.checkpoint.path) / "phase1" / BUDGET_FILE).exists()


@pytest.mark.slow
def test_two_ranks_refit_together_and_end_on_the_same_step(tmp_path: Path) -> None:
    """Under torchrun with 2 processes on the real clock: rank 0's re-fits reach rank 1 (a rank
    that missed one would train a different number of steps and hang the last all-reduce)."""
    document = small_training_job(tmp_path, processes=2)
    phase = {key: value for key, value in document["spec"]["phases"][0].items() if key != "steps"}
    document = with_value(document, "spec.phases", [phase])
    document = with_value(document, "spec.budget", {"time": "8s"})
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(document))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command += ["-m", "bertpretrain", "run", "--config", str(job)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # A session of its own, so that a hang's timeout stops the ranks too, not torchrun alone.
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=True) as process:  # fmt: skip
        try:
            stdout, stderr = process.communicate(timeout=600)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, stdout[-3000:] + stderr[-3000:]
    recorded = json.loads((Path(document["spec"]["checkpoint"]["path"]) / "phase1" / BUDGET_FILE).read_text())
    assert len(recorded["fits"]) > 1 and recorded["finished_seconds"] is not None, recorded
    assert f"re-fitted to {recorded['steps']:,} steps" in stdout
    assert f"step {recorded['steps']}/{recorded['steps']} loss" in stdout


def test_a_refit_waits_for_enough_timed_steps() -> None:
    """A speed measured over a run's first step or two (caches, a stall) would cut the run short:
    the re-fit waits until MIN_TIMED_STEPS steps after the first were timed."""
    now = [0.0]
    calibration = Calibration(0.1, 3, 10.0, 0.5, (Fit(0, 90, 0.5, 0.1),))
    budget = BudgetClock(calibration, lambda step: step, lambda: now[0])
    budget.start(0.5)
    now[0] = 3.0  # a slow first step: 30% of the share gone
    budget.ended(1)
    for step in (2, 3):
        now[0] += 0.1
        budget.ended(step)
        assert not budget.refit_due(step)
    now[0] += 0.1
    budget.ended(4)
    assert budget.refit_due(4)
    # 0.1 s a step since the first, 3.8 s of 10 gone: 62 more steps end nearest the share's end.
    fit = budget.refit(4)
    assert (fit.from_step, fit.micro_batch_seconds) == (5, pytest.approx(0.1))
    assert (fit.elapsed_seconds, fit.steps) == (pytest.approx(3.8), 66)


def _clocked_run(step_seconds: Callable[[float], float], share: float = 20.0) -> tuple[float, Calibration]:
    """A phase of ``share`` seconds run on a made-up clock as the training loop runs it, each step
    taking ``step_seconds(now)``: its training seconds and its record."""
    now = [2.5]
    fit = first_fit(share, now[0], 0.5, 1, lambda step, steps: step, "phase 1/1")
    budget = BudgetClock(Calibration(0.5, 3, share, now[0], (fit,)), lambda step: step, lambda: now[0])
    budget.start(now[0])
    step = 0
    while step < budget.calibration.steps:
        step += 1
        now[0] += step_seconds(now[0])
        budget.ended(step)
        if step < budget.calibration.steps and budget.refit_due(step):
            budget.apply(budget.refit(step))
    return budget.elapsed(), budget.calibration


@pytest.mark.parametrize("speed_up_at", [15.0, 16.0, 18.0, 19.0])
def test_a_run_of_a_few_dozen_steps_follows_a_late_change_of_speed_to_its_end(speed_up_at: float) -> None:
    """Steps of 0.5 s, 2.5% of a 20 s share, twice as fast from 75% to 95% of it on (a machine
    that another job left): the fits at fixed fractions alone would end the run 2.5-12.5% early,
    since the last fractions fall between fits 3 steps apart; the re-fits after the last planned
    steps end it within half a step."""
    seconds, calibration = _clocked_run(lambda now: 0.5 if now < speed_up_at else 0.25)
    assert abs(seconds - 20.0) <= 0.5 * 0.25 + 1e-9, calibration.fits
    assert calibration.steps > calibration.fits[0].steps
