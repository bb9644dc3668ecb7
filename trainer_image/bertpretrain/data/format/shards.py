"""HDF5 shards of training instances in NVIDIA DeepLearningExamples' BERT schema.

The schema of NVIDIA's ``create_pretraining_data.py`` (PyTorch/LanguageModeling/BERT), read by
its ``run_pretraining.py``; N instances per file, L = ``max_seq_length``, P =
``max_predictions_per_seq``, every dataset gzip-compressed (with a fletcher32 checksum per chunk
from :data:`SHARD_FORMAT` 2 on):

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

Shards made for the objective ``mlm`` (masked LM alone, on single segments ``[CLS] A [SEP]``:
``segment_ids`` all 0) have no sentence pairs, hence no ``next_sentence_labels`` dataset
(:data:`NEXT_SENTENCE_LABELS`): a reader that trains next sentence prediction finds it missing
instead of training on labels that mean nothing. NVIDIA's loader needs it, so only the shards of
``mlm-nsp`` are NVIDIA's format.

The dtypes above are those of the arrays in memory (what :func:`read_shard` and
:func:`read_datasets` with a schema return). On disk, from :data:`SHARD_FORMAT` 3 on, the data
stage stores each dataset in the smallest unsigned integer type that holds its values (see
:func:`storage_dtypes`: ``input_ids`` and ``masked_lm_ids`` uint16 for a vocabulary of at most
65,536 tokens, ``masked_lm_positions`` uint8 up to 256 positions), so gzip has half to a quarter
of the bytes to compress. NVIDIA's loader converts every dataset with ``astype(np.int64)``, so it
reads either.

Position 0 holds ``[CLS]``, which is never masked, so a 0 in ``masked_lm_positions`` after the
first slot marks padding (NVIDIA's loader relies on this). Padding is 0 whatever the vocabulary's
``[PAD]`` id, as in NVIDIA's files; ``input_mask`` tells padding apart.

HDF5 checks each chunk's checksum as it reads the chunk, so damaged bytes (a bad disk, a partial
copy) fail the read instead of becoming wrong token ids. Shards without checksums (NVIDIA's, or
from an older version) still read; there, only gzip's own check and HDF5's structure catch damage.

This module holds the schemas and the reading; the data stage writes shards with
:mod:`bertpretrain.data.prepare.shard_writer`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import h5py
import numpy as np

SHARD_FORMAT = 3
"""Version of the on-disk shard layout, bumped whenever it changes (2: fletcher32 checksums;
3: ids and positions stored in the smallest unsigned type that holds them, see :func:`storage_dtypes`).

Data preparation's cache key includes it, so shards written by an older version are rebuilt."""

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


DYNAMIC_DTYPES = {name: SHARD_DTYPES[name] for name in (*SEQUENCE_DATASETS, "next_sentence_labels")}
"""Dynamic masking: the same datasets without ``masked_lm_*``; ``input_ids`` are unmasked."""

NEXT_SENTENCE_LABELS = "next_sentence_labels"
"""The dataset that shards made for the objective ``mlm`` lack (in every schema, packed too)."""


def without_next_sentence_labels(dtypes: Mapping[str, type[np.integer]]) -> dict[str, type[np.integer]]:
    """A schema (:data:`SHARD_DTYPES`, :data:`DYNAMIC_DTYPES`, ``packed.PACKED_DTYPES``) as shards
    made for the objective ``mlm`` hold it: without :data:`NEXT_SENTENCE_LABELS`."""
    return {name: dtype for name, dtype in dtypes.items() if name != NEXT_SENTENCE_LABELS}


