"""The data stage as the job runner calls it: layout, metadata, resuming and errors."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bertjob.spec import JobSpec, parse_spec
from bertpretrain import corpus
from bertpretrain.prepare import PreparedData, prepare
from bertpretrain.shards import read_shard

PHASES = [
    {"maxSeqLength": 128, "maxPredictionsPerSeq": 20, "globalBatchSize": 8, "learningRate": 1e-3, "steps": 1},
    {"maxSeqLength": 512, "maxPredictionsPerSeq": 80, "globalBatchSize": 8, "learningRate": 1e-3, "steps": 1},
]


def make_spec(shards: Path, corpus_name: str, phases: list[dict[str, Any]] = PHASES, **data: Any) -> JobSpec:
    return parse_spec(
        {
            "image": "trainer:test",
            "data": {"corpus": corpus_name, "shards": str(shards), "vocab": {"trainSize": 1000},
                     "dupeFactor": 1, "numShards": 3, **data},
            "phases": phases,
            "checkpoint": {"path": str(shards / "checkpoints")},
        }
    )  # fmt: skip


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 documents of the Python docs in BERT's format: a sentence per line, blank line between."""
    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    docs = islice(corpus.documents(corpus.BUILTIN_PYTHON_DOCS), 60)
    path.write_text("\n\n".join("\n".join(document) for document in docs) + "\n", encoding="utf-8")
    return path


def shard_files(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted(directory.iterdir())}


def test_builtin_python_docs_give_both_phases(tmp_path: Path) -> None:
    data = prepare(make_spec(tmp_path, corpus.BUILTIN_PYTHON_DOCS))
    assert data == PreparedData(
        tmp_path / "vocab",
        1000,
        [tmp_path / "seq_len_128_max_pred_20", tmp_path / "seq_len_512_max_pred_80"],
    )
    assert sorted(p.name for p in data.vocab_dir.iterdir()) == ["tokenizer.json", "vocab.txt"]
    for directory, (length, predictions) in zip(data.phase_dirs, [(128, 20), (512, 80)], strict=True):
        names = ["metadata.json", "shard_00000.hdf5", "shard_00001.hdf5", "shard_00002.hdf5"]
        assert sorted(p.name for p in directory.iterdir()) == names
        metadata = json.loads((directory / "metadata.json").read_text())
        assert metadata["documents"] > 300 and metadata["sentences"] > 10_000 and metadata["tokens"] > 100_000
        assert metadata["parameters"]["max_seq_length"] == length
        assert metadata["parameters"]["seed"] == 12345 and metadata["parameters"]["dupe_factor"] == 1
        rows = 0
        for name in names[1:]:
            arrays = read_shard(directory / name)
            assert arrays["input_ids"].shape[1] == length and arrays["masked_lm_ids"].shape[1] == predictions
            assert arrays["input_ids"].max() < data.vocab_size
            rows += len(arrays["input_ids"])
        assert rows == metadata["instances"] == sum(s["instances"] for s in metadata["shards"])
        assert 0.45 < metadata["random_next"] / rows < 0.62


def test_second_run_reads_nothing(tmp_path: Path, text_corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = make_spec(tmp_path, str(text_corpus))
    first = prepare(spec)
    before = {d: shard_files(d) for d in [first.vocab_dir, *first.phase_dirs]}

    def no_corpus(name: str) -> None:
        raise AssertionError("the corpus was read again")

    monkeypatch.setattr(corpus, "documents", no_corpus)
    assert prepare(spec) == first
    assert {d: shard_files(d) for d in before} == before


def test_changed_parameters_remake_only_what_changed(tmp_path: Path, text_corpus: Path) -> None:
    first = prepare(make_spec(tmp_path, str(text_corpus)))
    vocab_before = shard_files(first.vocab_dir)
    phase1_before = shard_files(first.phase_dirs[0])
    phases = [PHASES[0], {**PHASES[1], "maxSeqLength": 256, "maxPredictionsPerSeq": 40}]
    second = prepare(make_spec(tmp_path, str(text_corpus), phases))
    assert shard_files(second.vocab_dir) == vocab_before
    assert shard_files(second.phase_dirs[0]) == phase1_before
    assert second.phase_dirs[1].name == "seq_len_256_max_pred_40"
    # Fewer shards: the old ones must not stay behind to be read as part of the dataset.
    third = prepare(make_spec(tmp_path, str(text_corpus), numShards=2))
    remade = sorted(shard_files(third.phase_dirs[0]))
    assert remade == ["metadata.json", "shard_00000.hdf5", "shard_00001.hdf5"]


def test_interrupted_dataset_is_made_again(tmp_path: Path, text_corpus: Path) -> None:
    data = prepare(make_spec(tmp_path, str(text_corpus)))
    # A run stopped while writing: no metadata.json yet, a shard half written.
    (data.phase_dirs[0] / "metadata.json").unlink()
    (data.phase_dirs[0] / "shard_00001.hdf5").write_bytes(b"\x89HDF\r\n")
    prepare(make_spec(tmp_path, str(text_corpus)))
    assert (data.phase_dirs[0] / "metadata.json").is_file()
    assert len(read_shard(data.phase_dirs[0] / "shard_00001.hdf5")["input_ids"]) > 0


def test_same_vocabulary_and_seed_give_identical_shards(tmp_path: Path, text_corpus: Path) -> None:
    trained = prepare(make_spec(tmp_path / "a", str(text_corpus), PHASES[:1]))
    vocab_file = str(trained.vocab_dir / "vocab.txt")
    runs = [
        prepare(make_spec(tmp_path / run, str(text_corpus), PHASES[:1], vocab={"file": vocab_file}))
        for run in ("b", "c")
    ]
    assert runs[0].vocab_size == trained.vocab_size
    for name in ("shard_00000.hdf5", "shard_00001.hdf5", "shard_00002.hdf5"):
        b, c = (read_shard(run.phase_dirs[0] / name) for run in runs)
        assert all(np.array_equal(b[key], c[key]) for key in b)
    other_seed = make_spec(tmp_path / "d", str(text_corpus), PHASES[:1], vocab={"file": vocab_file})
    other = prepare(other_seed.model_copy(update={"seed": 1}))
    ids = read_shard(other.phase_dirs[0] / "shard_00000.hdf5")["input_ids"]
    assert not np.array_equal(ids, read_shard(runs[0].phase_dirs[0] / "shard_00000.hdf5")["input_ids"])


def test_missing_corpus_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no-such-corpus"):
        prepare(make_spec(tmp_path, str(tmp_path / "no-such-corpus")))


def test_vocabulary_file_without_mask_is_named(tmp_path: Path, text_corpus: Path) -> None:
    vocab = tmp_path / "my-vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"my-vocab\.txt: the vocabulary has no \[MASK\] token"):
        prepare(make_spec(tmp_path / "out", str(text_corpus), vocab={"file": str(vocab)}))
