"""``python -m bertpretrain.mpilaunch -- mpirun ... python -m bertpretrain.mpilaunch --rank --
python -m bertpretrain run --config FILE``: an MPI launcher whose SIGTERM reaches every rank and
whose exit code is the ranks'.

Why (measured with Open MPI 4.1.4 and Horovod 0.28.1, an ssh stand-in, ranks on another address):

- ``mpirun`` on SIGTERM or SIGINT aborts the job: it sends the ranks SIGCONT, waits
  ``odls_base_sigkill_timeout`` seconds (default 1), sends SIGTERM, waits as long again, then
  SIGKILL, and exits 1 whatever the ranks exited with. Open MPI refuses SIGTERM in
  ``ess_base_forward_signals``; it forwards SIGUSR1, SIGUSR2, SIGTSTP, SIGCONT, SIGABRT, SIGALRM and
  SIGURG to every rank's process group at once, without aborting.
- ``mpirun`` not signalled exits with the code of the first rank to exit non-zero (200 stays 200),
  and stops the others by the same SIGCONT, wait, SIGTERM, wait, SIGKILL sequence: with the default
  1 s, rank 0 would be killed while it writes the checkpoint the others stopped for.
- ``horovodrun`` over MPI replaces itself with ``/bin/sh -c mpirun ...``, a shell that dies of
  SIGTERM (exit 143) without passing it on: mpirun is orphaned and the ranks train on.
- ``horovodrun --gloo`` (elastic Horovod) passes SIGTERM to its ranks, but exits 0 once they
  stopped, and 1 when a rank failed (with 200 or anything else).

So, on the Launcher (without ``--rank``), this module:

- starts the launcher command in its own process group with SIGUSR2 ignored (the shell that
  horovodrun becomes, and horovodrun itself, keep ignoring it; mpirun installs its own handler),
  and ``OMPI_MCA_odls_base_sigkill_timeout`` at :data:`SIGKILL_TIMEOUT_SECONDS` unless the
  environment sets it, so that mpirun gives rank 0 time to finish a checkpoint after the other
  ranks stopped;
- on SIGTERM or SIGINT sends :data:`FORWARDED_SIGNAL` (SIGUSR2) to that group, which mpirun forwards
  to every rank at once; under ``horovodrun --gloo`` or elastic horovodrun, which start their ranks
  themselves, the signal itself to horovodrun, which forwards it. A second SIGTERM or SIGINT sends
  the group SIGTERM (mpirun's abort), a third SIGKILL. The pod's ``terminationGracePeriodSeconds``
  (30 s unless set) bounds it all: the kubelet then kills the container;
- copies the command's output through, reading the line each rank's ``--rank`` wrapper writes as
  it ends, and exits with :func:`exit_code` of them.

On each rank (``--rank``), it runs the trainer as a child with SIGUSR2 ignored (Open MPI signals
the rank's whole process group), turns SIGUSR2 into SIGTERM to the trainer (which checkpoints and
exits 143), passes SIGTERM and SIGINT on, and at the end writes :func:`report_line` to stderr and
exits with the trainer's code.

On a Worker (``--worker``, around ``sshd -De``): sshd exits at once on SIGTERM, and with the
container's first process gone the kernel kills every process of the pod, the ranks among them,
before they checkpoint (and rank 0's checkpoint gathers from every rank). So the Worker's SIGTERM
goes to the rank wrappers below sshd instead (a Worker evicted alone stops the whole world: the
ranks agree to stop at the same step), sshd is stopped only once its sessions (the ranks) have
ended, and the wrapper exits 128 + the signal. A second SIGTERM or SIGINT stops sshd at once.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import BinaryIO

from bertjob_api.contract import EXIT_PEER_LOST

# The signal the Launcher sends mpirun for a SIGTERM: one mpirun forwards to every rank at once.
FORWARDED_SIGNAL = signal.SIGUSR2
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Seconds mpirun waits between SIGCONT, SIGTERM and SIGKILL when it stops the ranks after one
# exited: rank 0 writes the checkpoint while the others have already exited 143. 10 + 10 s fits the
# default 30 s grace period.
SIGKILL_TIMEOUT_SECONDS = 10
SIGKILL_TIMEOUT_ENV = "OMPI_MCA_odls_base_sigkill_timeout"
# The rank's own variables, by launcher: Open MPI's, Horovod's (gloo), MPICH's.
RANK_ENV = ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "PMI_RANK")
REPORT = re.compile(rb"bertpretrain\.mpilaunch: rank (\d+) exited with (\d+)")
USAGE = "usage: python -m bertpretrain.mpilaunch [--rank | --worker] [--] COMMAND [ARG...]"
MODULE = "bertpretrain.mpilaunch"
RANK_FLAG = "--rank"
WORKER_FLAG = "--worker"
# How often a stopping Worker looks for sshd's sessions in /proc.
POLL_SECONDS = 0.2


def report_line(rank: int, code: int) -> str:
    """The line a rank's wrapper writes as its trainer ends (``code``: the trainer's exit code,
    128 + N when signal N killed it), which the Launcher reads through mpirun's output."""
    return f"bertpretrain.mpilaunch: rank {rank} exited with {code}"


