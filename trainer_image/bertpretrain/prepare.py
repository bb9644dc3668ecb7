"""The data stage of a BertPretrainJob: corpus -> vocabulary -> instances -> HDF5 shards.

Everything goes under ``spec.data.shards``::

    vocab/vocab.txt, vocab/tokenizer.json           the WordPiece vocabulary (bertpretrain.vocab)
    seq_len_{L}_max_pred_{P}/shard_{i:05d}.hdf5     one dataset per phase (bertpretrain.shards)
    seq_len_{L}_max_pred_{P}/metadata.json          counts and parameters, written last

The corpus is read and tokenized once; each phase's (max_seq_length, max_predictions_per_seq)
then gets its own instances, made with a fresh ``random.Random(spec.seed)`` so that a phase's data
does not depend on which other phases were made in the same run. Instances are dealt to the
shards in turn, as Google's script deals them to its output files.

Resuming: a phase whose ``metadata.json`` records the same parameters (including the vocabulary's
SHA-256) is kept as it is, and an existing trained vocabulary is reused when its lower-casing
matches; delete a directory to have it made again. A corpus whose files changed under the same
name is not noticed.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from tqdm import tqdm

from bertjob.spec import JobSpec, PhaseSpec
from bertpretrain import corpus, vocab
from bertpretrain.instances import InstanceParams, create_training_instances
from bertpretrain.shards import write_shard

VOCAB_DIR = "vocab"
METADATA_FILE = "metadata.json"


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


def phase_dir_name(max_seq_length: int, max_predictions_per_seq: int) -> str:
    """Name of a phase's dataset directory, as NVIDIA names its datasets' directories."""
    return f"seq_len_{max_seq_length}_max_pred_{max_predictions_per_seq}"


def prepare(spec: JobSpec) -> PreparedData:
    """Make (or find already made) the vocabulary and every phase's shards for ``spec``.

    Raises:
        FileNotFoundError: the corpus or the vocabulary file does not exist.
        ValueError: a corpus file is not UTF-8, or the vocabulary lacks a special token.
    """
    data = spec.data
    root = Path(data.shards)
    vocab_dir = root / VOCAB_DIR
    documents = _make_vocab(spec, vocab_dir)
    tokenizer = vocab.load_tokenizer(vocab_dir)
    special = vocab.SpecialIds.of(tokenizer, vocab_dir / vocab.VOCAB_FILE)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    vocab_sha256 = hashlib.sha256((vocab_dir / vocab.VOCAB_FILE).read_bytes()).hexdigest()
    _report(f"vocabulary: {vocab_size} tokens, lowercase={_lowercase(tokenizer)}")

    phase_dirs = [root / phase_dir_name(p.max_seq_length, p.max_predictions_per_seq) for p in spec.phases]
    pending = {}
    for phase, directory in zip(spec.phases, phase_dirs, strict=True):
        parameters = _parameters(spec, phase, vocab_sha256, vocab_size)
        if _read_metadata(directory).get("parameters") == parameters:
            _report(f"{directory}: already made with these parameters, kept")
        else:
            pending[directory] = parameters
    if pending:
        if documents is None:
            documents = _read_corpus(data.corpus)
        started = time.perf_counter()
        token_ids = vocab.tokenize_documents(tokenizer, documents)
        counts = {
            "documents": len(token_ids),
            "sentences": sum(len(d) for d in token_ids),
            "tokens": sum(len(s) for d in token_ids for s in d),
        }
        seconds = time.perf_counter() - started
        _report(
            f"tokenized {counts['documents']} documents, {counts['sentences']} sentences, "
            f"{counts['tokens']} tokens in {seconds:.1f} s"
        )
        for directory, parameters in pending.items():
            _make_dataset(directory, parameters, token_ids, counts, special, vocab_size)
    return PreparedData(vocab_dir, vocab_size, phase_dirs)


def _make_vocab(spec: JobSpec, vocab_dir: Path) -> list[list[str]] | None:
    """Train, copy or reuse the vocabulary; returns the corpus when it had to be read."""
    data = spec.data
    reason = _vocab_to_make(spec, vocab_dir)
    if reason is None:
        _report(f"vocabulary: reusing {vocab_dir}")
        return None
    if data.vocab.file is not None:
        vocab.import_vocab(Path(data.vocab.file), data.lowercase, vocab_dir)
        _report(f"vocabulary: {data.vocab.file} copied to {vocab_dir}")
        return None
    assert data.vocab.train_size is not None  # VocabSpec holds exactly one of the two
    _report(f"vocabulary: training {data.vocab.train_size} tokens ({reason})")
    documents = _read_corpus(data.corpus)
    started = time.perf_counter()
    vocab.train_vocab(documents, data.vocab.train_size, data.lowercase, vocab_dir)
    _report(f"vocabulary: trained in {time.perf_counter() - started:.1f} s -> {vocab_dir}")
    return documents


def _vocab_to_make(spec: JobSpec, vocab_dir: Path) -> str | None:
    """Why the vocabulary must be made (trained or copied), or None to reuse the one there."""
    if spec.data.vocab.file is not None:
        # Copying is cheap and catches a changed file; the SHA-256 then decides what to remake.
        return "from file"
    if not all((vocab_dir / name).is_file() for name in (vocab.VOCAB_FILE, vocab.TOKENIZER_FILE)):
        return "none yet"
    existing = _lowercase(vocab.load_tokenizer(vocab_dir))
    if existing != spec.data.lowercase:
        return f"the one in {vocab_dir} has lowercase={existing}"
    return None


def _lowercase(tokenizer: Tokenizer) -> bool | None:
    return getattr(tokenizer.normalizer, "lowercase", None)


def _parameters(spec: JobSpec, phase: PhaseSpec, vocab_sha256: str, vocab_size: int) -> dict[str, Any]:
    data = spec.data
    return {
        "corpus": data.corpus,
        "vocab_sha256": vocab_sha256,
        "vocab_size": vocab_size,
        "lowercase": data.lowercase,
        **asdict(_instance_params(spec, phase)),
        "seed": spec.seed,
        "num_shards": data.num_shards,
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


def _read_metadata(directory: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((directory / METADATA_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


def _read_corpus(name: str) -> list[list[str]]:
    started = time.perf_counter()
    documents = list(tqdm(corpus.documents(name), desc="reading corpus", unit="document"))
    seconds = time.perf_counter() - started
    sentences = sum(len(d) for d in documents)
    _report(f"corpus {name}: {len(documents)} documents, {sentences} sentences in {seconds:.1f} s")
    return documents


def _make_dataset(
    directory: Path,
    parameters: dict[str, Any],
    token_ids: list[list[list[int]]],
    counts: dict[str, int],
    special: vocab.SpecialIds,
    vocab_size: int,
) -> None:
    started = time.perf_counter()
    params = InstanceParams(**{field.name: parameters[field.name] for field in fields(InstanceParams)})
    instances = create_training_instances(
        token_ids, params, special, vocab_size, random.Random(parameters["seed"])
    )
    directory.mkdir(parents=True, exist_ok=True)
    # The metadata goes first and comes back last, so that an interrupted run is never taken
    # for a finished one; shards of an earlier, larger num_shards must not be read as ours.
    (directory / METADATA_FILE).unlink(missing_ok=True)
    for stale in directory.glob("shard_*.hdf5"):
        stale.unlink()
    num_shards = parameters["num_shards"]
    if len(instances) < num_shards:
        _report(f"{directory}: warning: only {len(instances)} instances for {num_shards} shards")
    shards = []
    for i in tqdm(range(num_shards), desc=f"writing {directory.name}", unit="shard"):
        path = directory / f"shard_{i:05d}.hdf5"
        part = instances[i::num_shards]
        write_shard(path, part, params.max_seq_length, params.max_predictions_per_seq)
        shards.append({"file": path.name, "instances": len(part)})
    metadata = {
        "instances": len(instances),
        "random_next": sum(instance.is_random_next for instance in instances),
        **counts,
        "seconds": round(time.perf_counter() - started, 2),
        "parameters": parameters,
        "shards": shards,
    }
    tmp = directory / (METADATA_FILE + ".tmp")
    tmp.write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, directory / METADATA_FILE)
    _report(
        f"{directory}: {len(instances)} instances ({metadata['random_next']} random next) "
        f"in {num_shards} shards, {metadata['seconds']:.1f} s"
    )


def _report(message: str) -> None:
    """One progress line on stdout, as the training loop prints its own."""
    print(f"data: {message}", flush=True)
