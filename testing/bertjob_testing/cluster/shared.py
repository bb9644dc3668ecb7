"""One control plane for a whole pytest run, shared by pytest-xdist's workers.

The run's controller (the plain pytest process, or xdist's controller) names a directory in
``$BERTJOB_CLUSTER_ROOT`` before any worker starts (:func:`configure`); the first test that asks
for the cluster starts it there under a file lock, and every later one, in any worker, attaches to
it through its ``cluster.json``. The controller stops it when the run ends (:func:`finish`): its
processes run in their own sessions, so they outlive the worker that started them. The logs stay
when a test failed and are removed otherwise.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock

from bertjob_testing.cluster.controlplane import STATE_FILE, ControlPlane
from bertjob_testing.cluster.process import StopError
from bertjob_testing.cluster.reaper import OWNER_ENV

ROOT_ENV = "BERTJOB_CLUSTER_ROOT"
FAILED_FILE = "failed"


def configure() -> Path:
    """Name the run's cluster directory and the run's owner (this process: the clusters' reapers
    stop them when it ends) in the environment, which the workers inherit; called once by the
    controller, before the workers start."""
    root = Path(tempfile.mkdtemp(prefix="bertjob-cluster-"))
    os.environ[ROOT_ENV] = str(root)
    os.environ[OWNER_ENV] = str(os.getpid())
    return root


def root() -> Path:
    """The run's cluster directory.

    Raises:
        RuntimeError: :func:`configure` was not called (no ``$BERTJOB_CLUSTER_ROOT``).
    """
    value = os.environ.get(ROOT_ENV)
    if not value:
        raise RuntimeError(f"${ROOT_ENV} is not set: tests/conftest.py's pytest_configure sets it")
    return Path(value)


def control_plane() -> ControlPlane:
    """The run's control plane: started by the first caller, attached to by the others.

    Raises:
        bertjob_testing.cluster.build.BuildError, bertjob_testing.cluster.process.StartError:
            as :meth:`ControlPlane.start`; the next caller tries again.
    """
    workdir = root() / "cluster"
    with FileLock(str(root() / "cluster.lock")):
        if (workdir / STATE_FILE).is_file():
            return ControlPlane.load(workdir)
        workdir.mkdir(exist_ok=True)
        plane = ControlPlane(workdir)
        plane.start()
        plane.save()
        return plane


def existing() -> ControlPlane | None:
    """The run's control plane if one was started, without starting one."""
    directory = os.environ.get(ROOT_ENV)
    if directory and (Path(directory) / "cluster" / STATE_FILE).is_file():
        return ControlPlane.load(Path(directory) / "cluster")
    return None


def mark_failed() -> None:
    """Keep the logs when the run ends (a test that used the cluster failed)."""
    directory = os.environ.get(ROOT_ENV)
    if directory:
        Path(directory, FAILED_FILE).touch()


def finish() -> str | None:
    """Stop the run's cluster, if one was started; remove its directory unless a test failed.
    Returns where the logs were kept, or None."""
    directory = os.environ.get(ROOT_ENV)
    if not directory or not Path(directory).is_dir():
        return None
    plane = existing()
    if plane is not None:
        try:
            plane.stop()
        except StopError as error:
            print(f"\nthe test cluster did not stop whole: {error}")
            mark_failed()
    if (Path(directory) / FAILED_FILE).exists():
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    return None
