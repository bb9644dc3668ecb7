"""Extractive question answering on SQuAD v1.1 and v2.0 (Rajpurkar et al. 2016, 2018).

Reading (:func:`read_squad`) -> features with a document stride (:func:`squad_features`) -> the
model's start and end logits -> answer texts (:func:`predict_answers`) -> exact match and F1
(:func:`squad_metrics`). Windows, "max context" and span selection follow Google's
``run_squad.py`` (google-research/bert), which NVIDIA's BERT scripts keep; the metrics follow the
official SQuAD v2.0 evaluate script, whose rules reduce to v1.1's on questions that have answers.

Google's script maps tokens back to whitespace-separated words and then projects the tokens'
text onto the original words (``get_final_text``); here the tokenizer's character offsets, which
``tokenizers`` gives into the original string even through lower-casing and accent stripping,
do that directly: an answer is a slice of the original context.
"""

from __future__ import annotations

import collections
import json
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from bertpretrain.data.format.vocab import SpecialIds
from bertpretrain.finetune.errors import TaskDataError


@dataclass(frozen=True)
class SquadExample:
    """One question of a SQuAD file, its context paragraph and its gold answers.

    ``answers`` are ``(text, character start in context)`` pairs, empty for an impossible
    (v2.0) question; ``row`` is the question's number in file order, from 1.
    """

    id: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]
    is_impossible: bool
    row: int


@dataclass(frozen=True)
class SquadWindow:
    """What one feature needs to map logits back to its example's context.

    ``context_start`` is the index in ``input_ids`` of the window's first context token (after
    ``[CLS] question [SEP]``); ``offsets`` int64 [window tokens, 2] the characters of the
    original context each window token covers (start, end exclusive); ``max_context`` bool
    [window tokens] whether this window is the token's "max context" one among the windows
    that overlap on it (Google's ``_check_is_max_context``).
    """

    context_start: int
    offsets: np.ndarray
    max_context: np.ndarray


@dataclass
class SquadFeatures:
    """Model inputs for SQuAD, one row per (question, context window).

    ``input_ids``, ``token_type_ids``, ``attention_mask``: int64 [N, max_seq_length], padded with
    ``[PAD]`` (type 0, mask 0). ``start_positions``, ``end_positions``: int64 [N], token indices
    in the row, 0 (``[CLS]``) when the answer is not wholly inside the window or there is none;
    None unless built for training. ``example_index``: int64 [N], the row's example.
    ``windows``: N :class:`SquadWindow`.
    """

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    attention_mask: torch.Tensor
    start_positions: torch.Tensor | None
    end_positions: torch.Tensor | None
    example_index: torch.Tensor
    windows: list[SquadWindow]

    def __len__(self) -> int:
        return len(self.windows)


def read_squad(path: Path) -> tuple[list[SquadExample], bool]:
    """Read a SQuAD v1.1 or v2.0 JSON file: its questions in file order, and whether it is v2.0.

    A file is v2.0 when its ``version`` starts with ``"v2"`` or a question has ``is_impossible``.
    An impossible question's answers are dropped (v2.0 training files keep wrong guesses under
    ``plausible_answers``, and its gold answer is "no answer").

    Raises:
        TaskDataError: the file is missing, is not JSON, lacks a key of the SQuAD layout (named)
            or has a value of the wrong type; a question (by row) has no answers and is not
            impossible, an empty answer, an ``answer_start`` outside its context, an answer text
            that differs from the context at ``answer_start`` (both shown), or an id used before;
            the file has no questions.
    """
    path = Path(path)
    if not path.is_file():
        raise TaskDataError(path, "no such file")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise TaskDataError(path, f"not UTF-8 text: {error}") from None
    except json.JSONDecodeError as error:
        raise TaskDataError(path, f"not JSON: {error}") from None
    data = _get(document, "data", list, path, "the top level")
    examples: list[SquadExample] = []
    rows_by_id: dict[str, int] = {}
    for i, article in enumerate(data):
        for j, paragraph in enumerate(_get(article, "paragraphs", list, path, f"data[{i}]")):
            where = f"data[{i}].paragraphs[{j}]"
            context = _get(paragraph, "context", str, path, where)
            for k, qa in enumerate(_get(paragraph, "qas", list, path, where)):
                row = len(examples) + 1
                example = _example(qa, context, path, f"{where}.qas[{k}]", row)
                if example.id in rows_by_id:
                    raise TaskDataError(
                        path, f"id {example.id!r} is used by row {rows_by_id[example.id]} too", row
                    )
                rows_by_id[example.id] = row
                examples.append(example)
    if not examples:
        raise TaskDataError(path, "no questions")
    version = document.get("version")
    version_2 = (isinstance(version, str) and version.startswith("v2")) or any(
        example.is_impossible for example in examples
    )
    return examples, version_2


