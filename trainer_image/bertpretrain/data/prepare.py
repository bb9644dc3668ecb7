"""The data stage of a BertPretrainJob: corpus -> vocabulary -> documents -> instances -> shards.

Everything goes under ``spec.data.shards``::

    vocab/vocab.txt, vocab/tokenizer.json         the WordPiece vocabulary (bertpretrain.data.vocab)
    vocab/parameters.json                         what made it, written last
    documents/piece_{i:06d}.npz                   the corpus, tokenized, in ~1 MB pieces
    documents/manifest.json                       counts per piece, written last
    <dataset>/shard_{i:05d}.hdf5                  training shards of a phase (bertpretrain.data.shards)
    <dataset>/heldout_{i:05d}.hdf5                held-out shards, when heldoutFraction > 0
    <dataset>/metadata.json                       parameters and counts, written last

``<dataset>`` is ``seq_len_{L}_max_pred_{P}`` as NVIDIA names it, with ``_dynamic`` or
``_packed_{algorithm}`` appended for those modes.

Two passes, each spread over ``workers`` processes:

1. *Documents.* The main process reads the corpus (``bertpretrain.data.corpus``) and cuts it into
   pieces of about ``PIECE_BYTES`` of text; workers split sentences and tokenize each piece
   (``bertpretrain.data.documents``). Both phases use these pieces.
2. *Shards.* The pieces (cut into finer units when there are fewer pieces than shards) are
   dealt to the shards in a seeded random order, so every shard draws from all over the corpus.
   A worker makes each shard from its units alone: sentence pairs (``bertpretrain.data.instances``),
   masks (``bertpretrain.data.masking``), optional packing (``bertpretrain.data.packing``), one HDF5 file.

Memory is bounded by a piece in the main process and by a shard in a worker, never by the corpus.
What is made depends only on the corpus, the vocabulary, the parameters and the seed, not on the
number of workers: pieces are cut by bytes, and each shard's draws come from a generator seeded
with ``(seed, max_seq_length, max_predictions_per_seq, split, shard index)``.

Reusing and resuming: each stage has a *key*, everything that made its output (the corpus's files
by path, size and modification time, the vocabulary settings or file, the vocabulary's SHA-256,
seed, held-out fraction, instance parameters, ``SHARD_FORMAT``), recorded in a file written last
and only on success (``vocab/parameters.json``, ``documents/manifest.json``,
``<dataset>/metadata.json``). A re-run reuses a stage whose recorded key matches and otherwise
makes it again, printing why. Every file is written under a temporary name and renamed, and the
pieces' and shards' directories record their key in ``parameters.json`` first, so that a re-run
after an interruption keeps the files made with the same key and makes only what is missing.
Workers die with the main process (``_die_with_parent``).
"""

from __future__ import annotations

import collections
import ctypes
import hashlib
import itertools
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from bertjob_api.spec import DataSpec, JobSpec, PhaseSpec
from bertpretrain.common.files import check_writable
from bertpretrain.data import corpus, documents, vocab
from bertpretrain.data.instances import InstanceParams, assemble, create_pairs
from bertpretrain.data.masking import mask_tokens
from bertpretrain.data.packing import pack_instances, padding_fraction
from bertpretrain.data.shards import SHARD_FORMAT, read_attrs, write_shard

VOCAB_DIR = "vocab"
DOCUMENTS_DIR = "documents"
METADATA_FILE = "metadata.json"
PARAMETERS_FILE = "parameters.json"
MANIFEST_FILE = "manifest.json"
PIECE_BYTES = 1 << 20
SPLITS = ("train", "heldout")
_SHARD_PREFIX = {"train": "shard", "heldout": "heldout"}


@dataclass(frozen=True)
class PreparedData:
    """Where the data stage put its output.

    ``vocab_dir`` holds ``vocab.txt`` and ``tokenizer.json``; ``vocab_size`` is the number of
    token ids (the model's embedding rows); ``phase_dirs[k]`` holds the shards of
    ``spec.phases[k]``.
    """

    vocab_dir: Path
    vocab_size: int
    phase_dirs: list[Path]


