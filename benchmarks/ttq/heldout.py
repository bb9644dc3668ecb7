"""The evaluation sets and the scoring of a model on them, row by row.

Two held-out sets per replicate, made from the same held-out documents by the data stage in one
pass (each row a distinct segment): *singles* ``[CLS] A [SEP]`` (segment ids 0; the ``mlm``
recipes' format) and *pairs* ``[CLS] A [SEP] B [SEP]`` (segment ids 0 then 1; the classic recipe's
format), both masked once at 15% and stored. The shards do not record which document a row came
from, so :func:`row_documents` finds it from the data stage's tokenized documents (its pieces,
``<data>/documents/piece_*.npz``): the statistics resample held-out documents, each with all its
rows, since rows of one document are correlated.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

FORMATS = ("singles", "pairs")
GRAM = 4  # tokens per n-gram that votes for a row's document
COMMON_GRAM = 32  # an n-gram found in more held-out documents than this votes for none
_NAMES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids")


@dataclass(frozen=True)
class EvalSet:
    """Masked rows to score: ``input_ids``, ``input_mask``, ``segment_ids`` int64 [N, L] as stored
    (already masked), ``positions`` and ``labels`` int64 [N, P] (a position 0 is an empty slot:
    ``[CLS]`` is never masked), ``files`` where they came from. Rows without a masked position are
    left out when read (they carry nothing to score)."""

    input_ids: np.ndarray
    input_mask: np.ndarray
    segment_ids: np.ndarray
    positions: np.ndarray
    labels: np.ndarray
    files: tuple[str, ...]

    @classmethod
    def read(cls, dataset: Path, pattern: str = "heldout_*.hdf5") -> EvalSet:
        """The rows of ``dataset``'s shards matching ``pattern``, in file order.

        Raises:
            ValueError: no such shard in ``dataset``.
        """
        files = sorted(dataset.glob(pattern))
        if not files:
            raise ValueError(f"{dataset}: no {pattern} shards")
        parts: dict[str, list[np.ndarray]] = {name: [] for name in _NAMES}
        for file in files:
            with h5py.File(file, "r") as shard:
                for name in _NAMES:
                    parts[name].append(shard[name][:].astype(np.int64))
        ids, mask, segments, positions, labels = (np.concatenate(parts[name]) for name in _NAMES)
        keep = (positions != 0).any(axis=1)
        return cls(
            ids[keep], mask[keep], segments[keep], positions[keep], labels[keep], tuple(map(str, files))
        )

    @property
    def rows(self) -> int:
        """N."""
        return len(self.input_ids)

    @property
    def predictions(self) -> int:
        """Masked positions over all rows."""
        return int((self.positions != 0).sum())

    def unmasked(self) -> np.ndarray:
        """int64 [N, L]: the rows with their original tokens at the masked positions."""
        ids = self.input_ids.copy()
        rows, slots = np.nonzero(self.positions)
        ids[rows, self.positions[rows, slots]] = self.labels[rows, slots]
        return ids

    def distinct_segments(self) -> int:
        """Rows whose original text (token ids, masks undone) differs from every other row's."""
        return len(np.unique(self.unmasked(), axis=0))

    def has_segment_b(self) -> bool:
        """Whether some row has a second segment (segment id 1): the pair format."""
        return bool((self.segment_ids == 1).any())

    def describe(self) -> dict[str, Any]:
        """Counts for the record and the table."""
        return {
            "rows": self.rows,
            "distinct_segments": self.distinct_segments(),
            "predictions": self.predictions,
            "rows_with_segment_b": int((self.segment_ids == 1).any(axis=1).sum()),
            "files": list(self.files),
        }


def heldout_documents(documents_dir: Path) -> list[np.ndarray]:
    """The held-out documents of a data stage's pieces (``piece_*.npz`` in ``documents_dir``, in
    file order): each document's tokens, int32 [T_d], sentence after sentence. Raises ValueError
    when ``documents_dir`` has no piece."""
    files = sorted(documents_dir.glob("piece_*.npz"))
    if not files:
        raise ValueError(f"{documents_dir}: no piece_*.npz (the data stage's tokenized documents)")
    found = []
    for file in files:
        with np.load(file) as piece:
            tokens, sentences, documents = piece["tokens"], piece["sentence_starts"], piece["document_starts"]
            for d in np.flatnonzero(piece["heldout"]):
                found.append(tokens[sentences[documents[d]] : sentences[documents[d + 1]]].astype(np.int32))
    return found


