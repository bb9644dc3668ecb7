"""The data stage as the job runner calls it: layout, modes, resuming, determinism and errors."""

from __future__ import annotations

import collections
import json
from itertools import islice
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from bertjob_api.defaults import with_defaults
from bertjob_api.spec import JobSpec, SourceSpec, parse_spec
from bertpretrain.data.format.packed import PACKED_DTYPES, attention_mask
from bertpretrain.data.format.prepared import PreparedData
from bertpretrain.data.format.shards import DYNAMIC_DTYPES, SHARD_DTYPES, read_shard
from bertpretrain.data.format.vocab import SpecialIds, load_tokenizer
from bertpretrain.data.load.loader import (
    DynamicMasking,
    ShardError,
    build_loader,
    find_shards,
    heldout_batches,
)
from bertpretrain.data.prepare import cache
from bertpretrain.data.prepare.corpus import sources, splitting
from bertpretrain.data.prepare.corpus.pydocs import BUILTIN_PYTHON_DOCS
from bertpretrain.data.prepare.corpus.sources import read_source
from bertpretrain.data.prepare.stage import prepare

PHASE_128 = {"maxSeqLength": 128, "maxPredictionsPerSeq": 20, "globalBatchSize": 8, "learningRate": 1e-3,
             "steps": 1}  # fmt: skip
PHASE_512 = {**PHASE_128, "maxSeqLength": 512, "maxPredictionsPerSeq": 80}


def make_spec(shards: Path, sources: list[dict[str, Any]], phases: list[dict[str, Any]] | None = None,
              **data: Any) -> JobSpec:  # fmt: skip
    spec = parse_spec(
        {
            "image": "trainer:test",
            "data": {"sources": sources, "shards": str(shards), "vocab": {"trainSize": 1000},
                     "dupeFactor": 1, "numShards": 3, "workers": 1, **data},
            "phases": phases or [PHASE_128],
            "checkpoint": {"path": str(shards / "checkpoints")},
        }
    )  # fmt: skip
    return with_defaults(spec)


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """60 documents of the Python docs in BERT's format: a sentence per line, blank line between."""
    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    builtin = read_source(SourceSpec(path=BUILTIN_PYTHON_DOCS), collections.Counter())
    documents = [splitting.sentences(document) for document in islice(builtin, 60)]
    path.write_text("\n\n".join("\n".join(document) for document in documents) + "\n", encoding="utf-8")
    return [{"path": str(path)}]


