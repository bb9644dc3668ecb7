"""HDF5 shards of training instances in NVIDIA DeepLearningExamples' BERT schema.

The schema of NVIDIA's ``create_pretraining_data.py`` (PyTorch/LanguageModeling/BERT), read by
its ``run_pretraining.py``; N instances per file, L = ``max_seq_length``, P =
``max_predictions_per_seq``, every dataset gzip-compressed:

=======================  ======  ======  ==============================================
dataset                  dtype   shape   content
=======================  ======  ======  ==============================================
``input_ids``            int32   [N, L]  token ids after masking, zero-padded
``input_mask``           int8    [N, L]  1 for real tokens, 0 for padding
``segment_ids``          int8    [N, L]  0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]``, 0 padding
``masked_lm_positions``  int32   [N, P]  masked positions, increasing, zero-padded
``masked_lm_ids``        int32   [N, P]  original ids at those positions, zero-padded
``next_sentence_labels`` int8    [N]     1 when B is a random next (Google's convention)
=======================  ======  ======  ==============================================

Position 0 holds ``[CLS]``, which is never masked, so a 0 in ``masked_lm_positions`` after the
first slot marks padding (NVIDIA's loader relies on this). Padding is 0 whatever the vocabulary's
``[PAD]`` id, as in NVIDIA's files; ``input_mask`` tells padding apart.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np

from bertpretrain.instances import TrainingInstance

SHARD_DTYPES: dict[str, type[np.integer]] = {
    "input_ids": np.int32,
    "input_mask": np.int8,
    "segment_ids": np.int8,
    "masked_lm_positions": np.int32,
    "masked_lm_ids": np.int32,
    "next_sentence_labels": np.int8,
}
# The other datasets hold one value per instance.
SEQUENCE_DATASETS = ("input_ids", "input_mask", "segment_ids")  # [N, max_seq_length]
PREDICTION_DATASETS = ("masked_lm_positions", "masked_lm_ids")  # [N, max_predictions_per_seq]


def shard_shapes(
    num_sequences: int, max_seq_length: int, max_predictions_per_seq: int
) -> dict[str, tuple[int, ...]]:
    """The shape of each dataset of a shard holding ``num_sequences`` instances."""
    widths = {
        **dict.fromkeys(SEQUENCE_DATASETS, max_seq_length),
        **dict.fromkeys(PREDICTION_DATASETS, max_predictions_per_seq),
    }
    return {
        name: (num_sequences, widths[name]) if name in widths else (num_sequences,) for name in SHARD_DTYPES
    }


def write_shard(
    path: Path, instances: Sequence[TrainingInstance], max_seq_length: int, max_predictions_per_seq: int
) -> None:
    """Write ``instances`` to the HDF5 file ``path`` (see the module docstring for the schema).

    The file is written as ``<path>.tmp`` and renamed, so that ``path`` is either absent or
    complete. An empty ``instances`` gives datasets with N = 0.

    Raises:
        ValueError: an instance is longer than ``max_seq_length`` or has more than
            ``max_predictions_per_seq`` masked positions.
    """
    shapes = shard_shapes(len(instances), max_seq_length, max_predictions_per_seq)
    arrays = {name: np.zeros(shapes[name], dtype=dtype) for name, dtype in SHARD_DTYPES.items()}
    for row, instance in enumerate(instances):
        length = len(instance.input_ids)
        predictions = len(instance.masked_lm_positions)
        if length > max_seq_length or predictions > max_predictions_per_seq:
            raise ValueError(
                f"{path}: instance {row} has {length} tokens and {predictions} masked positions, "
                f"more than max_seq_length {max_seq_length} or max_predictions_per_seq "
                f"{max_predictions_per_seq}"
            )
        arrays["input_ids"][row, :length] = instance.input_ids
        arrays["input_mask"][row, :length] = 1
        arrays["segment_ids"][row, :length] = instance.segment_ids
        arrays["masked_lm_positions"][row, :predictions] = instance.masked_lm_positions
        arrays["masked_lm_ids"][row, :predictions] = instance.masked_lm_ids
        arrays["next_sentence_labels"][row] = instance.is_random_next

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with h5py.File(tmp, "w") as file:
            for name, array in arrays.items():
                file.create_dataset(name, data=array, compression="gzip")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_shard(path: Path) -> dict[str, np.ndarray]:
    """All six datasets of a shard as NumPy arrays, keyed by dataset name (whole file in memory).

    Raises:
        ValueError: a dataset of the schema is missing, or has another dtype.
    """
    with h5py.File(path, "r") as file:
        arrays = {name: file[name][()] for name in file if isinstance(file[name], h5py.Dataset)}
    for name, dtype in SHARD_DTYPES.items():
        if name not in arrays or arrays[name].dtype != dtype:
            found = arrays[name].dtype if name in arrays else "missing"
            raise ValueError(f"{path}: dataset {name} should be {np.dtype(dtype)}, found {found}")
    return arrays
