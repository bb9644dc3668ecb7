"""The TensorBoard writer: events TensorBoard's own reader takes, and a full disk (injected here;
tests/bertpretrain/test_volumes.py fills a real tmpfs) that closes the file at its last whole event."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from bertpretrain.training.tensorboard import ScalarWriter, TensorBoardDiskFullError


def _scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar under ``directory``, by tag, as TensorBoard reads them: ``(step, value)``."""
    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_reads_the_scalars_back(tmp_path: Path) -> None:
    writer = ScalarWriter(tmp_path / "tensorboard")
    writer.add_scalars(5, {"phase1/train/loss": 7.5, "phase1/train/learning_rate": 0.25})
    writer.add_scalars(10, {"phase1/train/loss": 6.5, "phase1/train/learning_rate": 0.5})
    writer.close()
    writer.close()
    assert _scalars(tmp_path / "tensorboard") == {
        "phase1/train/loss": [(5, 7.5), (10, 6.5)],
        "phase1/train/learning_rate": [(5, 0.25), (10, 0.5)],
    }
    with pytest.raises(ValueError, match="the TensorBoard writer is closed"):
        writer.add_scalars(15, {"phase1/train/loss": 6.0})


def test_a_second_writer_starts_a_file_of_its_own(tmp_path: Path) -> None:
    for step in (5, 10):  # a resumed run
        writer = ScalarWriter(tmp_path)
        writer.add_scalars(step, {"loss": float(step)})
        writer.close()
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    assert _scalars(tmp_path) == {"loss": [(5, 5.0), (10, 10.0)]}


class _FillsUp:
    """A file whose writes fail with ENOSPC once ``room`` bytes are written; the bytes that fit
    reach the real file, as a short write on a full volume leaves them."""

    def __init__(self, file, room: int):
        self._file, self._room = file, room

    def write(self, data: bytes) -> int:
        fits = data[: max(self._room, 0)]
        self._file.write(fits)
        self._room -= len(data)
        if len(fits) < len(data):
            self._file.flush()
            raise OSError(errno.ENOSPC, "No space left on device")
        return len(data)

    def __getattr__(self, name: str):
        return getattr(self._file, name)


def test_a_full_disk_closes_the_file_at_its_last_whole_event(tmp_path: Path) -> None:
    writer = ScalarWriter(tmp_path)
    writer.add_scalars(5, {"loss": 7.0})
    whole = writer.path.stat().st_size
    writer._records._writer = _FillsUp(writer._file, room=10)  # the volume fills
    with pytest.raises(TensorBoardDiskFullError) as error:
        writer.add_scalars(10, {"loss": 6.0})
    assert error.value.errno == errno.ENOSPC and error.value.path == writer.path
    assert str(error.value).startswith(f"{writer.path}: no space left on the device: ")
    assert str(error.value).endswith("(TensorBoard's event file was closed at its last whole event)")
    assert writer._file.closed
    assert writer.path.stat().st_size == whole  # the torn event is cut off
    assert _scalars(tmp_path) == {"loss": [(5, 7.0)]}
    writer.close()  # the training loop's clean-up closes it again, quietly


def test_other_write_errors_are_not_a_full_disk(tmp_path: Path) -> None:
    writer = ScalarWriter(tmp_path)

    def broken(data: bytes) -> int:
        raise OSError(errno.EIO, "Input/output error")

    writer._records._writer.write = broken
    with pytest.raises(OSError) as error:
        writer.add_scalars(5, {"loss": 7.0})
    assert not isinstance(error.value, TensorBoardDiskFullError) and error.value.errno == errno.EIO
    assert writer._file.closed