@pytest.fixture(scope="module")
def vocab_file(text_corpus: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> str:
    """A vocabulary trained once, so that runs compared with each other share it."""
    data = prepare(make_spec(tmp_path_factory.mktemp("vocab"), text_corpus))
    return str(data.vocab_dir / "vocab.txt")


def modified_times(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted(directory.iterdir())}


def metadata(directory: Path) -> dict[str, Any]:
    return dict(json.loads((directory / "metadata.json").read_text()))


def test_builtin_python_docs_give_both_phases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = prepare(make_spec(tmp_path, [{"path": "builtin:python-docs"}], [PHASE_128, PHASE_512]))

    assert data == PreparedData(
        tmp_path / "vocab", 1000, [tmp_path / "seq_len_128_max_pred_20", tmp_path / "seq_len_512_max_pred_80"]
    )
    # .lock: held by the writer of each directory (bertpretrain.common.files.writing); the corpus's
    # listing beside the record, to name the files that change.
    vocab_files = [".lock", "corpus_files.json", "parameters.json", "tokenizer.json", "vocab.txt"]
    assert sorted(p.name for p in data.vocab_dir.iterdir()) == vocab_files
    manifest = json.loads((tmp_path / "documents" / "manifest.json").read_text())
    assert [piece["file"] for piece in manifest["pieces"]] == ["piece_000000.npz", "piece_000001.npz"]
    for directory, (length, predictions) in zip(data.phase_dirs, [(128, 20), (512, 80)], strict=True):
        names = [
            "metadata.json",
            "parameters.json",
            "shard_00000.hdf5",
            "shard_00001.hdf5",
            "shard_00002.hdf5",
        ]
        assert sorted(p.name for p in directory.iterdir()) == [".lock", *names]
        made = metadata(directory)
        assert made["documents"] > 300 and made["tokens"] > 100_000
        assert made["parameters"]["max_seq_length"] == length and made["parameters"]["dupe_factor"] == 1
        rows = 0
        for name in names[2:]:
            arrays = read_shard(directory / name)
            assert arrays["input_ids"].shape[1] == length and arrays["masked_lm_ids"].shape[1] == predictions
            assert arrays["input_ids"].max() < data.vocab_size
            assert all(array.dtype == SHARD_DTYPES[key] for key, array in arrays.items())
            rows += len(arrays["input_ids"])
        with h5py.File(directory / names[2]) as file:
            # Stored narrow (1,000 ids, 128 or 512 positions), read back in the schema's dtypes.
            assert file["input_ids"].dtype == file["masked_lm_ids"].dtype == np.uint16
            assert file["masked_lm_positions"].dtype == (np.uint8 if length == 128 else np.uint16)
        assert rows == made["instances"] == sum(s["instances"] for s in made["shards"])
        assert 0.45 < made["random_next"] / rows < 0.62
        assert made["tokens"] == sum(int(read_shard(directory / n)["input_mask"].sum()) for n in names[2:])
    report = capsys.readouterr().out
    assert "documents, " in report and " sentences, " in report and " tokens from " in report
    assert "instances" in report and "padding" in report and "instances/s" in report


def test_second_run_reads_nothing(
    tmp_path: Path, text_corpus: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = make_spec(tmp_path, text_corpus)
    first = prepare(spec)
    before = {d: modified_times(d) for d in [first.vocab_dir, *first.phase_dirs, tmp_path / "documents"]}

    def no_corpus(*_: object) -> None:
        raise AssertionError("the corpus was read again")

    monkeypatch.setattr(sources, "read_corpus", no_corpus)
    assert prepare(spec) == first
    assert {d: modified_times(d) for d in before} == before


def test_changed_parameters_remake_only_what_changed(
    tmp_path: Path, text_corpus: list[dict[str, Any]], vocab_file: str
) -> None:
    vocab = {"file": vocab_file}
    first = prepare(make_spec(tmp_path, text_corpus, vocab=vocab))
    pieces_before = modified_times(tmp_path / "documents")
    phase1_before = modified_times(first.phase_dirs[0])
    second = prepare(make_spec(tmp_path, text_corpus, [PHASE_128, PHASE_512], vocab=vocab))
    assert modified_times(second.phase_dirs[0]) == phase1_before
    assert modified_times(tmp_path / "documents") == pieces_before
    # Fewer shards: the old ones must not stay behind to be read as part of the dataset.
    third = prepare(make_spec(tmp_path, text_corpus, numShards=2, vocab=vocab))
    remade = sorted(p.name for p in third.phase_dirs[0].glob("*.hdf5"))
    assert remade == ["shard_00000.hdf5", "shard_00001.hdf5"]
    assert modified_times(tmp_path / "documents") == pieces_before


def test_interrupted_run_makes_only_what_is_missing(
    tmp_path: Path, text_corpus: list[dict[str, Any]], vocab_file: str
) -> None:
    spec = make_spec(tmp_path, text_corpus, vocab={"file": vocab_file})
    directory = prepare(spec).phase_dirs[0]
    complete = read_shard(directory / "shard_00001.hdf5")
    kept = (directory / "shard_00000.hdf5").stat().st_mtime_ns
    # A run stopped while writing: no metadata.json yet, shard 1 never renamed into place, a
    # temporary file left behind.
    (directory / "metadata.json").unlink()
    (directory / "shard_00001.hdf5").unlink()
    (directory / "shard_00002.hdf5.tmp").write_bytes(b"\x89HDF\r\n")
    prepare(spec)
    assert (directory / "metadata.json").is_file()
    assert (directory / "shard_00000.hdf5").stat().st_mtime_ns == kept
    again = read_shard(directory / "shard_00001.hdf5")
    assert all(np.array_equal(again[name], complete[name]) for name in SHARD_DTYPES)


def test_shards_do_not_depend_on_the_number_of_workers(
    tmp_path: Path, text_corpus: list[dict[str, Any]], vocab_file: str
) -> None:
    runs = [
        prepare(make_spec(tmp_path / str(workers), text_corpus, vocab={"file": vocab_file}, workers=workers))
        for workers in (1, 2)
    ]
    for name in ("shard_00000.hdf5", "shard_00001.hdf5", "shard_00002.hdf5"):
        one, two = (read_shard(run.phase_dirs[0] / name) for run in runs)
        assert all(np.array_equal(one[key], two[key]) for key in SHARD_DTYPES)
    other = make_spec(tmp_path / "seed", text_corpus, vocab={"file": vocab_file})
    reseeded = prepare(other.model_copy(update={"seed": 1}))
    ids = read_shard(reseeded.phase_dirs[0] / "shard_00000.hdf5")["input_ids"]
    assert not np.array_equal(ids, read_shard(runs[0].phase_dirs[0] / "shard_00000.hdf5")["input_ids"])


def test_heldout_documents_never_reach_training(
    tmp_path: Path, text_corpus: list[dict[str, Any]], vocab_file: str
) -> None:
    # Weight 2 gives every document twice: both copies must land on the same side.
    sources = [{**text_corpus[0], "weight": 2.0}]
    data = prepare(make_spec(tmp_path, sources, vocab={"file": vocab_file}, heldoutFraction=0.25))
    made = metadata(data.phase_dirs[0])
    assert [s["file"] for s in made["heldout_shards"]] == ["heldout_00000.hdf5"]
    heldout, train = made["heldout"]["documents"], made["documents"]
    assert heldout + train == 120
    assert heldout % 2 == 0 and 0.1 < heldout / 120 < 0.4
    heldout_rows = read_shard(data.phase_dirs[0] / "heldout_00000.hdf5")["input_ids"]
    assert len(heldout_rows) == made["heldout"]["instances"] > 0


def unmasked(path: Path) -> dict[str, np.ndarray]:
    """A static shard's arrays, ``input_ids`` (int64 [N, L]) as before masking: each masked
    position given back its ``masked_lm_ids`` (a random replacement may be any id)."""
    arrays = read_shard(path)
    ids = arrays["input_ids"].astype(np.int64)
    rows, slots = np.nonzero(arrays["masked_lm_positions"])
    ids[rows, arrays["masked_lm_positions"][rows, slots]] = arrays["masked_lm_ids"][rows, slots]
    return {**arrays, "input_ids": ids}


def test_heldout_shards_take_one_pass_whatever_the_dupe_factor(
    tmp_path: Path, text_corpus: list[dict[str, Any]], vocab_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    made = {
        dupe: prepare(make_spec(tmp_path / str(dupe), text_corpus, vocab={"file": vocab_file},
                                heldoutFraction=0.3, dupeFactor=dupe)).phase_dirs[0]
        for dupe in (1, 5)
    }  # fmt: skip
    once, five = metadata(made[1]), metadata(made[5])
    # Training: five passes, each cutting the same documents into about as many instances.
    assert 4.8 < five["instances"] / once["instances"] < 5.2
    # Held out: one pass, so no segment is there twice, and as many rows as with dupe factor 1.
    shards = [unmasked(path) for path in sorted(made[5].glob("heldout_*.hdf5"))]
    heldout = np.concatenate([shard["input_ids"] for shard in shards])
    assert len(heldout) == five["heldout"]["instances"] == once["heldout"]["instances"] > 100
    assert len({row.tobytes() for row in heldout}) == len(heldout)
    # Segment A alone too: each pass splits a chunk into A and B (and draws B) anew, so with five
    # passes on held-out a whole row seldom recurs (2,137 rows held 2,119 distinct) and A more often
    # (1,892 distinct).
    segments_a = [
        ids[(shard["segment_ids"][row] == 0) & (shard["input_mask"][row] == 1)].tobytes()
        for shard in shards
        for row, ids in enumerate(shard["input_ids"])
    ]
    assert len(set(segments_a)) == len(heldout)
    assert five["parameters"]["heldout_dupe_factor"] == 1
    report = capsys.readouterr().out
    assert f"(+{len(heldout)} held out, distinct segments: one pass)" in report


def test_max_shard_mb_bounds_the_text_of_every_shard(
    tmp_path: Path, text_corpus: list[dict[str, Any]], vocab_file: str
) -> None:
    spec = make_spec(tmp_path, text_corpus, vocab={"file": vocab_file}, numShards=None, maxShardMB=0.03)
    made = metadata(prepare(spec).phase_dirs[0])
    pieces = json.loads((tmp_path / "documents" / "manifest.json").read_text())["pieces"]
    text = sum(piece["text_bytes"][0] for piece in pieces)
    assert sum(shard["text_bytes"] for shard in made["shards"]) == text
    assert len(made["shards"]) >= text / 30_000
    # A document is never cut: one larger than the limit makes a shard on its own.
    assert all(0 < shard["text_bytes"] <= 30_000 or shard["documents"] == 1 for shard in made["shards"])


def test_dynamic_masking_stores_unmasked_tokens(
    tmp_path: Path, text_corpus: list[dict[str, Any]], vocab_file: str
) -> None:
    data = prepare(make_spec(tmp_path, text_corpus, vocab={"file": vocab_file}, masking="dynamic"))
    assert data.phase_dirs[0].name == "seq_len_128_max_pred_20_dynamic"
    with h5py.File(data.phase_dirs[0] / "shard_00000.hdf5") as file:
        assert set(file) == set(DYNAMIC_DTYPES)
        ids = file["input_ids"][()]
    assert not (ids == 4).any()  # no [MASK]: the loader draws the masks


# NNLSHP reaches the targets with Graphcore's 3 sequences per pack; on this corpus of short
# documents, SPFHP needs about 8 at seq 512 (3 leaves about 4% padding, 6 about 1.3%).
@pytest.mark.parametrize(("algorithm", "per_pack"), [("nnlshp", 3), ("spfhp", 8)])
def test_packing_leaves_little_padding_and_keeps_sequences_apart(
    tmp_path: Path, algorithm: str, per_pack: int, vocab_file: str
) -> None:
    spec = make_spec(
        tmp_path, [{"path": "builtin:python-docs"}], [PHASE_128, PHASE_512], vocab={"file": vocab_file},
        packing=algorithm, maxSequencesPerPack=per_pack, numShards=1,
    )  # fmt: skip
    for directory, most_padding in zip(prepare(spec).phase_dirs, (0.05, 0.01), strict=True):
        made = metadata(directory)
        assert directory.name.endswith(f"_packed_{algorithm}")
        assert made["padding_before_packing"] > 0.1
        assert made["padding"] <= most_padding
        assert made["sequences_per_row"] == made["instances"] / made["rows"] > 1.1
        with h5py.File(directory / "shard_00000.hdf5") as file:
            assert set(file) == set(PACKED_DTYPES)
            input_mask = file["input_mask"][:64]
        mask = attention_mask(input_mask)
        assert not (mask & (input_mask[:, :, None] != input_mask[:, None, :])).any()
        assert not mask[input_mask == 0].any()


@pytest.mark.parametrize("mode", ["static", "dynamic", "spfhp"])
def test_objective_mlm_makes_single_segments_without_next_sentence_labels(
    tmp_path: Path, text_corpus: list[dict[str, Any]], vocab_file: str, mode: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    layout: dict[str, Any] = (
        {"masking": "dynamic"} if mode == "dynamic" else {"packing": mode} if mode != "static" else {}
    )
    spec = make_spec(tmp_path, text_corpus, vocab={"file": vocab_file}, heldoutFraction=0.2, **layout)
    data = prepare(spec.model_copy(update={"objective": "mlm"}))
    directory = data.phase_dirs[0]
    made = metadata(directory)
    assert made["parameters"]["next_sentence_prediction"] is False
    assert made["random_next"] == 0 and made["instances"] > 100
    assert "random next" not in capsys.readouterr().out
    schema = {"static": SHARD_DTYPES, "dynamic": DYNAMIC_DTYPES, "spfhp": PACKED_DTYPES}[mode]
    special = SpecialIds.of(load_tokenizer(data.vocab_dir), data.vocab_dir)
    paths = sorted(directory.glob("*.hdf5"))
    assert [p.name for p in paths] == ["heldout_00000.hdf5", "shard_00000.hdf5", "shard_00001.hdf5",
                                       "shard_00002.hdf5"]  # fmt: skip
    for path in paths:
        with h5py.File(path) as file:
            assert set(file) == set(schema) - {"next_sentence_labels"}, path.name
            arrays = {name: file[name][()] for name in file}
        assert not arrays["segment_ids"].any()  # one segment, A
        if mode == "spfhp":
            continue
        ids, lengths = arrays["input_ids"].astype(np.int64), arrays["input_mask"].sum(axis=1)
        if mode == "static":  # the tokens before masking (a random replacement may be any id)
            rows, slots = np.nonzero(arrays["masked_lm_positions"])
            ids[rows, arrays["masked_lm_positions"][rows, slots]] = arrays["masked_lm_ids"][rows, slots]
        assert (ids[:, 0] == special.cls).all()
        sep_rows, sep_columns = np.nonzero(ids == special.sep)
        np.testing.assert_array_equal(sep_rows, np.arange(len(ids)))
        np.testing.assert_array_equal(sep_columns, lengths - 1)
    # The loader reads them for objective mlm, next sentence labels -100, and refuses them for mlm-nsp.
    vocab_size = data.vocab_size
    masking = DynamicMasking.from_vocab(data.vocab_dir, 0.15, False) if mode == "dynamic" else None
    batch = next(iter(build_loader(directory, 128, 20, vocab_size, 4, masking=masking,
                                   next_sentence_prediction=False)))  # fmt: skip
    assert batch["next_sentence_labels"].shape == ((4, 3) if mode == "spfhp" else (4,))
    assert (batch["next_sentence_labels"] == -100).all()
    heldout = find_shards(directory, 128, 20, "heldout_*.hdf5", next_sentence_prediction=False)
    evaluated = list(heldout_batches(heldout, vocab_size, 4, masking=masking, max_predictions_per_seq=20,
                                     next_sentence_prediction=False))  # fmt: skip
    assert evaluated and all((b["next_sentence_labels"] == -100).all() for b in evaluated)
    with pytest.raises(ShardError, match="which the objective mlm-nsp needs"):
        build_loader(directory, 128, 20, vocab_size, 4, masking=masking)


def test_objective_is_part_of_the_datasets_key(
    tmp_path: Path, text_corpus: list[dict[str, Any]], vocab_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = make_spec(tmp_path, text_corpus, vocab={"file": vocab_file})
    mlm = spec.model_copy(update={"objective": "mlm"})
    documents_key: dict[str, Any] = {"corpus": "any"}
    keys = [cache.dataset_key(s, s.phases[0], documents_key, 1000) for s in (spec, mlm)]
    assert [key["next_sentence_prediction"] for key in keys] == [True, False]
    assert {name: value for name, value in keys[0].items() if name != "next_sentence_prediction"} == {
        name: value for name, value in keys[1].items() if name != "next_sentence_prediction"
    }
    # The shards of one objective are remade for the other, saying why.
    directory = prepare(spec).phase_dirs[0]
    with h5py.File(directory / "shard_00000.hdf5") as file:
        assert "next_sentence_labels" in file
    capsys.readouterr()
    assert prepare(mlm).phase_dirs[0] == directory
    assert "next_sentence_prediction changed (True -> False)" in capsys.readouterr().out
    with h5py.File(directory / "shard_00000.hdf5") as file:
        assert "next_sentence_labels" not in file


def test_missing_source_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no-such-corpus"):
        prepare(make_spec(tmp_path, [{"path": str(tmp_path / "no-such-corpus")}]))


def test_corpus_without_text_is_refused(tmp_path: Path, vocab_file: str) -> None:
    (tmp_path / "empty.txt").write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no document with any text"):
        prepare(
            make_spec(tmp_path / "out", [{"path": str(tmp_path / "empty.txt")}], vocab={"file": vocab_file})
        )


def test_unwritable_output_is_named(tmp_path: Path, text_corpus: list[dict[str, Any]]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(PermissionError, match=r"data\.shards .*a-file/shards: cannot write there"):
        prepare(make_spec(blocker / "shards", text_corpus))


def test_vocabulary_file_without_mask_is_named(tmp_path: Path, text_corpus: list[dict[str, Any]]) -> None:
    vocab = tmp_path / "my-vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"my-vocab\.txt: the vocabulary has no \[MASK\] token"):
        prepare(make_spec(tmp_path / "out", text_corpus, vocab={"file": str(vocab)}))


def test_sentences_longer_than_the_sequence_are_truncated(tmp_path: Path, vocab_file: str) -> None:
    text = tmp_path / "long.txt"
    long_sentence = " ".join(["the module returns a value"] * 200) + "."
    text.write_text(f"{long_sentence}\nShort one.\n\nAnother document here.\nIt ends.\n", encoding="utf-8")
    directory = prepare(
        make_spec(tmp_path / "out", [{"path": str(text)}], vocab={"file": vocab_file})
    ).phase_dirs[0]
    rows = np.concatenate([read_shard(p)["input_mask"] for p in sorted(directory.glob("shard_*.hdf5"))])
    assert rows.sum(axis=1).max() == 128