def _smallest_unsigned(most: int) -> type[np.integer]:
    """The narrowest of uint8/uint16/uint32 that holds ``0..most``."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if most <= np.iinfo(dtype).max:
            return dtype
    raise ValueError(f"no unsigned 32-bit type holds {most}")


def storage_dtypes(
    dtypes: Mapping[str, type[np.integer]], vocab_size: int, max_seq_length: int
) -> dict[str, type[np.integer]]:
    """The on-disk dtype of each dataset of ``dtypes`` (:data:`SHARD_DTYPES` or :data:`DYNAMIC_DTYPES`).

    Token ids (``input_ids``, ``masked_lm_ids``, in ``[0, vocab_size)``) and masked positions (in
    ``[0, max_seq_length)``) go to the smallest unsigned type that holds them: for BERT's 30,522
    tokens and 128 or 512 positions, uint16 ids and uint8/uint16 positions. Deflate's time grows
    with the bytes it reads, so this halves the work of the largest dataset. The 0/1 datasets keep
    their int8. Readers convert back (:func:`read_datasets` with a schema; NVIDIA's ``astype``).

    Raises:
        ValueError: ``vocab_size`` or ``max_seq_length`` is below 1.
    """
    if vocab_size < 1 or max_seq_length < 1:
        raise ValueError(f"vocab_size {vocab_size} and max_seq_length {max_seq_length} must be positive")
    narrow = {
        "input_ids": _smallest_unsigned(vocab_size - 1),
        "masked_lm_ids": _smallest_unsigned(vocab_size - 1),
        "masked_lm_positions": _smallest_unsigned(max_seq_length - 1),
    }
    return {name: narrow.get(name, dtype) for name, dtype in dtypes.items()}


def read_attrs(path: Path) -> dict[str, int | float]:
    """The file attributes of a shard (the counts the data stage stored in it).

    Raises:
        OSError: ``path`` is not a readable HDF5 file.
    """
    with h5py.File(path, "r") as file:
        return {name: value.item() for name, value in file.attrs.items()}


def read_datasets(
    path: Path, names: Iterable[str] | Mapping[str, type[np.integer]] | None = None
) -> dict[str, np.ndarray]:
    """Datasets of a shard, each read whole (default: every dataset), keyed by name.

    When ``names`` is a schema (name -> dtype, such as :data:`SHARD_DTYPES`), each dataset stored
    in a narrower integer type (:func:`storage_dtypes`) is returned in the schema's dtype, so
    readers see one dtype whatever the shard's format. Reading checks every chunk's checksum where
    the shard has them, and gzip's own check.

    Raises:
        OSError: ``path`` is not a readable HDF5 file, or a dataset cannot be read (a checksum,
            decompression or structure error); the message names the file and the dataset.
        KeyError: a named dataset is missing.
    """
    try:
        file = h5py.File(path, "r")
    except OSError as error:
        raise OSError(f"{path}: not a readable HDF5 file ({error})") from None
    with file:
        if names is None:
            names = [name for name in file if isinstance(file[name], h5py.Dataset)]
        arrays = {}
        for name in names:
            if name not in file:
                raise KeyError(f"{path}: no dataset {name}")
            try:
                arrays[name] = _as_schema(file[name][()], names, name)
            except OSError as error:
                raise OSError(
                    f"{path}: dataset {name} cannot be read, the file is damaged ({error})"
                ) from None
    return arrays


def _as_schema(array: np.ndarray, schema: Iterable[str], name: str) -> np.ndarray:
    """``array`` in the schema's dtype for ``name`` where it is stored narrower (a safe cast)."""
    if not isinstance(schema, Mapping) or name not in schema or array.dtype == schema[name]:
        return array
    if array.dtype.kind not in "iu" or not np.can_cast(array.dtype, schema[name], "safe"):
        return array  # left as found, for the caller's dtype check to name
    return array.astype(schema[name])


def read_shard(path: Path, next_sentence_prediction: bool = True) -> dict[str, np.ndarray]:
    """All six datasets of a shard as NumPy arrays in :data:`SHARD_DTYPES`, keyed by dataset name
    (whole file in memory; datasets stored narrower are converted).

    With ``next_sentence_prediction`` false (the objective ``mlm``), the five others only: a shard
    made for ``mlm`` has no ``next_sentence_labels``, and those of a shard made for ``mlm-nsp``
    are left out.

    Raises:
        OSError: see :func:`read_datasets`.
        ValueError: a dataset of the schema is missing, or has another dtype.
    """
    schema = SHARD_DTYPES if next_sentence_prediction else without_next_sentence_labels(SHARD_DTYPES)
    arrays = read_datasets(path)
    arrays = {
        name: _as_schema(array, schema, name)
        for name, array in arrays.items()
        if next_sentence_prediction or name != NEXT_SENTENCE_LABELS
    }
    for name, dtype in schema.items():
        if name not in arrays or arrays[name].dtype != dtype:
            found = arrays[name].dtype if name in arrays else "missing"
            raise ValueError(f"{path}: dataset {name} should be {np.dtype(dtype)}, found {found}")
    return arrays
