"""The built-in ``python-docs-modules`` task: deterministic, every class in both splits, no leaks.

Reading the corpus takes about 3 s, so it is read once here and handed to the in-process calls
(through the module's ``python_docs`` name); one call in a subprocess reads it for real.
"""

from __future__ import annotations

import collections
import itertools
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from bertpretrain.data.prepare.corpus.pydocs import python_docs
from bertpretrain.data.prepare.corpus.splitting import sentences
from bertpretrain.finetune import builtin
from bertpretrain.finetune.builtin import BUILTIN_TASKS, write_builtin_task

TASK = "python-docs-modules"
CLASSES = 4
PER_CLASS = 20


@pytest.fixture(scope="module")
def documents():
    return list(python_docs())


@pytest.fixture
def cached_corpus(documents, monkeypatch):
    monkeypatch.setattr(builtin, "python_docs", lambda: iter(documents))


def _rows(path: Path) -> list[tuple[str, str]]:
    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines[0] == "sentence\tlabel"
    assert lines[-1] == ""  # the file ends with a line break
    rows = [tuple(line.split("\t")) for line in lines[1:-1]]
    assert all(len(row) == 2 for row in rows), "a sentence holds a tab"
    return rows  # type: ignore[return-value]


def _write(out_dir: Path, seed: int = 7) -> tuple[Path, Path]:
    return write_builtin_task(TASK, out_dir, seed=seed, classes=CLASSES, per_class=PER_CLASS)


def test_task_is_listed():
    assert BUILTIN_TASKS == (TASK,)


def test_layout_classes_and_counts(tmp_path, cached_corpus):
    train, validation = _write(tmp_path / "new" / "dir")
    assert (train.name, validation.name) == ("train.tsv", "validation.tsv")
    train_rows, validation_rows = _rows(train), _rows(validation)
    train_labels = collections.Counter(label for _, label in train_rows)
    validation_labels = collections.Counter(label for _, label in validation_rows)
    assert len(train_labels) == CLASSES
    assert set(validation_labels) == set(train_labels)
    for label in train_labels:
        # The largest modules have hundreds of usable sentences, so each class is full.
        assert train_labels[label] + validation_labels[label] == PER_CLASS
    share = len(validation_rows) / (len(train_rows) + len(validation_rows))
    assert 0.1 <= share <= 0.3
    # Interleaved: the rows are not grouped by class.
    labels = [label for _, label in train_rows]
    changes = sum(1 for a, b in itertools.pairwise(labels) if a != b)
    assert changes > len(labels) / 2


def test_no_leaks_and_sentences_come_from_their_module(tmp_path, cached_corpus, documents):
    # Every usable sentence of each class, so that a duplicate anywhere in them would show.
    train, validation = write_builtin_task(TASK, tmp_path, seed=7, classes=CLASSES, per_class=10_000)
    train_rows, validation_rows = _rows(train), _rows(validation)
    texts = [sentence.casefold() for sentence, _ in train_rows + validation_rows]
    assert len(texts) == len(set(texts)), "a sentence is written twice"

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    # A module document's origin ends with its path relative to the stdlib; topics do not.
    by_origin_path = {doc.origin.rsplit(": ", 1)[1]: doc for doc in documents}
    module_sentences = {
        path: {" ".join(s.split()).casefold() for s in sentences(doc)}
        for path, doc in by_origin_path.items()
        if path.endswith(".py")
    }
    for sentence, label in train_rows + validation_rows:
        assert label.casefold() not in sentence.casefold()
        assert label.split(".")[-1].casefold() not in sentence.casefold()
        assert 6 <= len(sentence.split()) <= 60
        base = label.replace(".", "/")
        candidates = [p for p in (f"{base}.py", f"{base}/__init__.py") if (stdlib / p).is_file()]
        assert len(candidates) == 1, f"{label} is not a standard-library module"
        home = candidates[0]
        assert sentence.casefold() in module_sentences[home]
        elsewhere = [p for p, found in module_sentences.items() if p != home and sentence.casefold() in found]
        assert not elsewhere, f"{sentence!r} is also in {elsewhere}"


def test_same_bytes_on_rerun_and_another_seed_differs(tmp_path, cached_corpus):
    first = [p.read_bytes() for p in _write(tmp_path / "a")]
    second = [p.read_bytes() for p in _write(tmp_path / "b")]
    assert first == second
    before = [os.stat(p).st_mtime_ns for p in _write(tmp_path / "a")]
    after = [os.stat(p).st_mtime_ns for p in _write(tmp_path / "a")]
    assert before == after, "an unchanged file was rewritten"
    assert sorted(os.listdir(tmp_path / "a")) == ["train.tsv", "validation.tsv"], "a temporary file was left"
    other = [p.read_bytes() for p in _write(tmp_path / "c", seed=8)]
    assert other != first


def test_same_bytes_under_another_hash_seed(tmp_path, cached_corpus):
    here = [p.read_bytes() for p in _write(tmp_path / "here")]
    code = (
        "import sys; from pathlib import Path; from bertpretrain.finetune.builtin import write_builtin_task; "
        f"write_builtin_task({TASK!r}, Path(sys.argv[1]), seed=7, classes={CLASSES}, per_class={PER_CLASS})"
    )
    environment = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "there")], env=environment, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "", "the function printed"
    there = [(tmp_path / "there" / name).read_bytes() for name in ("train.tsv", "validation.tsv")]
    assert here == there


def test_smallest_classes_still_reach_both_files(tmp_path, cached_corpus):
    # 2 sentences and a fraction of 0.9 would round to 2 validation rows and none for training.
    train, validation = write_builtin_task(
        TASK, tmp_path, seed=1, classes=3, per_class=2, validation_fraction=0.9
    )
    train_labels = collections.Counter(label for _, label in _rows(train))
    validation_labels = collections.Counter(label for _, label in _rows(validation))
    assert len(train_labels) == 3
    assert train_labels == validation_labels == dict.fromkeys(train_labels, 1)


def test_unknown_name_names_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"spec\.finetune\[\]\.builtin.*python-docs-modules"):
        write_builtin_task("glue-sst2", tmp_path, seed=0)
    assert not tmp_path.joinpath("train.tsv").exists()


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"classes": 1}, "classes"),
        ({"per_class": 1}, "per_class"),
        ({"validation_fraction": 1.0}, "validation_fraction"),
    ],
)
def test_bad_arguments(tmp_path, arguments, field):
    with pytest.raises(ValueError, match=field):
        write_builtin_task(TASK, tmp_path, seed=0, **arguments)
