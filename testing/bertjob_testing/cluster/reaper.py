"""The reaper: a small process that outlives the test run only to stop what the run left behind.

A cluster's processes run in sessions of their own (so that they outlive the pytest-xdist worker
that started them), which also means that nothing stops them when the whole test run dies without
cleaning up: pytest killed with SIGKILL, CI's time limit, an out-of-memory kill. A parent-death
signal would not do: it follows the thread that started a process, and the cluster must outlive
the worker that started it. So each cluster starts one reaper, in a session of its own too, that
waits for the run's owner process (the pytest controller, :data:`OWNER_ENV`) to end, through a
pidfd (no polling, no PID reuse), and then stops every process group in the cluster's
:class:`bertjob_testing.cluster.process.Registry`. A cluster stopped normally stops its reaper last.

Run as ``python -m bertjob_testing.cluster.reaper REGISTRY_DIR OWNER_PID``.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from bertjob_testing.cluster.process import Registry, StopError, stop_all, with_testing_on_path

# The process whose end ends the cluster: the pytest controller names itself here
# (tests/conftest.py's pytest_configure), and xdist's workers inherit it; without it, the process
# that starts the cluster.
OWNER_ENV = "BERTJOB_CLUSTER_OWNER_PID"


def owner() -> int:
    """The pid of the process whose end ends the cluster (:data:`OWNER_ENV`, else this one)."""
    return int(os.environ.get(OWNER_ENV) or os.getpid())


def start(registry: Registry, log: Path) -> int:
    """Start a reaper for ``registry`` watching :func:`owner`; its pid (also its process group)."""
    with log.open("ab") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "bertjob_testing.cluster.reaper", str(registry.directory), str(owner())],
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=with_testing_on_path(),
            start_new_session=True,
        )
    return process.pid


def wait_for_exit(pid: int) -> None:
    """Return once process ``pid`` has ended (at once when it is gone already)."""
    try:
        descriptor = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        select.select([descriptor], [], [])
    finally:
        os.close(descriptor)


def main(argv: Sequence[str]) -> int:
    """Wait for the owner, then stop the registry's processes; 0, or 1 when some could not be
    stopped (named on stderr)."""
    directory, pid = Path(argv[0]), int(argv[1])
    wait_for_exit(pid)
    if not directory.is_dir():
        return 0
    registry = Registry(directory)
    groups = registry.groups()
    try:
        stop_all(registry, timeout_s=5.0)
    except StopError as error:
        print(f"reaper: owner {pid} ended; {error}", file=sys.stderr)
        return 1
    if groups:
        print(f"reaper: owner {pid} ended; stopped {', '.join(groups)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
