"""Fixtures for the trainer's tests: small real HDF5 shards, a vocabulary and job specs.

The shards follow NVIDIA DeepLearningExamples' schema. Tokens are drawn from a Zipf
distribution, so that a model can lower its MLM loss below ln V within a few steps by learning
token frequencies; sentence B copies sentence A when ``next_sentence_labels`` is 0.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from tokenizers import BertWordPieceTokenizer

from bertjob_api.defaults import with_defaults
from bertjob_api.spec import JobSpec, parse_spec
from bertpretrain.data.format.shards import read_shard
from bertpretrain.data.prepare import shard_writer
from bertpretrain.data.prepare.packing import pack_instances
from bertpretrain.model.config import BertConfig

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [
    *"abcdefghijklmnopqrstuvwxyz",
    *".,!",
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "was",
    "here",
    "is",
]
VOCAB = SPECIALS + WORDS
VOCAB_SIZE = len(VOCAB)
CLS, SEP, MASK = 2, 3, 4
TINY_MODEL = {
    "hiddenSize": 32,
    "numHiddenLayers": 2,
    "numAttentionHeads": 2,
    "intermediateSize": 64,
    "maxPositionEmbeddings": 128,
}


def _instance(
    rng: np.random.Generator,
    max_seq_length: int,
    max_predictions_per_seq: int,
    probs: np.ndarray,
    min_length: int,
) -> dict[str, Any]:
    length = int(rng.integers(min_length, max_seq_length + 1))
    len_a = (length - 3) // 2
    random_next = int(rng.integers(0, 2))
    sentence_a = rng.choice(len(probs), size=len_a, p=probs) + len(SPECIALS)
    sentence_b = rng.choice(len(probs), size=length - 3 - len_a, p=probs) + len(SPECIALS)
    if not random_next:
        sentence_b = np.resize(sentence_a, len(sentence_b))
    tokens = np.concatenate([[CLS], sentence_a, [SEP], sentence_b, [SEP]])
    segments = np.concatenate([np.zeros(len_a + 2), np.ones(length - len_a - 2)])
    candidates = np.flatnonzero(tokens >= len(SPECIALS))
    count = min(max_predictions_per_seq, max(1, round(0.15 * len(candidates))))
    positions = np.sort(rng.choice(candidates, size=count, replace=False))
    labels = tokens[positions]
    tokens = tokens.copy()
    tokens[positions] = MASK
    return {
        "tokens": tokens,
        "segments": segments,
        "positions": positions,
        "labels": labels,
        "random_next": random_next,
    }


def write_shard(
    path: Path,
    num_sequences: int,
    max_seq_length: int,
    max_predictions_per_seq: int,
    seed: int,
    min_length: int | None = None,
) -> None:
    """One shard of valid random instances in NVIDIA's schema and dtypes, of ``min_length``
    (default half of ``max_seq_length``) to ``max_seq_length`` tokens. Written as NVIDIA's script
    writes them, gzip-compressed without checksums: the shards of other tools must load too."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, len(WORDS) + 1)
    probs = ranks**-1.2 / np.sum(ranks**-1.2)
    arrays: dict[str, np.ndarray] = {
        "input_ids": np.zeros((num_sequences, max_seq_length), np.int32),
        "input_mask": np.zeros((num_sequences, max_seq_length), np.int8),
        "segment_ids": np.zeros((num_sequences, max_seq_length), np.int8),
        "masked_lm_positions": np.zeros((num_sequences, max_predictions_per_seq), np.int32),
        "masked_lm_ids": np.zeros((num_sequences, max_predictions_per_seq), np.int32),
        "next_sentence_labels": np.zeros(num_sequences, np.int8),
    }
    for row in range(num_sequences):
        shortest = max_seq_length // 2 if min_length is None else min_length
        instance = _instance(rng, max_seq_length, max_predictions_per_seq, probs, shortest)
        length, count = len(instance["tokens"]), len(instance["positions"])
        arrays["input_ids"][row, :length] = instance["tokens"]
        arrays["input_mask"][row, :length] = 1
        arrays["segment_ids"][row, :length] = instance["segments"]
        arrays["masked_lm_positions"][row, :count] = instance["positions"]
        arrays["masked_lm_ids"][row, :count] = instance["labels"]
        arrays["next_sentence_labels"][row] = instance["random_next"]
    with h5py.File(path, "w") as file:
        for name, values in arrays.items():
            file.create_dataset(name, data=values, compression="gzip")


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Run tiny models on one intra-op thread (``pytestmark = pytest.mark.usefixtures(...)``): on
    a small shared machine a second OpenMP thread makes their steps slower, by up to hundreds of
    milliseconds when it is descheduled. ``OMP_NUM_THREADS`` keeps the xeon-cpu device setup of
    :func:`bertpretrain.runtime.parallel.joining.join` at one thread too (set apart from the test's own
    ``monkeypatch``, which a test may undo halfway)."""
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        torch.set_num_threads(1)
        yield
    torch.set_num_threads(threads)


ShardMaker = Callable[..., Path]


@pytest.fixture
def make_shards(tmp_path: Path) -> ShardMaker:
    """``make_shards(name, max_seq_length, max_predictions_per_seq, num_shards=3,
    sequences_per_shard=40, prefix="shard", min_length=None) -> directory`` of
    ``<prefix>_*.hdf5`` files under ``tmp_path`` (``prefix="heldout"`` for held-out shards)."""

    def make(
        name: str,
        max_seq_length: int = 32,
        max_predictions_per_seq: int = 5,
        num_shards: int = 3,
        sequences_per_shard: int = 40,
        prefix: str = "shard",
        min_length: int | None = None,
    ) -> Path:
        directory = tmp_path / name
        directory.mkdir(exist_ok=True)
        for index in range(num_shards):
            write_shard(
                directory / f"{prefix}_{index:04d}.hdf5",
                sequences_per_shard,
                max_seq_length,
                max_predictions_per_seq,
                seed=1000 * max_seq_length + index + (500 if prefix != "shard" else 0),
                min_length=min_length,
            )
        return directory

    return make


def _damage(path: Path, dataset: str = "input_ids", size: int = 64 << 10) -> None:
    with h5py.File(path, "r") as file:
        stored = file[dataset].id
        if file[dataset].chunks is None:
            extents = [(stored.get_offset(), stored.get_storage_size())]
        else:
            infos = [stored.get_chunk_info(index) for index in range(stored.get_num_chunks())]
            extents = sorted((info.byte_offset, info.size) for info in infos)
    total = sum(length for _, length in extents)
    size = min(size, total // 2)
    skip = (total - size) // 2  # bytes of data before the damage
    garbage = np.random.default_rng(15)
    with open(path, "r+b") as handle:
        for offset, length in extents:
            start = min(max(skip, 0), length)
            end = min(max(skip + size, 0), length)
            if start < end:
                handle.seek(offset + start)
                original = np.frombuffer(handle.read(end - start), np.uint8)
                handle.seek(offset + start)
                # XOR with non-zero bytes: every byte changes.
                handle.write((original ^ garbage.integers(1, 256, len(original), np.uint8)).tobytes())
            skip -= length


@pytest.fixture
def damage_shard() -> Callable[..., None]:
    """``damage_shard(path, dataset="input_ids", size=64 KiB)``: overwrite ``size`` bytes (at
    most half of them) in the middle of the dataset's stored data with garbage, inside its chunks
    only, so that the file's structure stays intact and its values do not."""
    return _damage


