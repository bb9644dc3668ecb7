"""The learning-rate schedule of NVIDIA's BERT recipe: linear warm-up, then polynomial decay.

Follows ``PolyWarmUpScheduler`` in NVIDIA DeepLearningExamples
(``PyTorch/LanguageModeling/BERT/schedulers.py``): with ``progress = step / total_steps``, the
multiplier of the peak learning rate is ``progress / warmup_proportion`` during warm-up and
``(1 - progress) ** degree`` after it, ``degree = 0.5`` by default. The decay is measured from
step 0, not from the end of warm-up, as there. NVIDIA's scheduler gives the first optimizer step
the rate of step 1; :class:`torch.optim.lr_scheduler.LambdaLR` evaluates its function at 0 before
the first step, so the function here is shifted by one. As there, the last step's rate is 0.
"""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR


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


def poly_warmup_schedule(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_proportion: float, degree: float = 0.5
) -> LambdaLR:
    """A ``LambdaLR`` that sets each group's rate to its initial rate x :func:`poly_warmup_multiplier`.

    Call ``step()`` after each optimizer step. The k-th optimizer step (k = 1, 2, ...) runs at
    the multiplier of step k.

    Raises:
        ValueError: ``total_steps < 1`` or ``warmup_proportion`` outside ``[0, 1)``.
    """
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    if not 0.0 <= warmup_proportion < 1.0:
        raise ValueError(f"warmup_proportion must be in [0, 1), got {warmup_proportion}")
    return LambdaLR(
        optimizer, lambda step: poly_warmup_multiplier(step + 1, total_steps, warmup_proportion, degree)
    )
