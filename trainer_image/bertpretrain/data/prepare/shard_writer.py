"""Writing HDF5 shards (:mod:`bertpretrain.data.format.shards`' schemas) as the data stage makes them:
gzip-compressed, checksummed datasets in chunks of whole rows, each file under a temporary name,
synced and renamed (:class:`bertjob_api.files.AtomicPath`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from bertjob_api.files import AtomicPath

CHUNK_BYTES = 1 << 20
"""Uncompressed bytes per chunk (whole rows): HDF5's default chunk cache holds one chunk."""
# gzip level 1 after the byte shuffle: see write_shard. Level 1 is the fastest deflate; higher levels
# cost more time than they save bytes on token ids.
_FILTERS: dict[str, Any] = {"compression": "gzip", "compression_opts": 1, "shuffle": True, "fletcher32": True}


def _filters(dtype: np.dtype | type[np.integer]) -> dict[str, Any]:
    """:data:`_FILTERS`, without the byte shuffle for types of one or two bytes: there it costs
    time and (measured on token ids in uint16) makes gzip's output larger, not smaller."""
    return _FILTERS if np.dtype(dtype).itemsize > 2 else {**_FILTERS, "shuffle": False}


def write_shard(
    path: Path, arrays: dict[str, np.ndarray], attrs: dict[str, int | float] | None = None
) -> None:
    """Write one shard: each array as a gzip-compressed dataset, ``attrs`` as file attributes.

    ``arrays`` follows one of the schemas (``SHARD_DTYPES`` or ``DYNAMIC_DTYPES`` of
    ``bertpretrain.data.format.shards``, or ``bertpretrain.data.format.packed.PACKED_DTYPES``), each
    array in its dtype. The file is written under a temporary name, synced and renamed
    (:class:`bertjob_api.files.AtomicPath`), so that ``path`` is either absent or complete. The
    byte-shuffle filter groups the high bytes of the int32 ids, which roughly halves the file and
    time spent compressing; the fletcher32 filter stores a checksum of each
    compressed chunk. Chunks are whole rows, about :data:`CHUNK_BYTES` each. Readers (h5py, NVIDIA's
    loader) undo the filters and check the checksums without being told.

    Raises:
        ValueError: the arrays do not all have the same number of rows (nothing is written).
        bertjob_api.files.DiskFullError: no space left (nothing is left at ``path``).
    """
    path = Path(path)
    rows = {name: len(array) for name, array in arrays.items()}
    if len(set(rows.values())) > 1:
        raise ValueError(f"{path}: datasets of different lengths {rows}")
    with AtomicPath(path) as tmp, h5py.File(tmp, "w") as file:
        for name, array in arrays.items():
            file.create_dataset(
                name, data=array, chunks=_row_chunks(array), **_FILTERS,
                # HDF5 allows a chunk larger than the data only when the dataset may grow.
                maxshape=(None, *array.shape[1:]) if len(array) == 0 else None,
            )  # fmt: skip
        file.attrs.update(attrs or {})


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

    ``dtypes`` maps each dataset's name to its on-disk dtype (as
    ``bertpretrain.data.format.shards.storage_dtypes`` gives, or ``SHARD_DTYPES``) and ``widths`` to
    its row width (absent for one value per row). Datasets start empty and grow by :meth:`append`;
    chunks hold a power-of-two number of whole rows, at most ``block_rows``, so that appending blocks
    of ``block_rows`` rows (a multiple of every chunk) only ever writes whole chunks, each compressed
    once. Filters as :func:`write_shard`, but no byte
    shuffle for dtypes of one or two bytes. Used as a context manager: the file is written under a
    temporary name (:class:`bertjob_api.files.AtomicPath`) and synced and renamed to ``path`` by
    :meth:`finish`; leaving the block without it (an error) removes the temporary file.

    Raises:
        ValueError: in :meth:`append`, a dataset is missing or the arrays differ in rows.
    """

    def __init__(
        self, path: Path, dtypes: dict[str, type[np.integer]], widths: dict[str, int], block_rows: int
    ):
        self.path = Path(path)
        self._target: AtomicPath | None = None
        self._dtypes = dtypes
        self._widths = widths
        self._block_rows = block_rows
        self._file: h5py.File | None = None
        self.rows = 0

    def __enter__(self) -> ShardWriter:
        self._target = AtomicPath(self.path)
        self._file = h5py.File(self._target.temporary, "w")
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
            # numpy's cast is cheaper than HDF5's conversion; values fit (see format.shards.storage_dtypes).
            dataset[self.rows :] = np.asarray(arrays[name]).astype(dataset.dtype, copy=False)
        self.rows += count

    def finish(self, attrs: Mapping[str, Any] | None = None) -> None:
        """Store ``attrs`` as file attributes, close the file, sync it and rename it to ``path``.

        Raises:
            bertjob_api.files.DiskFullError: no space left (the temporary is removed).
        """
        assert self._file is not None and self._target is not None, (
            "ShardWriter.finish outside its with-block"
        )
        self._file.attrs.update(attrs or {})
        self._file.close()
        self._file = None
        target, self._target = self._target, None
        target.commit()

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._target is not None:
            self._target.discard()
            self._target = None
