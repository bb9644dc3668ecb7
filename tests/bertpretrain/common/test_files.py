"""bertpretrain.common.files on its own: what a failed write leaves, and the writability check (the full
disk, the locks and the durability are tested with the checkpoints and the export that use them)."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import BinaryIO

import pytest

from bertjob_api.files import format_size, is_disk_full, write_atomically
from bertpretrain.common import files


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out" / "state.json"
    write_atomically(target, lambda file: file.write(b"old"))
    assert target.read_bytes() == b"old"

    def fails_halfway(file: BinaryIO) -> None:
        file.write(b"new, but only ha")
        raise ValueError("the serializer failed")

    with pytest.raises(ValueError, match="the serializer failed"):  # not taken for a full disk
        write_atomically(target, fails_halfway)
    assert target.read_bytes() == b"old"
    assert [path.name for path in target.parent.iterdir()] == ["state.json"]


def test_a_full_disk_is_told_apart_from_other_errors() -> None:
    cut_short = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    cut_short.__context__ = OSError(errno.ENOSPC, "No space left on device")  # as torch.save raises it
    assert is_disk_full(cut_short)
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not is_disk_full(OSError(errno.EIO, "Input/output error"))
    assert not is_disk_full(RuntimeError("unexpected pos 704 vs 598"))


def test_check_writable_names_the_field(tmp_path: Path) -> None:
    files.check_writable("spec.checkpoint.path", tmp_path / "new" / "dir")
    assert (tmp_path / "new" / "dir").is_dir() and not list((tmp_path / "new" / "dir").iterdir())
    files.check_writable("spec.export.path", tmp_path / "exports" / "hf", parent=True)
    assert (tmp_path / "exports").is_dir() and not (tmp_path / "exports" / "hf").exists()
    (tmp_path / "a-file").write_text("")
    with pytest.raises(
        PermissionError,
        match=rf"^spec\.logging\.path {tmp_path}/a-file/logs: cannot write there \(Not a directory\)$",
    ):
        files.check_writable("spec.logging.path", tmp_path / "a-file" / "logs")


@pytest.mark.parametrize(
    ("count", "text"), [(0, "0 bytes"), (1023, "1023 bytes"), (1536, "1.5 KiB"), (5 << 30, "5.0 GiB")]
)
def test_format_size(count: int, text: str) -> None:
    assert format_size(count) == text
