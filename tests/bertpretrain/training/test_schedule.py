"""The learning-rate schedules (NVIDIA's poly and linear, and one-cycle) and the accumulation ramp."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import transformers
from torch import nn
from torch.optim.lr_scheduler import OneCycleLR

from bertpretrain.training.schedule import (
    ScheduleName,
    build_schedule,
    linear_warmup_multiplier,
    one_cycle_multiplier,
    poly_warmup_multiplier,
    poly_warmup_schedule,
    ramp_accumulation_steps,
    ramped_micro_batches,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def rates(
    total_steps: int, warmup_proportion: float, peak: float = 1e-3, name: ScheduleName = "poly"
) -> list[float]:
    """The learning rate each optimizer step 1..total_steps runs at."""
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=peak)
    scheduler = build_schedule(optimizer, name, total_steps, warmup_proportion)
    seen = []
    for _ in range(total_steps):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return seen


def test_rates_follow_nvidia_formula() -> None:
    total, warmup, peak = 100, 0.1, 1e-3
    expected = []
    for step in range(1, total + 1):
        progress = step / total
        expected.append(peak * (progress / warmup if progress < warmup else (1 - progress) ** 0.5))
    assert rates(total, warmup, peak) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_poly_warmup_schedule_is_build_schedule_poly() -> None:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = poly_warmup_schedule(optimizer, 40, 0.25, degree=2.0)
    for step in range(1, 41):
        assert optimizer.param_groups[0]["lr"] == poly_warmup_multiplier(step, 40, 0.25, 2.0)
        optimizer.step()
        scheduler.step()


def test_warmup_is_linear_to_the_peak_then_decays() -> None:
    seen = rates(200, 0.05)
    assert seen[0] == pytest.approx(1e-3 / 10)
    assert seen[8] == pytest.approx(0.9e-3)
    # Step 10 is 5 % of 200: warm-up is over and the decay, measured from step 0, has begun.
    assert seen[9] == pytest.approx(0.95**0.5 * 1e-3)
    assert all(a < b for a, b in itertools.pairwise(seen[:10]))
    assert all(a > b for a, b in itertools.pairwise(seen[10:]))
    assert seen[-1] == 0.0


def test_without_warmup_the_first_step_is_near_the_peak() -> None:
    assert poly_warmup_multiplier(1, 100, 0.0) == pytest.approx(0.99**0.5)
    assert poly_warmup_multiplier(150, 100, 0.0) == 0.0


def test_degree_changes_the_decay() -> None:
    assert poly_warmup_multiplier(50, 100, 0.0, degree=1.0) == pytest.approx(0.5)
    assert poly_warmup_multiplier(50, 100, 0.0, degree=2.0) == pytest.approx(0.25)


def test_linear_rates_at_chosen_steps() -> None:
    # 100 steps, 10 of warm-up: up by a tenth of the peak a step, then down by a ninetieth.
    seen = rates(100, 0.1, peak=2e-3, name="linear")
    assert seen[0] == pytest.approx(0.2e-3, rel=1e-12)  # step 1
    assert seen[4] == pytest.approx(1e-3, rel=1e-12)  # step 5
    assert seen[9] == pytest.approx(2e-3, rel=1e-12)  # step 10, the end of warm-up: the peak
    assert seen[10] == pytest.approx(2e-3 * 89 / 90, rel=1e-12)  # step 11
    assert seen[54] == pytest.approx(1e-3, rel=1e-12)  # step 55, half-way down
    assert seen[98] == pytest.approx(2e-3 / 90, rel=1e-12)  # step 99
    assert seen[99] == 0.0  # step 100, the last
    assert max(seen) == seen[9]
    assert all(a < b for a, b in itertools.pairwise(seen[:10]))
    assert all(a > b for a, b in itertools.pairwise(seen[9:]))
    assert linear_warmup_multiplier(150, 100, 0.1) == 0.0


@pytest.mark.parametrize(("total", "warmup_steps"), [(100, 10), (37, 5), (64, 0)])
def test_linear_matches_hugging_face_shifted_by_one(total: int, warmup_steps: int) -> None:
    # get_linear_schedule_with_warmup's k-th optimizer step runs at its function's k - 1
    # (0 at the first step); ours, as NVIDIA's, at k.
    theirs_optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1e-3)
    theirs = transformers.get_linear_schedule_with_warmup(theirs_optimizer, warmup_steps, total)
    theirs_optimizer.step()
    expected = []
    for _ in range(total):
        theirs.step()
        expected.append(theirs_optimizer.param_groups[0]["lr"])
    assert rates(total, warmup_steps / total, name="linear") == pytest.approx(expected, rel=1e-12, abs=1e-18)


@pytest.mark.parametrize("name", ["poly", "linear", "one-cycle"])
def test_state_dict_resumes_the_schedule(name: ScheduleName) -> None:
    multiplier = {
        "poly": lambda step: poly_warmup_multiplier(step, 50, 0.2),
        "linear": lambda step: linear_warmup_multiplier(step, 50, 0.2),
        "one-cycle": lambda step: one_cycle_multiplier(step, 50, 0.2),
    }[name]
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_schedule(optimizer, name, 50, 0.2)
    for _ in range(17):
        optimizer.step()
        scheduler.step()
    fresh_optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    resumed = build_schedule(fresh_optimizer, name, 50, 0.2)
    # The rate itself lives in the optimizer's state, as in a checkpoint.
    fresh_optimizer.load_state_dict(optimizer.state_dict())
    resumed.load_state_dict(scheduler.state_dict())
    assert resumed.last_epoch == 17
    assert resumed.get_last_lr() == scheduler.get_last_lr()
    assert fresh_optimizer.param_groups[0]["lr"] == pytest.approx(multiplier(18))
    fresh_optimizer.step()
    resumed.step()
    assert fresh_optimizer.param_groups[0]["lr"] == pytest.approx(multiplier(19))


@pytest.mark.parametrize(
    ("name", "total", "warmup", "degree", "message"),
    [
        ("poly", 0, 0.1, 0.5, "total_steps"),
        ("linear", 0, 0.1, 0.5, "total_steps"),
        ("poly", 10, 1.0, 0.5, "warmup_proportion"),
        ("linear", 10, 1.0, 0.5, "warmup_proportion"),
        ("linear", 10, -0.1, 0.5, "warmup_proportion"),
        ("poly", 10, 0.1, 0.0, "degree"),
        ("one-cycle", 0, 0.1, 0.5, "total_steps"),
        ("one-cycle", 10, 1.0, 0.5, "warmup_proportion"),
        ("one-cycle", 10, -0.1, 0.5, "warmup_proportion"),
        ("cosine", 10, 0.1, 0.5, "schedule"),
    ],
)
def test_rejects_bad_arguments(name: str, total: int, warmup: float, degree: float, message: str) -> None:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=message):
        build_schedule(optimizer, name, total, warmup, degree)  # type: ignore[arg-type]


def one_cycle_lr_rates(total_steps: int, pct_start: float, count: int) -> list[float]:
    """OneCycleLR's rates (peak 1, from 0 up and down to 0) at its steps 0..count - 1."""
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = OneCycleLR(
        optimizer,
        max_lr=1.0,
        total_steps=total_steps,
        pct_start=pct_start,
        anneal_strategy="cos",
        three_phase=False,
        cycle_momentum=False,
        # initial_lr = max_lr / div_factor = 0 and min_lr = initial_lr / final_div_factor = 0.
        div_factor=float("inf"),
        final_div_factor=1.0,
    )
    seen = []
    for _ in range(count):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return seen


