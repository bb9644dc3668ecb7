"""Output files that survive crashes, power cuts and full disks.

- :func:`write_atomically` writes a file under a temporary name beside it, ``fsync``\\ s it,
  renames it into place and ``fsync``\\ s the directory, so that a reader never sees half a file
  and the rename survives a power cut (rename(2) is atomic, but durable only once the directory
  is synced). New files get mode ``0o666`` less the umask, as any file a program creates.
- A full disk (``ENOSPC``, or ``EDQUOT`` for a quota) becomes :class:`DiskFullError`, one line
  naming the file, the free space and the size needed, with the partial file removed; the entry
  point exits with :data:`DISK_FULL_EXIT_CODE`, which Kubeflow retries (a volume can be grown).
- Writers of a directory hold an exclusive ``flock`` on a lock file in it while their
  temporaries exist. A process that gets the lock therefore knows that the temporaries it finds
  were left by writers that died (SIGKILL, a lost node: the kernel or the NFS server releases a
  dead process's locks), whichever pod or host they ran on, and removes them
  (:func:`writing`, :func:`remove_stale`). Where the file system has no locks, only temporaries
  untouched for :data:`STALE_SECONDS` are removed: a writer that is alive keeps changing its file.
- :func:`check_writable`: a directory the job will write, tried before any work is done.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Literal

from bertjob_api.contract import EXIT_DISK_FULL

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

# Exit code for a full volume (200), which the children's restartPolicy retries: the contract's.
DISK_FULL_EXIT_CODE = EXIT_DISK_FULL
# Where file locks are missing: a temporary unchanged this long has no live writer.
STALE_SECONDS = 3600.0
LOCK_FILE = ".lock"
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# Errors of flock(2) on file systems without locks (NFS without lockd, some FUSE file systems).
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL)

LockState = Literal["held", "busy", "unsupported"]


class DiskFullError(OSError):
    """No space (or quota) left on the device while writing ``path``; the partial file is gone.

    ``free`` is the space left afterwards and ``needed`` the size of what was being written
    (None when not known), in bytes.
    """

    def __init__(self, path: Path, free: int, needed: int | None):
        super().__init__(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        self.path, self.free, self.needed = path, free, needed

    def __str__(self) -> str:
        needed = f", {format_size(self.needed)} needed" if self.needed is not None else ""
        return (
            f"{self.path}: no space left on the device: {format_size(self.free)} free{needed} "
            "(the partial file was removed)"
        )


def format_size(count: int) -> str:
    """``count`` bytes for people: ``512 bytes``, ``3.2 MiB``."""
    if count < 1024:
        return f"{count} bytes"
    value = count / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged process may still write on the file system of ``path`` (or of its
    nearest existing parent)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from or during, is ENOSPC or EDQUOT."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError) and current.errno in _DISK_FULL:
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


class _RecordingFile(io.FileIO):
    """A raw file that keeps the OSError its last failed write raised: torch.save reports a failed
    write as a RuntimeError (``unexpected pos``) that may not carry the errno."""

    error: OSError | None = None

    def write(self, buffer: ReadableBuffer, /) -> int:
        try:
            return super().write(buffer)
        except OSError as error:
            self.error = error
            raise


def temporary_name(name: str) -> str:
    """A hidden name for a temporary of ``name``, unique among writers on any host."""
    return f".{name}.tmp{os.getpid()}.{secrets.token_hex(4)}"


# What temporary_name makes (and, without the random part, what earlier versions made).
TEMPORARY = re.compile(r"^\..+\.tmp\d+(\.[0-9a-f]{8})?$")


def write_atomically(path: Path, write: Callable[[BinaryIO], object], size: int | None = None) -> None:
    """Write ``path`` through ``write(file)`` under a temporary name, then move it into place.

    The file is synced before the rename and its directory after it (made first if missing, its
    parents synced too). ``size``: what the file will take, in bytes, for the message of a full
    disk.

    Raises:
        DiskFullError: the device ran out of space or quota; the temporary is removed.
        OSError: any other failure to write (the temporary is removed), and what ``write`` raises.
    """
    directory = path.parent
    make_directory(directory)
    temporary = directory / temporary_name(path.name)
    raw = None
    try:
        raw = _RecordingFile(temporary, "xb")  # O_EXCL, mode 0o666 less the umask
        with io.BufferedWriter(raw) as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        if raw is not None:
            raw.close()
        temporary.unlink(missing_ok=True)
        if is_disk_full(error) or (raw is not None and raw.error is not None and is_disk_full(raw.error)):
            raise DiskFullError(path, free_bytes(directory), size) from None
        raise
    fsync_directory(directory)


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


def fsync_directory(directory: Path) -> None:
    """Make the entries of ``directory`` (a rename, a new file) durable; a no-op on file systems
    that cannot sync a directory."""
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(descriptor)


def make_directory(directory: Path) -> None:
    """``mkdir -p directory``, syncing the parent of each directory it creates."""
    missing = []
    while not directory.exists() and directory != directory.parent:
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        path.mkdir(exist_ok=True)
        fsync_directory(path.parent)


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
