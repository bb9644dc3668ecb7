"""Files replaced in one rename, durably: what the API's generators and the trainer both write.

- :func:`write_atomically` writes a file under a temporary name beside it, ``fsync``\\ s it,
  renames it into place and ``fsync``\\ s the directory, so that a reader never sees half a file
  and the rename survives a power cut (rename(2) is atomic, but durable only once the directory
  is synced). New files get mode ``0o666`` less the umask, as any file a program creates; with
  ``keep_mode`` (a generated file kept in git) the file keeps the permissions of the one it
  replaces, ``0o644`` when new. :func:`write_text` is that for UTF-8 text.
- A full disk (``ENOSPC``, or ``EDQUOT`` for a quota) becomes :class:`DiskFullError`, one line
  naming the file, the free space and the size needed, with the partial file removed; the
  trainer's entry point exits with :data:`bertjob_api.contract.EXIT_DISK_FULL`, which Kubeflow
  retries (a volume can be grown).
- Temporaries are named by :func:`temporary_name` (matched by :data:`TEMPORARY`), unique among
  writers on any host, so that the trainer can tell those that dead writers left
  (``bertpretrain.common.files``, which holds the locks and the clean-up).

Standard library only: the API package imports no torch (a checkpoint's ``torch.save`` is one
``write`` callable among others).
"""

from __future__ import annotations

import errno
import io
import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# The mode of a new file written with keep_mode: what git checks a file out with.
NEW_FILE_MODE = 0o644


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


def write_atomically(
    path: Path, write: Callable[[BinaryIO], object], size: int | None = None, *, keep_mode: bool = False
) -> None:
    """Write ``path`` through ``write(file)`` under a temporary name, then move it into place.

    The file is synced before the rename and its directory after it (made first if missing, its
    parents synced too). ``size``: what the file will take, in bytes, for the message of a full
    disk. ``keep_mode``: the file keeps the permissions of the one it replaces (:data:`NEW_FILE_MODE`
    when there is none), rather than ``0o666`` less the umask.

    Raises:
        DiskFullError: the device ran out of space or quota; the temporary is removed.
        OSError: any other failure to write (the temporary is removed), and what ``write`` raises.
    """
    directory = path.parent
    make_directory(directory)
    temporary = directory / temporary_name(path.name)
    mode = None
    if keep_mode:
        mode = path.stat().st_mode & 0o777 if path.exists() else NEW_FILE_MODE
    raw = None
    try:
        raw = _RecordingFile(temporary, "xb")  # O_EXCL, mode 0o666 less the umask
        with io.BufferedWriter(raw) as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException as error:
        if raw is not None:
            raw.close()
        temporary.unlink(missing_ok=True)
        if is_disk_full(error) or (raw is not None and raw.error is not None and is_disk_full(raw.error)):
            raise DiskFullError(path, free_bytes(directory), size) from None
        raise
    fsync_directory(directory)


class AtomicPath:
    """A file written at a temporary path and moved into place whole, as :func:`write_atomically`
    does, for writers that take a path rather than a file object (h5py, a tokenizer's ``save``).

    ``temporary`` (named by :func:`temporary_name`, beside ``path``, whose directory is made if
    missing) is what the writer writes. :meth:`commit` syncs it, renames it to ``path`` and syncs the
    directory; :meth:`discard` removes it. As a context manager it yields ``temporary`` and commits
    when the block ends normally, discards when it raises. ``size``: what the file will take, in
    bytes, for the message of a full disk.

    Raises:
        DiskFullError: (from :meth:`commit` or the end of the block) the device ran out of space or
            quota while the file was written or synced; the temporary is removed.
    """

    def __init__(self, path: Path, size: int | None = None):
        self.path, self.size = Path(path), size
        make_directory(self.path.parent)
        self.temporary = self.path.parent / temporary_name(self.path.name)

    def commit(self) -> None:
        """Sync the temporary, rename it to ``path`` and sync the directory."""
        try:
            descriptor = os.open(self.temporary, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            os.replace(self.temporary, self.path)
        except BaseException as error:
            self._failed(error)
            raise
        fsync_directory(self.path.parent)

    def discard(self) -> None:
        """Remove the temporary, if it is there."""
        self.temporary.unlink(missing_ok=True)

    def _failed(self, error: BaseException) -> None:
        self.discard()
        if is_disk_full(error):
            raise DiskFullError(self.path, free_bytes(self.path.parent), self.size) from None

    def __enter__(self) -> Path:
        return self.temporary

    def __exit__(self, kind: object, error: BaseException | None, traceback: object) -> None:
        if error is None:
            self.commit()
        else:
            self._failed(error)


def write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) through :func:`write_atomically`, keeping the file's
    permissions (:data:`NEW_FILE_MODE` when new): a generated file in the repository.

    Raises:
        DiskFullError: the device ran out of space or quota; the old file is left whole.
        OSError: any other failure to write; the old file is left whole.
    """
    data = text.encode("utf-8")
    write_atomically(path, lambda file: file.write(data), len(data), keep_mode=True)


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