def test_one_cycle_rates_at_chosen_steps() -> None:
    # 120 steps, 30 of warm-up. Up: (1 - cos(pi * k / 30)) / 2, so step 10 is (1 - cos(pi/3)) / 2 =
    # 1/4, 15 is 1/2, 20 is (1 - cos(2 pi/3)) / 2 = 3/4 and 30 the peak. Down:
    # (1 + cos(pi * (k - 30) / 90)) / 2, so 60 is (1 + cos(pi/3)) / 2 = 3/4, 75 is 1/2, 90 is 1/4.
    seen = rates(120, 0.25, peak=1.0, name="one-cycle")
    expected = {1: (1 - math.cos(math.pi / 30)) / 2, 10: 0.25, 15: 0.5, 20: 0.75, 30: 1.0}
    expected |= {60: 0.75, 75: 0.5, 90: 0.25, 119: (1 + math.cos(math.pi * 89 / 90)) / 2, 120: 0.0}
    for step, value in expected.items():
        assert seen[step - 1] == pytest.approx(value, rel=0, abs=1e-12), step
    assert seen[-1] == 0.0  # exactly: the last step does not move the weights
    assert seen[0] > 0.0  # shifted by one: the first step does not run at 0
    assert max(seen) == seen[29]
    assert all(a < b for a, b in itertools.pairwise(seen[:30]))
    assert all(a > b for a, b in itertools.pairwise(seen[29:]))


