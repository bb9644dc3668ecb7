"""Helpers the corpus tests share: read one source, split its documents, write a Parquet or Arrow file."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.feather
import pyarrow.ipc
import pyarrow.parquet as pq

from bertjob_api.spec import SourceSpec
from bertpretrain.data.prepare.corpus.raw import RawDocument
from bertpretrain.data.prepare.corpus.sources import read_source
from bertpretrain.data.prepare.corpus.splitting import sentences

Counter = collections.Counter[str]


def read(path: Path | str, **fields: Any) -> tuple[list[RawDocument], Counter]:
    """The documents of one source (``SourceSpec`` fields as keywords) and what was skipped."""
    skipped: Counter = collections.Counter()
    return list(read_source(SourceSpec(path=str(path), **fields), skipped)), skipped


def split(documents: list[RawDocument]) -> list[list[str]]:
    """Each document's sentences."""
    return [sentences(document) for document in documents]


TABLE = pa.table(
    {
        "id": [1, 2, 3, 4],
        "text": ["One row. Two sentences.", None, "Another row\n\nin two paragraphs", ""],
    }
)


def write_table(file: Path, table: pa.Table = TABLE) -> None:
    """``table`` as Parquet, Feather, or Arrow IPC (stream or file format), by ``file``'s name."""
    if file.suffix == ".parquet":
        pq.write_table(table, file, row_group_size=1)
    elif file.suffix == ".feather":
        pyarrow.feather.write_feather(table, file)
    elif file.name.endswith(".stream.arrow"):
        with pa.OSFile(str(file), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=1)
    else:
        with pa.OSFile(str(file), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=3)
