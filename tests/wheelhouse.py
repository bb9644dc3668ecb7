"""The wheelhouse that make downloads from requirements/operator.lock (the .venv recipe), from
which tests/test_wheel.py and tests/test_lock.py install without an index."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

WHEELHOUSE = Path(sys.executable).parent.parent / "wheelhouse"


def wheelhouse_or_skip() -> Path:
    """:data:`WHEELHOUSE`; a test without it skips, and fails under CI=true, where make made it."""
    if not any(WHEELHOUSE.glob("*.whl")):
        if os.environ.get("CI") == "true":
            pytest.fail(f"no wheelhouse at {WHEELHOUSE}: make downloads it (the .venv recipe)")
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: `make` downloads it")
    return WHEELHOUSE
