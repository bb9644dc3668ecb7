"""Pass 2 of the data stage: the pieces dealt to a phase's shards in a seeded order, and each shard
made by a worker from its units alone: sentence pairs (single segments for the objective ``mlm``),
masks, optional packing, one HDF5 file. Training shards take ``dupe_factor`` passes over their
documents, held-out shards one (``heldout_dupe_factor`` in the dataset's key), so that no held-out
segment is scored twice.

Shards made for ``mlm`` have no ``next_sentence_labels`` dataset, packed or not
(``bertpretrain.data.format.shards``), so that nothing can train next sentence prediction on them."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from bertpretrain.common.progress import ProgressBar
from bertpretrain.data.format import vocab
from bertpretrain.data.format.masking import mask_tokens
from bertpretrain.data.format.shards import (
    DYNAMIC_DTYPES,
    NEXT_SENTENCE_LABELS,
    SHARD_DTYPES,
    read_attrs,
    shard_shapes,
    storage_dtypes,
    without_next_sentence_labels,
)
from bertpretrain.data.prepare import documents
from bertpretrain.data.prepare.cache import METADATA_FILE, start_directory, write_json
from bertpretrain.data.prepare.instances import (
    InstanceParams,
    Pairs,
    assemble,
    create_pairs,
    create_segments,
)
from bertpretrain.data.prepare.messages import report
from bertpretrain.data.prepare.packing import pack_instances, padding_fraction
from bertpretrain.data.prepare.pieces import Piece
from bertpretrain.data.prepare.pool import run_parallel
from bertpretrain.data.prepare.shard_writer import ShardWriter, write_shard

SPLITS = ("train", "heldout")
# Instances made, masked and written at a time (a multiple of every chunk's rows: see ShardWriter).
BLOCK_ROWS = 8192
_SHARD_PREFIX = {"train": "shard", "heldout": "heldout"}


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


def make_dataset(
    directory: Path,
    documents_dir: Path,
    parameters: dict[str, Any],
    pieces: list[Piece],
    special: vocab.SpecialIds,
    tokenizer: Tokenizer,
    workers: int,
) -> None:
    """Pass 2 for one phase: every shard of every split, made from the pieces in ``documents_dir``
    by ``workers`` processes, then ``metadata.json``.

    ``metadata.json`` records ``parameters`` (the dataset's key) and is written last, and only
    when there is something to train on.

    Raises:
        ValueError: no training instance was made (every document held out, say).
    """
    started = time.perf_counter()
    start_directory(directory, parameters, "*.hdf5")
    plan = plan_shards(pieces, parameters)
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
        ProgressBar(
            run_parallel(calls, workers, initializer),
            total=len(tasks),
            desc=f"data: {directory.name}",
            unit="shards",
        ),
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
    write_json(directory / METADATA_FILE, metadata)
    packed = (
        f", {metadata['rows']} packed rows of {metadata['sequences_per_row']:.2f} sequences, padding "
        f"{metadata['padding_before_packing']:.1%} -> {metadata['padding']:.1%}"
        if parameters["packing"] != "none"
        else f", padding {metadata['padding']:.1%}"
    )
    heldout = (
        f" (+{metadata['heldout']['instances']} held out, distinct segments: one pass)"
        if results["heldout"]
        else ""
    )
    random_next = (
        f" ({metadata['random_next']} random next)" if parameters["next_sentence_prediction"] else ""
    )
    report(
        f"{directory}: {metadata['instances']} instances{heldout}{random_next} "
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
    if task.split == "heldout":
        # One pass: every held-out row a distinct segment (instances.HELDOUT_DUPE_FACTOR says why).
        params = replace(params, dupe_factor=parameters["heldout_dupe_factor"])
    split_index = SPLITS.index(task.split)
    # A shard may hold several units of one piece: read each piece once (units are dealt in a
    # random order, so only consecutive units of one piece share a read). Only the selected
    # documents are kept, so memory holds the shard's documents and one piece.
    parts = []
    piece_file, piece = None, None
    for unit in task.units:
        if unit.file != piece_file:
            piece_file, piece = unit.file, documents.load_piece(_shard_context["documents_dir"] / unit.file)
        assert piece is not None
        in_unit = np.zeros(piece.num_documents, bool)
        in_unit[unit.first : unit.last] = True
        parts.append(piece.select(in_unit & (piece.heldout == bool(split_index))))
    del piece
    docs = documents.concatenate(parts)
    del parts
    rng = np.random.default_rng(
        [parameters["seed"], params.max_seq_length, params.max_predictions_per_seq, split_index, task.index]
    )
    pairs = (create_pairs if params.next_sentence_prediction else create_segments)(docs, params, rng)
    counts = {
        "documents": docs.num_documents,
        "text_bytes": int(docs.text_bytes.sum()),
        "instances": len(pairs),
        "random_next": int(pairs.is_random_next.sum()),
        "tokens": int(pairs.lengths.sum()),
        "max_seq_length": params.max_seq_length,
    }
    if parameters["packing"] != "none":
        # Packing looks at the whole shard's lengths at once, so a packed shard is held whole.
        arrays = _instances(pairs, docs.tokens, params, parameters, rng)
        arrays = pack_instances(
            arrays, parameters["max_sequences_per_pack"], parameters["packing"], rng,
            next_sentence_prediction=params.next_sentence_prediction,
        )  # fmt: skip
        rows = len(arrays["input_ids"])
        masked = int((arrays["masked_lm_positions"] > 0).sum())
        write_shard(task.path, arrays, _with_rows(counts, masked, rows, pairs))
        return _with_rows(counts, masked, rows, pairs)
    static = parameters["masking"] == "static"
    schema = SHARD_DTYPES if static else DYNAMIC_DTYPES
    if not params.next_sentence_prediction:
        schema = without_next_sentence_labels(schema)
    dtypes = storage_dtypes(schema, parameters["vocab_size"], params.max_seq_length)
    widths = {
        name: shard_shapes(0, params.max_seq_length, params.max_predictions_per_seq)[name][1]
        for name in dtypes
        if name != NEXT_SENTENCE_LABELS
    }
    masked = 0
    # Instances are made, masked and written a block at a time: memory holds a block, not the shard.
    with ShardWriter(task.path, dtypes, widths, BLOCK_ROWS) as writer:
        for start in range(0, len(pairs), BLOCK_ROWS):
            arrays = _instances(pairs[start : start + BLOCK_ROWS], docs.tokens, params, parameters, rng)
            if static:
                masked += int((arrays["masked_lm_positions"] > 0).sum())
            writer.append(arrays)
        counts = _with_rows(counts, masked, len(pairs), pairs)
        writer.finish(counts)
    return counts


def _instances(
    pairs: Pairs, tokens: np.ndarray, params: InstanceParams, parameters: dict[str, Any],
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:  # fmt: skip
    """The pairs as instances in NVIDIA's arrays, masked when masking is static; without
    ``next_sentence_labels`` for the objective ``mlm``."""
    arrays = assemble(pairs, tokens, params.max_seq_length, _shard_context["special"])
    if not params.next_sentence_prediction:
        del arrays[NEXT_SENTENCE_LABELS]
    if parameters["masking"] == "static":
        arrays.update(
            mask_tokens(
                arrays["input_ids"], arrays["input_mask"], params.max_predictions_per_seq,
                params.masked_lm_prob, _shard_context["special"], parameters["vocab_size"], rng,
                _shard_context["continuation"],
            )
        )  # fmt: skip
    return arrays


def _with_rows(counts: dict[str, Any], masked: int, rows: int, pairs: Pairs) -> dict[str, Any]:
    max_seq_length = counts["max_seq_length"]
    return {
        **counts,
        "masked": masked,
        "rows": rows,
        "slots": rows * max_seq_length,
        "padding": padding_fraction(pairs.lengths, rows, max_seq_length) if rows else 0.0,
    }
