"""TensorBoard scalars, written in the caller's thread so that a full disk stops the run cleanly.

``torch.utils.tensorboard.SummaryWriter`` writes from a background thread: on a full volume that
thread dies with a traceback, its event file left open (the volume stays busy), and the error
reaches the training loop only at some later call, or never. This writer uses TensorBoard's own
record format (``tensorboard.summary.writer.record_writer.RecordWriter``: length, masked CRC-32C,
``Event`` protobuf, CRC) and flushes each event where it is logged, once per ``logging.everySteps``
optimizer steps, a few hundred bytes. A write that does not fit closes the file, cuts it back to
its last whole event and raises :class:`TensorBoardDiskFullError`, which the trainer's entry point
reports in one line and exits with ``EXIT_DISK_FULL`` (200), as for its other files.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Mapping
from itertools import count
from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.record_writer import RecordWriter

from bertjob_api.files import DiskFullError, format_size, free_bytes, is_disk_full

# TensorBoard reads every file whose name holds "tfevents"; this is the name its writers give.
EVENT_FILE_PREFIX = "events.out.tfevents"
_files = count()


class TensorBoardDiskFullError(DiskFullError):
    """The volume of ``path`` (an event file) filled up while an event was written; the file is
    closed and keeps every event before that one. ``free`` and ``needed`` in bytes."""

    def __str__(self) -> str:
        needed = f", {format_size(self.needed)} needed" if self.needed is not None else ""
        return (
            f"{self.path}: no space left on the device: {format_size(self.free)} free{needed} "
            "(TensorBoard's event file was closed at its last whole event)"
        )


class ScalarWriter:
    """Appends scalar events to a new event file ``directory/events.out.tfevents.<s>.<host>.<pid>.<n>``
    (a resumed run starts a new file beside the old ones, as TensorBoard's writers do).

    Raises:
        OSError: the directory cannot be created or the file opened.
        TensorBoardDiskFullError: the first event does not fit.
    """

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        name = (
            f"{EVENT_FILE_PREFIX}.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_files)}"
        )
        self.path = directory / name
        self._file = self.path.open("xb")
        self._records = RecordWriter(self._file)
        self._whole_bytes = 0  # the file's size after its last whole event
        self._write(Event(wall_time=time.time(), file_version="brain.Event:2"))

    def add_scalars(self, step: int, values: Mapping[str, float]) -> None:
        """One event at optimizer step ``step`` holding each of ``values`` as the scalar of its
        tag (``phase1/train/loss``).

        Raises:
            TensorBoardDiskFullError: the event does not fit; the file is closed, nothing more is written.
            ValueError: the writer is closed.
        """
        summary = Summary(value=[Summary.Value(tag=tag, simple_value=value) for tag, value in values.items()])
        self._write(Event(wall_time=time.time(), step=step, summary=summary))

    def close(self) -> None:
        """Close the file (its events are flushed already); closing twice does nothing."""
        self._file.close()

    def _write(self, event: Event) -> None:
        if self._file.closed:
            raise ValueError(f"{self.path}: the TensorBoard writer is closed")
        data = event.SerializeToString()
        try:
            self._records.write(data)
            self._records.flush()
        except OSError as error:
            self._abandon()
            if is_disk_full(error):
                raise TensorBoardDiskFullError(self.path, free_bytes(self.path.parent), len(data)) from None
            raise
        self._whole_bytes = self._file.tell()

    def _abandon(self) -> None:
        """Close the file whatever its buffer holds, then cut off the torn event: a smaller size
        never needs space, and a reader that stops at a torn record would miss nothing else."""
        with contextlib.suppress(OSError):  # close flushes again, which may fail; it closes anyway
            self._file.close()
        with contextlib.suppress(OSError):
            os.truncate(self.path, self._whole_bytes)