def _get(node: Any, key: str, kind: type, path: Path, where: str, row: int | None = None) -> Any:
    """``node[key]``, checked to be a ``kind``; the error names ``where`` in the SQuAD layout."""
    if not isinstance(node, dict):
        raise TaskDataError(
            path, f"{where} is a JSON {type(node).__name__}, the SQuAD layout has an object", row
        )
    if key not in node:
        raise TaskDataError(path, f"{where} has no {key!r} key, which the SQuAD layout needs", row)
    value = node[key]
    # bool is an int in Python, but not an answer_start.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TaskDataError(
            path, f"{where}.{key} is a JSON {type(value).__name__}, expected {kind.__name__}", row
        )
    return value


def _example(qa: Any, context: str, path: Path, where: str, row: int) -> SquadExample:
    """One question object, validated against its context."""
    qid = _get(qa, "id", object, path, where, row)
    if not isinstance(qid, str | int) or isinstance(qid, bool):
        raise TaskDataError(path, f"{where}.id is {qid!r}, expected a string", row)
    question = _get(qa, "question", str, path, where, row)
    impossible = qa.get("is_impossible", False)
    if not isinstance(impossible, bool):
        raise TaskDataError(path, f"{where}.is_impossible is {impossible!r}, expected true or false", row)
    if impossible:
        return SquadExample(str(qid), question, context, (), True, row)
    answers = []
    for n, answer in enumerate(_get(qa, "answers", list, path, where, row), 1):
        text = _get(answer, "text", str, path, f"{where}.answers[{n - 1}]", row)
        start = _get(answer, "answer_start", int, path, f"{where}.answers[{n - 1}]", row)
        if not text:
            raise TaskDataError(
                path, f"answer {n} is empty (a question without an answer is is_impossible)", row
            )
        if not 0 <= start < len(context):
            raise TaskDataError(
                path, f"answer {n} starts at character {start}, outside the context of {len(context)}", row
            )
        found = context[start : start + len(text)]
        if found != text:
            raise TaskDataError(
                path,
                f"answer {n} {text!r} differs from the context at answer_start {start}, which has {found!r}",
                row,
            )
        answers.append((text, start))
    if not answers:
        raise TaskDataError(path, "the question has no answers and is not is_impossible", row)
    return SquadExample(str(qid), question, context, tuple(answers), False, row)


def squad_features(
    examples: Sequence[SquadExample],
    tokenizer: Tokenizer,
    max_seq_length: int,
    doc_stride: int,
    max_query_length: int,
    training: bool,
) -> SquadFeatures:
    """Tokenize the examples into ``[CLS] question [SEP] window [SEP]`` rows (Google's
    ``convert_examples_to_features`` in ``run_squad.py``).

    The question keeps its first ``max_query_length`` tokens; windows of ``max_seq_length -
    len(question) - 3`` context tokens start ``doc_stride`` tokens apart until the context's last
    token is in one (an empty context gives one empty window). For training, the labels point at
    the first answer's first and last tokens when the window holds all of it, else at 0
    (``[CLS]``), and at 0 for an impossible question. ``tokenizer`` is used with its special ids
    and without truncation or padding (a copy is made if it has them).

    Raises:
        ValueError: ``max_seq_length`` leaves no context token after a question of
            ``max_query_length`` tokens (named as the spec's maxSeqLength/maxQueryLength), or
            ``doc_stride`` or ``max_query_length`` is below 1; the tokenizer lacks a special token.
    """
    if max_query_length < 1 or doc_stride < 1:
        raise ValueError(
            f"maxQueryLength ({max_query_length}) and docStride ({doc_stride}) must be at least 1"
        )
    if max_seq_length - max_query_length - 3 < 1:
        raise ValueError(
            f"maxSeqLength {max_seq_length} leaves no room for the context after a question of "
            f"maxQueryLength {max_query_length} tokens, [CLS] and two [SEP]: it must be at least "
            f"maxQueryLength + 4 = {max_query_length + 4}"
        )
    special = SpecialIds.of(tokenizer, "the SQuAD tokenizer")
    if tokenizer.truncation is not None or tokenizer.padding is not None:
        tokenizer = Tokenizer.from_str(tokenizer.to_str())
        tokenizer.no_truncation()
        tokenizer.no_padding()
    contexts = list(dict.fromkeys(example.context for example in examples))
    context_number = {context: n for n, context in enumerate(contexts)}
    encoded = tokenizer.encode_batch(contexts, add_special_tokens=False)
    context_ids = [np.asarray(encoding.ids, np.int64) for encoding in encoded]
    context_offsets = [
        _offsets(context, encoding.offsets) for context, encoding in zip(contexts, encoded, strict=True)
    ]
    questions = tokenizer.encode_batch([example.question for example in examples], add_special_tokens=False)

    rows: list[np.ndarray] = []
    types: list[int] = []  # the row's first type-1 index
    labels: list[tuple[int, int]] = []
    example_index: list[int] = []
    windows: list[SquadWindow] = []
    for index, example in enumerate(examples):
        question = np.asarray(questions[index].ids[:max_query_length], np.int64)
        number = context_number[example.context]
        ids, offsets = context_ids[number], context_offsets[number]
        spans = _spans(len(ids), max_seq_length - len(question) - 3, doc_stride)
        owner = _max_context_owner(len(ids), spans)
        answer = (-1, -1)
        if training and not example.is_impossible:
            text, start = example.answers[0]
            answer = _answer_tokens(offsets, start, start + len(text))
        context_start = len(question) + 2
        for k, (first, length) in enumerate(spans):
            rows.append(
                np.concatenate(
                    [[special.cls], question, [special.sep], ids[first : first + length], [special.sep]]
                )
            )
            types.append(context_start)
            inside = answer[0] >= 0 and first <= answer[0] and answer[1] < first + length
            labels.append(
                (answer[0] - first + context_start, answer[1] - first + context_start) if inside else (0, 0)
            )
            example_index.append(index)
            windows.append(
                SquadWindow(
                    context_start, offsets[first : first + length], owner[first : first + length] == k
                )
            )

    input_ids = np.full((len(rows), max_seq_length), special.pad, np.int64)
    token_type_ids = np.zeros((len(rows), max_seq_length), np.int64)
    attention_mask = np.zeros((len(rows), max_seq_length), np.int64)
    for r, (row, first_b) in enumerate(zip(rows, types, strict=True)):
        input_ids[r, : len(row)] = row
        token_type_ids[r, first_b : len(row)] = 1
        attention_mask[r, : len(row)] = 1
    positions = torch.tensor(labels, dtype=torch.int64).reshape(-1, 2)
    return SquadFeatures(
        input_ids=torch.from_numpy(input_ids),
        token_type_ids=torch.from_numpy(token_type_ids),
        attention_mask=torch.from_numpy(attention_mask),
        start_positions=positions[:, 0].clone() if training else None,
        end_positions=positions[:, 1].clone() if training else None,
        example_index=torch.tensor(example_index, dtype=torch.int64),
        windows=windows,
    )