@pytest.fixture
def shard_dir(make_shards: ShardMaker) -> Path:
    """Phase-1-like shards: 3 x 40 sequences of 32 tokens, 5 predictions each."""
    return make_shards("phase1")


@pytest.fixture
def packed_shard_dir(make_shards: ShardMaker) -> Path:
    """Phase-1-like shards packed with SPFHP, up to 3 instances of 6-32 tokens per row."""
    directory = make_shards("packed", min_length=6)
    for path in sorted(directory.glob("shard_*.hdf5")):
        packed = pack_instances(read_shard(path), 3, "spfhp", np.random.default_rng(0))
        path.unlink()
        shard_writer.write_shard(path, packed)
    return directory


@pytest.fixture
def vocab_dir(tmp_path: Path) -> Path:
    """A directory with ``vocab.txt`` and a matching ``tokenizer.json`` (uncased WordPiece)."""
    directory = tmp_path / "vocab"
    directory.mkdir()
    (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    tokenizer = BertWordPieceTokenizer({token: index for index, token in enumerate(VOCAB)}, lowercase=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


SpecMaker = Callable[..., JobSpec]


@pytest.fixture
def make_spec(tmp_path: Path) -> SpecMaker:
    """``make_spec(phases=[{...}], **spec fields) -> JobSpec`` through ``with_defaults``.

    A tiny model on xeon-cpu in fp32, checkpoints under ``tmp_path/checkpoints``; phase fields
    in the YAML spelling.
    """

    def make(phases: list[dict[str, Any]], **fields: Any) -> JobSpec:
        document: dict[str, Any] = {
            "image": "bertjob/trainer:test",
            "accelerator": "xeon-cpu",
            "precision": "fp32",
            "model": {"preset": "bert-tiny", **TINY_MODEL},
            "data": {"sources": [{"path": "unused"}], "shards": str(tmp_path)},
            "phases": phases,
            "checkpoint": {"path": str(tmp_path / "checkpoints"), "everySteps": 5, "keep": 2},
            "logging": {"everySteps": 5},
            "seed": 7,
            **fields,
        }
        return with_defaults(parse_spec(document))

    return make


PhaseMaker = Callable[..., dict[str, Any]]


@pytest.fixture
def make_phase() -> PhaseMaker:
    """``make_phase(**fields)``: a phase in the YAML spelling, by default seq 32, 5 predictions,
    global batch 16, 20 steps."""

    def make(**fields: Any) -> dict[str, Any]:
        return {
            "maxSeqLength": 32,
            "maxPredictionsPerSeq": 5,
            "globalBatchSize": 16,
            "learningRate": 5e-3,
            "warmupProportion": 0.1,
            "steps": 20,
            **fields,
        }

    return make


@pytest.fixture
def vocab_size() -> int:
    """Size of the fixtures' vocabulary."""
    return VOCAB_SIZE


@pytest.fixture
def tiny_config() -> BertConfig:
    """A two-layer, 32-wide BERT over the fixtures' vocabulary."""
    return BertConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )


@pytest.fixture
def file_events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The ``("fsync", path)`` and ``("rename", target)`` calls made from now on, in order
    (``os.replace`` and ``os.rename`` both count as a rename): what makes a write durable."""
    events: list[tuple[str, str]] = []
    fsync, replace, rename = os.fsync, os.replace, os.rename

    def recording_fsync(descriptor: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{descriptor}")))
        fsync(descriptor)

    def recording(move: Any) -> Any:
        def recorded(source: Any, target: Any, **kwargs: Any) -> None:
            events.append(("rename", str(target)))
            move(source, target, **kwargs)

        return recorded

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording(replace))
    monkeypatch.setattr(os, "rename", recording(rename))
    return events
