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
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

CHUNK_BYTES = 1 << 20
"""Uncompressed bytes per chunk (whole rows): HDF5's default chunk cache holds one chunk."""
SHARD_FORMAT = 3
"""Version of the on-disk shard layout, bumped whenever it changes (2: fletcher32 checksums;
3: ids and positions stored in the smallest unsigned type that holds them, see :func:`storage_dtypes`).

Data preparation's cache key includes it, so shards written by an older version are rebuilt."""

# gzip level 1 after the byte shuffle: see write_shard. Level 1 is the fastest deflate; higher levels
# cost more time than they save bytes on token ids.
_FILTERS: dict[str, Any] = {"compression": "gzip", "compression_opts": 1, "shuffle": True, "fletcher32": True}

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


def _filters(dtype: np.dtype | type[np.integer]) -> dict[str, Any]:
    """:data:`_FILTERS`, without the byte shuffle for types of one or two bytes: there it costs
    time and (measured on token ids in uint16) makes gzip's output larger, not smaller."""
    return _FILTERS if np.dtype(dtype).itemsize > 2 else {**_FILTERS, "shuffle": False}


def write_shard(
    path: Path, arrays: dict[str, np.ndarray], attrs: dict[str, int | float] | None = None
) -> None:
    """Write one shard: each array as a gzip-compressed dataset, ``attrs`` as file attributes.

    ``arrays`` follows one of the schemas (:data:`SHARD_DTYPES`, :data:`DYNAMIC_DTYPES` or
    ``bertpretrain.data.packing.PACKED_DTYPES``), each array in its dtype. The file is written as
    ``<path>.tmp`` and renamed, so that ``path`` is either absent or complete. The byte-shuffle
    filter groups the high bytes of the int32 ids, which roughly halves the file and time spent
    compressing; the fletcher32 filter stores a checksum of each compressed chunk. Chunks are
    whole rows, about :data:`CHUNK_BYTES` each. Readers (h5py, NVIDIA's loader) undo the filters
    and check the checksums without being told.

    Raises:
        ValueError: the arrays do not all have the same number of rows (nothing is written).
    """
    path = Path(path)
    rows = {name: len(array) for name, array in arrays.items()}
    if len(set(rows.values())) > 1:
        raise ValueError(f"{path}: datasets of different lengths {rows}")
    tmp = path.with_name(path.name + ".tmp")
    try:
        with h5py.File(tmp, "w") as file:
            for name, array in arrays.items():
                file.create_dataset(
                    name, data=array, chunks=_row_chunks(array), **_FILTERS,
                    # HDF5 allows a chunk larger than the data only when the dataset may grow.
                    maxshape=(None, *array.shape[1:]) if len(array) == 0 else None,
                )  # fmt: skip
            file.attrs.update(attrs or {})
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _row_chunks(array: np.ndarray) -> tuple[int, ...]:
    """Chunks of whole rows: the loader reads whole rows, and NVIDIA's whole files."""
    return (max(1, min(len(array), _chunk_rows(array.dtype, array.shape[1:]))), *array.shape[1:])


def _chunk_rows(
    dtype: np.dtype | type[np.integer], row_shape: tuple[int, ...], most: int | None = None
) -> int:
    """Rows per chunk: about :data:`CHUNK_BYTES`, a power of two, at most ``most``."""
    row_bytes = np.dtype(dtype).itemsize * int(np.prod(row_shape))
    rows = 1 << max(0, (CHUNK_BYTES // row_bytes).bit_length() - 1)
    return min(rows, most) if most else rows


class ShardWriter:
    """Writes one shard a block of rows at a time, so that a shard is never held in memory whole.

    ``dtypes`` maps each dataset's name to its on-disk dtype (as :func:`storage_dtypes` gives, or
    :data:`SHARD_DTYPES`) and ``widths`` to its row width (absent for one value per row). Datasets
    start empty and grow by :meth:`append`; chunks hold a power-of-two number of whole rows, at most
    ``block_rows``, so that appending blocks of ``block_rows`` rows (a multiple of every chunk) only
    ever writes whole chunks, each compressed once. Filters as :func:`write_shard`, but no byte
    shuffle for dtypes of one or two bytes. Used as a context manager: the file is written as
    ``<path>.tmp`` and renamed to ``path`` by :meth:`finish`; leaving the block without it (an
    error) removes the temporary file.

    Raises:
        ValueError: in :meth:`append`, a dataset is missing or the arrays differ in rows.
    """

    def __init__(
        self, path: Path, dtypes: dict[str, type[np.integer]], widths: dict[str, int], block_rows: int
    ):
        self.path = Path(path)
        self._tmp = self.path.with_name(self.path.name + ".tmp")
        self._dtypes = dtypes
        self._widths = widths
        self._block_rows = block_rows
        self._file: h5py.File | None = None
        self.rows = 0

    def __enter__(self) -> ShardWriter:
        self._file = h5py.File(self._tmp, "w")
        for name, dtype in self._dtypes.items():
            row = (self._widths[name],) if name in self._widths else ()
            self._file.create_dataset(
                name, shape=(0, *row), maxshape=(None, *row), dtype=dtype,
                chunks=(_chunk_rows(dtype, row, self._block_rows), *row), **_filters(dtype),
            )  # fmt: skip
        return self

    def append(self, arrays: dict[str, np.ndarray]) -> None:
        """Add the rows of ``arrays`` (one array per dataset, cast to the dataset's dtype)."""
        assert self._file is not None, "ShardWriter.append outside its with-block"
        rows = {name: len(arrays[name]) for name in self._dtypes if name in arrays}
        if len(rows) != len(self._dtypes) or len(set(rows.values())) > 1:
            raise ValueError(f"{self.path}: a block needs the datasets {sorted(self._dtypes)} of one length")
        count = next(iter(rows.values()))
        for name in self._dtypes:
            dataset = self._file[name]
            dataset.resize(self.rows + count, axis=0)
            # numpy's cast is cheaper than HDF5's conversion; values fit (see storage_dtypes).
            dataset[self.rows :] = np.asarray(arrays[name]).astype(dataset.dtype, copy=False)
        self.rows += count

    def finish(self, attrs: Mapping[str, Any] | None = None) -> None:
        """Store ``attrs`` as file attributes, close the file and rename it to ``path``."""
        assert self._file is not None, "ShardWriter.finish outside its with-block"
        self._file.attrs.update(attrs or {})
        self._file.close()
        self._file = None
        os.replace(self._tmp, self.path)

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._tmp.unlink(missing_ok=True)


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


def read_shard(path: Path) -> dict[str, np.ndarray]:
    """All six datasets of a shard as NumPy arrays in :data:`SHARD_DTYPES`, keyed by dataset name
    (whole file in memory; datasets stored narrower are converted).

    Raises:
        OSError: see :func:`read_datasets`.
        ValueError: a dataset of the schema is missing, or has another dtype.
    """
    arrays = read_datasets(path)
    arrays = {name: _as_schema(array, SHARD_DTYPES, name) for name, array in arrays.items()}
    for name, dtype in SHARD_DTYPES.items():
        if name not in arrays or arrays[name].dtype != dtype:
            found = arrays[name].dtype if name in arrays else "missing"
            raise ValueError(f"{path}: dataset {name} should be {np.dtype(dtype)}, found {found}")
    return arrays
