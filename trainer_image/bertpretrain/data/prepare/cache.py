"""What the data stage reuses and resumes: each stage's key (everything that made its output), the
records that hold it, and the bookkeeping that keeps files of an interrupted run with the same key.

A stage's key is recorded in a file written last and only on success (``vocab/parameters.json``,
``documents/manifest.json``, ``<dataset>/metadata.json``); a re-run reuses a stage whose recorded
key matches and otherwise makes it again, printing why. The pieces' and shards' directories also
record their key in ``parameters.json`` first (:func:`start_directory`), so that a re-run after an
interruption keeps the files made with the same key and makes only what is missing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bertjob_api.files import write_atomically
from bertjob_api.spec import DataSpec, JobSpec, PhaseSpec
from bertpretrain.data.format import vocab
from bertpretrain.data.format.shards import SHARD_FORMAT
from bertpretrain.data.prepare.corpus.sources import CorpusIdentity, Listing, code_versions, describe_change
from bertpretrain.data.prepare.instances import HELDOUT_DUPE_FACTOR, InstanceParams
from bertpretrain.data.prepare.messages import report

METADATA_FILE = "metadata.json"
# The corpus's listing (sources.CorpusIdentity.listing), beside the records whose key holds its digest.
CORPUS_FILES = "corpus_files.json"
PARAMETERS_FILE = "parameters.json"
MANIFEST_FILE = "manifest.json"
PIECE_BYTES = 1 << 20


# Keys -------------------------------------------------------------------------------------------


def vocab_key(spec: JobSpec, corpus: CorpusIdentity) -> dict[str, Any]:
    """Everything the vocabulary is made from: the file, or the corpus, the code that reads and
    splits it (:func:`~.corpus.sources.code_versions`) and the training settings."""
    data = spec.data
    settings = {"lowercase": data.lowercase, "pad_to_multiple_of": data.vocab.pad_to_multiple_of}
    if data.vocab.file is not None:
        try:
            stat = Path(data.vocab.file).stat()
        except OSError:
            # Made again, and import_vocab names the missing file.
            return {"file": data.vocab.file, "file_identity": None, **settings}
        return {"file": data.vocab.file, "file_identity": [stat.st_size, stat.st_mtime_ns], **settings}
    return {
        "train_size": data.vocab.train_size,
        **settings,
        "seed": spec.seed,
        "corpus": corpus.key,
        "corpus_code": code_versions(data.sources),
    }


def documents_key(spec: JobSpec, corpus: CorpusIdentity, vocab_dir: Path) -> dict[str, Any]:
    """Everything the tokenized pieces are made from: the corpus, the code that reads and splits
    it, the vocabulary and the settings.

    The vocabulary counts by the SHA-256 of both its files: ``tokenizer.json`` also holds the
    normalizer, so a ``vocab.txt`` taken again with another ``lowercase`` is another vocabulary.
    """
    vocab_hash = hashlib.sha256()
    for name in (vocab.VOCAB_FILE, vocab.TOKENIZER_FILE):
        vocab_hash.update((vocab_dir / name).read_bytes())
    return {
        "corpus": corpus.key,
        "corpus_code": code_versions(spec.data.sources),
        "vocab_sha256": vocab_hash.hexdigest(),
        "seed": spec.seed,
        "heldout_fraction": spec.data.heldout_fraction,
        "piece_bytes": piece_bytes(spec.data),
    }


def piece_bytes(data: DataSpec) -> int:
    """How much text (UTF-8 bytes) a piece holds at most: ``PIECE_BYTES``, less under ``maxShardMB``."""
    if data.max_shard_mb is None:
        return PIECE_BYTES
    return max(1, min(PIECE_BYTES, int(data.max_shard_mb * 1e6)))


def dataset_key(
    spec: JobSpec, phase: PhaseSpec, documents_key: dict[str, Any], vocab_size: int
) -> dict[str, Any]:
    """Everything a phase's shards are made from: the pieces' key, the instance and masking
    parameters, the passes over the held-out documents (``heldout_dupe_factor``: datasets made
    before it was recorded repeated each held-out segment ``dupe_factor`` times, and a key
    without it does not match, so they are remade), and the shards' on-disk format (so that
    shards of an older layout are remade)."""
    data = spec.data
    return {
        **documents_key,
        "vocab_size": vocab_size,
        **asdict(_instance_params(spec, phase)),
        "heldout_dupe_factor": HELDOUT_DUPE_FACTOR,
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
        next_sentence_prediction=spec.objective == "mlm-nsp",
    )


# Bookkeeping ------------------------------------------------------------------------------------


def start_directory(directory: Path, parameters: dict[str, Any], pattern: str) -> None:
    """Record ``parameters`` in ``directory`` before anything else is written there.

    Files left by an interrupted run with the same parameters are kept (they are complete: each
    was renamed into place); with other parameters they are deleted, and so is the old
    metadata, so that an interrupted run is never taken for a finished one.
    """
    directory.mkdir(parents=True, exist_ok=True)
    for name in (METADATA_FILE, MANIFEST_FILE):
        (directory / name).unlink(missing_ok=True)
    if read_json(directory / PARAMETERS_FILE) != parameters:
        for stale in directory.glob(pattern):
            stale.unlink()
        write_json(directory / PARAMETERS_FILE, parameters)


def reuse(
    stage: str,
    made: dict[str, Any] | None,
    key: dict[str, Any],
    where: Path | None = None,
    listings: tuple[Listing | None, Listing] | None = None,
) -> bool:
    """Whether what an earlier run finished for ``stage``, recorded as ``made``, has ``key``.

    Prints a line saying so, or why the stage is made again. ``listings``: the corpus's listing
    recorded with ``made`` (:func:`read_listing`; None when missing) and the current one, to name
    the files that changed.
    """
    place = f" {where}" if where else ""
    if made == key:
        report(f"{stage}: reusing{place}")
        return True
    if not made:
        report(f"{stage}: building{place}, none was finished there before")
    else:
        report(f"{stage}: rebuilding{place}, {_differences(made, key, listings)}")
    return False


# How a changed key field is told, where its values say little on their own.
_CHANGED = {
    "vocab_sha256": "the vocabulary changed",
    "file_identity": "the vocabulary file changed (size/mtime)",
}


def _differences(
    old: dict[str, Any], new: dict[str, Any], listings: tuple[Listing | None, Listing] | None
) -> str:
    changes = []
    for name in dict.fromkeys([*new, *old]):
        if old.get(name) == new.get(name):
            continue
        if name == "corpus":
            old_listing, new_listing = listings or (None, [])
            changes.append(
                describe_change(old.get(name) or [], new.get(name) or [], old_listing, new_listing)
            )
        elif name == "corpus_code" and isinstance(old.get(name), dict) and isinstance(new.get(name), dict):
            changes.append(
                f"the code that reads or splits the corpus changed ({_versions(old[name], new[name])})"
            )
        elif name in _CHANGED:
            changes.append(_CHANGED[name])
        else:
            changes.append(f"{name} changed ({_short(old.get(name))} -> {_short(new.get(name))})")
    return ", ".join(changes)


def _versions(old: dict[str, Any], new: dict[str, Any]) -> str:
    """Which versions of ``code_versions`` differ: ``"readers.bert 1 -> 2"``."""
    flat_old = {f"{part}.{name}": v for part, versions in old.items() for name, v in dict(versions).items()}
    flat_new = {f"{part}.{name}": v for part, versions in new.items() for name, v in dict(versions).items()}
    return ", ".join(
        f"{name} {flat_old.get(name)} -> {flat_new.get(name)}"
        for name in sorted({*flat_old, *flat_new})
        if flat_old.get(name) != flat_new.get(name)
    )


def _short(value: Any, most: int = 60) -> str:
    text = str(value)
    return text if len(text) <= most else text[: most - 3] + "..."


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; empty when it is missing or not a JSON object."""
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return content if isinstance(content, dict) else {}


def write_json(path: Path, content: dict[str, Any], indent: int | None = 2) -> None:
    """Replace ``path`` with ``content`` as JSON, synced (:func:`bertjob_api.files.write_atomically`).

    Raises:
        bertjob_api.files.DiskFullError: no space left; the old file is left whole.
    """
    data = (json.dumps(content, indent=indent) + "\n").encode("utf-8")
    write_atomically(path, lambda file: file.write(data), len(data))


def write_listing(directory: Path, corpus: CorpusIdentity) -> None:
    """Keep the corpus's listing in ``directory`` (before its record is written), to name the files
    that changed on a later run. Compact JSON: with 100,000 files it is megabytes."""
    write_json(directory / CORPUS_FILES, {"sources": corpus.listing}, indent=None)


def read_listing(directory: Path) -> Listing | None:
    """The listing :func:`write_listing` kept in ``directory``; None when there is none."""
    listing = read_json(directory / CORPUS_FILES).get("sources")
    return listing if isinstance(listing, list) else None
