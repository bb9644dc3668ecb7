"""ProgressBar's lines without a terminal: their form, units and spacing in time.

Under pytest's capture neither standard stream is a terminal, so every bar here writes lines; the
bars drawn on a real terminal, and the data stage's lines, are tested in
tests/bertpretrain/data/prepare/test_progress_logs.py.
"""

from __future__ import annotations

import pytest

from bertpretrain.common.progress import LINE_SECONDS, ProgressBar, binary_size, duration, line_interval


class Clock:
    """A clock for a bar, moved by hand: tqdm reads time through the bar's ``_time``."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def on_clock(bar: ProgressBar, clock: Clock) -> ProgressBar:
    """``bar`` timed by ``clock``, as if it had started at ``clock.now`` (tqdm set these at init)."""
    bar._time = clock
    bar.start_t = bar.last_print_t = clock.now
    return bar


def lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    captured = capsys.readouterr()
    assert "\r" not in captured.out + captured.err, repr(captured)
    assert captured.err == ""
    return captured.out.splitlines()


def test_a_line_gives_count_total_rate_time_and_time_left(capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    bar = on_clock(ProgressBar(total=5000, desc="data: vocabulary", unit="documents"), clock)
    clock.now += 12
    bar.n = 1204
    assert (
        bar.line()
        == "data: vocabulary: 1,204 of 5,000 documents (24%), 100 documents/s, 12 s, about 37 s left"
    )
    bar.n = 5000
    assert bar.line() == "data: vocabulary: 5,000 of 5,000 documents (100%), 417 documents/s, 12 s"
    bar.close()
    assert lines(capsys) == [bar.line()]


def test_bytes_have_binary_units_and_slow_rates_a_decimal(capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    documents = on_clock(ProgressBar(desc="data: documents", unit="B", unit_scale=True), clock)
    clock.now += 150
    documents.n = 21 * 2**20
    # 21 MiB in 150 s: 143.4 KiB/s. tqdm's unit_scale on a count in MB read "21.0kMB" (issue 31).
    assert documents.line() == "data: documents: 21.0 MiB, 143.4 KiB/s, 2 min 30 s"
    shards = on_clock(ProgressBar(total=256, desc="data: seq_len_128", unit="shards"), clock)
    clock.now += 3
    shards.n = 7
    assert (
        shards.line() == "data: seq_len_128: 7 of 256 shards (3%), 2.3 shards/s, 3.0 s, about 1 min 46 s left"
    )
    documents.close()
    shards.close()
    capsys.readouterr()


@pytest.mark.parametrize(
    ("count", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536 * 2**20, "1.5 GiB"), (3 * 2**50, "3.0 PiB")],
)
def test_binary_size(count: int, text: str) -> None:
    assert binary_size(count) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.04, "0.0 s"), (9.94, "9.9 s"), (12.7, "12 s"), (245, "4 min 05 s"), (7380, "2 h 03 min")],
)
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_lines_come_at_most_once_an_interval_and_once_more_at_the_end(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)
    clock = Clock()
    bar = on_clock(ProgressBar(total=100, desc="work", unit="items"), clock)
    assert lines(capsys) == []  # no line for the empty bar tqdm draws when it starts
    for _ in range(100):  # an item every second: a line at 30, 60 and 90 s, the last at the end
        clock.now += 1
        bar.update()
        bar.set_postfix(item="x")  # redraws the bar at once, but a line waits for its interval
    bar.close()
    printed = lines(capsys)
    assert [line.split(" (")[0] for line in printed] == [f"work: {n} of 100 items" for n in (30, 60, 90, 100)]
    bar.close()  # tqdm's context manager and __del__ close again: nothing more
    assert lines(capsys) == []


def test_the_last_line_is_not_repeated_and_an_untouched_bar_writes_none(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TQDM_MININTERVAL", "0")
    # A generator, as the vocabulary's documents are: no length, so no total.
    assert list(ProgressBar((i for i in range(3)), desc="each", unit="items")) == [0, 1, 2]
    assert [line.split(",")[0] for line in lines(capsys)] == [
        "each: 1 items",
        "each: 2 items",
        "each: 3 items",
    ]
    with ProgressBar(desc="idle", unit="items"):
        pass
    assert lines(capsys) == []


def test_the_interval_comes_from_tqdms_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)
    assert line_interval() == LINE_SECONDS == 30
    monkeypatch.setenv("TQDM_MININTERVAL", "2.5")
    assert line_interval() == 2.5
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv("TQDM_MININTERVAL", bad)
        with pytest.raises(ValueError, match=f"TQDM_MININTERVAL: '{bad}' is not a number of seconds"):
            line_interval()