def _offsets(context: str, offsets: list[tuple[int, int]]) -> np.ndarray:
    """int64 [tokens, 2] character spans, each token's end stretched over the characters the
    normalizer dropped after it (a decomposed accent, a control character), so that "Cafe" +
    U+0301 comes back with its accent; whitespace stays outside."""
    spans = np.asarray(offsets, np.int64).reshape(-1, 2)
    nexts = np.append(spans[1:, 0], len(context))
    for t in np.flatnonzero(spans[:, 1] < nexts):
        end = int(spans[t, 1])
        while end < nexts[t] and not context[end].isspace():
            end += 1
        spans[t, 1] = end
    return spans


def _spans(num_tokens: int, size: int, stride: int) -> list[tuple[int, int]]:
    """(first token, length) of each window over ``num_tokens`` context tokens, as ``run_squad.py``."""
    spans: list[tuple[int, int]] = []
    first = 0
    while True:
        length = min(num_tokens - first, size)
        spans.append((first, length))
        if first + length >= num_tokens:
            return spans
        first += min(length, stride)


def _max_context_owner(num_tokens: int, spans: list[tuple[int, int]]) -> np.ndarray:
    """int [num_tokens]: for each context token, the window in which it has the most context,
    scored min(tokens left, tokens right) + 0.01 x window length, the first window winning a tie
    (Google's ``_check_is_max_context``)."""
    position = np.arange(num_tokens)
    first = np.array([span[0] for span in spans])[:, None]
    length = np.array([span[1] for span in spans])[:, None]
    left, right = position - first, first + length - 1 - position
    score = np.where((left >= 0) & (right >= 0), np.minimum(left, right) + 0.01 * length, -np.inf)
    return np.argmax(score, axis=0) if num_tokens else np.zeros(0, np.int64)


def _answer_tokens(offsets: np.ndarray, start: int, end: int) -> tuple[int, int]:
    """First and last context token overlapping characters [start, end), or (-1, -1) if none
    does (an answer of dropped characters only, which no window can hold)."""
    first = int(np.searchsorted(offsets[:, 1], start, side="right"))
    last = int(np.searchsorted(offsets[:, 0], end, side="left")) - 1
    return (first, last) if first <= last else (-1, -1)


