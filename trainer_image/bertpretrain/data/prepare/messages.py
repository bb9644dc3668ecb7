"""The data stage's progress lines on stdout, and the phrases its messages share."""

from __future__ import annotations

import collections

NO_TEXT = "no document with any text was found"


def skips(skipped: collections.Counter[str]) -> str:
    """``"; skipped: 2 empty file, 1 redirect"`` to end a message with, or ``""`` when nothing was."""
    if not skipped:
        return ""
    return "; skipped: " + ", ".join(f"{count} {reason}" for reason, count in sorted(skipped.items()))


def report(message: str) -> None:
    """One progress line on stdout, as the training loop prints its own."""
    print(f"data: {message}", flush=True)
