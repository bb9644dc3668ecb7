"""How training stops short of its end, other than by a signal, for the entry point's exit codes.

Kept apart from the loop (:mod:`bertpretrain.training.phase`) so that :mod:`bertpretrain.run` can
name it without importing torch; a signal's stop is :class:`bertpretrain.training.preemption.Preempted`.
"""

from __future__ import annotations


class DivergenceError(RuntimeError):
    """The training loss became NaN or infinite (or fp16 overflowed too many steps in a row); the
    message names the step and the last good checkpoint. A restart would not mend it: exit 1."""