@pytest.mark.parametrize(("total", "warmup"), [(120, 0.25), (37, 0.1), (64, 0.0)])
def test_one_cycle_step_k_runs_at_the_multiplier_of_step_k(total: int, warmup: float) -> None:
    expected = [one_cycle_multiplier(step, total, warmup) for step in range(1, total + 1)]
    assert rates(total, warmup, peak=1.0, name="one-cycle") == expected


def test_one_cycle_without_warmup_starts_at_the_peak() -> None:
    assert one_cycle_multiplier(0, 100, 0.0) == 1.0
    assert one_cycle_multiplier(50, 100, 0.0) == pytest.approx(0.5, rel=0, abs=1e-12)
    assert one_cycle_multiplier(100, 100, 0.0) == 0.0
    assert one_cycle_multiplier(150, 100, 0.0) == 0.0


@pytest.mark.parametrize(("total", "warmup"), [(120, 0.25), (100, 0.1), (37, 0.1), (50, 0.3), (10, 0.5)])
def test_one_cycle_is_one_cycle_lr_one_step_longer(total: int, warmup: float) -> None:
    # OneCycleLR's rate at its step s (its last_epoch; s = 0 before any step) rises from 0 at s = 0
    # to the peak at s = pct_start * T - 1, pct = s / (pct_start * T - 1), then falls to 0 at
    # s = T - 1. Ours, before LambdaLR's shift, rises from 0 at step 0 to the peak at step
    # warmup * total and falls to 0 at step total. With T = total + 1 and
    # pct_start = (warmup * total + 1) / T all three breakpoints coincide at s = step, and both
    # phases' fractions are then ours term for term, so the two agree at every step 0..total.
    # (warmup * total need not be whole: 37 x 0.1 = 3.7 puts both peaks between steps 3 and 4.)
    theirs = one_cycle_lr_rates(total + 1, (warmup * total + 1) / (total + 1), total + 1)
    assert theirs[0] == 0.0 == one_cycle_multiplier(0, total, warmup)
    # The k-th optimizer step under build_schedule runs at the multiplier of step k: theirs at s = k.
    assert rates(total, warmup, peak=1.0, name="one-cycle") == pytest.approx(theirs[1:], rel=0, abs=1e-12)


@pytest.mark.parametrize(("total", "warmup"), [(120, 0.25), (100, 0.1), (37, 0.1), (64, 0.0)])
def test_one_cycle_lr_used_as_usual_agrees_from_the_peak_on(total: int, warmup: float) -> None:
    # Used as usual, OneCycleLR(total_steps=total, pct_start=warmup) stepped after each optimizer
    # step runs the k-th step at its s = k - 1. Its peak (s = warmup * total - 1) and its end
    # (s = total - 1) then fall on our steps k = warmup * total and k = total, and its fall's
    # fraction (s - (warmup * total - 1)) / (total - warmup * total) is ours, so from the peak on
    # the two agree step for step. Its rise, from 0 at s = 0 (the first step, wasted) to the peak,
    # is one step shorter than ours, which starts at step 0 before any optimizer step: there the
    # two cannot agree, and ours is held to the closed formula instead (above).
    theirs = one_cycle_lr_rates(total, warmup, total)
    ours = rates(total, warmup, peak=1.0, name="one-cycle")
    peak = math.ceil(warmup * total)  # the first optimizer step at or past the peak, 1-based
    assert ours[max(peak, 1) - 1 :] == pytest.approx(theirs[max(peak, 1) - 1 :], rel=0, abs=1e-12)
    # Without warm-up the comparison above covers every step.
    if warmup > 0:
        assert theirs[0] == 0.0 < ours[0]
        assert all(t < o for t, o in zip(theirs[: peak - 1], ours[: peak - 1], strict=True))


