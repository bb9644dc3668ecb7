"""Preemption: SIGTERM asks the training loop to save a checkpoint and stop.

Kubernetes sends SIGTERM to every container of a pod it deletes, evicts or preempts, and SIGKILL
after the pod's grace period (30 s by default). The handler only records the request; the loop
polls it after each optimizer step, writes a checkpoint and raises :class:`Preempted`, and the
entry point exits with 128 + the signal number (143 for SIGTERM, the contract's
:data:`bertjob_api.contract.EXIT_PREEMPTED`), which Kubeflow's ``restartPolicy: ExitCode`` treats
as retryable, while 1 (bad input, divergence) is permanent. The request lives
on the :class:`StopSignals` object that a phase enters, not in a module global.

Once training is done, the job's entry point installs another :class:`StopSignals`: a SIGTERM
then (the pod deleted as the job ends) only gets noted, the export is finished, and the job
exits 0, since its work is done.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any


class Preempted(Exception):  # noqa: N818 (an orderly stop, not an error)
    """Training stopped on a signal after saving ``checkpoint``; exit with :attr:`exit_code`."""

    def __init__(self, signal_number: int, step: int, checkpoint: Path):
        self.signal_number = signal_number
        self.checkpoint = checkpoint
        name = signal.Signals(signal_number).name
        super().__init__(f"{name} received: stopped after step {step}, saved {checkpoint}")

    @property
    def exit_code(self) -> int:
        """128 + the signal number, as a shell reports a process killed by that signal."""
        return 128 + self.signal_number


class StopSignals:
    """A context in which ``signals`` (default SIGTERM) set :attr:`received` instead of killing.

    Outside the main thread (where Python cannot install handlers) it does nothing. The previous
    handlers are restored on exit. :meth:`install` and :meth:`restore` do the same outside a
    ``with`` block.
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)):
        self.signals = signals
        self.received: int | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def _handle(self, signal_number: int, _frame: FrameType | None) -> None:
        self.received = signal_number

    def install(self) -> None:
        """Catch the signals from now on (once; a second call does nothing)."""
        if not self._previous and threading.current_thread() is threading.main_thread():
            self._previous = {number: signal.signal(number, self._handle) for number in self.signals}

    def restore(self) -> None:
        """Give the signals back to the handlers they had before :meth:`install`."""
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}

    def __enter__(self) -> StopSignals:
        self.install()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.restore()
