"""One local process of the test cluster: started in its own session with its output in a log
file, ready when a probe says so, and always stopped (SIGTERM to its process group, then SIGKILL).

As controller-runtime's envtest keeps one small type per process
(``pkg/internal/testing/process``), each kind of component (:mod:`bertjob_testing.cluster.components`)
is a :class:`Component`: its command with its flags, its probe and its ``extra_args``. A started one
is a :class:`Process`, written into the cluster's :class:`Registry` before its probe runs, so that
nothing started is ever left running: :func:`stop_all` stops what a registry holds and reports
every error, and the reaper (:mod:`bertjob_testing.cluster.reaper`) does the same when the test run
dies without stopping it (pytest killed with SIGKILL).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

# What a component that lost the race for its port prints; the component is then started again
# on other ports.
PORT_TAKEN = ("address already in use", "bind: address already in use")
PR_SET_PDEATHSIG = 1
# The registry's folder of clean-up commands.
CLEANUPS = "cleanups"
# Looked up once here: a child between fork and exec must not call into the dynamic loader, whose
# lock another thread of the parent may have held at the fork.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


class StartError(RuntimeError):
    """A component did not start: the message names it, its version, and the last lines of its log."""


class PortTakenError(StartError):
    """A component exited because one of its ports was taken meanwhile."""


def die_with_parent() -> None:
    """For ``preexec_fn``: the child gets SIGKILL when the thread that started it ends (Linux's
    parent-death signal), so a process the tests start in their own session-less way does not
    outlive a test run killed with SIGKILL. (The cluster's processes, which must outlive the
    worker that started them, are the reaper's instead.)"""
    if _prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError("prctl(PR_SET_PDEATHSIG) failed")


def with_testing_on_path(environment: dict[str, str] | None = None) -> dict[str, str]:
    """``environment`` (this process's when None) with this package's folder first on
    ``PYTHONPATH``, for the helpers run as ``python -m bertjob_testing...`` (the package is the
    tests', not installed)."""
    environment = dict(os.environ if environment is None else environment)
    folder = str(Path(__file__).resolve().parents[2])
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [folder, environment.get("PYTHONPATH")]))
    return environment


