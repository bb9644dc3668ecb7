"""The warm-up and decay schedules of NVIDIA's BERT recipe: poly and linear."""

from __future__ import annotations

import itertools

import pytest
import torch
import transformers
from torch import nn

from bertpretrain.training.schedule import (
    ScheduleName,
    build_schedule,
    linear_warmup_multiplier,
    poly_warmup_multiplier,
    poly_warmup_schedule,
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


@pytest.mark.parametrize("name", ["poly", "linear"])
def test_state_dict_resumes_the_schedule(name: ScheduleName) -> None:
    multiplier = {
        "poly": lambda step: poly_warmup_multiplier(step, 50, 0.2),
        "linear": lambda step: linear_warmup_multiplier(step, 50, 0.2),
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
        ("cosine", 10, 0.1, 0.5, "schedule"),
    ],
)
def test_rejects_bad_arguments(name: str, total: int, warmup: float, degree: float, message: str) -> None:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=message):
        build_schedule(optimizer, name, total, warmup, degree)  # type: ignore[arg-type]
