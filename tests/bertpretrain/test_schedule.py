"""The warm-up and polynomial-decay schedule of NVIDIA's BERT recipe."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from bertpretrain.schedule import poly_warmup_multiplier, poly_warmup_schedule

pytestmark = pytest.mark.usefixtures("one_thread")


def rates(total_steps: int, warmup_proportion: float, peak: float = 1e-3) -> list[float]:
    """The learning rate each optimizer step 1..total_steps runs at."""
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=peak)
    scheduler = poly_warmup_schedule(optimizer, total_steps, warmup_proportion)
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


def test_state_dict_resumes_the_schedule() -> None:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = poly_warmup_schedule(optimizer, 50, 0.2)
    for _ in range(17):
        optimizer.step()
        scheduler.step()
    fresh_optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    resumed = poly_warmup_schedule(fresh_optimizer, 50, 0.2)
    # The rate itself lives in the optimizer's state, as in a checkpoint.
    fresh_optimizer.load_state_dict(optimizer.state_dict())
    resumed.load_state_dict(scheduler.state_dict())
    assert resumed.last_epoch == 17
    assert resumed.get_last_lr() == scheduler.get_last_lr()
    assert fresh_optimizer.param_groups[0]["lr"] == pytest.approx(poly_warmup_multiplier(18, 50, 0.2))
    fresh_optimizer.step()
    resumed.step()
    assert fresh_optimizer.param_groups[0]["lr"] == pytest.approx(poly_warmup_multiplier(19, 50, 0.2))


@pytest.mark.parametrize(("total", "warmup"), [(0, 0.1), (10, 1.0), (10, -0.1)])
def test_rejects_bad_arguments(total: int, warmup: float) -> None:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError):
        poly_warmup_schedule(optimizer, total, warmup)