def in_namespaces(*options: str) -> list[str]:
    """The command prefix that runs what follows it under :mod:`bertjob_testing.cluster.namespaces`
    with ``options`` (``--netns=PATH``, ``--forward=PORT``, ``--bind=SOURCE:TARGET``); its
    environment needs :func:`with_testing_on_path`."""
    return [sys.executable, "-m", "bertjob_testing.cluster.namespaces", *options, "--"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (another process may take it before it is used: the
    components retry, see :data:`PORT_TAKEN`)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def takes_connections(address: str, port: int) -> bool:
    """Whether something listens on ``address``:``port``."""
    try:
        socket.create_connection((address, port), timeout=1).close()
    except OSError:
        return False
    return True


def answers(url: str, context: ssl.SSLContext | None = None, timeout_s: float = 2.0) -> bool:
    """Whether ``url`` answers 200 (HTTPS with ``context``)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False


def insecure() -> ssl.SSLContext:
    """A TLS context that checks nothing: for the health endpoints of components that serve a
    self-signed certificate of their own."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


class Process:
    """A started component: its command, log, and how it is stopped.

    Args:
        name: the component's name in messages (``kube-apiserver v1.36.3``).
        command: the executable and its arguments.
        log: the file that receives stdout and stderr.
        env: the environment (the caller's when None).
    """

    def __init__(
        self, name: str, command: Sequence[str], log: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.command = list(command)
        self.log = log
        self.started_s = 0.0
        self.ready_s = 0.0
        with log.open("ab") as output:
            output.write(f"--- {name}: {' '.join(self.command)} ---\n".encode())
            output.flush()
            self.popen = subprocess.Popen(
                self.command,
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self.started_s = time.monotonic()

    @property
    def pid(self) -> int:
        """The process id (also its process group's)."""
        return self.popen.pid

    def wait_ready(self, probe: Callable[[], bool], timeout_s: float) -> float:
        """Poll ``probe`` until it is true; the seconds from start to ready.

        Raises:
            PortTakenError: the process exited saying a port was in use.
            StartError: it exited otherwise, or was not ready in ``timeout_s`` seconds (it is
                stopped then); the message ends with the last lines of its log.
        """
        deadline = self.started_s + timeout_s
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                log = tail(self.log)
                kind = PortTakenError if any(text in log for text in PORT_TAKEN) else StartError
                raise kind(f"{self.name} exited with {self.popen.returncode} before it was ready:\n{log}")
            if probe():
                self.ready_s = time.monotonic() - self.started_s
                return self.ready_s
            time.sleep(0.1)
        self.stop()
        raise StartError(f"{self.name} was not ready after {timeout_s:.0f} s:\n{tail(self.log)}")

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM to the process group, SIGKILL after ``timeout_s`` seconds; waits for the exit."""
        stop_group(self.pid, timeout_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=timeout_s)


def stop_group(pid: int, timeout_s: float = 10.0) -> None:
    """Stop process group ``pid`` (started with ``start_new_session``): SIGTERM, then SIGKILL
    after ``timeout_s`` seconds. Nothing happens when it is gone already."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        # A child of ours is reaped by its Popen; one of another process (the xdist controller
        # stopping a worker's cluster) only by its parent: both count as gone once they are zombies.
        if not running(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def running(pid: int) -> bool:
    """Whether process ``pid`` runs: a zombie, ended but not yet reaped by its parent, does not."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class Component(Protocol):
    """One kind of process (a module of :mod:`bertjob_testing.cluster.components`).

    ``name`` names it in messages and logs, ``version`` is the pinned version, ``extra_args`` are
    appended to its command (a later flag wins over an earlier one of the same name, as the Go
    flag packages parse them).
    """

    name: str
    extra_args: list[str]

    @property
    def version(self) -> str:
        """The pinned version it runs."""
        ...

    def command(self) -> list[str]:
        """The executable and its flags, with ports chosen anew at each call (a try after a port
        was taken gets others)."""
        ...

    def environment(self) -> dict[str, str] | None:
        """Its environment (None: the caller's)."""
        ...

    def ready(self) -> bool:
        """Whether it is ready (the probe :meth:`Process.wait_ready` polls)."""
        ...


class StopError(RuntimeError):
    """Some processes could not be stopped; the message lists each with its error."""


class Registry:
    """The process groups a cluster started, one file each in ``directory``, written before the
    process's probe runs and removed once it is stopped: what :func:`stop_all` and the reaper
    stop. Files rather than memory, so that another process (xdist's controller, the reaper) sees
    what a worker started."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def add(self, name: str, pid: int) -> None:
        """Record process group ``pid`` as ``name`` (to a temporary name, then renamed)."""
        temporary = self.directory / f".{name}.tmp"
        temporary.write_text(str(pid))
        temporary.rename(self.directory / name)

    def remove(self, name: str) -> None:
        """Forget ``name`` (stopped)."""
        (self.directory / name).unlink(missing_ok=True)

    def add_cleanup(self, name: str, command: Sequence[str]) -> None:
        """Record ``command`` (an argv) to run once every process group is stopped: what undoes
        what the processes made on the machine (mounts, cgroups, interfaces)."""
        directory = self.directory / CLEANUPS
        directory.mkdir(exist_ok=True)
        temporary = directory / f".{name}.tmp"
        temporary.write_text(json.dumps(list(command)))
        temporary.rename(directory / name)

    def cleanups(self) -> dict[str, list[str]]:
        """Each recorded clean-up's name and command, in the order they were recorded."""
        directory = self.directory / CLEANUPS
        found = []
        for path in directory.iterdir() if directory.is_dir() else ():
            if not path.name.startswith("."):
                found.append((path.stat().st_mtime_ns, path.name, json.loads(path.read_text())))
        return {name: command for _, name, command in sorted(found)}

    def groups(self) -> dict[str, int]:
        """Each recorded name and its process group, in the order they were recorded."""
        found = []
        for path in self.directory.iterdir():
            if path.name.startswith(".") or path.is_dir():
                continue
            try:
                found.append((path.stat().st_mtime_ns, path.name, int(path.read_text())))
            except (FileNotFoundError, ValueError):
                continue
        return {name: pid for _, name, pid in sorted(found)}


def launch(component: Component, log: Path, registry: Registry) -> Process:
    """Start ``component`` (its command and ``extra_args``) and record it in ``registry`` before
    anything can fail: the caller then waits with :meth:`Process.wait_ready`."""
    process = Process(
        f"{component.name} {component.version}",
        [*component.command(), *component.extra_args],
        log,
        env=component.environment(),
    )
    registry.add(component.name, process.pid)
    return process


def stop_all(registry: Registry, timeout_s: float = 10.0) -> None:
    """Stop every process group of ``registry``, the last recorded first, then run its clean-ups,
    the last recorded first; each is forgotten once done, and every one is tried whatever
    happened to the others.

    Raises:
        StopError: some could not be stopped, naming each and its error.
    """
    errors = []
    for name, pid in reversed(list(registry.groups().items())):
        try:
            stop_group(pid, timeout_s)
            registry.remove(name)
        except Exception as error:  # every group is tried; all errors are reported
            errors.append(f"{name} (process group {pid}): {error!r}")
    for name, command in reversed(list(registry.cleanups().items())):
        environment = with_testing_on_path()
        done = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
        if done.returncode == 0:
            (registry.directory / CLEANUPS / name).unlink(missing_ok=True)
        else:
            errors.append(f"clean-up {name} (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    if errors:
        raise StopError("could not stop: " + "; ".join(errors))
