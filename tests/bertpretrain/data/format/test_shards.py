"""HDF5 shards: NVIDIA's schema, attributes, atomic writes and clear errors."""

from __future__ import annotations

import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from bertpretrain.data.format.shards import (
    DYNAMIC_DTYPES,
    NEXT_SENTENCE_LABELS,
    SHARD_DTYPES,
    read_attrs,
    read_datasets,
    read_shard,
    shard_shapes,
    storage_dtypes,
    without_next_sentence_labels,
)
from bertpretrain.data.prepare.shard_writer import ShardWriter, write_shard

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


def _widths() -> dict[str, int]:
    return {name: shape[1] for name, shape in shard_shapes(0, L, P).items() if len(shape) == 2}


def test_shard_writer_appends_blocks_into_one_file_of_whole_chunks(tmp_path: Path) -> None:
    blocks = [arrays(64, seed) for seed in range(3)] + [arrays(10, 3)]
    path = tmp_path / "shard.hdf5"
    with ShardWriter(path, SHARD_DTYPES, _widths(), block_rows=64) as writer:
        for block in blocks:
            assert not path.exists()  # only the temporary file until finish
            writer.append(block)
        writer.finish({"instances": writer.rows})
    read = read_shard(path)
    for name in SHARD_DTYPES:
        assert np.array_equal(read[name], np.concatenate([block[name] for block in blocks])), name
    with h5py.File(path) as file:
        for name in SHARD_DTYPES:
            rows = file[name].chunks[0]
            # Powers of two that divide the block, so each full block writes whole chunks.
            assert rows & (rows - 1) == 0 and 64 % rows == 0, (name, rows)
            assert file[name].fletcher32 and file[name].compression == "gzip", name
    assert read_attrs(path) == {"instances": 202}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard.hdf5"]


def test_shard_writer_leaves_nothing_when_the_block_fails(tmp_path: Path) -> None:
    path = tmp_path / "shard.hdf5"
    with (
        pytest.raises(ValueError, match=r"shard\.hdf5: a block needs the datasets"),
        ShardWriter(path, SHARD_DTYPES, _widths(), block_rows=64) as writer,
    ):
        writer.append(arrays(8))
        writer.append({name: array for name, array in arrays(8).items() if name != "masked_lm_ids"})
    assert list(tmp_path.iterdir()) == []


def test_storage_dtypes_are_the_narrowest_that_hold_ids_and_positions() -> None:
    bert = storage_dtypes(SHARD_DTYPES, 30522, 128)
    assert (bert["input_ids"], bert["masked_lm_ids"], bert["masked_lm_positions"]) == (
        np.uint16, np.uint16, np.uint8,
    )  # fmt: skip
    assert bert["input_mask"] == bert["segment_ids"] == bert["next_sentence_labels"] == np.int8
    assert storage_dtypes(SHARD_DTYPES, 65536, 256)["input_ids"] == np.uint16
    assert storage_dtypes(SHARD_DTYPES, 65536, 256)["masked_lm_positions"] == np.uint8
    wide = storage_dtypes(SHARD_DTYPES, 65537, 257)
    assert wide["input_ids"] == np.uint32 and wide["masked_lm_positions"] == np.uint16
    assert set(storage_dtypes(DYNAMIC_DTYPES, 30522, 128)) == set(DYNAMIC_DTYPES)
    with pytest.raises(ValueError, match="vocab_size 0"):
        storage_dtypes(SHARD_DTYPES, 0, 128)


def test_narrow_shards_read_back_in_the_schemas_dtypes(tmp_path: Path) -> None:
    block = arrays(64)
    block["input_ids"][0, :3] = [0, 30521, 65535]  # the ends of uint16
    block["masked_lm_positions"][0, :2] = [0, L - 1]
    path = tmp_path / "shard.hdf5"
    with ShardWriter(path, storage_dtypes(SHARD_DTYPES, 65536, L), _widths(), block_rows=64) as writer:
        writer.append(block)
        writer.finish()
    with h5py.File(path) as file:
        assert file["input_ids"].dtype == np.uint16 and file["masked_lm_positions"].dtype == np.uint8
        assert not file["input_ids"].shuffle and file["input_ids"].fletcher32
        # What NVIDIA's loader does with each dataset.
        assert np.array_equal(file["input_ids"][()].astype(np.int64), block["input_ids"])
    for read in (read_shard(path), read_datasets(path, SHARD_DTYPES)):
        for name, dtype in SHARD_DTYPES.items():
            assert read[name].dtype == dtype and np.array_equal(read[name], block[name]), name
    assert read_datasets(path, ["input_ids"])["input_ids"].dtype == np.uint16  # no schema: as stored


def test_shards_of_objective_mlm_read_without_next_sentence_labels(tmp_path: Path) -> None:
    written = arrays(5)
    mlm = without_next_sentence_labels(SHARD_DTYPES)
    assert set(mlm) == set(SHARD_DTYPES) - {NEXT_SENTENCE_LABELS}
    assert set(without_next_sentence_labels(DYNAMIC_DTYPES)) == set(DYNAMIC_DTYPES) - {NEXT_SENTENCE_LABELS}
    write_shard(tmp_path / "mlm.hdf5", {name: written[name] for name in mlm})
    read = read_shard(tmp_path / "mlm.hdf5", next_sentence_prediction=False)
    assert set(read) == set(mlm)
    assert all(
        np.array_equal(read[name], written[name]) and read[name].dtype == dtype for name, dtype in mlm.items()
    )
    # Next sentence prediction needs the labels; without it, those of an mlm-nsp shard are left out.
    with pytest.raises(
        ValueError, match=r"mlm\.hdf5: dataset next_sentence_labels should be int8, found missing"
    ):
        read_shard(tmp_path / "mlm.hdf5")
    write_shard(tmp_path / "nsp.hdf5", written)
    assert set(read_shard(tmp_path / "nsp.hdf5", next_sentence_prediction=False)) == set(mlm)
