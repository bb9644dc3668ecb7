"""The data stage's process pool: calls run in order over spawned workers that die with the main
process, at most two per worker in flight."""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

# The tokenizers library's own thread pool; off in the workers, where the processes are the
# parallelism (set by the initializers, restored here after a run in this process).
TOKENIZERS_PARALLELISM = "TOKENIZERS_PARALLELISM"


def run_parallel(
    calls: Iterable[tuple[Callable[..., Any], tuple[Any, ...]]],
    workers: int,
    initializer: tuple[Callable[..., None], tuple[Any, ...]],
) -> Iterator[Any]:
    """Results of ``function(*arguments)`` for each call, in order, over ``workers`` processes.

    At most ``2 x workers`` calls are in flight, so a lazy ``calls`` is read only as fast as the
    workers keep up (memory stays bounded by the pieces in flight). Processes are spawned, not
    forked: the parent may hold threads (tokenizers, torch) that a fork would copy half-way. One
    worker means this process, on one thread, with no start-up cost.
    """
    if workers == 1:
        saved = os.environ.get(TOKENIZERS_PARALLELISM)
        try:
            initializer[0](*initializer[1])
            for function, arguments in calls:
                yield function(*arguments)
        finally:
            if saved is None:
                os.environ.pop(TOKENIZERS_PARALLELISM, None)
            else:
                os.environ[TOKENIZERS_PARALLELISM] = saved
        return
    window: collections.deque[Future[Any]] = collections.deque()
    pool = ProcessPoolExecutor(
        workers, mp_context=get_context("spawn"), initializer=_start_worker,
        initargs=(os.getpid(), *initializer),
    )  # fmt: skip
    try:
        for function, arguments in calls:
            window.append(pool.submit(function, *arguments))
            if len(window) >= 2 * workers:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()
    finally:
        # After an error (or an abandoned generator) the calls still queued are dropped, not run.
        pool.shutdown(wait=True, cancel_futures=True)


def _start_worker(parent: int, initializer: Callable[..., None], arguments: tuple[Any, ...]) -> None:
    """Worker start-up: tie the worker's life to ``parent``'s, then ``initializer(*arguments)``."""
    _die_with_parent(parent)
    initializer(*arguments)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when ``parent`` (the process that started it) dies.

    A main process killed outright (SIGKILL from the OOM killer or after the kubelet's grace
    period) cannot stop its workers, which would go on writing shards and holding memory and
    the volume. Linux's ``prctl(PR_SET_PDEATHSIG)`` kills them with it, with no thread or pipe
    to watch; it fires when the *thread* that started the worker ends, which for a
    ``ProcessPoolExecutor`` is the one calling ``submit`` and it outlives the pool. The parent's
    pid is checked afterwards, in case it died before the call (the worker has been re-parented
    by then). Elsewhere than on Linux only that check is made.

    Raises:
        OSError: prctl failed.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)
