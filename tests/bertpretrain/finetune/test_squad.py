"""SQuAD: reading and its errors, windows with a document stride, answers from logits, metrics.

Expectations are worked out by hand from small contexts of one-token words, where a window's
tokens, its labels and its max-context tokens can be counted on the fingers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from bertpretrain.data.format.vocab import load_tokenizer
from bertpretrain.finetune.errors import TaskDataError
from bertpretrain.finetune.squad import (
    SquadExample,
    SquadFeatures,
    exact_match,
    normalize_answer,
    predict_answers,
    read_squad,
    squad_features,
    squad_metrics,
    token_f1,
)

VOCAB = [
    *("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
    *("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"),
    *("which", "one", "who", "met", "the", "owner", "cafe", "in", "paris", "##ians", "zoe", "."),
]
ID = {token: index for index, token in enumerate(VOCAB)}
PAD, CLS, SEP = ID["[PAD]"], ID["[CLS]"], ID["[SEP]"]
GREEK = "alpha beta gamma delta epsilon zeta eta theta iota kappa"


@pytest.fixture
def tokenizer(tmp_path: Path) -> Tokenizer:
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return load_tokenizer(path, lowercase=True)


def example(
    qid: str, question: str, context: str, answers: list[str], impossible: bool = False
) -> SquadExample:
    """An example whose answers start at their first occurrence in the context."""
    spans = tuple((text, context.index(text)) for text in answers)
    return SquadExample(qid, question, context, spans, impossible, row=1)


def write_squad(path: Path, qas: list[dict[str, Any]], context: str = GREEK, version: str = "1.1") -> Path:
    document = {
        "version": version,
        "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}],
    }
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def qa(qid: str, text: str = "beta", start: int = 6, **fields: Any) -> dict[str, Any]:
    return {"id": qid, "question": "which one", "answers": [{"text": text, "answer_start": start}], **fields}


# Reading


def test_reads_questions_in_file_order_across_paragraphs(tmp_path: Path) -> None:
    document = {
        "version": "1.1",
        "data": [
            {"title": "a", "paragraphs": [{"context": GREEK, "qas": [qa("q1"), qa("q2", "gamma", 11)]}]},
            {
                "title": "b",
                "paragraphs": [
                    {
                        "context": "Zoë met",
                        "qas": [
                            {
                                "id": "q3",
                                "question": "who",
                                "answers": [
                                    {"text": "Zoë", "answer_start": 0},
                                    {"text": "met", "answer_start": 4},
                                ],
                            }
                        ],
                    }
                ],
            },
        ],
    }
    path = tmp_path / "train.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    examples, version_2 = read_squad(path)
    assert not version_2
    assert [(e.id, e.row, e.is_impossible) for e in examples] == [
        ("q1", 1, False),
        ("q2", 2, False),
        ("q3", 3, False),
    ]
    assert examples[1].answers == (("gamma", 11),)
    assert examples[2] == SquadExample("q3", "who", "Zoë met", (("Zoë", 0), ("met", 4)), False, 3)


def test_version_2_by_version_string_or_by_an_impossible_question(tmp_path: Path) -> None:
    assert read_squad(write_squad(tmp_path / "a.json", [qa("q1")], version="v2.0"))[1]
    impossible = {"id": "q2", "question": "who", "answers": [], "is_impossible": True,
                  "plausible_answers": [{"text": "beta", "answer_start": 6}]}  # fmt: skip
    examples, version_2 = read_squad(write_squad(tmp_path / "b.json", [qa("q1"), impossible], version="1.1"))
    assert version_2
    assert examples[1].is_impossible and examples[1].answers == ()


def error(path: Path) -> str:
    with pytest.raises(TaskDataError) as caught:
        read_squad(path)
    return str(caught.value)


def test_answer_that_differs_from_its_context_names_file_row_and_both_texts(tmp_path: Path) -> None:
    path = write_squad(tmp_path / "dev.json", [qa("q1"), qa("q2", "gamma", 12)])
    message = error(path)
    assert message.startswith(f"{path}: row 2: ")
    assert "'gamma'" in message and "'amma '" in message  # GREEK[12:17]


def test_answer_start_outside_the_context(tmp_path: Path) -> None:
    message = error(write_squad(tmp_path / "dev.json", [qa("q1", "beta", len(GREEK) + 3)]))
    assert "row 1" in message and "outside the context" in message


def test_missing_file_and_not_json(tmp_path: Path) -> None:
    assert error(tmp_path / "absent.json") == f"{tmp_path / 'absent.json'}: no such file"
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    assert error(tmp_path / "bad.json").startswith(f"{tmp_path / 'bad.json'}: not JSON")


def test_layout_errors_name_the_missing_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"version": "1.1", "articles": []}), encoding="utf-8")
    assert "'data'" in error(path)
    path.write_text(json.dumps({"data": [{"paragraphs": [{"qas": []}]}]}), encoding="utf-8")
    assert "'context'" in error(path)
    write_squad(path, [qa("q1"), {"id": "q2", "question": "which", "answers": [{"text": "beta"}]}])
    message = error(path)
    assert "row 2" in message and "'answer_start'" in message


def test_question_without_answers_in_a_v1_file(tmp_path: Path) -> None:
    path = write_squad(tmp_path / "train.json", [qa("q1"), {"id": "q2", "question": "which", "answers": []}])
    message = error(path)
    assert message.startswith(f"{path}: row 2: ") and "no answers" in message


def test_duplicate_id(tmp_path: Path) -> None:
    message = error(write_squad(tmp_path / "train.json", [qa("q1"), qa("q2"), qa("q1")]))
    assert "row 3" in message and "'q1'" in message and "row 1" in message


def test_file_without_questions(tmp_path: Path) -> None:
    assert "no questions" in error(write_squad(tmp_path / "empty.json", []))


# Features


def test_windows_labels_and_max_context(tokenizer: Tokenizer) -> None:
    # 10 one-token words; question 2 tokens; windows of 9 - 2 - 3 = 4 tokens every 2 tokens:
    # W0 = words 0-3, W1 = 2-5, W2 = 4-7, W3 = 6-9. The context starts at row index 4.
    examples = [
        example("theta", "which one", GREEK, ["theta"]),  # word 7: in W2 (index 7) and W3 (index 5)
        example("span", "which one", GREEK, ["delta epsilon"]),  # words 3-4: wholly inside W1 only
    ]
    features = squad_features(
        examples, tokenizer, max_seq_length=9, doc_stride=2, max_query_length=4, training=True
    )
    assert len(features) == 8
    assert features.example_index.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert features.input_ids.shape == (8, 9) and features.input_ids.dtype == torch.int64
    words = GREEK.split()
    assert features.input_ids[1].tolist() == [
        CLS,
        ID["which"],
        ID["one"],
        SEP,
        *(ID[w] for w in words[2:6]),
        SEP,
    ]
    assert features.token_type_ids[1].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1]
    assert features.attention_mask.tolist() == [[1] * 9] * 8
    assert features.start_positions is not None and features.end_positions is not None
    assert features.start_positions.tolist() == [0, 0, 7, 5, 0, 5, 0, 0]
    assert features.end_positions.tolist() == [0, 0, 7, 5, 0, 6, 0, 0]
    # Scores min(left, right) + 0.04: word 2 -> W0 (1 vs 0), 3 -> W1, 4 -> W1, 5 -> W2, 6 -> W2, 7 -> W3.
    expected = [[1, 1, 1, 0], [0, 1, 1, 0], [0, 1, 1, 0], [0, 1, 1, 1]]
    assert [w.max_context.tolist() for w in features.windows[:4]] == [
        [bool(v) for v in row] for row in expected
    ]
    starts = [sum(len(w) + 1 for w in words[:i]) for i in range(6, 10)]  # "eta" is in "beta" too
    assert features.windows[3].context_start == 4
    assert features.windows[3].offsets.tolist() == [
        [s, s + len(w)] for s, w in zip(starts, words[6:10], strict=True)
    ]


def test_last_window_is_padded_and_the_question_truncated(tokenizer: Tokenizer) -> None:
    context = "alpha beta gamma delta epsilon zeta eta theta iota"  # 9 words: the last window has 3
    examples = [example("q", "which one which one which", context, ["beta"])]
    features = squad_features(
        examples, tokenizer, max_seq_length=9, doc_stride=2, max_query_length=2, training=False
    )
    assert len(features) == 4
    assert features.start_positions is None and features.end_positions is None
    assert features.input_ids[3].tolist() == [
        CLS,
        ID["which"],
        ID["one"],
        SEP,
        ID["eta"],
        ID["theta"],
        ID["iota"],
        SEP,
        PAD,
    ]
    assert features.attention_mask[3].tolist() == [1] * 8 + [0]
    assert features.token_type_ids[3].tolist() == [0] * 4 + [1] * 4 + [0]


def test_impossible_question_points_at_cls(tokenizer: Tokenizer) -> None:
    examples = [example("q", "which one", GREEK, [], impossible=True)]
    features = squad_features(
        examples, tokenizer, max_seq_length=9, doc_stride=2, max_query_length=4, training=True
    )
    assert features.start_positions is not None and features.end_positions is not None
    assert features.start_positions.tolist() == [0] * 4 and features.end_positions.tolist() == [0] * 4


def test_no_room_for_the_context(tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError, match=r"maxSeqLength.*maxQueryLength"):
        squad_features([example("q", "which", GREEK, ["beta"])], tokenizer, 10, 2, 7, training=True)


# Predictions


def logits_at(features: SquadFeatures, marks: dict[tuple[int, int], float], value: float = 0.0) -> np.ndarray:
    """[N, L] logits of ``value`` but ``marks[(feature, index)]``."""
    logits = np.full(tuple(features.input_ids.shape), value)
    for (feature, index), mark in marks.items():
        logits[feature, index] = mark
    return logits


CITY = "Zoë met the CAFÉ owner in Paris. The Parisians met Cafe\u0301 owner Zoë."
# Tokens: 0 zoe, 1 met, 2 the, 3 cafe, 4 owner, 5 in, 6 paris, 7 ., 8 the, 9 paris, 10 ##ians,
# 11 met, 12 cafe, 13 owner, 14 zoe, 15 .


def test_gold_logits_give_back_the_original_text(tokenizer: Tokenizer) -> None:
    examples = [
        example("zoe", "who met the owner", CITY, ["Zoë"]),  # token 0
        example("cafe", "which owner", CITY, ["CAFÉ owner"]),  # tokens 3-4
        example("parisians", "who met", CITY, ["Parisians"]),  # tokens 9-10
        example("decomposed", "which one", CITY, ["Cafe\u0301"]),  # token 12; the accent is a 2nd character
    ]
    max_seq_length, stride = 12, 3
    features = squad_features(examples, tokenizer, max_seq_length, stride, max_query_length=4, training=False)
    assert features.windows[0].offsets.tolist() == [[0, 3], [4, 7], [8, 11], [12, 16], [17, 22]]
    question_tokens = [4, 2, 2, 2]
    gold_tokens = [(0, 0), (3, 4), (9, 10), (12, 12)]
    # Windows of 12 - q - 3 tokens start every 3 tokens until token 15 is in one.
    starts: dict[tuple[int, int], float] = {}
    ends: dict[tuple[int, int], float] = {}
    feature = 0
    for index, (q, (first, last)) in enumerate(zip(question_tokens, gold_tokens, strict=True)):
        size = max_seq_length - q - 3
        for window_first in range(0, 16 - size + stride, stride):
            assert features.example_index[feature] == index
            if window_first <= first and last < window_first + size:
                starts[feature, q + 2 + first - window_first] = 10.0
                ends[feature, q + 2 + last - window_first] = 10.0
            feature += 1
    assert feature == len(features) == 5 + 4 + 4 + 4
    predictions = predict_answers(examples, features, logits_at(features, starts), logits_at(features, ends))
    assert predictions == {
        "zoe": "Zoë",
        "cafe": "CAFÉ owner",
        "parisians": "Parisians",
        "decomposed": "Cafe\u0301",
    }
    assert squad_metrics(examples, predictions) == {"exact_match": 100.0, "f1": 100.0}


def greek_features(
    tokenizer: Tokenizer, impossible: bool = False
) -> tuple[list[SquadExample], SquadFeatures]:
    examples = [example("q", "which one", GREEK, [] if impossible else ["theta"], impossible)]
    return examples, squad_features(examples, tokenizer, 9, 2, 4, training=False)


def test_span_must_start_in_its_max_context_window(tokenizer: Tokenizer) -> None:
    examples, features = greek_features(tokenizer)
    # theta (word 7) at index 7 of W2, which is not its max-context window, beats alpha in W0.
    start = logits_at(features, {(2, 7): 10.0, (0, 4): 4.0}, value=-10.0)
    end = logits_at(features, {(2, 7): 10.0, (0, 4): 4.0}, value=-10.0)
    assert predict_answers(examples, features, start, end) == {"q": "alpha"}
    start[3, 5], end[3, 5] = 10.0, 10.0  # theta in W3, its max-context window
    assert predict_answers(examples, features, start, end) == {"q": "theta"}


def test_max_answer_length(tokenizer: Tokenizer) -> None:
    examples, features = greek_features(tokenizer)
    start, end = logits_at(features, {(0, 4): 10.0}), logits_at(features, {(0, 6): 10.0})
    # alpha..gamma is 3 tokens; with 2 allowed, the first of the equal zero-logit ends in W0 wins.
    assert predict_answers(examples, features, start, end, max_answer_length=3) == {"q": "alpha beta gamma"}
    assert predict_answers(examples, features, start, end, max_answer_length=2) == {"q": "alpha"}


def test_version_2_null_score_against_the_best_span(tokenizer: Tokenizer) -> None:
    examples, features = greek_features(tokenizer, impossible=True)
    nulls = {(f, 0): 5.0 for f in range(4)}
    start, end = logits_at(features, {**nulls, (0, 4): 3.0}), logits_at(features, {**nulls, (0, 4): 3.0})
    # null 5 + 5 = 10 against alpha 3 + 3 = 6: a difference of 4.
    assert predict_answers(examples, features, start, end, version_2=True) == {"q": ""}
    assert predict_answers(examples, features, start, end, version_2=True, null_score_diff_threshold=4.5) == {
        "q": "alpha"
    }
    assert predict_answers(examples, features, start, end, version_2=False) == {"q": "alpha"}
    # The null score is the smallest over the features: 1 + 1 = 2 in W1, below 6.
    start[1, 0], end[1, 0] = 1.0, 1.0
    assert predict_answers(examples, features, start, end, version_2=True) == {"q": "alpha"}
    assert squad_metrics(examples, {"q": ""}) == {"exact_match": 100.0, "f1": 100.0}


def test_logits_of_the_wrong_shape(tokenizer: Tokenizer) -> None:
    examples, features = greek_features(tokenizer)
    with pytest.raises(ValueError, match="start_logits"):
        predict_answers(examples, features, np.zeros((4, 8)), np.zeros((4, 8)))


# Metrics


def test_normalisation_and_exact_match() -> None:
    assert normalize_answer("The Cat!") == "cat"
    assert normalize_answer("  An  apple,  a day\tthere ") == "apple day there"
    assert exact_match("The Cat!", "cat") == 1.0
    assert exact_match("cats", "cat") == 0.0


def test_token_f1_by_hand() -> None:
    # {big, red, dog} vs {red, dog, barked}: 2 shared, precision = recall = 2/3.
    assert token_f1("the big red dog", "red dog barked") == pytest.approx(2 / 3)
    # 1 shared of 3 predicted and 1 gold: precision 1/3, recall 1, F1 = 2 (1/3) / (4/3) = 1/2.
    assert token_f1("dog dog dog", "dog") == pytest.approx(0.5)
    assert token_f1("cat", "dog") == 0.0


def test_no_answer_rules() -> None:
    assert token_f1("", "") == 1.0 and exact_match("", "") == 1.0
    assert token_f1("the", "") == 1.0  # an article alone normalizes to nothing
    assert token_f1("", "cat") == 0.0 and token_f1("cat", "") == 0.0


def test_squad_metrics_best_gold_answer_in_percent() -> None:
    examples = [
        example("a", "q", "the city of Paris", ["Paris", "the city of Paris"]),  # EM 1, F1 1
        example("b", "q", "red dog barked", ["red dog barked"]),  # EM 0, F1 2/3
        example("c", "q", "x", [], impossible=True),  # "" right: EM 1, F1 1
        example("d", "q", "x", [], impossible=True),  # "cat" wrong: 0, 0
        example(
            "e", "q", "big cat, a big brown cat", ["big cat", "a big brown cat"]
        ),  # EM 0, F1 max(0.5, 0.8)
    ]
    predictions = {"a": "city of paris", "b": "the big red dog", "c": "", "d": "cat", "e": "brown cat"}
    metrics = squad_metrics(examples, predictions)
    assert metrics["exact_match"] == pytest.approx(40.0)
    assert metrics["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1 + 0 + 0.8) / 5)
    with pytest.raises(ValueError, match="no prediction"):
        squad_metrics(examples, {"a": "paris"})