def dataset_dir_name(phase: PhaseSpec, data: DataSpec) -> str:
    """Name of a phase's dataset directory: NVIDIA's ``seq_len_{L}_max_pred_{P}``, plus the mode."""
    name = f"seq_len_{phase.max_seq_length}_max_pred_{phase.max_predictions_per_seq}"
    if data.masking == "dynamic":
        return name + "_dynamic"
    if data.packing != "none":
        return f"{name}_packed_{data.packing}"
    return name


def prepare(spec: JobSpec) -> PreparedData:
    """Make (or find already made) the vocabulary and every phase's shards for ``spec``.

    Prints progress bars and a report (documents, sentences, tokens, instances, padding,
    seconds) per stage.

    Raises:
        FileNotFoundError: a corpus source or the vocabulary file does not exist.
        PermissionError: ``spec.data.shards`` cannot be written.
        ValueError: a corpus file is unreadable (the message names it), or the vocabulary lacks
            a special token.
    """
    data = spec.data
    root = Path(data.shards)
    check_writable("spec.data.shards", root)
    vocab_dir = root / VOCAB_DIR
    corpus_identity = corpus.identity(data.sources)
    _make_vocab(spec, corpus_identity, vocab_dir)
    tokenizer = vocab.load_tokenizer(vocab_dir)
    special = vocab.SpecialIds.of(tokenizer, vocab_dir / vocab.VOCAB_FILE)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=False)
    _report(f"vocabulary: {vocab_size} tokens, lowercase={vocab.has_lowercase(tokenizer)}")

    documents_key = _documents_key(spec, corpus_identity, vocab_dir)
    phase_dirs = [root / dataset_dir_name(phase, data) for phase in spec.phases]
    pending = {}
    for phase, directory in zip(spec.phases, phase_dirs, strict=True):
        key = _dataset_key(spec, phase, documents_key, vocab_size)
        if not _reuse(str(directory), _read_json(directory / METADATA_FILE).get("parameters"), key):
            pending[directory] = key
    if pending:
        pieces = _make_documents(spec, tokenizer, documents_key, root / DOCUMENTS_DIR)
        for directory, parameters in pending.items():
            _make_dataset(directory, parameters, pieces, special, tokenizer, _workers(data))
    return PreparedData(vocab_dir, vocab_size, phase_dirs)


def _workers(data: DataSpec) -> int:
    return data.workers or available_cpus()