def predict_answers(
    examples: Sequence[SquadExample],
    features: SquadFeatures,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    version_2: bool = False,
    null_score_diff_threshold: float = 0.0,
) -> dict[str, str]:
    """Each example's answer text from the model's logits (Google's ``write_predictions``).

    ``start_logits``, ``end_logits``: float [N, max_seq_length], one row per feature. In each of
    an example's features, the ``n_best_size`` highest start and end indices (ties to the lower
    index) pair into spans that lie in the window's context, end at or after their start, are at
    most ``max_answer_length`` tokens long and start on a token whose max-context window this is;
    the best span by start + end logit wins (the earlier feature on a tie). Its text is the slice
    of the original context that its tokens cover. With ``version_2`` the answer is "" when the
    null score (the minimum over the features of start + end logit at ``[CLS]``) exceeds the
    best span's score by more than ``null_score_diff_threshold``. An example without a valid span
    gets "". Returns example id -> answer text.

    Raises:
        ValueError: the logits' shapes differ from ``features.input_ids``'.
    """
    starts = np.asarray(start_logits, np.float64)
    ends = np.asarray(end_logits, np.float64)
    shape = tuple(features.input_ids.shape)
    if starts.shape != shape or ends.shape != shape:
        raise ValueError(
            f"start_logits {starts.shape} and end_logits {ends.shape} must be {shape} like input_ids"
        )
    by_example: list[list[int]] = [[] for _ in examples]
    for f, e in enumerate(features.example_index.tolist()):
        by_example[e].append(f)
    predictions: dict[str, str] = {}
    for e, example in enumerate(examples):
        best_score, best_text = -np.inf, None  # best_text None: no valid span yet
        null_score = np.inf
        for f in by_example[e]:
            window = features.windows[f]
            null_score = min(null_score, starts[f, 0] + ends[f, 0])
            top_starts = np.argsort(-starts[f], kind="stable")[:n_best_size] - window.context_start
            top_ends = np.argsort(-ends[f], kind="stable")[:n_best_size] - window.context_start
            in_window = len(window.offsets)
            start_ok = (top_starts >= 0) & (top_starts < in_window)
            start_ok[start_ok] = window.max_context[top_starts[start_ok]]
            end_ok = (top_ends >= 0) & (top_ends < in_window)
            length = top_ends[None, :] - top_starts[:, None] + 1
            ok = start_ok[:, None] & end_ok[None, :] & (length >= 1) & (length <= max_answer_length)
            if not ok.any():
                continue
            score = (
                starts[f, top_starts + window.context_start][:, None]
                + ends[f, top_ends + window.context_start]
            )
            score = np.where(ok, score, -np.inf)
            i, j = divmod(int(np.argmax(score)), score.shape[1])
            if ok[i, j] and (best_text is None or score[i, j] > best_score):
                best_score = score[i, j]
                first, last = window.offsets[top_starts[i], 0], window.offsets[top_ends[j], 1]
                best_text = example.context[first:last]
        answer = best_text or ""
        if version_2 and (best_text is None or null_score - best_score > null_score_diff_threshold):
            answer = ""
        predictions[example.id] = answer
    return predictions


_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, drop ASCII punctuation, the articles a/an/the and extra whitespace (the
    official SQuAD evaluate script's ``normalize_answer``)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, truth: str) -> float:
    """1.0 when the normalized texts are equal, else 0.0 (official SQuAD evaluate script)."""
    return float(normalize_answer(prediction) == normalize_answer(truth))


def token_f1(prediction: str, truth: str) -> float:
    """F1 of the normalized texts' bags of words, in [0, 1] (official SQuAD v2.0 evaluate script).

    When either side has no words, 1.0 if both have none (a correct "no answer"), else 0.0.
    """
    predicted, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
    if not predicted or not gold:
        return float(predicted == gold)
    same = sum((collections.Counter(predicted) & collections.Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def squad_metrics(examples: Sequence[SquadExample], predictions: dict[str, str]) -> dict[str, float]:
    """``{"exact_match": ..., "f1": ...}`` in percent (0-100): the mean over questions of the best
    score over the question's gold answers (official SQuAD v2.0 evaluate script; gold answers
    that normalize to nothing are dropped, and a question left with none, as an impossible one,
    has the single gold answer "").

    Raises:
        ValueError: no examples, or a question without a prediction (the count and a first id).
    """
    if not examples:
        raise ValueError("squad_metrics: no examples")
    missing = [example.id for example in examples if example.id not in predictions]
    if missing:
        raise ValueError(f"{len(missing)} questions have no prediction, the first {missing[0]!r}")
    total_em = total_f1 = 0.0
    for example in examples:
        golds = [text for text, _ in example.answers if normalize_answer(text)] or [""]
        prediction = predictions[example.id]
        total_em += max(exact_match(prediction, gold) for gold in golds)
        total_f1 += max(token_f1(prediction, gold) for gold in golds)
    return {"exact_match": 100.0 * total_em / len(examples), "f1": 100.0 * total_f1 / len(examples)}