def row_documents(rows: EvalSet, documents: Sequence[np.ndarray]) -> np.ndarray:
    """int64 [N]: for each row of ``rows``, the index in ``documents`` (:func:`heldout_documents`)
    of the document its segment A was cut from, or -1 where none is found.

    Segment A (the tokens after ``[CLS]`` up to the first ``[SEP]``, its masks undone) is a run of
    one document's tokens, maybe truncated at either end (NVIDIA's ``truncate_seq_pair``); each of
    its 4-token n-grams votes for the documents that hold it (n-grams in more than
    :data:`COMMON_GRAM` documents vote for none) and the most voted wins, the lowest index on a tie.
    A pair's segment B is not read: a random next segment comes from another document.
    """
    index: dict[bytes, list[int]] = {}
    for d, tokens in enumerate(documents):
        if len(tokens) >= GRAM:
            grams = np.lib.stride_tricks.sliding_window_view(np.ascontiguousarray(tokens, np.int32), GRAM)
            for key in {gram.tobytes() for gram in grams}:
                index.setdefault(key, []).append(d)
    ids = rows.unmasked()
    found = np.full(rows.rows, -1, np.int64)
    for row in range(rows.rows):
        segment_a = int(((rows.segment_ids[row] == 0) & (rows.input_mask[row] == 1)).sum())
        tokens = np.ascontiguousarray(ids[row, 1 : segment_a - 1], np.int32)  # no [CLS], no [SEP]
        if len(tokens) < GRAM:
            continue
        votes: Counter[int] = Counter()
        for gram in np.lib.stride_tricks.sliding_window_view(tokens, GRAM):
            holders = index.get(gram.tobytes(), ())
            if len(holders) <= COMMON_GRAM:
                votes.update(holders)
        if votes:
            found[row] = min(votes, key=lambda d: (-votes[d], d))
    return found


def by_document(values: Sequence[int], documents: np.ndarray) -> np.ndarray:
    """int64 [U]: ``values`` (one per row, [N]) summed over the rows of each document in
    ``documents`` (:func:`row_documents`, [N]), in increasing document order, then each row whose
    document was not found (-1) as a unit of its own, in row order.

    Raises:
        ValueError: ``values`` and ``documents`` differ in length.
    """
    values = np.asarray(values, np.int64)
    if values.shape != documents.shape:
        raise ValueError(f"{len(values)} row values for {len(documents)} rows' documents")
    units = documents.copy()
    unknown = units < 0
    units[unknown] = units.max(initial=-1) + 1 + np.arange(int(unknown.sum()))
    _, inverse = np.unique(units, return_inverse=True)
    return np.bincount(inverse, weights=values).astype(np.int64)


def score_rows(
    model: Any, rows: EvalSet, device: str, batch_size: int = 128
) -> tuple[np.ndarray, np.ndarray]:
    """Masked-LM predictions of ``model`` (a transformers masked LM; put in eval mode here) on
    ``rows``, row by row: (correct, total), int64 [N] each: per row, the masked positions whose
    argmax token is the label, and its masked positions (>= 1)."""
    model.eval()
    correct = np.zeros(rows.rows, np.int64)
    # transformers' BERT masked LMs: the encoder, then the MLM head on the masked slots alone (the
    # vocabulary projection at all 128 positions was most of the scoring's time: 5,583 rows took
    # about 15 s on 2 cores). Anything else: its logits at every position.
    split = hasattr(model, "bert") and hasattr(model, "cls")
    with torch.no_grad():
        for start in range(0, rows.rows, batch_size):
            part = slice(start, start + batch_size)
            inputs = {
                "input_ids": torch.from_numpy(rows.input_ids[part]).to(device),
                "attention_mask": torch.from_numpy(rows.input_mask[part]).to(device),
                "token_type_ids": torch.from_numpy(rows.segment_ids[part]).to(device),
            }
            positions = torch.from_numpy(rows.positions[part]).to(device)
            labels = torch.from_numpy(rows.labels[part]).to(device)
            if split:
                hidden = model.bert(**inputs).last_hidden_state  # [B, L, H]
                picked = model.cls(hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])))
            else:
                logits = model(**inputs).logits  # [B, L, V]
                picked = logits.gather(1, positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
            hits = (picked.argmax(-1) == labels) & (positions != 0)  # [B, P]
            correct[part] = hits.sum(dim=1).cpu().numpy()
    return correct, (rows.positions != 0).sum(axis=1).astype(np.int64)


def quiet_transformers() -> None:
    """No progress bars and no warnings from transformers: lines in a log."""
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    disable_progress_bars()


def score_model(model: Any, sets: dict[str, EvalSet], device: str) -> dict[str, dict[str, Any]]:
    """:func:`score_rows` on each set: per format, ``correct`` and ``total`` (lists of ints, per
    row) and ``accuracy`` (their sums' ratio)."""
    scores = {}
    for name, rows in sets.items():
        correct, total = score_rows(model, rows, device)
        scores[name] = {
            "accuracy": float(correct.sum() / max(int(total.sum()), 1)),
            "correct": correct.tolist(),
            "total": total.tolist(),
        }
    return scores


def score_export(export: Path, sets: dict[str, EvalSet], device: str) -> dict[str, dict[str, Any]]:
    """:func:`score_model` of the Hugging Face directory ``export`` (loaded as a masked LM)."""
    from transformers import AutoModelForMaskedLM

    quiet_transformers()
    model = AutoModelForMaskedLM.from_pretrained(str(export)).to(device)
    return score_model(model, sets, device)


def accuracies(scores: dict[str, dict[str, Any]], formats: Sequence[str] = FORMATS) -> dict[str, float]:
    """Each format's accuracy from a record's ``scores``."""
    return {name: scores[name]["accuracy"] for name in formats if name in scores}
