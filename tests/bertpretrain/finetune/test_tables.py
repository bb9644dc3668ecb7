"""Classification files in each format, their errors, and BERT's features for them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tokenizers import Tokenizer

from bertpretrain.data.format.vocab import load_tokenizer
from bertpretrain.finetune.errors import TaskDataError
from bertpretrain.finetune.tables import (
    ClassificationExample,
    detect_format,
    encode_classification,
    read_classification,
    truncate_seq_pair,
)

# A vocabulary whose ids the tests can read off: the line number is the id.
VOCAB = [
    *("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
    *("the", "cat", "sat", "on", "mat", "dog", "ran", "##s", "."),
]
PAD, CLS, SEP = 0, 2, 3
THE, CAT, SAT, ON, MAT, DOG, RAN, S, DOT = 5, 6, 7, 8, 9, 10, 11, 12, 13


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@contextmanager
def raises_at(path: Path, row: int | None, *words: str) -> Iterator[None]:
    """Expect a TaskDataError at ``path`` and ``row`` whose message has each of ``words``."""
    with pytest.raises(TaskDataError) as info:
        yield
    error = info.value
    where = f"{path}: row {row}: " if row is not None else f"{path}: "
    assert str(error).startswith(where), str(error)
    assert (error.file, error.row) == (str(path), row)
    for word in words:
        assert word in str(error), (word, str(error))


# --- formats -------------------------------------------------------------------------------------


def test_tsv_pairs_keep_stray_quotes(tmp_path: Path) -> None:
    # MRPC's layout; GLUE's TSVs are not quoted, and a sentence may open a quote it never closes.
    path = write(
        tmp_path / "train.tsv",
        "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        '1\t11\t12\tHe said "hello there.\tShe left.\n'
        '0\t13\t14\t"Quoted start\tplain, with comma\n',
    )
    examples, labels = read_classification(path, "tsv", "#1 String", "#2 String", "Quality", None)

    assert labels == ["0", "1"]
    assert examples == [
        ClassificationExample('He said "hello there.', "She left.", 1, 2),
        ClassificationExample('"Quoted start', "plain, with comma", 0, 3),
    ]


def test_csv_singles_with_quoted_comma_and_line_break(tmp_path: Path) -> None:
    path = write(
        tmp_path / "train.csv",
        'sentence,label\n"Hello, world",pos\n\n"two\nlines",neg\nplain,pos\n',
    )
    examples, labels = read_classification(path, "auto", "sentence", None, "label", None)

    assert labels == ["neg", "pos"]
    # Rows are where each record starts: line 3 is blank, the quoted line break spans lines 4-5.
    assert examples == [
        ClassificationExample("Hello, world", None, 1, 2),
        ClassificationExample("two\nlines", None, 0, 4),
        ClassificationExample("plain", None, 1, 6),
    ]


def test_csv_row_numbers_count_lines_inside_quotes(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.csv", 'sentence,label\n"two\nlines",neg\nextra,pos,field\n')
    with raises_at(path, 4, "3 fields", "header has 2"):
        read_classification(path, "csv", "sentence", None, "label", None)


def test_jsonl_integer_labels_sort_numerically(tmp_path: Path) -> None:
    lines = [
        {"premise": "the cat sat", "hypothesis": "a cat", "label": 10},
        {"premise": "the dog ran", "hypothesis": "a dog", "label": 2},
        {},  # replaced by a blank line below
        {"premise": "mat", "hypothesis": "on", "label": 1.0},
        {"premise": "x", "hypothesis": "y", "label": "-1", "extra": True},
    ]
    text = "\n".join("" if not line else json.dumps(line) for line in lines) + "\n"
    path = write(tmp_path / "train.jsonl", text)
    examples, labels = read_classification(path, "auto", "premise", "hypothesis", "label", None)

    # Numeric order, not string order (which would put "10" before "2").
    assert labels == ["-1", "1", "2", "10"]
    assert [(example.label, example.row) for example in examples] == [(3, 1), (2, 2), (1, 4), (0, 5)]
    assert examples[0].text_pair == "a cat"


def test_derived_labels_put_integers_first_then_strings(tmp_path: Path) -> None:
    rows = "".join(f"s{index}\t{label}\n" for index, label in enumerate(["b", "10", "a", "9", "b"]))
    path = write(tmp_path / "mixed.tsv", "sentence\tlabel\n" + rows)
    _, labels = read_classification(path, "tsv", "sentence", None, "label", None)
    assert labels == ["9", "10", "a", "b"]


def test_parquet_columns_by_name_and_declared_labels(tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    table = pa.table(
        {
            "idx": [0, 1, 2],
            "label": [0, 2, 1],
            "question": ["the cat", "the dog", "on the mat"],
            "sentence": ["sat", "ran", "sat ."],
        }
    )
    pq.write_table(table, path)
    declared = ["2", "1", "0"]
    examples, labels = read_classification(path, "auto", "question", "sentence", "label", declared)

    assert labels == declared
    # Class index = position in the declared list: "0" -> 2, "2" -> 0.
    assert examples == [
        ClassificationExample("the cat", "sat", 2, 1),
        ClassificationExample("the dog", "ran", 0, 2),
        ClassificationExample("on the mat", "sat .", 1, 3),
    ]


def test_declared_labels_keep_their_order(tmp_path: Path) -> None:
    path = write(tmp_path / "sst.tsv", "sentence\tlabel\ngood\tpos\nbad\tneg\n")
    examples, labels = read_classification(path, "tsv", "sentence", None, "label", ["pos", "neg"])
    assert labels == ["pos", "neg"]
    assert [example.label for example in examples] == [0, 1]


def test_detect_format(tmp_path: Path) -> None:
    names = {"a.tsv": "tsv", "a.CSV": "csv", "a.jsonl": "jsonl", "a.parquet": "parquet"}
    assert {name: detect_format(tmp_path / name) for name in names} == names
    with raises_at(tmp_path / "a.json", None, "jsonl"):
        detect_format(tmp_path / "a.json")
    with raises_at(tmp_path / "a.txt", None, "'.txt'", "set format"):
        detect_format(tmp_path / "a.txt")


# --- errors --------------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.tsv"
    with raises_at(path, None, "no such file"):
        read_classification(path, "tsv", "sentence", None, "label", None)


def test_missing_column_lists_the_columns(tmp_path: Path) -> None:
    path = write(tmp_path / "train.tsv", "sentence\tgold\ngood\t1\n")
    with raises_at(path, 1, "'label'", "['sentence', 'gold']"):
        read_classification(path, "tsv", "sentence", None, "label", None)


def test_missing_parquet_column_lists_the_columns(tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"sentence": ["a"], "gold": [1]}), path)
    with raises_at(path, None, "'label'", "['sentence', 'gold']"):
        read_classification(path, "parquet", "sentence", None, "label", None)


def test_missing_jsonl_field_names_the_row(tmp_path: Path) -> None:
    path = write(tmp_path / "train.jsonl", '{"text": "a", "label": 0}\n{"text": "b", "gold": 1}\n')
    with raises_at(path, 2, "'label'", "['text', 'gold']"):
        read_classification(path, "jsonl", "text", None, "label", None)


def test_wrong_number_of_fields(tmp_path: Path) -> None:
    path = write(tmp_path / "train.tsv", "sentence\tlabel\ngood\t1\nbad\t0\textra\n")
    with raises_at(path, 3, "3 fields", "header has 2"):
        read_classification(path, "tsv", "sentence", None, "label", None)


@pytest.mark.parametrize("empty", ["", "   "])
def test_empty_text(tmp_path: Path, empty: str) -> None:
    path = write(tmp_path / "train.tsv", f"a\tb\tlabel\ngood\tfine\t1\nbad\t{empty}\t0\n")
    with raises_at(path, 3, "empty text", "'b'"):
        read_classification(path, "tsv", "a", "b", "label", None)


def test_null_text_in_parquet(tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"sentence": ["a", None], "label": ["x", "y"]}), path)
    with raises_at(path, 2, "empty text"):
        read_classification(path, "parquet", "sentence", None, "label", None)


def test_label_outside_declared_set(tmp_path: Path) -> None:
    path = write(tmp_path / "train.tsv", "sentence\tlabel\ngood\tpos\nmeh\tneutral\n")
    with raises_at(path, 3, "'neutral'", "['pos', 'neg']"):
        read_classification(path, "tsv", "sentence", None, "label", ["pos", "neg"])


def test_validation_label_unseen_in_training(tmp_path: Path) -> None:
    train = write(tmp_path / "train.tsv", "sentence\tlabel\ngood\t1\nbad\t0\n")
    dev = write(tmp_path / "dev.tsv", "sentence\tlabel\nok\t1\nodd\t1\nnew\t2\n")
    _, labels = read_classification(train, "tsv", "sentence", None, "label", None)
    with raises_at(dev, 4, "'2'", "['0', '1']"):
        read_classification(dev, "tsv", "sentence", None, "label", labels)


@pytest.mark.parametrize(
    ("label", "words"),
    [
        ("1.5", ["1.5", "not an integer"]),
        ("true", ["True", "boolean"]),
        ("null", ["None"]),
        ('" "', ["empty label"]),
    ],
)
def test_unusable_json_labels(tmp_path: Path, label: str, words: list[str]) -> None:
    text = '{"text": "a", "label": 1}\n{"text": "b", "label": ' + label + "}\n"
    path = write(tmp_path / "train.jsonl", text)
    with raises_at(path, 2, *words):
        read_classification(path, "jsonl", "text", None, "label", None)


@pytest.mark.parametrize(("line", "words"), [("[1, 2]", ["a JSON list"]), ("{oops", ["not JSON"])])
def test_jsonl_line_that_is_not_an_object(tmp_path: Path, line: str, words: list[str]) -> None:
    path = write(tmp_path / "train.jsonl", f'{{"text": "a", "label": 1}}\n\n{line}\n')
    with raises_at(path, 3, *words):
        read_classification(path, "jsonl", "text", None, "label", None)


@pytest.mark.parametrize(("name", "content"), [("header.tsv", "sentence\tlabel\n"), ("empty.jsonl", "\n\n")])
def test_no_examples(tmp_path: Path, name: str, content: str) -> None:
    path = write(tmp_path / name, content)
    with raises_at(path, None, "no examples"):
        read_classification(path, "auto", "sentence", None, "label", None)


def test_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "train.tsv"
    path.write_bytes(b"sentence\tlabel\ngood\t1\nbad \xff\t0\n")
    with raises_at(path, 3, "not UTF-8"):
        read_classification(path, "tsv", "sentence", None, "label", None)


def test_bad_arguments(tmp_path: Path) -> None:
    path = write(tmp_path / "train.tsv", "sentence\tlabel\ngood\t1\n")
    with pytest.raises(ValueError, match="unknown format"):
        read_classification(path, "xlsx", "sentence", None, "label", None)
    with pytest.raises(ValueError, match="duplicates"):
        read_classification(path, "tsv", "sentence", None, "label", ["1", "1"])


# --- features ------------------------------------------------------------------------------------


@pytest.fixture
def tokenizer(tmp_path: Path) -> Tokenizer:
    write(tmp_path / "vocab.txt", "\n".join(VOCAB) + "\n")
    return load_tokenizer(tmp_path / "vocab.txt", lowercase=True)


def test_truncate_seq_pair_by_hand() -> None:
    # Budget 5 from 5 + 3: a is longer, pop 5 -> (4, 3); longer a, pop 4 -> (3, 3); still 6 > 5
    # and a tie, which pops from b -> (3, 2).
    a, b = [1, 2, 3, 4, 5], [6, 7, 8]
    truncate_seq_pair(a, b, 5)
    assert (a, b) == ([1, 2, 3], [6, 7])
    # Budget 4: one more step from (3, 2): a is longer -> (2, 2).
    a, b = [1, 2, 3, 4, 5], [6, 7, 8]
    truncate_seq_pair(a, b, 4)
    assert (a, b) == ([1, 2], [6, 7])
    # The shorter text keeps everything while the longer one has more.
    a, b = [1], [2, 3, 4, 5, 6, 7]
    truncate_seq_pair(a, b, 4)
    assert (a, b) == ([1], [2, 3, 4])


def test_encode_singles_and_pairs(tokenizer: Tokenizer) -> None:
    examples = [
        ClassificationExample("The cat sat.", None, 1, 2),
        ClassificationExample("the cat", "Dogs ran", 0, 3),
    ]
    features = encode_classification(examples, tokenizer, 9)

    assert set(features) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    assert all(tensor.dtype == torch.int64 for tensor in features.values())
    assert features["input_ids"].tolist() == [
        [CLS, THE, CAT, SAT, DOT, SEP, PAD, PAD, PAD],
        [CLS, THE, CAT, SEP, DOG, S, RAN, SEP, PAD],
    ]
    assert features["token_type_ids"].tolist() == [[0] * 9, [0, 0, 0, 0, 1, 1, 1, 1, 0]]
    assert features["attention_mask"].tolist() == [[1] * 6 + [0] * 3, [1] * 8 + [0]]
    assert features["labels"].tolist() == [1, 0]


def test_encode_truncates_pairs_longest_first(tokenizer: Tokenizer) -> None:
    # 4 + 3 tokens, max_seq_length 8 leaves 5: a is longer, pop "on" -> (3, 3); a tie pops from
    # b, "ran" -> (3, 2): "the cat sat" and "dog ##s".
    examples = [ClassificationExample("the cat sat on", "dogs ran", 1, 2)]
    features = encode_classification(examples, tokenizer, 8)
    assert features["input_ids"].tolist() == [[CLS, THE, CAT, SAT, SEP, DOG, S, SEP]]
    assert features["token_type_ids"].tolist() == [[0, 0, 0, 0, 0, 1, 1, 1]]
    assert features["attention_mask"].tolist() == [[1] * 8]


def test_encode_truncates_singles_from_the_end(tokenizer: Tokenizer) -> None:
    examples = [ClassificationExample("the cat sat on the mat.", None, 0, 2)]
    features = encode_classification(examples, tokenizer, 5)
    assert features["input_ids"].tolist() == [[CLS, THE, CAT, SAT, SEP]]


def test_encode_ignores_the_tokenizers_own_truncation(tokenizer: Tokenizer) -> None:
    tokenizer.enable_truncation(2)
    features = encode_classification([ClassificationExample("the cat sat", None, 0, 2)], tokenizer, 6)
    assert features["input_ids"].tolist() == [[CLS, THE, CAT, SAT, SEP, PAD]]
    assert tokenizer.truncation is not None and tokenizer.truncation["max_length"] == 2


def test_encode_refuses_a_length_without_room_for_text(tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError, match="max_seq_length 3"):
        encode_classification([ClassificationExample("a", "b", 0, 2)], tokenizer, 3)
