"""Pass 1 of the data stage: the corpus cut into pieces of about ``PIECE_BYTES`` of text in the main
process, split into sentences and tokenized in the workers, one ``documents/piece_{i:06d}.npz`` each."""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from bertjob_api.spec import JobSpec
from bertpretrain.common.progress import ProgressBar
from bertpretrain.data.prepare import documents
from bertpretrain.data.prepare.cache import (
    MANIFEST_FILE,
    read_json,
    read_listing,
    reuse,
    start_directory,
    write_json,
    write_listing,
)
from bertpretrain.data.prepare.corpus import sources, splitting
from bertpretrain.data.prepare.corpus.raw import RawDocument
from bertpretrain.data.prepare.messages import NO_TEXT, report, skips
from bertpretrain.data.prepare.pool import TOKENIZERS_PARALLELISM, run_parallel


@dataclass(frozen=True)
class Piece:
    """One tokenized piece of the corpus and its counts (per split: train, held-out)."""

    file: str
    documents: list[int]
    sentences: list[int]
    tokens: list[int]
    text_bytes: list[int]


def _piece_counts(file: str, tokenized: documents.TokenizedDocuments) -> Piece:
    sentences_per_document = np.diff(tokenized.document_starts)
    tokens_per_document = (
        np.add.reduceat(np.diff(tokenized.sentence_starts), tokenized.document_starts[:-1])
        if tokenized.num_documents
        else np.zeros(0, np.int64)
    )
    counts: dict[str, list[int]] = {"documents": [], "sentences": [], "tokens": [], "text_bytes": []}
    for heldout in (False, True):
        chosen = tokenized.heldout == heldout
        counts["documents"].append(int(chosen.sum()))
        counts["sentences"].append(int(sentences_per_document[chosen].sum()))
        counts["tokens"].append(int(tokens_per_document[chosen].sum()))
        counts["text_bytes"].append(int(tokenized.text_bytes[chosen].sum()))
    return Piece(file, **counts)


def make_documents(
    spec: JobSpec,
    tokenizer: Tokenizer,
    key: dict[str, Any],
    corpus: sources.CorpusIdentity,
    directory: Path,
    workers: int,
) -> list[Piece]:
    """Pass 1: the corpus, tokenized, as pieces under ``directory`` (made or found).

    ``manifest.json`` records ``key`` and the pieces' counts; it is written last, and only when
    the corpus gave some text, so that a failed run is never taken for a finished one. The
    corpus's listing is kept beside it (``cache.CORPUS_FILES``), to name the files that changed.
    """
    data = spec.data
    piece_bytes = key["piece_bytes"]
    manifest = read_json(directory / MANIFEST_FILE)
    if reuse(
        "documents", manifest.get("parameters"), key, directory, (read_listing(directory), corpus.listing)
    ):
        return [Piece(**piece) for piece in manifest["pieces"]]
    start_directory(directory, key, "piece_*.npz")
    started = time.perf_counter()
    skipped: collections.Counter[str] = collections.Counter()
    raw_documents = sources.read_corpus(data.sources, spec.seed, skipped)
    tasks = (
        (_make_piece, (directory / f"piece_{index:06d}.npz", piece))
        for index, piece in enumerate(_cut(raw_documents, piece_bytes))
    )
    initializer = (_init_encoder, (tokenizer.to_str(), spec.seed, data.heldout_fraction))
    pieces: list[Piece] = []
    try:
        # Counted in bytes: tqdm's unit_scale scales the count, so a count in MB read "21.0kMB".
        with ProgressBar(desc="data: documents", unit="B", unit_scale=True) as progress:
            for piece in run_parallel(tasks, workers, initializer):
                pieces.append(piece)
                progress.update(sum(piece.text_bytes))
    finally:
        # With one worker the encoder (and its chunk table, tens of MB) lives in this process.
        _release_encoder()
    totals = {
        name: sum(sum(getattr(p, name)) for p in pieces) for name in ("documents", "sentences", "tokens")
    }
    megabytes = sum(sum(p.text_bytes) for p in pieces) / 1e6
    seconds = time.perf_counter() - started
    report(
        f"documents: {totals['documents']} documents, {totals['sentences']} sentences, {totals['tokens']} "
        f"tokens from {megabytes:.1f} MB of text in {len(pieces)} pieces, {seconds:.1f} s "
        f"({megabytes / max(seconds, 1e-9):.2f} MB/s){skips(skipped)}"
    )
    if not totals["documents"]:
        raise ValueError(f"data.sources: {NO_TEXT}{skips(skipped)}")
    manifest = {"parameters": key, "seconds": round(seconds, 2), "skipped": dict(skipped)}
    write_listing(directory, corpus)
    write_json(directory / MANIFEST_FILE, {**manifest, "pieces": [asdict(p) for p in pieces]})
    return pieces


def _cut(raw_documents: Iterable[RawDocument], piece_bytes: int) -> Iterator[list[RawDocument]]:
    """Consecutive runs of documents of at most ``piece_bytes`` of UTF-8 text.

    A document is never cut, so one larger than ``piece_bytes`` makes a piece on its own.
    """
    piece: list[RawDocument] = []
    size = 0
    for document in raw_documents:
        document_bytes = len(document.text.encode("utf-8", "surrogatepass"))
        if piece and size + document_bytes > piece_bytes:
            yield piece
            piece, size = [], 0
        piece.append(document)
        size += document_bytes
    if piece:
        yield piece


_encoder: documents.DocumentEncoder | None = None


def _init_encoder(tokenizer_json: str, seed: int, heldout_fraction: float) -> None:
    """Worker start-up: one encoder per process, on one thread (the processes are the parallelism)."""
    global _encoder
    os.environ[TOKENIZERS_PARALLELISM] = "false"
    _encoder = documents.DocumentEncoder(Tokenizer.from_str(tokenizer_json), seed, heldout_fraction)


def _release_encoder() -> None:
    global _encoder
    _encoder = None


def _make_piece(path: Path, raw_documents: list[RawDocument]) -> Piece:
    """Worker: split, tokenize and save one piece, unless an earlier run saved it already."""
    if path.is_file():
        try:
            return _piece_counts(path.name, documents.load_piece(path))
        except ValueError:
            path.unlink()
    assert _encoder is not None
    tokenized = _encoder.encode([splitting.sentences(document) for document in raw_documents])
    documents.save_piece(tokenized, path)
    return _piece_counts(path.name, tokenized)
