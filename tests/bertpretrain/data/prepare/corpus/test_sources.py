"""Sources chained with their weights: whole and fractional copies, seeded."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path

import pytest

from bertjob_api.spec import SourceSpec
from bertpretrain.data.prepare.corpus.raw import RawDocument
from bertpretrain.data.prepare.corpus.sources import read_corpus
from tests.bertpretrain.data.prepare.corpus.reading import Counter

# --- weights --------------------------------------------------------------------------------------


@pytest.fixture()
def numbered(tmp_path: Path) -> str:
    file = tmp_path / "numbered.txt"
    file.write_text("".join(f"Document {i}.\n\n" for i in range(400)), encoding="utf-8")
    return str(file)


def weighted(path: str, weights: list[float], seed: int = 1) -> Iterator[RawDocument]:
    sources = [SourceSpec(path=path, weight=weight) for weight in weights]
    return read_corpus(sources, seed, collections.Counter())


def numbers(documents: Iterator[RawDocument]) -> list[int]:
    return [int(d.text.removeprefix("Document ").removesuffix(".")) for d in documents]


def test_whole_weights_repeat_each_document(numbered: str) -> None:
    assert numbers(weighted(numbered, [2.0])) == [i for i in range(400) for _ in range(2)]
    assert numbers(weighted(numbered, [1.0, 3.0])) == list(range(400)) + [
        i for i in range(400) for _ in range(3)
    ]


def test_fractional_weight_keeps_a_seeded_share(numbered: str) -> None:
    half = numbers(weighted(numbered, [0.5]))
    assert 160 <= len(half) <= 240
    assert half == sorted(set(half))
    assert numbers(weighted(numbered, [0.5])) == half
    assert numbers(weighted(numbered, [0.5], seed=2)) != half
    # The draw depends on the source's index: the same file twice gives two different halves.
    both = numbers(weighted(numbered, [0.5, 0.5]))
    assert both[: len(half)] == half and both[len(half) :] != half


def test_weight_above_one_adds_a_share_of_second_copies(numbered: str) -> None:
    used = collections.Counter(numbers(weighted(numbered, [1.5])))
    assert set(used) == set(range(400))
    assert 160 <= sum(1 for count in used.values() if count == 2) <= 240
    assert set(used.values()) == {1, 2}


def test_read_corpus_chains_sources_and_counts_skips(tmp_path: Path, numbered: str) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    skipped: Counter = collections.Counter()
    sources = [SourceSpec(path=str(empty)), SourceSpec(path=numbered, weight=0.01)]
    documents = list(read_corpus(sources, 0, skipped))
    assert 0 < len(documents) < 20
    assert skipped == {"empty file": 1}