def exit_code(launcher_code: int, reports: Sequence[tuple[int, int]], received: int | None = None) -> int:
    """The Launcher's exit code.

    ``launcher_code``: mpirun's (or horovodrun's) exit code, 128 + N if signal N killed it;
    ``reports``: (rank, exit code) in the order the ranks' lines arrived, a rank's last one
    counting (elastic Horovod restarts ranks under the same number); ``received``: the signal the
    Launcher got, if any.

    - not signalled and the launcher succeeded: 0 (an elastic job mended its failures);
    - the first rank's code that is neither 0 nor :data:`~bertjob_api.contract.EXIT_PEER_LOST`:
      the real cause (143 after a checkpoint, 200 on a full volume, 1 ...);
    - else 201 if a rank lost a peer;
    - signalled: 0 if every rank reported success (the work is done, as the trainer itself exits
      0 on a SIGTERM once training is done), else 128 + the signal;
    - else the launcher's own code (mpirun's failure to start the ranks, say).
    """
    if launcher_code == 0 and received is None:
        return 0
    last: dict[int, int] = {}
    for rank, code in reports:
        last.pop(rank, None)  # a later report moves the rank to the end of the order
        last[rank] = code
    codes = list(last.values())
    causes = [code for code in codes if code not in (0, EXIT_PEER_LOST)]
    if causes:
        return causes[0]
    if EXIT_PEER_LOST in codes:
        return EXIT_PEER_LOST
    if received is not None:
        return 0 if codes and launcher_code == 0 else 128 + received
    return launcher_code


def _status(returncode: int) -> int:
    """A ``Popen.returncode`` as a shell reports it: -N (killed by signal N) becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _forwards_itself(command: Sequence[str]) -> bool:
    """Whether the launcher command starts the ranks without mpirun and passes SIGTERM on itself:
    ``horovodrun --gloo`` and elastic horovodrun (``--host-discovery-script``)."""
    if not command or os.path.basename(command[0]) != "horovodrun":
        return False
    return "--gloo" in command or "--host-discovery-script" in command


def _copy(source: BinaryIO, sink: BinaryIO, reports: list[tuple[int, int]], lock: threading.Lock) -> None:
    """Copy ``source`` to ``sink`` line by line, noting the ranks' report lines."""
    for line in source:
        sink.write(line)
        sink.flush()
        found = REPORT.search(line)
        if found:
            with lock:
                reports.append((int(found[1]), int(found[2])))


class _Signals:
    """Handlers of :data:`STOP_SIGNALS` (and ``extra``) for the wrapper's life, restored by
    :meth:`restore`. Until :meth:`attach` gives them the child's reaction, signals wait in a list;
    :attr:`received` is the first stop signal, :attr:`count` how many came."""

    def __init__(self, extra: tuple[signal.Signals, ...] = ()):
        self.received: int | None = None
        self.count = 0
        self._react: Callable[[int, int], None] | None = None
        self._pending: list[tuple[int, int]] = []
        self._previous = {number: signal.signal(number, self._handle) for number in (*STOP_SIGNALS, *extra)}

    def _handle(self, number: int, _frame: FrameType | None) -> None:
        if number in STOP_SIGNALS:
            self.received = number if self.received is None else self.received
            self.count += 1
        if self._react is None:
            self._pending.append((number, self.count))
        else:
            self._react(number, self.count)

    def attach(self, react: Callable[[int, int], None]) -> None:
        """React to the signals from now on, first to those that came before."""
        self._react = react
        while self._pending:
            react(*self._pending.pop(0))

    def restore(self) -> None:
        """Give the signals back to their previous handlers."""
        for number, handler in self._previous.items():
            signal.signal(number, handler)


