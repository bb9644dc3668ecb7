"""The learning-rate schedules of NVIDIA's BERT recipe: linear warm-up, then polynomial or linear decay.

Both follow NVIDIA DeepLearningExamples (``PyTorch/LanguageModeling/BERT/schedulers.py``). With
``progress = step / total_steps``, the multiplier of the peak learning rate is
``progress / warmup_proportion`` during warm-up, and after it

- ``(1 - progress) ** degree`` in ``PolyWarmUpScheduler`` (``degree = 0.5`` by default), the
  decay measured from step 0, not from the end of warm-up, as there;
- ``(1 - progress) / (1 - warmup_proportion)`` in ``LinearWarmUpScheduler``, a straight line from
  the peak at the end of warm-up to 0 at ``total_steps``. Hugging Face's
  ``get_linear_schedule_with_warmup`` is the same line with the warm-up given in steps.

NVIDIA's schedulers give the first optimizer step the rate of step 1;
:class:`torch.optim.lr_scheduler.LambdaLR` evaluates its function at 0 before the first step, so
the functions here are shifted by one. As there, the last step's rate is 0.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Literal

import torch
from torch.optim.lr_scheduler import LambdaLR

ScheduleName = Literal["poly", "linear"]


def poly_warmup_multiplier(
    step: int, total_steps: int, warmup_proportion: float, degree: float = 0.5
) -> float:
    """The peak-rate multiplier in NVIDIA's ``PolyWarmUpScheduler`` after ``step`` optimizer steps.

    Steps are optimizer steps (not micro-batches); past ``total_steps`` the multiplier is 0.
    """
    progress = step / total_steps
    if progress < warmup_proportion:
        return progress / warmup_proportion
    return max(1.0 - progress, 0.0) ** degree


def linear_warmup_multiplier(step: int, total_steps: int, warmup_proportion: float) -> float:
    """The peak-rate multiplier in NVIDIA's ``LinearWarmUpScheduler`` after ``step`` optimizer steps.

    1 at the end of warm-up (``step = warmup_proportion * total_steps``), 0 at ``total_steps``
    and past it; ``warmup_proportion`` must be below 1.
    """
    progress = step / total_steps
    if progress < warmup_proportion:
        return progress / warmup_proportion
    return max((1.0 - progress) / (1.0 - warmup_proportion), 0.0)


def build_schedule(
    optimizer: torch.optim.Optimizer,
    name: ScheduleName,
    total_steps: int,
    warmup_proportion: float,
    degree: float = 0.5,
) -> LambdaLR:
    """A ``LambdaLR`` that sets each group's rate to its initial rate x the ``name`` multiplier.

    Call ``step()`` after each optimizer step. The k-th optimizer step (k = 1, 2, ...) runs at
    the multiplier of step k: :func:`poly_warmup_multiplier` for ``"poly"`` (with ``degree``),
    :func:`linear_warmup_multiplier` for ``"linear"`` (which has no ``degree``).

    Args:
        optimizer: each group's learning rate when this is called is its peak rate.
        name: ``"poly"`` or ``"linear"``, the job spec's ``optimizer.schedule``.
        total_steps: optimizer steps of the whole schedule (not micro-batches).
        warmup_proportion: the fraction of ``total_steps`` spent warming up, in ``[0, 1)``.
        degree: the exponent of the poly decay (the spec's ``polyPower``), ``> 0``.

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
    multiplier: Callable[[int], float]
    if name == "poly":
        multiplier = partial(
            poly_warmup_multiplier,
            total_steps=total_steps,
            warmup_proportion=warmup_proportion,
            degree=degree,
        )
    elif name == "linear":
        multiplier = partial(
            linear_warmup_multiplier, total_steps=total_steps, warmup_proportion=warmup_proportion
        )
    else:
        raise ValueError(f"schedule must be 'poly' or 'linear', got {name!r}")
    return LambdaLR(optimizer, lambda step: multiplier(step + 1))


def poly_warmup_schedule(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_proportion: float, degree: float = 0.5
) -> LambdaLR:
    """``build_schedule(optimizer, "poly", ...)``; the same arguments and errors."""
    return build_schedule(optimizer, "poly", total_steps, warmup_proportion, degree)
