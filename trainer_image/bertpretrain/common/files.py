"""Output files that survive crashes, power cuts and full disks: the trainer's side of them.

- The one atomic write, :func:`bertjob_api.files.write_atomically` (a temporary beside the file,
  ``fsync``, rename, ``fsync`` of the directory), and :class:`bertjob_api.files.DiskFullError` live
  in the API package, which the API's generators use too; import them from there. The
  entry point exits with :data:`bertjob_api.contract.EXIT_DISK_FULL` on a full disk, which
  Kubeflow retries (a volume can be grown).
- Writers of a directory hold an exclusive ``flock`` on a lock file in it while their
  temporaries exist. A process that gets the lock therefore knows that the temporaries it finds
  were left by writers that died (SIGKILL, a lost node: the kernel or the NFS server releases a
  dead process's locks), whichever pod or host they ran on, and removes them
  (:func:`writing`, :func:`remove_stale`). Where the file system has no locks, only temporaries
  untouched for :data:`STALE_SECONDS` are removed: a writer that is alive keeps changing its file.
- :func:`write_file`: a new file inside a directory that is itself renamed into place whole.
- :func:`check_writable`: a directory the job will write, tried before any work is done.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from bertjob_api.files import (
    DiskFullError,
    free_bytes,
    is_disk_full,
    make_directory,
    temporary_name,
)

__all__ = [
    "LOCK_FILE",
    "STALE_SECONDS",
    "LockState",
    "check_writable",
    "lock",
    "remove_stale",
    "write_file",
    "writing",
]

# Where file locks are missing: a temporary unchanged this long has no live writer.
STALE_SECONDS = 3600.0
LOCK_FILE = ".lock"
# Errors of flock(2) on file systems without locks (NFS without lockd, some FUSE file systems).
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL)

LockState = Literal["held", "busy", "unsupported"]


def write_file(path: Path, data: bytes) -> None:
    """Create ``path`` (which must not exist) with ``data`` and sync it: a file in a directory that
    is renamed into place whole, which needs no temporary of its own.

    Raises:
        DiskFullError: the device ran out of space; the partial file is removed.
    """
    try:
        with open(path, "xb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
    except OSError as error:
        if not is_disk_full(error):
            raise
        path.unlink(missing_ok=True)
        raise DiskFullError(path, free_bytes(path.parent), len(data)) from None


@contextlib.contextmanager
def lock(path: Path, wait: bool = True) -> Iterator[LockState]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the ``with`` block.

    Yields ``"held"``; ``"busy"`` when ``wait`` is False and another process holds it;
    ``"unsupported"`` when the file system has no locks (nothing is held then).
    """
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            state: LockState = "held"
        except BlockingIOError:
            state = "busy"
        except OSError as error:
            if error.errno not in _NO_LOCKS:
                raise
            state = "unsupported"
        yield state
    finally:
        os.close(descriptor)  # releases the lock


@contextlib.contextmanager
def writing(directory: Path, names: re.Pattern[str], lock_name: str = LOCK_FILE) -> Iterator[list[Path]]:
    """Be the writer of ``directory`` (made if missing) for the ``with`` block: wait for its lock,
    then remove the stale temporaries (names matching ``names``) that dead writers left; yields
    the paths removed."""
    make_directory(directory)
    with lock(directory / lock_name) as state:
        yield _remove(directory, names, None if state == "held" else STALE_SECONDS)


def remove_stale(directory: Path, names: re.Pattern[str], lock_name: str = LOCK_FILE) -> list[Path]:
    """Remove the temporaries in ``directory`` whose names match ``names`` and that no live writer
    holds (see the module's docstring); nothing while a writer holds the lock. Only files and
    directories owned by this process's user are removed.

    Returns:
        The paths removed.
    """
    if not directory.is_dir():
        return []
    try:
        with lock(directory / lock_name, wait=False) as state:
            if state == "busy":
                return []
            return _remove(directory, names, None if state == "held" else STALE_SECONDS)
    except OSError as error:  # a directory this user cannot write holds nothing of theirs to remove
        if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return []
        raise


def _remove(directory: Path, names: re.Pattern[str], older_than: float | None) -> list[Path]:
    """Remove this user's entries of ``directory`` matching ``names``: all of them, or those
    unchanged for ``older_than`` seconds."""
    removed = []
    now = time.time()
    for entry in os.scandir(directory):
        if not names.match(entry.name):
            continue
        stat = entry.stat(follow_symlinks=False)
        if stat.st_uid != os.geteuid():
            continue
        if older_than is not None and now - _last_change(entry, stat.st_mtime) < older_than:
            continue
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return sorted(removed)


def _last_change(entry: os.DirEntry[str], mtime: float) -> float:
    """The newest modification time of a file, or of a directory and the files in it."""
    if not entry.is_dir(follow_symlinks=False):
        return mtime
    with contextlib.suppress(OSError):
        children = [child.stat(follow_symlinks=False).st_mtime for child in os.scandir(entry.path)]
        mtime = max([mtime, *children])
    return mtime


def check_writable(field: str, path: Path, parent: bool = False) -> None:
    """Check that this process can create files in directory ``path`` (made if missing), or, with
    ``parent``, in the directory that holds ``path`` (a directory replaced whole, such as an
    export), by creating and removing an empty file there.

    Raises:
        PermissionError: ``"<field> <path>: cannot write there (<reason>)"``.
        DiskFullError: no space is left there to create a file.
    """
    directory = path.parent if parent else path
    probe = directory / temporary_name("write-test")
    try:
        make_directory(directory)
        probe.touch(exist_ok=False)
        probe.unlink()
    except OSError as error:
        if is_disk_full(error):
            raise DiskFullError(directory, free_bytes(directory), None) from None
        raise PermissionError(f"{field} {path}: cannot write there ({error.strerror})") from None