def _ignoring_forwarded(start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """``start()`` with :data:`FORWARDED_SIGNAL` ignored, a disposition the child inherits
    through exec (unlike a handler); this process's own handler is back afterwards."""
    previous = signal.signal(FORWARDED_SIGNAL, signal.SIG_IGN)
    try:
        return start()
    finally:
        signal.signal(FORWARDED_SIGNAL, previous)


# Seconds the Launcher keeps copying output after its command ended (a rank's orphan could hold
# the pipes open for ever).
DRAIN_SECONDS = 10


def launch(command: Sequence[str]) -> int:
    """Run the launcher ``command`` (mpirun or horovodrun, its ranks under ``--rank``) as the
    module's docstring says, and return :func:`exit_code`."""
    env = dict(os.environ)
    env.setdefault(SIGKILL_TIMEOUT_ENV, str(SIGKILL_TIMEOUT_SECONDS))
    signals = _Signals()
    try:
        child = _ignoring_forwarded(
            lambda: subprocess.Popen(
                list(command), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, process_group=0
            )
        )
        forwards_itself = _forwards_itself(command)

        def react(number: int, count: int) -> None:
            if count == 1:
                if forwards_itself:
                    child.send_signal(number)
                else:
                    os.killpg(child.pid, FORWARDED_SIGNAL)
            elif child.returncode is None:
                os.killpg(child.pid, signal.SIGTERM if count == 2 else signal.SIGKILL)

        reports: list[tuple[int, int]] = []
        lock = threading.Lock()
        assert child.stdout is not None and child.stderr is not None
        copies = [
            threading.Thread(target=_copy, args=(pipe, sink, reports, lock), daemon=True)
            for pipe, sink in ((child.stdout, sys.stdout.buffer), (child.stderr, sys.stderr.buffer))
        ]
        for copy in copies:
            copy.start()
        signals.attach(react)
        launcher_code = _status(child.wait())
        for copy in copies:
            copy.join(DRAIN_SECONDS)
    finally:
        signals.restore()
    with lock:
        reported = list(reports)
    code = exit_code(launcher_code, reported, signals.received)
    received = f", {signal.Signals(signals.received).name} received" if signals.received else ""
    print(
        f"bertpretrain.mpilaunch: {command[0]} exited with {launcher_code}, ranks' codes "
        f"{sorted(dict(reported).items())}{received}; exit {code}",
        file=sys.stderr,
        flush=True,
    )
    return code


def rank(command: Sequence[str]) -> int:
    """Run one rank's ``command`` (the trainer) as the module's docstring says; returns its exit
    code (128 + N if signal N killed it) after writing :func:`report_line` to stderr."""
    signals = _Signals(extra=(FORWARDED_SIGNAL,))
    try:
        child = _ignoring_forwarded(lambda: subprocess.Popen(list(command)))

        def react(number: int, _count: int) -> None:
            if child.returncode is None:
                child.send_signal(signal.SIGTERM if number == FORWARDED_SIGNAL else number)

        signals.attach(react)
        code = _status(child.wait())
    finally:
        signals.restore()
    number = next((os.environ[name] for name in RANK_ENV if name in os.environ), "0")
    print(report_line(int(number), code), file=sys.stderr, flush=True)
    return code


def _children() -> dict[int, list[int]]:
    """Every live process's children, from /proc (zombies, ended but not yet reaped, and
    processes that end meanwhile are left out)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name, in parentheses, may hold spaces: the fields after it are plain.
            state, parent = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state != "Z":
            children.setdefault(int(parent), []).append(int(stat.parent.name))
    return children


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid``, nearest first."""
    children, found, frontier = _children(), [], [pid]
    while frontier:
        frontier = [child for parent in frontier for child in children.get(parent, [])]
        found += frontier
    return found


def _is_rank_wrapper(pid: int) -> bool:
    """Whether process ``pid`` runs ``python -m bertpretrain.mpilaunch --rank``."""
    try:
        argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    return any(argv[i : i + 2] == [MODULE, RANK_FLAG] for i in range(len(argv)))


def worker(command: Sequence[str]) -> int:
    """Run a Worker's sshd ``command`` as the module's docstring says; returns sshd's exit code,
    or 128 + the signal that stopped the Worker."""
    signals = _Signals()
    stopping = threading.Event()
    try:
        child = subprocess.Popen(list(command))

        def react(number: int, count: int) -> None:
            if count == 1:
                for pid in _descendants(child.pid):
                    if _is_rank_wrapper(pid):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGTERM)
                stopping.set()
            elif child.returncode is None:
                child.send_signal(signal.SIGTERM)

        signals.attach(react)
        while True:
            try:
                code = _status(child.wait(POLL_SECONDS))
                break
            except subprocess.TimeoutExpired:
                # sshd's sessions are its children, and the ranks run below them.
                if stopping.is_set() and not _descendants(child.pid):
                    child.send_signal(signal.SIGTERM)
    finally:
        signals.restore()
    return 128 + signals.received if signals.received is not None else code


def main(argv: Sequence[str] | None = None) -> int:
    """``[--rank | --worker] [--] COMMAND [ARG...]``: :func:`rank` with ``--rank``, :func:`worker`
    with ``--worker``, else :func:`launch`; 2 with a usage message when no command is given."""
    args = list(sys.argv[1:] if argv is None else argv)
    mode = args[0] if args[:1] in ([RANK_FLAG], [WORKER_FLAG]) else None
    args = args[1:] if mode else args
    args = args[1:] if args[:1] == ["--"] else args
    if not args:
        print(f"{USAGE}\nbertpretrain.mpilaunch: no command given", file=sys.stderr)
        return 2
    run = {RANK_FLAG: rank, WORKER_FLAG: worker}.get(mode or "", launch)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
