"""Real volumes that are full or read-only: a tmpfs of a few hundred KiB mounted for each test
(skipped where this process may not mount one; the tests of checkpoint.py, export.py and
run.py inject the same errors everywhere)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from bertjob_api.contract import EXIT_DISK_FULL
from bertjob_api.files import DiskFullError, free_bytes
from bertjob_testing.jobs import small_training_job, with_value
from bertpretrain.model.config import BertConfig
from bertpretrain.run import main as bertpretrain_main
from tests.bertpretrain.training.test_checkpoint import Training

pytestmark = pytest.mark.usefixtures("one_thread")

Mount = Callable[..., Path]


@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator[Mount]:
    """``mount_tmpfs(name, size="256k", read_only=False)``: a tmpfs at ``tmp_path/name``, unmounted
    after the test."""
    mounted: list[Path] = []

    def mount(name: str, size: str = "256k", read_only: bool = False) -> Path:
        point = tmp_path / name
        point.mkdir()
        options = f"size={size},mode=0755" + (",ro" if read_only else "")
        command = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)]
        result = (
            subprocess.run(command, capture_output=True, text=True, check=False)
            if shutil.which("mount")
            else None
        )
        if result is None or result.returncode != 0:
            reason = result.stderr.strip() if result else "no mount command"
            pytest.skip(f"mounting a tmpfs is not permitted here ({reason})")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        # --lazy when a file is still open there (a failed test's traceback holds its frames).
        if subprocess.run(["umount", str(point)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "--lazy", str(point)], check=True)


def test_a_checkpoint_that_does_not_fit(mount_tmpfs: Mount, tiny_config: BertConfig) -> None:
    volume = mount_tmpfs("volume")
    training = Training(tiny_config, steps=1)
    for _ in range(2):  # the restart, on a volume as full as before, says the same
        with pytest.raises(DiskFullError) as error:
            training.save(volume, 5)
        assert str(error.value).startswith(f"{volume}/phase1/step_000005.pt: no space left on the device: ")
        assert error.value.free == free_bytes(volume) and error.value.needed is not None
        assert error.value.needed > error.value.free
        assert [path.name for path in (volume / "phase1").iterdir()] == [".lock"]  # no partial file


def _job(tmp_path: Path, checkpoints: Path) -> Path:
    """A one-phase job of 10 steps, its checkpoints (about 4.5 MiB each) and log on ``checkpoints``."""
    document = small_training_job(tmp_path, processes=1)
    document = with_value(document, "spec.phases", [{**document["spec"]["phases"][0], "steps": 10}])
    document = with_value(document, "spec.checkpoint.path", str(checkpoints))
    # Off: the message tested is the checkpoint's, and TensorBoard's events on the same volume
    # could be the first write that does not fit (the test below fills TensorBoard's volume).
    document = with_value(document, "spec.logging.tensorboard", False)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(document))
    return job


@pytest.mark.slow
def test_a_run_whose_checkpoint_does_not_fit_exits_to_be_retried(
    tmp_path: Path, mount_tmpfs: Mount, capsys: pytest.CaptureFixture[str]
) -> None:
    volume = mount_tmpfs("volume", size="2m")
    job = _job(tmp_path, volume / "checkpoints")
    assert bertpretrain_main(["run", "--config", str(job)]) == EXIT_DISK_FULL
    error = _message(capsys.readouterr().err)
    assert error.startswith(
        f"bertpretrain run: {volume}/checkpoints/phase1/step_000010.pt: no space left on the device: "
    ), error
    assert not list((volume / "checkpoints" / "phase1").glob(".step_*")), "a partial file was left"

    # A fresh start on a volume that another job's files fill to the last byte: the first write,
    # the log's first line, fails, and Python's error names no file.
    shutil.rmtree(volume / "checkpoints")
    filler = volume / "other-job.bin"
    with filler.open("wb", buffering=0) as file, pytest.raises(OSError, match="No space left"):
        while True:
            file.write(b"\0" * 4096)
    assert bertpretrain_main(["run", "--config", str(job)]) == EXIT_DISK_FULL
    error = _message(capsys.readouterr().err)
    assert error.startswith("bertpretrain run: [Errno 28] No space left on device (free space: "), error
    assert f"spec.checkpoint.path {volume}/checkpoints: 0 bytes," in error


@pytest.mark.slow
def test_a_full_disk_under_tensorboard_exits_to_be_retried(
    tmp_path: Path, mount_tmpfs: Mount, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "logs").mkdir()
    volume = mount_tmpfs("logs/tensorboard", size="64k")
    document = small_training_job(tmp_path)
    document = with_value(document, "spec.logging", {"path": str(tmp_path / "logs"), "everySteps": 1})
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(document))
    # Another job's file leaves one page: the first events fit, a later one does not.
    filler = volume / "other-job.bin"
    with filler.open("wb", buffering=0) as file, pytest.raises(OSError, match="No space left"):
        while True:
            file.write(b"\0" * 4096)
    os.truncate(filler, filler.stat().st_size - 4096)

    assert bertpretrain_main(["run", "--config", str(job)]) == EXIT_DISK_FULL
    error = _message(capsys.readouterr().err)
    [events] = volume.glob("events.out.tfevents.*")
    assert error.startswith(f"bertpretrain run: {events}: no space left on the device: "), error
    assert error.endswith("(TensorBoard's event file was closed at its last whole event)"), error
    open_files = [os.readlink(fd) for fd in Path("/proc/self/fd").iterdir() if fd.is_symlink()]
    assert not [path for path in open_files if path.startswith(str(volume))], "a file is left open"
    # What was written before is whole: TensorBoard reads the losses the JSON-lines log has.
    scalars = EventAccumulator(str(volume))
    scalars.Reload()
    losses = [event.value for event in scalars.Scalars("phase1/train/loss")]
    logged = [json.loads(line) for line in (tmp_path / "logs" / "train.jsonl").read_text().splitlines()]
    train = [
        line["data"]["loss"] for line in logged if line["type"] == "LOG" and line["data"]["split"] == "train"
    ]
    assert 0 < len(losses) < len(train) and losses == pytest.approx(train[: len(losses)])


def _message(stderr: str) -> str:
    """The one line of the trainer's own on ``stderr`` (the data stage's progress bars aside)."""
    assert "Traceback" not in stderr, stderr
    [line] = [line for line in stderr.splitlines() if line.startswith("bertpretrain")]
    return line


def test_a_read_only_volume_is_named_before_any_work(
    tmp_path: Path, mount_tmpfs: Mount, capsys: pytest.CaptureFixture[str]
) -> None:
    volume = mount_tmpfs("volume", read_only=True)
    job = _job(tmp_path, volume / "checkpoints")
    assert bertpretrain_main(["run", "--config", str(job)]) == 1
    assert capsys.readouterr().err == (
        f"bertpretrain run: spec.checkpoint.path {volume}/checkpoints: cannot write there "
        "(Read-only file system)\n"
    )
    assert not (tmp_path / "data" / "vocab").exists()
