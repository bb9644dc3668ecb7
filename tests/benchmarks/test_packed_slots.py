"""benchmarks/packed_slots.py: it runs, and its packed rows are cut to the slots they use."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_packed_rows_run_at_both_widths(capsys: pytest.CaptureFixture[str]) -> None:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    packed_slots = importlib.import_module("packed_slots")
    assert packed_slots.main(["--pairs", "1", "--micro-batch", "5", "--vocab-size", "500"]) == 0
    out = capsys.readouterr().out
    widths = dict(re.findall(r"^(all|used) slots: (\d+) slots a row", out, re.MULTILINE))
    # 30% of at most 127 tokens a row: at most 38 predictions, so 40 slots of the 114.
    assert widths == {"all": "114", "used": "40"}, out
    assert re.search(r"used / all slots, time a step: \d+\.\d{3} \(per pair", out), out
