"""HDF5 shards: NVIDIA's schema, attributes, atomic writes and clear errors."""

from __future__ import annotations

import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from bertpretrain.data.shards import SHARD_DTYPES, read_attrs, read_shard, shard_shapes, write_shard

L, P = 32, 5


def arrays(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = shard_shapes(rows, L, P)
    return {name: rng.integers(0, 100, shapes[name]).astype(dtype) for name, dtype in SHARD_DTYPES.items()}


def test_shard_round_trips_with_nvidias_datasets_and_attributes(tmp_path: Path) -> None:
    written = arrays(7)
    write_shard(tmp_path / "shard.hdf5", written, {"instances": 7, "padding": 0.25})
    with h5py.File(tmp_path / "shard.hdf5") as file:
        assert set(file) == set(SHARD_DTYPES)
        assert all(file[name].compression == "gzip" for name in file)
    read = read_shard(tmp_path / "shard.hdf5")
    assert all(np.array_equal(read[name], written[name]) and read[name].dtype == written[name].dtype
               for name in SHARD_DTYPES)  # fmt: skip
    assert read_attrs(tmp_path / "shard.hdf5") == {"instances": 7, "padding": 0.25}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard.hdf5"]


def test_empty_shard_has_no_rows(tmp_path: Path) -> None:
    write_shard(tmp_path / "empty.hdf5", arrays(0))
    read = read_shard(tmp_path / "empty.hdf5")
    assert read["input_ids"].shape == (0, L) and read["next_sentence_labels"].shape == (0,)


def test_ragged_arrays_are_refused_and_nothing_written(tmp_path: Path) -> None:
    ragged = {**arrays(4), "next_sentence_labels": np.zeros(3, np.int8)}
    with pytest.raises(ValueError, match=r"shard\.hdf5: datasets of different lengths"):
        write_shard(tmp_path / "shard.hdf5", ragged)
    assert list(tmp_path.iterdir()) == []


def test_wrong_dtype_is_named(tmp_path: Path) -> None:
    write_shard(tmp_path / "shard.hdf5", {**arrays(2), "input_ids": arrays(2)["input_ids"].astype(np.int64)})
    with pytest.raises(ValueError, match=r"shard\.hdf5: dataset input_ids should be int32, found int64"):
        read_shard(tmp_path / "shard.hdf5")


def test_datasets_carry_checksums_in_chunks_of_whole_rows(tmp_path: Path) -> None:
    write_shard(tmp_path / "shard.hdf5", arrays(300))
    with h5py.File(tmp_path / "shard.hdf5") as file:
        for name in SHARD_DTYPES:
            assert file[name].fletcher32, name
            assert file[name].chunks[1:] == file[name].shape[1:], name


def test_damaged_data_fails_its_checksum_naming_file_and_dataset(tmp_path: Path, damage_shard) -> None:
    path = tmp_path / "shard.hdf5"
    write_shard(path, arrays(300))
    damage_shard(path, "masked_lm_ids")
    with pytest.raises(
        OSError, match=rf"{re.escape(str(path))}: dataset masked_lm_ids cannot be read, the file is damaged"
    ):
        read_shard(path)
