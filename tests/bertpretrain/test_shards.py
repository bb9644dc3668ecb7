"""HDF5 shards in NVIDIA DeepLearningExamples' schema."""

from __future__ import annotations

import random
from pathlib import Path

import h5py
import numpy as np
import pytest

from bertpretrain.instances import InstanceParams, TrainingInstance, create_training_instances
from bertpretrain.shards import read_shard, write_shard
from bertpretrain.vocab import SpecialIds

SPECIAL = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
L, P = 32, 5
SCHEMA = {
    "input_ids": (np.int32, L),
    "input_mask": (np.int8, L),
    "segment_ids": (np.int8, L),
    "masked_lm_positions": (np.int32, P),
    "masked_lm_ids": (np.int32, P),
    "next_sentence_labels": (np.int8, None),
}


@pytest.fixture
def instances() -> list[TrainingInstance]:
    rng = random.Random(0)
    documents = [
        [[rng.randint(5, 499) for _ in range(rng.randint(3, 12))] for _ in range(8)] for _ in range(6)
    ]
    return create_training_instances(documents, InstanceParams(L, P, dupe_factor=2), SPECIAL, 500, rng)


def test_shard_has_exactly_nvidias_datasets(instances: list[TrainingInstance], tmp_path: Path) -> None:
    path = tmp_path / "shard_00000.hdf5"
    write_shard(path, instances, L, P)
    n = len(instances)
    with h5py.File(path, "r") as file:
        assert sorted(file.keys()) == sorted(SCHEMA)
        for name, (dtype, width) in SCHEMA.items():
            assert file[name].dtype == dtype, name
            assert file[name].shape == ((n,) if width is None else (n, width)), name
            assert file[name].compression == "gzip", name
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no .tmp left behind


def test_shard_rows_hold_the_instances_zero_padded(instances: list[TrainingInstance], tmp_path: Path) -> None:
    path = tmp_path / "shard.hdf5"
    write_shard(path, instances, L, P)
    arrays = read_shard(path)
    for row, instance in enumerate(instances):
        n, k = len(instance.input_ids), len(instance.masked_lm_positions)
        assert arrays["input_ids"][row].tolist() == instance.input_ids + [0] * (L - n)
        assert arrays["input_mask"][row].tolist() == [1] * n + [0] * (L - n)
        assert arrays["segment_ids"][row].tolist() == instance.segment_ids + [0] * (L - n)
        assert arrays["masked_lm_positions"][row].tolist() == instance.masked_lm_positions + [0] * (P - k)
        assert arrays["masked_lm_ids"][row].tolist() == instance.masked_lm_ids + [0] * (P - k)
        assert arrays["next_sentence_labels"][row] == int(instance.is_random_next)
    # [CLS] first and never masked, so a 0 position marks padding.
    assert (arrays["input_ids"][:, 0] == SPECIAL.cls).all()
    assert (arrays["masked_lm_positions"][:, 0] > 0).all()
    assert set(np.unique(arrays["next_sentence_labels"])) == {0, 1}


def test_empty_shard_has_no_rows(tmp_path: Path) -> None:
    write_shard(tmp_path / "empty.hdf5", [], L, P)
    arrays = read_shard(tmp_path / "empty.hdf5")
    assert arrays["input_ids"].shape == (0, L) and arrays["next_sentence_labels"].shape == (0,)


def test_instance_too_long_is_refused_and_nothing_written(tmp_path: Path) -> None:
    long = TrainingInstance([SPECIAL.cls, *range(5, 5 + L), SPECIAL.sep], [0] * (L + 2), [1], [5], False)
    with pytest.raises(ValueError, match=r"shard\.hdf5: instance 0 has 34 tokens"):
        write_shard(tmp_path / "shard.hdf5", [long], L, P)
    assert list(tmp_path.iterdir()) == []


def test_read_shard_checks_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "foreign.hdf5"
    with h5py.File(path, "w") as file:
        for name, (_, width) in SCHEMA.items():
            file.create_dataset(name, data=np.zeros((2,) if width is None else (2, width), dtype=np.int64))
    with pytest.raises(ValueError, match=r"foreign\.hdf5: dataset input_ids should be int32, found int64"):
        read_shard(path)
