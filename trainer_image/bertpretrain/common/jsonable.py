"""Values made fit for strict JSON: NaN and infinities, which JSON cannot hold, become null.

Both the training logs (``training/dllogger.py``) and the fine-tuning results
(``finetune/results.py``) write figures that a diverged run leaves as NaN or infinity.
"""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with NaN and infinities (a diverged run's loss) as None, which JSON can hold,
    nested dicts, lists and tuples (as lists) included."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value