def available_cpus(cgroup_cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """CPUs this process may use: its affinity, capped by a cgroup v2 CPU quota.

    In a pod with ``resources.limits.cpu: 4`` on a 64-core node, the affinity still lists 64 cores;
    the quota (``cpu.max``: ``400000 100000``) is what says 4.
    """
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = cgroup_cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        return cpus
    if quota == "max":
        return cpus
    return max(1, min(cpus, math.ceil(int(quota) / int(period))))


# Vocabulary -------------------------------------------------------------------------------------


def _make_vocab(spec: JobSpec, corpus_identity: list[dict[str, Any]], vocab_dir: Path) -> None:
    """Train, copy or reuse the vocabulary (padded to ``padToMultipleOf`` when asked).

    ``vocab/parameters.json`` records what made the vocabulary there; it is written last, so a
    vocabulary without one (an interrupted or failed run) is never reused.
    """
    data = spec.data
    key = _vocab_key(spec, corpus_identity)
    record = vocab_dir / PARAMETERS_FILE
    made = all((vocab_dir / name).is_file() for name in (vocab.VOCAB_FILE, vocab.TOKENIZER_FILE))
    if _reuse("vocabulary", _read_json(record) if made else None, key, where=vocab_dir):
        return
    record.unlink(missing_ok=True)
    pad = data.vocab.pad_to_multiple_of
    if data.vocab.file is not None:
        vocab.import_vocab(Path(data.vocab.file), data.lowercase, vocab_dir, pad)
        _report(f"vocabulary: {data.vocab.file} copied to {vocab_dir}")
        _write_json(record, key)
        return
    assert data.vocab.train_size is not None  # VocabSpec holds exactly one of the two
    _report(f"vocabulary: training {data.vocab.train_size} tokens")
    started = time.perf_counter()
    skipped: collections.Counter[str] = collections.Counter()
    # Sentence splitting runs here, in one process: training needs one pass over the text, and
    # tokenizers' trainer holds word counts, not the corpus.
    documents_read = tqdm(corpus.read_corpus(data.sources, spec.seed, skipped), desc="vocabulary", unit="doc")
    sentences = (s for document in documents_read for s in corpus.sentences(document))
    first = next(sentences, None)
    if first is None:
        # Trained on nothing, the vocabulary would hold the special tokens alone: all text [UNK].
        raise ValueError(f"data.sources: {_NO_TEXT}{_skips(skipped)}")
    vocab.train_vocab(
        itertools.chain([first], sentences), data.vocab.train_size, data.lowercase, vocab_dir, pad
    )
    _write_json(record, key)
    _report(f"vocabulary: trained in {time.perf_counter() - started:.1f} s -> {vocab_dir}{_skips(skipped)}")


def _vocab_key(spec: JobSpec, corpus_identity: list[dict[str, Any]]) -> dict[str, Any]:
    """Everything the vocabulary is made from: the file, or the corpus and training settings."""
    data = spec.data
    settings = {"lowercase": data.lowercase, "pad_to_multiple_of": data.vocab.pad_to_multiple_of}
    if data.vocab.file is not None:
        try:
            stat = Path(data.vocab.file).stat()
        except OSError:
            # Made again, and import_vocab names the missing file.
            return {"file": data.vocab.file, "file_identity": None, **settings}
        return {"file": data.vocab.file, "file_identity": [stat.st_size, stat.st_mtime_ns], **settings}
    return {"train_size": data.vocab.train_size, **settings, "seed": spec.seed, "corpus": corpus_identity}


# Pass 1: documents ------------------------------------------------------------------------------


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


def _documents_key(spec: JobSpec, corpus_identity: list[dict[str, Any]], vocab_dir: Path) -> dict[str, Any]:
    """Everything the tokenized pieces are made from.

    The vocabulary counts by the SHA-256 of both its files: ``tokenizer.json`` also holds the
    normalizer, so a ``vocab.txt`` taken again with another ``lowercase`` is another vocabulary.
    """
    vocab_hash = hashlib.sha256()
    for name in (vocab.VOCAB_FILE, vocab.TOKENIZER_FILE):
        vocab_hash.update((vocab_dir / name).read_bytes())
    return {
        "corpus": corpus_identity,
        "vocab_sha256": vocab_hash.hexdigest(),
        "seed": spec.seed,
        "heldout_fraction": spec.data.heldout_fraction,
        "piece_bytes": _piece_bytes(spec.data),
    }


def _make_documents(spec: JobSpec, tokenizer: Tokenizer, key: dict[str, Any], directory: Path) -> list[Piece]:
    """Pass 1: the corpus, tokenized, as pieces under ``directory`` (made or found).

    ``manifest.json`` records ``key`` and the pieces' counts; it is written last, and only when
    the corpus gave some text, so that a failed run is never taken for a finished one.
    """
    data = spec.data
    piece_bytes = key["piece_bytes"]
    manifest = _read_json(directory / MANIFEST_FILE)
    if _reuse("documents", manifest.get("parameters"), key, where=directory):
        return [Piece(**piece) for piece in manifest["pieces"]]
    _start_directory(directory, key, "piece_*.npz")
    started = time.perf_counter()
    skipped: collections.Counter[str] = collections.Counter()
    raw_documents = corpus.read_corpus(data.sources, spec.seed, skipped)
    tasks = (
        (_make_piece, (directory / f"piece_{index:06d}.npz", piece))
        for index, piece in enumerate(_cut(raw_documents, piece_bytes))
    )
    initializer = (_init_encoder, (tokenizer.to_str(), spec.seed, data.heldout_fraction))
    pieces: list[Piece] = []
    with tqdm(desc="documents", unit="MB", unit_scale=True) as progress:
        for piece in _run_parallel(tasks, _workers(data), initializer):
            pieces.append(piece)
            progress.update(round(sum(piece.text_bytes) / 1e6, 3))
    totals = {
        name: sum(sum(getattr(p, name)) for p in pieces) for name in ("documents", "sentences", "tokens")
    }
    megabytes = sum(sum(p.text_bytes) for p in pieces) / 1e6
    seconds = time.perf_counter() - started
    _report(
        f"documents: {totals['documents']} documents, {totals['sentences']} sentences, {totals['tokens']} "
        f"tokens from {megabytes:.1f} MB of text in {len(pieces)} pieces, {seconds:.1f} s "
        f"({megabytes / max(seconds, 1e-9):.2f} MB/s){_skips(skipped)}"
    )
    if not totals["documents"]:
        raise ValueError(f"data.sources: {_NO_TEXT}{_skips(skipped)}")
    manifest = {"parameters": key, "seconds": round(seconds, 2), "skipped": dict(skipped)}
    _write_json(directory / MANIFEST_FILE, {**manifest, "pieces": [asdict(p) for p in pieces]})
    return pieces


def _piece_bytes(data: DataSpec) -> int:
    if data.max_shard_mb is None:
        return PIECE_BYTES
    return max(1, min(PIECE_BYTES, int(data.max_shard_mb * 1e6)))


def _cut(raw_documents: Iterable[corpus.RawDocument], piece_bytes: int) -> Iterator[list[corpus.RawDocument]]:
    """Consecutive runs of documents of at most ``piece_bytes`` of UTF-8 text.

    A document is never cut, so one larger than ``piece_bytes`` makes a piece on its own.
    """
    piece: list[corpus.RawDocument] = []
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
_PARALLELISM = "TOKENIZERS_PARALLELISM"


def _init_encoder(tokenizer_json: str, seed: int, heldout_fraction: float) -> None:
    """Worker start-up: one encoder per process, on one thread (the processes are the parallelism)."""
    global _encoder
    os.environ[_PARALLELISM] = "false"
    _encoder = documents.DocumentEncoder(Tokenizer.from_str(tokenizer_json), seed, heldout_fraction)


def _make_piece(path: Path, raw_documents: list[corpus.RawDocument]) -> Piece:
    """Worker: split, tokenize and save one piece, unless an earlier run saved it already."""
    if path.is_file():
        try:
            return _piece_counts(path.name, documents.load_piece(path))
        except ValueError:
            path.unlink()
    assert _encoder is not None
    tokenized = _encoder.encode([corpus.sentences(document) for document in raw_documents])
    documents.save_piece(tokenized, path)
    return _piece_counts(path.name, tokenized)


# Pass 2: shards ---------------------------------------------------------------------------------


def _dataset_key(
    spec: JobSpec, phase: PhaseSpec, documents_key: dict[str, Any], vocab_size: int
) -> dict[str, Any]:
    """Everything a phase's shards are made from: the pieces' key, the instance and masking
    parameters, and the shards' on-disk format (so that shards of an older layout are remade)."""
    data = spec.data
    return {
        **documents_key,
        "vocab_size": vocab_size,
        **asdict(_instance_params(spec, phase)),
        "whole_word_mask": data.whole_word_mask,
        "masking": data.masking,
        "packing": data.packing,
        "max_sequences_per_pack": data.max_sequences_per_pack if data.packing != "none" else None,
        "num_shards": data.num_shards,
        "max_shard_mb": data.max_shard_mb,
        "shard_format": SHARD_FORMAT,
    }


def _instance_params(spec: JobSpec, phase: PhaseSpec) -> InstanceParams:
    data = spec.data
    return InstanceParams(
        max_seq_length=phase.max_seq_length,
        max_predictions_per_seq=phase.max_predictions_per_seq,
        masked_lm_prob=data.masked_lm_prob,
        short_seq_prob=data.short_seq_prob,
        dupe_factor=data.dupe_factor,
    )


@dataclass(frozen=True)
class Unit:
    """Documents ``[first, last)`` of one piece: what is dealt to the shards."""

    file: str
    first: int
    last: int
    text_bytes: tuple[int, int]  # train, held-out


@dataclass(frozen=True)
class ShardTask:
    """Everything a worker needs to make one shard file."""

    path: Path
    split: str
    index: int
    units: list[Unit]
    parameters: dict[str, Any]


def plan_shards(pieces: list[Piece], parameters: dict[str, Any]) -> dict[str, list[list[Unit]]]:
    """The units of each shard of each split (``train``, ``heldout``), dealt in a seeded order.

    With ``num_shards``, units are dealt in turn to that many training shards (and
    ``ceil(num_shards x heldout_fraction)`` held-out ones); pieces are cut into as many units as
    it takes for every shard to get one. With ``max_shard_mb``, units are added to a shard until
    the next one would take it over that much text. Empty shards are dropped.
    """
    fraction = parameters["heldout_fraction"]
    num_shards = parameters["num_shards"]
    counts = {"train": num_shards, "heldout": math.ceil(num_shards * fraction) if num_shards else None}
    if not fraction:
        counts["heldout"] = 0
    groups = 1
    if num_shards:
        groups = max(1, math.ceil(max(counts.values()) / max(len(pieces), 1)))
    units = [
        Unit(piece.file, *_group_bounds(sum(piece.documents), groups, g), _group_bytes(piece, groups, g))
        for piece in pieces
        for g in range(groups)
    ]
    order = np.random.default_rng([parameters["seed"], 0x5EED]).permutation(len(units))
    dealt = [units[i] for i in order]
    plan: dict[str, list[list[Unit]]] = {}
    for split_index, split in enumerate(SPLITS):
        if counts[split] == 0:
            plan[split] = []
        elif num_shards:
            plan[split] = [dealt[s :: counts[split]] for s in range(counts[split])]
        else:
            plan[split] = _fill(dealt, split_index, int(parameters["max_shard_mb"] * 1e6))
        plan[split] = [shard for shard in plan[split] if any(u.text_bytes[split_index] for u in shard)]
    return plan


def _group_bounds(count: int, groups: int, group: int) -> tuple[int, int]:
    return count * group // groups, count * (group + 1) // groups


def _group_bytes(piece: Piece, groups: int, group: int) -> tuple[int, int]:
    # Exact per-document sizes are in the piece file; an even share is close enough for planning.
    return (piece.text_bytes[0] // groups, piece.text_bytes[1] // groups)


def _fill(units: list[Unit], split_index: int, max_bytes: int) -> list[list[Unit]]:
    shards: list[list[Unit]] = [[]]
    size = 0
    for unit in units:
        unit_bytes = unit.text_bytes[split_index]
        if not unit_bytes:
            continue
        if shards[-1] and size + unit_bytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(unit)
        size += unit_bytes
    return shards


def _make_dataset(
    directory: Path,
    parameters: dict[str, Any],
    pieces: list[Piece],
    special: vocab.SpecialIds,
    tokenizer: Tokenizer,
    workers: int,
) -> None:
    """Pass 2 for one phase: every shard of every split, then ``metadata.json``.

    ``metadata.json`` records ``parameters`` (the dataset's key) and is written last, and only
    when there is something to train on.

    Raises:
        ValueError: no training instance was made (every document held out, say).
    """
    started = time.perf_counter()
    _start_directory(directory, parameters, "*.hdf5")
    plan = plan_shards(pieces, parameters)
    documents_dir = directory.parent / DOCUMENTS_DIR
    tasks = [
        ShardTask(directory / f"{_SHARD_PREFIX[split]}_{index:05d}.hdf5", split, index, units, parameters)
        for split, shards in plan.items()
        for index, units in enumerate(shards)
    ]
    continuation = vocab.continuation_table(tokenizer) if parameters["whole_word_mask"] else None
    initializer = (_init_shard_worker, (documents_dir, special, continuation))
    results: dict[str, list[dict[str, Any]]] = {split: [] for split in SPLITS}
    calls = ((_make_shard, (task,)) for task in tasks)
    for task, counts in zip(
        tasks,
        tqdm(_run_parallel(calls, workers, initializer), total=len(tasks), desc=directory.name, unit="shard"),
        strict=True,
    ):
        results[task.split].append({"file": task.path.name, **counts})
    metadata = {
        **_totals(results["train"]),
        "heldout": _totals(results["heldout"]),
        "seconds": round(time.perf_counter() - started, 2),
        "parameters": parameters,
        "shards": results["train"],
        "heldout_shards": results["heldout"],
    }
    if not metadata["instances"]:
        raise ValueError(
            f"{directory}: no training instance could be made from {metadata['documents']} documents "
            f"({metadata['heldout']['documents']} held out); add text or lower data.heldoutFraction"
        )
    _write_json(directory / METADATA_FILE, metadata)
    packed = (
        f", {metadata['rows']} packed rows of {metadata['sequences_per_row']:.2f} sequences, padding "
        f"{metadata['padding_before_packing']:.1%} -> {metadata['padding']:.1%}"
        if parameters["packing"] != "none"
        else f", padding {metadata['padding']:.1%}"
    )
    heldout = f" (+{metadata['heldout']['instances']} held out)" if results["heldout"] else ""
    _report(
        f"{directory}: {metadata['instances']} instances{heldout} ({metadata['random_next']} random next) "
        f"in {len(results['train'])} shards{packed}, {metadata['seconds']:.1f} s "
        f"({metadata['instances'] / max(metadata['seconds'], 1e-9):.0f} instances/s)"
    )


def _totals(shards: list[dict[str, Any]]) -> dict[str, Any]:
    total = {
        name: sum(shard[name] for shard in shards)
        for name in ("documents", "instances", "random_next", "masked", "tokens", "rows", "slots")
    }
    unpacked_slots = sum(shard["instances"] * shard["max_seq_length"] for shard in shards)
    return {
        **total,
        "padding": 1 - total["tokens"] / total["slots"] if total["slots"] else 0.0,
        "padding_before_packing": 1 - total["tokens"] / unpacked_slots if unpacked_slots else 0.0,
        "sequences_per_row": total["instances"] / total["rows"] if total["rows"] else 0.0,
    }


_shard_context: dict[str, Any] = {}


def _init_shard_worker(
    documents_dir: Path, special: vocab.SpecialIds, continuation: np.ndarray | None
) -> None:
    _shard_context.update(documents_dir=documents_dir, special=special, continuation=continuation)


def _make_shard(task: ShardTask) -> dict[str, Any]:
    """Worker: one shard file from its units, unless an earlier run left it complete."""
    if task.path.is_file():
        try:
            return read_attrs(task.path)
        except OSError:
            task.path.unlink()
    parameters = task.parameters
    params = InstanceParams(**{name: parameters[name] for name in InstanceParams.__dataclass_fields__})
    split_index = SPLITS.index(task.split)
    # A shard may hold several units of one piece: read each piece once.
    pieces = {
        file: documents.load_piece(_shard_context["documents_dir"] / file)
        for file in dict.fromkeys(unit.file for unit in task.units)
    }
    parts = []
    for unit in task.units:
        piece = pieces[unit.file]
        in_unit = np.zeros(piece.num_documents, bool)
        in_unit[unit.first : unit.last] = True
        parts.append(piece.select(in_unit & (piece.heldout == bool(split_index))))
    docs = documents.concatenate(parts)
    rng = np.random.default_rng(
        [parameters["seed"], params.max_seq_length, params.max_predictions_per_seq, split_index, task.index]
    )
    pairs = create_pairs(docs, params, rng)
    arrays = assemble(pairs, docs.tokens, params.max_seq_length, _shard_context["special"])
    tokens = int(pairs.lengths.sum())
    if parameters["masking"] == "static":
        arrays.update(
            mask_tokens(
                arrays["input_ids"], arrays["input_mask"], params.max_predictions_per_seq,
                params.masked_lm_prob, _shard_context["special"], parameters["vocab_size"], rng,
                _shard_context["continuation"],
            )
        )  # fmt: skip
    if parameters["packing"] != "none":
        arrays = pack_instances(arrays, parameters["max_sequences_per_pack"], parameters["packing"], rng)
    rows = len(arrays["input_ids"])
    counts = {
        "documents": docs.num_documents,
        "text_bytes": int(docs.text_bytes.sum()),
        "instances": len(pairs),
        "random_next": int(pairs.is_random_next.sum()),
        "masked": int((arrays["masked_lm_positions"] > 0).sum()) if "masked_lm_positions" in arrays else 0,
        "tokens": tokens,
        "rows": rows,
        "slots": rows * params.max_seq_length,
        "max_seq_length": params.max_seq_length,
        "padding": padding_fraction(pairs.lengths, rows, params.max_seq_length) if rows else 0.0,
    }
    write_shard(task.path, arrays, counts)
    return counts


# Shared plumbing --------------------------------------------------------------------------------


def _run_parallel(
    calls: Iterable[tuple[Callable[..., Any], tuple[Any, ...]]],
    workers: int,
    initializer: tuple[Callable[..., None], tuple[Any, ...]],
) -> Iterator[Any]:
    """Results of ``function(*arguments)`` for each call, in order, over ``workers`` processes.

    At most ``2 x workers`` calls are in flight, so a lazy ``calls`` is read only as fast as the
    workers keep up (memory stays bounded by the pieces in flight). Processes are spawned, not
    forked: the parent may hold threads (tokenizers, torch) that a fork would copy half-way. One
    worker means this process, on one thread, with no start-up cost.
    """
    if workers == 1:
        saved = os.environ.get(_PARALLELISM)
        try:
            initializer[0](*initializer[1])
            for function, arguments in calls:
                yield function(*arguments)
        finally:
            if saved is None:
                os.environ.pop(_PARALLELISM, None)
            else:
                os.environ[_PARALLELISM] = saved
        return
    window: collections.deque[Future[Any]] = collections.deque()
    pool = ProcessPoolExecutor(
        workers, mp_context=get_context("spawn"), initializer=_start_worker,
        initargs=(os.getpid(), *initializer),
    )  # fmt: skip
    try:
        for function, arguments in calls:
            window.append(pool.submit(function, *arguments))
            if len(window) >= 2 * workers:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()
    finally:
        # After an error (or an abandoned generator) the calls still queued are dropped, not run.
        pool.shutdown(wait=True, cancel_futures=True)


def _start_worker(parent: int, initializer: Callable[..., None], arguments: tuple[Any, ...]) -> None:
    """Worker start-up: tie the worker's life to ``parent``'s, then ``initializer(*arguments)``."""
    _die_with_parent(parent)
    initializer(*arguments)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when ``parent`` (the process that started it) dies.

    A main process killed outright (SIGKILL from the OOM killer or after the kubelet's grace
    period) cannot stop its workers, which would go on writing shards and holding memory and
    the volume. Linux's ``prctl(PR_SET_PDEATHSIG)`` kills them with it, with no thread or pipe
    to watch; it fires when the *thread* that started the worker ends, which for a
    ``ProcessPoolExecutor`` is the one calling ``submit`` and it outlives the pool. The parent's
    pid is checked afterwards, in case it died before the call (the worker has been re-parented
    by then). Elsewhere than on Linux only that check is made.

    Raises:
        OSError: prctl failed.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)


def _start_directory(directory: Path, parameters: dict[str, Any], pattern: str) -> None:
    """Record ``parameters`` in ``directory`` before anything else is written there.

    Files left by an interrupted run with the same parameters are kept (they are complete: each
    was renamed into place); with other parameters they are deleted, and so is the old
    metadata, so that an interrupted run is never taken for a finished one.
    """
    directory.mkdir(parents=True, exist_ok=True)
    for name in (METADATA_FILE, MANIFEST_FILE):
        (directory / name).unlink(missing_ok=True)
    if _read_json(directory / PARAMETERS_FILE) != parameters:
        for stale in directory.glob(pattern):
            stale.unlink()
        _write_json(directory / PARAMETERS_FILE, parameters)


def _reuse(stage: str, made: dict[str, Any] | None, key: dict[str, Any], where: Path | None = None) -> bool:
    """Whether what an earlier run finished for ``stage``, recorded as ``made``, has ``key``.

    Prints a line saying so, or why the stage is made again.
    """
    place = f" {where}" if where else ""
    if made == key:
        _report(f"{stage}: reusing{place}")
        return True
    if not made:
        _report(f"{stage}: building{place}, none was finished there before")
    else:
        _report(f"{stage}: rebuilding{place}, {_differences(made, key)}")
    return False


# How a changed key field is told, where its values say little on their own.
_CHANGED = {
    "vocab_sha256": "the vocabulary changed",
    "file_identity": "the vocabulary file changed (size/mtime)",
}


def _differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    changes = []
    for name in dict.fromkeys([*new, *old]):
        if old.get(name) == new.get(name):
            continue
        if name == "corpus":
            changes.append(corpus.describe_change(old.get(name) or [], new.get(name) or []))
        elif name in _CHANGED:
            changes.append(_CHANGED[name])
        else:
            changes.append(f"{name} changed ({_short(old.get(name))} -> {_short(new.get(name))})")
    return ", ".join(changes)


def _short(value: Any, most: int = 60) -> str:
    text = str(value)
    return text if len(text) <= most else text[: most - 3] + "..."


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, content: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


_NO_TEXT = "no document with any text was found"


def _skips(skipped: collections.Counter[str]) -> str:
    if not skipped:
        return ""
    return "; skipped: " + ", ".join(f"{count} {reason}" for reason, count in sorted(skipped.items()))


def _report(message: str) -> None:
    """One progress line on stdout, as the training loop prints its own."""
    print(f"data: {message}", flush=True)
