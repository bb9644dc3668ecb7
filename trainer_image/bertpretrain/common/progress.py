"""Progress of long loops: tqdm's bars on a terminal, plain lines in a log.

A tqdm bar redraws itself with carriage returns. On a terminal that is a bar; in a pod's log
(``kubectl logs``), a file or a pipe, it is one endless line, so :class:`ProgressBar` decides by
the stream a bar would be drawn on, standard error:

- *standard error is a terminal*: tqdm's bar, exactly as ``tqdm(...)`` draws it there.
- *otherwise*: one line on standard output per report, at most every :data:`LINE_SECONDS`
  seconds, and a last one when the loop ends (unless the one before already gave the final
  count). Lines go to standard output because the stage's other messages do, so that a log
  holding only standard output still tells the whole story in order::

      data: vocabulary: 1,204 documents, 310 documents/s, 3.9 s
      data: seq_len_128_max_pred_20: 96 of 256 shards (38%), 2.1 shards/s, 46 s, about 1 min 16 s left
      data: documents: 1.2 GiB, 8.4 MiB/s, 2 min 26 s

tqdm's environment variables still apply to both: ``TQDM_DISABLE=1`` prints neither bars nor
lines, and ``TQDM_MININTERVAL`` (seconds) sets the interval between lines as it sets the one
between redraws of a bar. tqdm reads its variables once, when it is first imported (a value
that is no number stops that import); the interval between lines is read when a bar is made.

Units: with ``unit="B"`` a count is bytes, written with binary prefixes in lines (``21.0 MiB``,
``929.5 KiB/s``; the bar, with ``unit_scale=True``, uses tqdm's decimal ``MB``); any other unit is
a plural noun (``"documents"``) after a count with thousands separators.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from tqdm import tqdm

LINE_SECONDS = 30.0
"""Least seconds between two progress lines, unless ``TQDM_MININTERVAL`` says otherwise."""

_BINARY_PREFIXES = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def writes_lines() -> bool:
    """Whether a :class:`ProgressBar` made now writes lines (standard error is no terminal)."""
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return not (isatty is not None and isatty())
    except ValueError:  # a closed stream: no terminal to draw on
        return True


def line_interval() -> float:
    """Least seconds between two lines: ``TQDM_MININTERVAL`` when set, else :data:`LINE_SECONDS`.

    Raises:
        ValueError: ``TQDM_MININTERVAL`` is not a number of seconds (>= 0).
    """
    text = os.environ.get("TQDM_MININTERVAL")
    if text is None:
        return LINE_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:  # also refuses nan
        raise ValueError(f"TQDM_MININTERVAL: {text!r} is not a number of seconds (>= 0)")
    return seconds


class ProgressBar(tqdm):
    """``tqdm`` with the same arguments, which writes plain lines when standard error is no
    terminal (see the module's docstring).

    Only ``desc``, ``total``, ``unit``, ``initial`` and ``unit_scale`` (for bytes) shape a line;
    a ``file`` given by the caller is where lines go too. In line mode the bar's own ``leave``,
    ``mininterval`` and ``maxinterval`` are set by this class.
    """

    def __init__(self, iterable: Any = None, *args: Any, **kwargs: Any) -> None:
        # Set before tqdm's __init__, which draws the empty bar (through display) at once.
        self._lines = writes_lines()
        self._line_n: float = kwargs.get("initial", 0)
        self._line_t: float | None = None  # None: no line yet, the interval counts from the start
        if self._lines:
            self._interval = line_interval()
            kwargs.setdefault("file", sys.stdout)
            # leave=False: tqdm's close then only clears the bar (display(msg="")), which a line
            # never needs, instead of writing one more newline. maxinterval: tqdm's monitor thread
            # redraws a bar waiting that long; a line may wait the whole interval.
            kwargs.update(leave=False, mininterval=self._interval, maxinterval=self._interval)
        super().__init__(iterable, *args, **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        """Draw the bar (terminal) or write a line, when one is due: the count changed since the
        last line and :func:`line_interval` seconds have passed since it. Returns whether it wrote.
        """
        if not self._lines:
            return bool(super().display(msg, pos))
        return self._write_line(final=False) if msg is None else False

    def clear(self, nolock: bool = False) -> None:
        """Clear the bar from the terminal; a line, once written, stays."""
        if not self._lines:
            super().clear(nolock)

    def close(self) -> None:
        """End the bar; in line mode, write the final count unless the last line gave it."""
        if self._lines and not getattr(self, "disable", True):
            self._write_line(final=True)
        super().close()

    def _write_line(self, final: bool) -> bool:
        now = self._time()  # tqdm's clock, which its own interval checks read too
        if self.n == self._line_n:  # nothing new (and, while tqdm's __init__ draws, no start_t yet)
            return False
        since = now - (self.start_t if self._line_t is None else self._line_t)
        if not final and since < self._interval:
            return False
        self._line_n, self._line_t = self.n, now
        self.fp.write(self.line() + "\n")
        self.fp.flush()
        return True

    def line(self) -> str:
        """This bar's progress as one line: ``desc: count[ of total (percent)], rate, elapsed[,
        about remaining left]``; see the module's docstring for units."""
        elapsed = self._time() - self.start_t
        n, total = self.n, self.total
        rate = n / elapsed if elapsed > 0 else None
        if total:
            # "1,204 of 5,000 documents": the noun once; sizes keep their own units ("1.2 GiB of 4.0 GiB").
            parts = [f"{self._amount(n, unit=False)} of {self._amount(total)} ({100 * n / total:.0f}%)"]
        else:
            parts = [self._amount(n)]
        if rate:
            parts.append(f"{self._amount(rate, rate=True)}/s")
        parts.append(duration(elapsed))
        if total and rate and n < total:
            parts.append(f"about {duration((total - n) / rate)} left")
        text = ", ".join(parts)
        return f"{self.desc}: {text}" if self.desc else text

    def _amount(self, value: float, rate: bool = False, unit: bool = True) -> str:
        if self.unit == "B":
            return binary_size(value)
        # A count is a whole number, a rate below 10 keeps a decimal: "2.1 shards/s".
        number = f"{value:,.1f}" if rate and value < 10 else f"{value:,.0f}"
        return f"{number} {self.unit}" if unit else number


def binary_size(count: float) -> str:
    """``count`` bytes with a binary prefix: ``"512 B"``, ``"21.0 MiB"`` (1 MiB = 1,048,576 B)."""
    value = float(count)
    for prefix in _BINARY_PREFIXES[:-1]:
        if abs(value) < 1024:
            return f"{value:.0f} {prefix}" if prefix == "B" else f"{value:.1f} {prefix}"
        value /= 1024
    return f"{value:.1f} {_BINARY_PREFIXES[-1]}"


def duration(seconds: float) -> str:
    """``"0.4 s"``, ``"12 s"``, ``"4 min 05 s"``, ``"2 h 03 min"``: a duration a reader takes in at
    a glance (tenths below 10 s, where a stage of a small job ends)."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"