def test_ramp_accumulation_steps_at_chosen_steps() -> None:
    # 100 steps, ramp 0.1 -> R = 10, A = 8: min(8, 1 + floor(7 * (step - 1) / 9)):
    # steps 1..10 give 1 + floor(0, 7/9, 14/9, 21/9, 28/9, 35/9, 42/9, 49/9, 56/9, 63/9)
    # = 1, 1, 2, 3, 4, 4, 5, 6, 7, 8; then 8.
    seen = [ramp_accumulation_steps(step, 100, 8, 0.1) for step in range(1, 13)]
    assert seen == [1, 1, 2, 3, 4, 4, 5, 6, 7, 8, 8, 8]
    assert ramp_accumulation_steps(100, 100, 8, 0.1) == 8
    assert ramp_accumulation_steps(150, 100, 8, 0.1) == 8
    # 37 steps, ramp 0.25 -> R = 9.25, max(R - 1, 1) = 33/4, A = 5: 1 + floor(16 * (step - 1) / 33):
    # steps 1..10 give 1 + floor(0, .48, .97, 1.45, 1.94, 2.42, 2.91, 3.39, 3.88, 4.36), A at ceil(R).
    seen = [ramp_accumulation_steps(step, 37, 5, 0.25) for step in range(1, 12)]
    assert seen == [1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    # R = 1 (10 x 0.1): max(R - 1, 1) = 1, so step 2 is already A = 1 + 3 * 1.
    assert [ramp_accumulation_steps(step, 10, 4, 0.1) for step in (1, 2, 3)] == [1, 4, 4]
    assert [ramp_accumulation_steps(step, 100, 1, 0.5) for step in (1, 30, 100)] == [1, 1, 1]


def test_ramp_takes_the_proportion_as_written() -> None:
    # 30 x 0.1 is 3.0000000000000004 in floats, which would reach A at step 4; the spec's 0.1 x 30
    # is 3 steps: min(4, 1 + floor(3 * (step - 1) / 2)) = 1, 2, 4.
    assert [ramp_accumulation_steps(step, 30, 4, 0.1) for step in (1, 2, 3, 4)] == [1, 2, 4, 4]


@pytest.mark.parametrize(
    ("total", "accumulation", "ramp"),
    [(100, 8, 0.1), (37, 5, 0.25), (10, 4, 0.1), (30, 4, 0.1), (1000, 64, 0.3), (5, 3, 0.9), (50, 1, 0.5)],
)
def test_ramp_is_monotone_within_bounds_and_sums(total: int, accumulation: int, ramp: float) -> None:
    seen = [ramp_accumulation_steps(step, total, accumulation, ramp) for step in range(1, total + 11)]
    assert seen[0] == 1
    assert all(a <= b for a, b in itertools.pairwise(seen))
    assert max(seen) == accumulation
    # The ramp is over by step ceil(R) (step 2 when R < 2).
    full = max(math.ceil(ramp * total - 1e-9), 2)
    assert set(seen[full - 1 :]) == {accumulation}
    assert ramped_micro_batches(0, total, accumulation, ramp) == 0
    assert [ramped_micro_batches(step, total, accumulation, ramp) for step in range(1, total + 11)] == list(
        itertools.accumulate(seen)
    )


def test_ramped_micro_batches_at_chosen_steps() -> None:
    # The steps of the first case above: 1 + 1 + 2 + 3 + 4 + 4 + 5 + 6 + 7 + 8 = 41 by step 10,
    # then 8 a step.
    assert ramped_micro_batches(10, 100, 8, 0.1) == 41
    assert ramped_micro_batches(12, 100, 8, 0.1) == 57
    assert ramped_micro_batches(100, 100, 8, 0.1) == 41 + 8 * 90
    assert ramped_micro_batches(4, 100, 8, 0.1) == 7


@pytest.mark.parametrize(
    ("step", "total", "accumulation", "ramp", "message"),
    [
        (1, 100, 8, 0.0, "ramp_proportion"),
        (1, 100, 8, 1.0, "ramp_proportion"),
        (1, 100, 8, -0.1, "ramp_proportion"),
        (1, 100, 8, float("nan"), "ramp_proportion"),
        (1, 100, 0, 0.1, "accumulation_steps"),
        (1, 0, 8, 0.1, "total_steps"),
        (-1, 100, 8, 0.1, "step"),
    ],
)
def test_ramp_rejects_bad_arguments(
    step: int, total: int, accumulation: int, ramp: float, message: str
) -> None:
    with pytest.raises(ValueError, match=rf"^{message} must"):
        ramp_accumulation_steps(step, total, accumulation, ramp)
    with pytest.raises(ValueError, match=rf"^{message} must"):
        ramped_micro_batches(step, total, accumulation, ramp)


def test_ramp_has_no_step_zero() -> None:
    with pytest.raises(ValueError, match=r"^step must be >= 1 "):
        ramp_accumulation_steps(0, 100, 8, 0.1)
