"""Learning-rate schedules (NVIDIA's poly and linear, and one-cycle) and a gradient-accumulation ramp.

Poly and linear follow NVIDIA DeepLearningExamples (``PyTorch/LanguageModeling/BERT/schedulers.py``).
With ``progress = step / total_steps``, the multiplier of the peak learning rate is
``progress / warmup_proportion`` during warm-up, and after it

- ``(1 - progress) ** degree`` in ``PolyWarmUpScheduler`` (``degree = 0.5`` by default), the
  decay measured from step 0, not from the end of warm-up, as there;
- ``(1 - progress) / (1 - warmup_proportion)`` in ``LinearWarmUpScheduler``, a straight line from
  the peak at the end of warm-up to 0 at ``total_steps``. Hugging Face's
  ``get_linear_schedule_with_warmup`` is the same line with the warm-up given in steps.

One-cycle (Smith and Topin 2019, "Super-Convergence", as :class:`torch.optim.lr_scheduler.OneCycleLR`
with ``anneal_strategy="cos"``, ``three_phase=False`` and initial and final rates of 0) is
``(1 - cos(pi * progress / warmup_proportion)) / 2`` during warm-up, a half-cosine from 0 up to the
peak, and ``(1 + cos(pi * (progress - warmup_proportion) / (1 - warmup_proportion))) / 2`` after it,
a half-cosine from the peak down to 0 at ``total_steps``.

NVIDIA's schedulers give the first optimizer step the rate of step 1;
:class:`torch.optim.lr_scheduler.LambdaLR` evaluates its function at 0 before the first step, so
the functions here are shifted by one. As there, the last step's rate is 0. All three schedules
use that convention, one-cycle included, so its first step does not run at a rate of 0 as
OneCycleLR's does.

:func:`ramp_accumulation_steps` and :func:`ramped_micro_batches` grow the global batch over the first
part of a phase (Geiping and Goldstein 2022, "Cramming") by growing the gradient accumulation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from functools import partial
from typing import Literal

import torch
from torch.optim.lr_scheduler import LambdaLR

ScheduleName = Literal["poly", "linear", "one-cycle"]


def poly_warmup_multiplier(
    step: float, total_steps: float, warmup_proportion: float, degree: float = 0.5
) -> float:
    """The peak-rate multiplier in NVIDIA's ``PolyWarmUpScheduler`` after ``step`` optimizer steps.

    Steps are optimizer steps (not micro-batches); past ``total_steps`` the multiplier is 0.
    """
    progress = step / total_steps
    if progress < warmup_proportion:
        return progress / warmup_proportion
    return max(1.0 - progress, 0.0) ** degree


def linear_warmup_multiplier(step: float, total_steps: float, warmup_proportion: float) -> float:
    """The peak-rate multiplier in NVIDIA's ``LinearWarmUpScheduler`` after ``step`` optimizer steps.

    1 at the end of warm-up (``step = warmup_proportion * total_steps``), 0 at ``total_steps``
    and past it; ``warmup_proportion`` must be below 1.
    """
    progress = step / total_steps
    if progress < warmup_proportion:
        return progress / warmup_proportion
    return max((1.0 - progress) / (1.0 - warmup_proportion), 0.0)


def one_cycle_multiplier(step: float, total_steps: float, warmup_proportion: float) -> float:
    """The peak-rate multiplier of the one-cycle schedule after ``step`` optimizer steps.

    Smith and Topin 2019 ("Super-Convergence"), as torch's ``OneCycleLR`` with
    ``anneal_strategy="cos"``, ``three_phase=False`` and initial and final rates of 0. With
    ``p = step / total_steps`` and ``w = warmup_proportion``: ``(1 - cos(pi * p / w)) / 2`` for
    ``p < w``, rising from 0 at step 0 to 1 at ``step = w * total_steps``, then
    ``(1 + cos(pi * (p - w) / (1 - w))) / 2``, falling to 0 at ``total_steps``; 0 at and past
    ``total_steps``. ``w = 0`` has no warm-up: step 0 is at the peak. ``warmup_proportion`` must be
    in ``[0, 1)``; steps are optimizer steps (not micro-batches).

    ``OneCycleLR`` ends its phases at its steps ``pct_start * T - 1`` and ``T - 1``; with
    ``T = total_steps + 1`` and ``pct_start = (w * total_steps + 1) / T`` its rate at its step
    ``step`` is this multiplier (for ``w > 0``). Used as usual, with ``T = total_steps`` and
    ``pct_start = w``, its k-th optimizer step runs at this multiplier of step k from the peak on,
    but its warm-up is a step shorter and starts at 0 on the first step.
    """
    if step >= total_steps:
        # Exactly 0, not cos(pi)'s rounding, so the last step never moves the weights.
        return 0.0
    progress = step / total_steps
    if progress < warmup_proportion:
        return (1.0 - math.cos(math.pi * progress / warmup_proportion)) / 2.0
    return (1.0 + math.cos(math.pi * (progress - warmup_proportion) / (1.0 - warmup_proportion))) / 2.0


def build_schedule(
    optimizer: torch.optim.Optimizer,
    name: ScheduleName,
    total_steps: int,
    warmup_proportion: float,
    degree: float = 0.5,
    progress: Callable[[int], float] | None = None,
) -> LambdaLR:
    """A ``LambdaLR`` that sets each group's rate to its initial rate x the ``name`` multiplier.

    Call ``step()`` after each optimizer step. The k-th optimizer step (k = 1, 2, ...) runs at
    the multiplier of step k: :func:`poly_warmup_multiplier` for ``"poly"`` (with ``degree``),
    :func:`linear_warmup_multiplier` for ``"linear"`` and :func:`one_cycle_multiplier` for
    ``"one-cycle"`` (neither of which has a ``degree``). The last step's rate is 0.

    Args:
        optimizer: each group's learning rate when this is called is its peak rate.
        name: ``"poly"``, ``"linear"`` or ``"one-cycle"``, the job spec's ``optimizer.schedule``.
        total_steps: optimizer steps of the whole schedule (not micro-batches).
        warmup_proportion: the fraction of ``total_steps`` spent warming up, in ``[0, 1)``.
        degree: the exponent of the poly decay (the spec's ``polyPower``), ``> 0``; checked but
            unused by the other schedules.
        progress: the phase's progress after each step, from 0 to 1 at its last step, in place of
            ``step / total_steps`` (a wall-clock budget's re-fits bend it:
            :meth:`bertpretrain.training.budget.Calibration.progress`); read at every step.

    Raises:
        ValueError: an unknown ``name``, ``total_steps < 1``, ``warmup_proportion`` outside
            ``[0, 1)`` or ``degree <= 0``.
    """
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    if not 0.0 <= warmup_proportion < 1.0:
        raise ValueError(f"warmup_proportion must be in [0, 1), got {warmup_proportion}")
    if degree <= 0:
        raise ValueError(f"degree must be > 0, got {degree}")
    # Each multiplier is given the progress and a total of 1: step / total_steps is the progress,
    # and (step / total_steps) / 1 is it bit for bit.
    multiplier: Callable[[float], float]
    if name == "poly":
        multiplier = partial(
            poly_warmup_multiplier, total_steps=1, warmup_proportion=warmup_proportion, degree=degree
        )
    elif name == "linear":
        multiplier = partial(linear_warmup_multiplier, total_steps=1, warmup_proportion=warmup_proportion)
    elif name == "one-cycle":
        multiplier = partial(one_cycle_multiplier, total_steps=1, warmup_proportion=warmup_proportion)
    else:
        raise ValueError(f"schedule must be 'poly', 'linear' or 'one-cycle', got {name!r}")
    at = progress if progress is not None else (lambda step: step / total_steps)
    return LambdaLR(optimizer, lambda step: multiplier(at(step + 1)))


def poly_warmup_schedule(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_proportion: float, degree: float = 0.5
) -> LambdaLR:
    """``build_schedule(optimizer, "poly", ...)``; the same arguments and errors."""
    return build_schedule(optimizer, "poly", total_steps, warmup_proportion, degree)


def _ramp_span(total_steps: int, accumulation_steps: int, ramp_proportion: float) -> Fraction:
    """``max(R - 1, 1)`` optimizer steps, with ``R = ramp_proportion * total_steps`` exact."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    if accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
    if not 0.0 < ramp_proportion < 1.0:  # also refuses NaN
        raise ValueError(f"ramp_proportion must be in (0, 1), got {ramp_proportion}")
    # The decimal the spec wrote, not the binary float nearest it: 0.1 x 30 must be 3 steps, as a
    # reader of the spec expects, where the float is 3.0000000000000004 and would end the ramp a
    # step late. Exact rationals also make ramped_micro_batches equal the sum of the steps' values.
    ramp = Fraction(repr(float(ramp_proportion))) * total_steps
    return max(ramp - 1, Fraction(1))


def _ramped(step: int, accumulation_steps: int, span: Fraction) -> int:
    return min(accumulation_steps, 1 + math.floor((accumulation_steps - 1) * (step - 1) / span))


def ramp_accumulation_steps(
    step: int, total_steps: int, accumulation_steps: int, ramp_proportion: float
) -> int:
    """The micro-batches per rank that optimizer step ``step`` (1-based) accumulates, in a batch ramp.

    The global batch grows over the first part of training, as in Cramming (Geiping and Goldstein
    2022, "Cramming: Training a Language Model on a Single GPU in One Day"), here by growing the
    gradient accumulation. With ``A = accumulation_steps`` and ``R = ramp_proportion * total_steps``
    (optimizer steps, computed exactly from ``ramp_proportion``'s shortest decimal, ``repr``, so
    ``0.1 * 30`` is 3):

        ``min(A, 1 + floor((A - 1) * (step - 1) / max(R - 1, 1)))``

    1 at step 1, growing linearly and never down, ``A`` from step ``ceil(R)`` on (from step 2 when
    ``R < 2``) and never above it; past ``total_steps`` it stays ``A``.

    Args:
        step: the optimizer step, ``>= 1``.
        total_steps: optimizer steps of the phase, ``>= 1``.
        accumulation_steps: micro-batches per rank of a step after the ramp, ``>= 1``.
        ramp_proportion: the fraction of ``total_steps`` the ramp lasts, in ``(0, 1)``.

    Raises:
        ValueError: ``step < 1`` (there is no step 0 to accumulate), ``total_steps < 1``,
            ``accumulation_steps < 1`` or ``ramp_proportion`` outside ``(0, 1)``; the message
            names the argument.
    """
    span = _ramp_span(total_steps, accumulation_steps, ramp_proportion)
    if step < 1:
        raise ValueError(f"step must be >= 1 (optimizer steps count from 1), got {step}")
    return _ramped(step, accumulation_steps, span)


def ramped_micro_batches(step: int, total_steps: int, accumulation_steps: int, ramp_proportion: float) -> int:
    """The micro-batches per rank that optimizer steps 1..``step`` consume under the batch ramp.

    The sum of :func:`ramp_accumulation_steps` over steps 1..``step`` (0 for ``step = 0``): how far
    into its micro-batches the data loader resumes from a checkpoint taken after ``step`` optimizer
    steps. The ramp's steps
    are summed one by one, the rest as ``accumulation_steps`` each, so the cost is O(ramp steps),
    not O(``step``). Same arguments and formula (Cramming, Geiping and Goldstein 2022) as
    :func:`ramp_accumulation_steps`.

    Raises:
        ValueError: ``step < 0``, ``total_steps < 1``, ``accumulation_steps < 1`` or
            ``ramp_proportion`` outside ``(0, 1)``; the message names the argument.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    span = _ramp_span(total_steps, accumulation_steps, ramp_proportion)
    # Every step from span + 1 on accumulates accumulation_steps: (A - 1)(s - 1) / span >= A - 1.
    ramping = min(step, math.ceil(span))
    ramped = sum(_ramped(s, accumulation_steps, span) for s in range(1, ramping + 1))
    return ramped + accumulation_steps * (step - ramping)
