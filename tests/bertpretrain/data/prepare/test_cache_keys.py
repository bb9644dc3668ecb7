"""The data stage's cache keys: they hold the version of the code that reads and splits the corpus,
and they stay small however many files the corpus has (the listing is kept beside them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertjob_api.spec import SourceSpec
from bertpretrain.data.prepare import cache
from bertpretrain.data.prepare.corpus import pydocs, readers, splitting
from bertpretrain.data.prepare.corpus.sources import (
    CorpusIdentity,
    code_versions,
    describe_change,
    files_key,
    identity,
)
from bertpretrain.data.prepare.stage import prepare
from tests.bertpretrain.data.prepare.test_prepare import make_spec
from tests.bertpretrain.data.prepare.test_prepare_cache import lines, write_corpus


def _keys(tmp_path: Path, corpus: CorpusIdentity) -> tuple[dict[str, object], dict[str, object]]:
    """The trained vocabulary's key and the documents' key of a job on ``corpus``."""
    spec = make_spec(tmp_path / "out", [{"path": str(tmp_path / "c.txt"), "format": "bert"}])
    vocab_dir = tmp_path / "vocab"
    vocab_dir.mkdir(exist_ok=True)
    for name in ("vocab.txt", "tokenizer.json"):
        (vocab_dir / name).write_text("{}")
    return cache.vocab_key(spec, corpus), cache.documents_key(spec, corpus, vocab_dir)


@pytest.mark.parametrize(
    ("versions", "name"),
    [(readers.READER_VERSIONS, "bert"), (splitting.SPLITTER_VERSIONS, "sentences")],
    ids=["reader", "splitter"],
)
def test_a_new_version_of_the_reading_code_changes_both_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, versions: dict[str, int], name: str
) -> None:
    (tmp_path / "c.txt").write_text("One.\n")
    corpus = identity([SourceSpec(path=str(tmp_path / "c.txt"), format="bert")])
    vocab_before, documents_before = _keys(tmp_path, corpus)
    monkeypatch.setitem(versions, name, versions[name] + 1)
    vocab_after, documents_after = _keys(tmp_path, corpus)
    assert vocab_after != vocab_before and documents_after != documents_before


def test_code_versions_name_the_readers_a_source_uses() -> None:
    bert = code_versions([SourceSpec(path="c.txt", format="bert")])
    assert bert == {
        "readers": {"bert": readers.READER_VERSIONS["bert"]},
        "splitting": splitting.SPLITTER_VERSIONS,
    }
    builtin = code_versions([SourceSpec(path=pydocs.BUILTIN_PYTHON_DOCS)])
    assert builtin["readers"] == {"python-docs": pydocs.VERSION}
    # "auto" picks a reader per file: any of them may be used.
    assert code_versions([SourceSpec(path="dir")])["readers"] == readers.READER_VERSIONS


def test_a_new_reader_version_remakes_the_documents_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = write_corpus(tmp_path / "corpus.txt", 0, 10)
    spec = make_spec(tmp_path / "out", [{"path": str(text), "format": "bert"}], vocab={"trainSize": 300})
    prepare(spec)
    capsys.readouterr()
    bert = readers.READER_VERSIONS["bert"]
    monkeypatch.setitem(readers.READER_VERSIONS, "bert", bert + 1)
    prepare(spec)
    output = capsys.readouterr().out
    for stage in ("vocabulary", "documents"):
        [line] = lines(output, f"{stage}: rebuilding")
        assert f"the code that reads or splits the corpus changed (readers.bert {bert} -> {bert + 1})" in line


def test_the_key_of_100k_files_stays_small_and_the_listing_names_what_changed() -> None:
    listing = {
        f"/data/corpus/part-{i:06d}.txt": [1_000_000 + i, 1_700_000_000_000_000_000 + i]
        for i in range(100_000)
    }
    source = {"path": "/data/corpus", "format": "auto"}
    old = [{**source, "files": files_key(listing)}]
    # The key holds a count and a digest: the same size for 100,000 files as for one.
    assert old[0]["files"]["count"] == 100_000
    assert len(json.dumps(old)) < 200
    assert set(old[0]["files"]) == {"count", "sha256"}

    edited = dict(listing)
    for i in (7, 70, 700):
        edited[f"/data/corpus/part-{i:06d}.txt"] = [1, 2]
    del edited["/data/corpus/part-099999.txt"]
    new = [{**source, "files": files_key(edited)}]
    assert new != old
    message = describe_change(old, new, [listing], [edited])
    assert message == (
        "the corpus changed (3 files changed, first: /data/corpus/part-000007.txt, "
        "/data/corpus/part-099999.txt removed)"
    )
    # A listing that is not the one the old key was made from is not believed.
    assert describe_change(old, new, [edited], [edited]) == (
        "the corpus changed (100000 files before, 99999 now; which ones was not recorded)"
    )
    assert "not recorded" in describe_change(old, new, None, [edited])


def test_the_listing_is_kept_beside_the_record(tmp_path: Path) -> None:
    text = write_corpus(tmp_path / "corpus.txt", 0, 10)
    spec = make_spec(tmp_path / "out", [{"path": str(text)}], vocab={"trainSize": 300})
    prepare(spec)
    corpus = identity(spec.data.sources)
    for directory in ("vocab", "documents"):
        assert cache.read_listing(tmp_path / "out" / directory) == corpus.listing
    assert corpus.listing == [{str(text): [text.stat().st_size, text.stat().st_mtime_ns]}]
