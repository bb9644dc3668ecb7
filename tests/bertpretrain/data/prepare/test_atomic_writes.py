"""The data stage's files are written atomically and durably (bertjob_api.files): synced before they
are renamed into place, and the temporaries of a writer that was killed are removed when the stage
starts again."""

from __future__ import annotations

import errno
import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from bertjob_api.files import TEMPORARY, AtomicPath, DiskFullError
from bertpretrain.common.files import remove_stale, writing
from bertpretrain.data.format.shards import SHARD_DTYPES, read_shard
from bertpretrain.data.prepare import cache, documents, shard_writer
from bertpretrain.data.prepare.stage import prepare
from bertpretrain.data.prepare.vocab import import_vocab
from tests.bertpretrain.data.prepare.test_prepare import make_spec
from tests.bertpretrain.data.prepare.test_prepare_cache import write_corpus


def temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if TEMPORARY.match(p.name))


WIDTHS = {"input_ids": 8, "input_mask": 8, "segment_ids": 8, "masked_lm_positions": 2, "masked_lm_ids": 2}


def shard_arrays(rows: int) -> dict[str, np.ndarray]:
    """``rows`` rows of each dataset of the shard schema (sequences of 8, 2 predictions)."""
    return {
        name: np.ones((rows, WIDTHS[name]) if name in WIDTHS else (rows,), dtype)
        for name, dtype in SHARD_DTYPES.items()
    }


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths that os.fsync is called on (the file a descriptor names when it is synced)."""
    paths: list[str] = []
    real = os.fsync

    def fsync(descriptor: int) -> None:
        paths.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        real(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    return paths


def assert_synced(synced: list[str], path: Path) -> None:
    """``path`` was synced under a temporary name of its own, and so was its directory."""
    names = [Path(p).name for p in synced if Path(p).parent == path.parent]
    assert any(TEMPORARY.match(name) and name.startswith(f".{path.name}.tmp") for name in names), synced
    assert str(path.parent) in synced


def test_every_writer_of_the_data_stage_syncs_its_file(tmp_path: Path, synced: list[str]) -> None:
    cache.write_json(tmp_path / "metadata.json", {"instances": 3})
    assert_synced(synced, tmp_path / "metadata.json")

    piece = documents.empty()
    documents.save_piece(piece, tmp_path / "piece_000000.npz")
    assert_synced(synced, tmp_path / "piece_000000.npz")
    assert documents.load_piece(tmp_path / "piece_000000.npz").num_documents == 0

    shard_writer.write_shard(tmp_path / "shard_00000.hdf5", shard_arrays(3))
    assert_synced(synced, tmp_path / "shard_00000.hdf5")
    assert len(read_shard(tmp_path / "shard_00000.hdf5")["input_ids"]) == 3

    with shard_writer.ShardWriter(tmp_path / "shard_00001.hdf5", SHARD_DTYPES, WIDTHS, 4) as writer:
        writer.append(shard_arrays(5))
        writer.finish({"rows": 5})
    assert_synced(synced, tmp_path / "shard_00001.hdf5")

    vocab_file = tmp_path / "given.txt"
    vocab_file.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n", encoding="utf-8")
    out = tmp_path / "vocab"
    import_vocab(vocab_file, True, out)
    for name in ("vocab.txt", "tokenizer.json"):
        assert_synced(synced, out / name)
    assert Tokenizer.from_file(str(out / "tokenizer.json")).token_to_id("the") == 5
    assert (out / "vocab.txt").read_text().split() == vocab_file.read_text().split()
    assert temporaries(tmp_path) == [] and temporaries(out) == []


def test_a_shard_that_fails_midway_leaves_no_temporary(tmp_path: Path) -> None:
    with (
        pytest.raises(ValueError, match="a block needs the datasets"),
        shard_writer.ShardWriter(tmp_path / "shard_00000.hdf5", SHARD_DTYPES, WIDTHS, 4) as writer,
    ):
        writer.append(shard_arrays(5))
        assert temporaries(tmp_path)
        writer.append({"input_ids": np.zeros((1, 8))})
    bad = {**shard_arrays(3), "input_ids": np.ones((3, 8), object)}  # h5py cannot store objects
    with pytest.raises(TypeError):
        shard_writer.write_shard(tmp_path / "shard_00001.hdf5", bad)
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_is_named_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(DiskFullError, match=r"shard_00000\.hdf5: no space left on the device"):
        shard_writer.write_shard(tmp_path / "shard_00000.hdf5", shard_arrays(3))
    with (
        pytest.raises(DiskFullError, match=r"x\.bin: no space left"),
        AtomicPath(tmp_path / "x.bin", 10) as temporary,
    ):
        temporary.write_bytes(b"0123456789")
    assert list(tmp_path.iterdir()) == []


def _write_shard_until_killed(directory: Path, ready: Any) -> None:
    """A child process: the data stage's writer of ``directory``, killed in the middle of a shard."""
    with (
        writing(directory, TEMPORARY),
        shard_writer.ShardWriter(directory / "shard_00002.hdf5", SHARD_DTYPES, WIDTHS, 4) as writer,
        AtomicPath(directory / "metadata.json") as temporary,
    ):
        writer.append(shard_arrays(4))
        temporary.write_text("{")
        ready.set()
        # Killed here. (Not an Event to wait on: a process killed while waiting on a
        # multiprocessing Event leaves Event.set blocked forever.)
        while True:
            signal.pause()


def test_temporaries_of_a_killed_writer_are_removed_when_the_stage_starts_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = write_corpus(tmp_path / "corpus.txt", 0, 10)
    spec = make_spec(tmp_path / "out", [{"path": str(text)}], vocab={"trainSize": 300})
    directory = prepare(spec).phase_dirs[0]
    complete = read_shard(directory / "shard_00002.hdf5")
    (directory / "metadata.json").unlink()
    (directory / "shard_00002.hdf5").unlink()

    # spawn, not fork: this process has run the stage (tokenizers and tqdm threads), and a forked
    # child of a threaded process may deadlock.
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    child = context.Process(target=_write_shard_until_killed, args=(directory, ready))
    child.start()
    try:
        assert ready.wait(60), "the child never started writing"
        left = temporaries(directory)
        assert len(left) == 2
        # While the writer lives (it holds the directory's lock), the clean-up leaves its files alone.
        assert remove_stale(directory, TEMPORARY) == []
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
    finally:
        if child.is_alive():
            child.kill()
    assert child.exitcode == -signal.SIGKILL and temporaries(directory) == left

    capsys.readouterr()
    prepare(spec)
    assert temporaries(directory) == []
    output = capsys.readouterr().out
    assert all(
        f"data: removed {directory / name}, left by a writer that was stopped" in output for name in left
    )
    again = read_shard(directory / "shard_00002.hdf5")
    assert all(np.array_equal(again[name], complete[name]) for name in SHARD_DTYPES)
