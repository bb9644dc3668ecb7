"""Batches of pretraining instances from one phase's HDF5 shards, split across ranks.

The shards follow NVIDIA DeepLearningExamples' BERT schema: ``input_ids`` int32 [N, L],
``input_mask`` int8 [N, L], ``segment_ids`` int8 [N, L], ``masked_lm_positions`` int32 [N, P],
``masked_lm_ids`` int32 [N, P] and ``next_sentence_labels`` int8 [N] (1 = random next sentence),
zero-padded. Position 0 holds [CLS] and is never masked, so a masked position of 0 is padding.
Shards made with dynamic masking lack the two ``masked_lm_*`` datasets: the loader masks their
rows each time it reads them (RoBERTa's dynamic masking, Liu et al. 2019), with draws seeded by
``(seed, epoch, shard, rank)``, so every epoch sees new masks and a resumed run the same ones.

Shards made for the objective ``mlm`` (single segments) have no ``next_sentence_labels``: a loader
made with ``next_sentence_prediction`` false (the job's objective ``mlm``) yields -100 there
(nothing to predict), also for shards that hold labels; one made with it true (``mlm-nsp``, the
default) refuses shards without them.

Packed shards (``bertpretrain.data.prepare.packing``, Graphcore's schema) hold several instances per row;
their batches carry ``position_ids`` and ``next_sentence_positions`` as well, and the model
attends within each instance only. There, "sequences" in this module means rows.

Each epoch visits the shards in a shuffled order and each shard's instances in a shuffled order,
both drawn from ``(seed, epoch)``; every rank draws the same permutation and takes every
``world_size``-th instance from offset ``rank``, so the ranks see disjoint parts of the data and,
the remainder being dropped, the same number of batches. Batches run on across shard and epoch
boundaries, and the stream never ends: the training loop counts steps, not epochs. A shard is
read whole into memory when its turn comes. Held-out shards (``heldout_*.hdf5``) are read once, in
order, by :func:`heldout_batches`. Before training, :func:`verify_phases` reads every shard of the
job once, the ranks sharing the work, so that a damaged file stops the job before step 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from bertjob_api.spec import PhaseSpec
from bertpretrain.common.batch import Batch
from bertpretrain.common.labels import IGNORE_INDEX
from bertpretrain.data.format.masking import mask_tokens
from bertpretrain.data.format.packed import PACKED_DTYPES, packed_shapes
from bertpretrain.data.format.shards import (
    DYNAMIC_DTYPES,
    NEXT_SENTENCE_LABELS,
    PREDICTION_DATASETS,
    SHARD_DTYPES,
    read_datasets,
    shard_shapes,
    without_next_sentence_labels,
)
from bertpretrain.data.format.vocab import SpecialIds, continuation_table, load_tokenizer

Arrays = dict[str, np.ndarray]


class ShardError(ValueError):
    """A shard directory or file that does not fit the schema or the phase; names the path."""


ShardKind = Literal["static", "dynamic", "packed"]
_SCHEMAS: dict[ShardKind, dict[str, type[np.integer]]] = {
    "static": SHARD_DTYPES,
    "dynamic": DYNAMIC_DTYPES,
    "packed": PACKED_DTYPES,
}
TRAIN_PATTERN = "shard_*.hdf5"
HELDOUT_PATTERN = "heldout_*.hdf5"


@dataclass(frozen=True)
class Shard:
    """One HDF5 file, its rows (instances, or packs of them) and its schema.

    ``kind``: static (NVIDIA's schema), dynamic (unmasked, masked by the loader) or packed.
    ``next_sentence_labels``: whether the file holds them (shards made for the objective ``mlm``
    do not).
    """

    path: Path
    num_sequences: int
    kind: ShardKind = "static"
    next_sentence_labels: bool = True

    @property
    def dynamic(self) -> bool:
        """Whether the loader must draw this shard's masks."""
        return self.kind == "dynamic"

    @property
    def schema(self) -> dict[str, type[np.integer]]:
        """The datasets the file holds, and their dtypes in memory."""
        schema = _SCHEMAS[self.kind]
        return schema if self.next_sentence_labels else without_next_sentence_labels(schema)


def _without_labels_error(path: Path) -> ShardError:
    return ShardError(
        f"{path}: no dataset {NEXT_SENTENCE_LABELS}, which the objective mlm-nsp needs (the shard was "
        "made for the objective mlm, masked LM alone: set spec.objective mlm to train on it)"
    )


def _refuse_without_labels(shards: Sequence[Shard], next_sentence_prediction: bool) -> None:
    """Raise :func:`_without_labels_error` for the first shard without labels when they are needed."""
    if next_sentence_prediction:
        for shard in shards:
            if not shard.next_sentence_labels:
                raise _without_labels_error(shard.path)


@dataclass(frozen=True)
class DynamicMasking:
    """What the loader needs to mask the rows of dynamic shards (see ``bertpretrain.data.format.masking``)."""

    masked_lm_prob: float
    special: SpecialIds
    continuation: np.ndarray | None  # bool [vocab size] for whole-word masking, else None

    @classmethod
    def from_vocab(cls, vocab_dir: Path, masked_lm_prob: float, whole_word_mask: bool) -> DynamicMasking:
        """Read the special ids (and ``##`` pieces) from the vocabulary the shards were made with.

        Raises:
            FileNotFoundError, ValueError: see ``bertpretrain.data.format.vocab.load_tokenizer``.
        """
        tokenizer = load_tokenizer(vocab_dir)
        continuation = continuation_table(tokenizer) if whole_word_mask else None
        return cls(masked_lm_prob, SpecialIds.of(tokenizer, vocab_dir), continuation)


def find_shards(
    shard_dir: Path,
    max_seq_length: int,
    max_predictions_per_seq: int,
    pattern: str = TRAIN_PATTERN,
    *,
    next_sentence_prediction: bool = True,
) -> list[Shard]:
    """The files of ``shard_dir`` matching ``pattern``, sorted by name, each checked against the phase.

    Only the datasets' shapes are read here; the values are checked when a shard is loaded.
    ``next_sentence_prediction`` (true for the objective ``mlm-nsp``) requires
    ``next_sentence_labels`` in every shard; when false (``mlm``), shards may lack them.

    Raises:
        ShardError: the directory is missing or holds no such file, or a shard cannot be opened,
            lacks a dataset (``next_sentence_labels`` only when ``next_sentence_prediction``; the
            message then says that the shard was made for the objective mlm), or has a sequence
            length (L) or predictions per sequence (P) other than the phase's.
    """
    if not shard_dir.is_dir():
        raise ShardError(f"{shard_dir}: shard directory does not exist")
    paths = sorted(shard_dir.glob(pattern))
    if not paths:
        raise ShardError(f"{shard_dir}: no {pattern} files")
    return [
        _inspect(path, max_seq_length, max_predictions_per_seq, next_sentence_prediction) for path in paths
    ]


def _inspect(
    path: Path, max_seq_length: int, max_predictions_per_seq: int, next_sentence_prediction: bool
) -> Shard:
    try:
        with h5py.File(path, "r") as file:
            shapes = {name: file[name].shape for name in file if isinstance(file[name], h5py.Dataset)}
    except OSError as error:
        raise ShardError(f"{path}: not a readable HDF5 file ({error})") from None
    kind: ShardKind
    if "next_sentence_positions" in shapes:
        kind = "packed"
    else:
        kind = "static" if any(name in shapes for name in PREDICTION_DATASETS) else "dynamic"
    schema = _SCHEMAS[kind]
    shapes = {name: shape for name, shape in shapes.items() if name in schema}
    missing = sorted(set(schema) - set(shapes))
    # A shard that lacks its labels alone was made for the objective mlm: valid without next
    # sentence prediction, and refused as such (not as a damaged file) with it.
    if missing and missing != [NEXT_SENTENCE_LABELS]:
        raise ShardError(f"{path}: missing dataset(s) {', '.join(missing)}")
    if missing and next_sentence_prediction:
        raise _without_labels_error(path)
    rows = shapes["input_ids"][0]
    expected: Mapping[str, tuple[int, ...]]
    if kind == "packed":
        per_pack = shapes["next_sentence_positions"][1]
        expected = packed_shapes(rows, max_seq_length, per_pack, max_predictions_per_seq)
    else:
        expected = shard_shapes(rows, max_seq_length, max_predictions_per_seq)
    for name, shape in shapes.items():
        if len(shape) != len(expected[name]) or shape[0] != rows:
            raise ShardError(f"{path}: dataset {name} has shape {shape}, expected {rows} rows")
        if shape != expected[name]:
            if name in PREDICTION_DATASETS:
                what = f"max_predictions_per_seq is {max_predictions_per_seq}"
                if kind == "packed":
                    what += f" (x {per_pack} instances per row = {expected[name][1]})"
            else:
                what = f"max_seq_length is {max_seq_length}"
            raise ShardError(f"{path}: dataset {name} has width {shape[1]}, but the phase's {what}")
    return Shard(path, rows, kind, next_sentence_labels=not missing)


def load_shard(shard: Shard, vocab_size: int) -> Arrays:
    """All datasets of one shard (:attr:`Shard.schema`) as numpy arrays, checked to be valid token
    ids and positions.

    Raises:
        ShardError: the file cannot be read (damaged: its checksums, where it has them, or its
            structure; see ``bertpretrain.data.format.shards.read_datasets``), or holds ids outside
            ``[0, vocab_size)`` or masked positions outside the sequence.
    """
    try:
        arrays = read_datasets(shard.path, shard.schema)
    except (OSError, KeyError) as error:
        raise ShardError(error.args[0]) from None
    for name in ("input_ids", "masked_lm_ids"):
        values = arrays.get(name, np.zeros(0, np.int32))
        if values.size and (values.min() < 0 or values.max() >= vocab_size):
            raise ShardError(
                f"{shard.path}: {name} holds ids in [{values.min()}, {values.max()}], "
                f"outside the vocabulary of {vocab_size}"
            )
    positions = arrays.get("masked_lm_positions", np.zeros(0, np.int32))
    if positions.size and (positions.min() < 0 or positions.max() >= arrays["input_ids"].shape[1]):
        raise ShardError(f"{shard.path}: masked_lm_positions outside the sequence")
    return arrays


def verify_shards(shards: Sequence[Shard], vocab_size: int, rank: int = 0, world_size: int = 1) -> None:
    """Load this rank's share of ``shards`` once each (see :func:`load_shard`), before training.

    Rank ``r`` reads the shards at positions ``r, r + world_size, ...``, so the ranks together read
    every shard once: eight ranks on one node do not read the same files eight times.

    Raises:
        ShardError: the first of its shards that is damaged or holds invalid values.
    """
    for shard in shards[rank::world_size]:
        load_shard(shard, vocab_size)


def phase_shards(
    shard_dir: Path,
    max_seq_length: int,
    max_predictions_per_seq: int,
    *,
    next_sentence_prediction: bool = True,
) -> list[Shard]:
    """A phase's training shards, then its held-out shards if it has any (see :func:`find_shards`).

    Raises:
        ShardError: see :func:`find_shards`.
    """
    shards = find_shards(
        shard_dir, max_seq_length, max_predictions_per_seq, next_sentence_prediction=next_sentence_prediction
    )
    if any(shard_dir.glob(HELDOUT_PATTERN)):
        shards += find_shards(
            shard_dir, max_seq_length, max_predictions_per_seq, HELDOUT_PATTERN,
            next_sentence_prediction=next_sentence_prediction,
        )  # fmt: skip
    return shards


def verify_phases(
    phases: Sequence[PhaseSpec],
    directories: Sequence[Path],
    vocab_size: int,
    rank: int = 0,
    world_size: int = 1,
    gather: Callable[[object], list[object]] | None = None,
    *,
    next_sentence_prediction: bool = True,
) -> None:
    """Check every shard of every phase (``directories[k]`` holds ``phases[k]``'s) before step 1.

    ``next_sentence_prediction``: as for :func:`find_shards` (true for the objective ``mlm-nsp``).

    Every rank runs this: each reads its share of all the phases' shards (:func:`verify_shards`),
    then ``gather`` (an all-gather over the ranks, ``DataParallel.gather_object``) tells each rank
    what the others found, so that all of them stop with the same error, and rank 0's log, the
    one people read, names the file even when another node found it.

    Raises:
        ShardError: a directory, or a shard in it, that :func:`find_shards` or :func:`load_shard`
            refuses; with several ranks, the error of the lowest rank that found one.
    """
    error = None
    try:
        shards = [
            shard
            for phase, directory in zip(phases, directories, strict=True)
            for shard in phase_shards(
                directory,
                phase.max_seq_length,
                phase.max_predictions_per_seq,
                next_sentence_prediction=next_sentence_prediction,
            )
        ]
        verify_shards(shards, vocab_size, rank, world_size)
    except ShardError as found:
        error = str(found)
    errors = gather(error) if gather is not None else [error]
    first = next((message for message in errors if message is not None), None)
    if first is not None:
        raise ShardError(first)


def _load(shard: Shard, vocab_size: int, next_sentence_prediction: bool) -> Arrays:
    """:func:`load_shard`, without ``next_sentence_labels`` when next sentence prediction is off:
    then every shard gives the same datasets, whether it holds labels or not, and
    :func:`to_batch` makes them -100."""
    arrays = load_shard(shard, vocab_size)
    if not next_sentence_prediction:
        arrays.pop(NEXT_SENTENCE_LABELS, None)
    return arrays


# Packed batches' prediction slots are cut to a multiple of this many (see used_prediction_slots).
PREDICTION_SLOT_MULTIPLE = 8


def used_prediction_slots(positions: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``positions`` and ``labels`` (int64 [B, S*P]) without the slots no row of the batch uses.

    A packed row has room for ``max_predictions_per_seq`` predictions of each of its S sequences,
    but its sequences share one row's tokens, and so one row's share of masks: at 30% masking a
    row of three at 128 tokens holds at most about 41 of its 3 x 38 = 114 slots. The MLM head
    projects every slot it is given onto the vocabulary, so the empty ones cost time and change no
    loss. The cut keeps the columns up to the batch's last used one (position 0 is never masked: a
    row starts with [CLS]), rounded up to a multiple of :data:`PREDICTION_SLOT_MULTIPLE` so that a
    compiled head sees few shapes. Returns [B, W] for both, W <= S*P.
    """
    used = np.flatnonzero((positions != 0).any(axis=0))
    width = 0 if used.size == 0 else int(used[-1]) + 1
    width = min(positions.shape[1], max(1, -(-width // PREDICTION_SLOT_MULTIPLE)) * PREDICTION_SLOT_MULTIPLE)
    return np.ascontiguousarray(positions[:, :width]), np.ascontiguousarray(labels[:, :width])


def to_batch(arrays: Arrays) -> Batch:
    """Model inputs from shard rows: every tensor int64, labels -100 where there is nothing to
    predict; the keys and shapes are :class:`bertpretrain.common.batch.Batch`'s.

    Rows without ``next_sentence_labels`` (objective ``mlm``) get ``next_sentence_labels`` all
    -100: int64 [B], or [B, S] for packed rows. Packed rows' ``masked_lm_positions`` and
    ``masked_lm_labels`` are [B, W], W the slots the batch uses (:func:`used_prediction_slots`).
    """
    positions = arrays["masked_lm_positions"].astype(np.int64)
    labels = np.where(positions == 0, IGNORE_INDEX, arrays["masked_lm_ids"]).astype(np.int64)
    packed = "next_sentence_positions" in arrays
    if packed:
        positions, labels = used_prediction_slots(positions, labels)
    if NEXT_SENTENCE_LABELS not in arrays:
        shape = arrays["next_sentence_positions"].shape if packed else arrays["input_ids"].shape[:1]
        next_sentence_labels = np.full(shape, IGNORE_INDEX, np.int64)
    else:
        next_sentence_labels = arrays[NEXT_SENTENCE_LABELS].astype(np.int64)
        if packed:
            next_sentence_labels[arrays["next_sentence_weights"] == 0] = IGNORE_INDEX
    # The HDF5 datasets keep NVIDIA's names (segment_ids, input_mask, masked_lm_ids).
    batch = Batch(
        input_ids=torch.from_numpy(arrays["input_ids"].astype(np.int64)),
        token_type_ids=torch.from_numpy(arrays["segment_ids"].astype(np.int64)),
        attention_mask=torch.from_numpy(arrays["input_mask"].astype(np.int64)),
        masked_lm_positions=torch.from_numpy(positions),
        masked_lm_labels=torch.from_numpy(labels),
        next_sentence_labels=torch.from_numpy(next_sentence_labels),
    )
    if packed:
        batch["position_ids"] = torch.from_numpy(arrays["position_ids"].astype(np.int64))
        next_sentence_positions = arrays["next_sentence_positions"].astype(np.int64)
        batch["next_sentence_positions"] = torch.from_numpy(next_sentence_positions)
    return batch


def _masked(
    arrays: Arrays, masking: DynamicMasking, max_predictions_per_seq: int, vocab_size: int, seed: list[int]
) -> Arrays:
    """Dynamic shard rows with masks drawn from ``seed`` (see ``bertpretrain.data.format.masking``)."""
    masked = mask_tokens(
        arrays["input_ids"], arrays["input_mask"], max_predictions_per_seq, masking.masked_lm_prob,
        masking.special, vocab_size, np.random.default_rng(seed), masking.continuation,
    )  # fmt: skip
    return {**arrays, **masked}


@dataclass(frozen=True)
class DataPosition:
    """Where a rank's stream stands: the next row to read is row ``sample`` of this rank's share
    of shard ``shard`` (a file name) in epoch ``epoch``, after ``sequences`` rows in all."""

    epoch: int
    shard: str
    sample: int
    sequences: int

    def to_dict(self) -> dict[str, Any]:
        """Plain values, for checkpoints."""
        return {"epoch": self.epoch, "shard": self.shard, "sample": self.sample, "sequences": self.sequences}


class PretrainingBatches(IterableDataset[Batch]):
    """The endless stream of one rank's batches of ``micro_batch_size`` instances (see the module).

    ``masking`` is required when a shard is dynamic; ``max_predictions_per_seq`` is then the P of
    the masks drawn. ``skip_batches`` starts the stream after that many batches, where a resumed
    run left off, without reading the shards that are skipped whole. With DataLoader workers,
    worker ``w`` of ``n`` yields batches ``w, w + n, ...``, which the DataLoader interleaves back
    into order. ``next_sentence_prediction`` false (objective ``mlm``) yields
    ``next_sentence_labels`` -100 whatever the shards hold; true requires them in every shard.

    Raises:
        ShardError: dynamic shards without ``masking``; with ``next_sentence_prediction``, a shard
            without ``next_sentence_labels``; too few rows for ``world_size``.
    """

    def __init__(
        self,
        shards: list[Shard],
        vocab_size: int,
        micro_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        skip_batches: int = 0,
        masking: DynamicMasking | None = None,
        max_predictions_per_seq: int = 0,
        *,
        next_sentence_prediction: bool = True,
    ):
        if masking is None and any(shard.dynamic for shard in shards):
            raise ShardError(f"{shards[0].path.parent}: unmasked (dynamic) shards, but no masking was given")
        _refuse_without_labels(shards, next_sentence_prediction)
        self.next_sentence_prediction = next_sentence_prediction
        self.shards = shards
        self.masking = masking
        self.max_predictions_per_seq = max_predictions_per_seq
        self.vocab_size = vocab_size
        self.micro_batch_size = micro_batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.skip_batches = skip_batches
        self.sequences_per_epoch = sum(shard.num_sequences // world_size for shard in shards)
        if self.sequences_per_epoch == 0:
            raise ShardError(
                f"{shards[0].path.parent}: {sum(s.num_sequences for s in shards)} sequences "
                f"cannot be split across world size {world_size}"
            )

    def __iter__(self) -> Iterator[Batch]:
        worker = get_worker_info()
        worker_id, num_workers = (worker.id, worker.num_workers) if worker else (0, 1)
        for index, arrays in enumerate(self._batches()):
            if index % num_workers == worker_id:
                yield to_batch(arrays)

    def _rows(self, epoch: int, shard_index: int) -> np.ndarray:
        """This rank's rows of a shard in this epoch, in shuffled order."""
        count = self.shards[shard_index].num_sequences
        order = np.random.default_rng([self.seed, epoch, shard_index]).permutation(count)
        return order[self.rank :: self.world_size][: count // self.world_size]

    def _shard_order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.shards))

    def _locate(self, sequences: int) -> tuple[int, int, int]:
        """``(epoch, index into that epoch's shard order, row offset)`` after ``sequences`` rows."""
        epoch, skip = divmod(sequences, self.sequences_per_epoch)
        for order_index, shard_index in enumerate(self._shard_order(epoch)):
            rows = self.shards[shard_index].num_sequences // self.world_size
            if skip < rows:
                return epoch, order_index, skip
            skip -= rows
        raise AssertionError("sequences_per_epoch counts every shard's rows")

    def position(self, batches: int) -> DataPosition:
        """The stream's position after ``batches`` batches (what a resumed run skips)."""
        sequences = batches * self.micro_batch_size
        epoch, order_index, sample = self._locate(sequences)
        shard = self.shards[self._shard_order(epoch)[order_index]]
        return DataPosition(epoch, shard.path.name, sample, sequences)

    def _batches(self) -> Iterator[Arrays]:
        epoch, first, skip = self._locate(self.skip_batches * self.micro_batch_size)
        carry: Arrays = {}
        while True:
            for shard_index in self._shard_order(epoch)[first:]:
                shard = self.shards[shard_index]
                rows = self._rows(epoch, shard_index)
                loaded = _load(shard, self.vocab_size, self.next_sentence_prediction)
                arrays = {name: values[rows] for name, values in loaded.items()}
                if shard.dynamic:
                    assert self.masking is not None
                    # Every row of this rank is masked, also those skipped, so a resumed run draws
                    # the masks that the interrupted one drew.
                    seed = [self.seed, epoch, int(shard_index), self.rank]
                    arrays = _masked(
                        arrays, self.masking, self.max_predictions_per_seq, self.vocab_size, seed
                    )
                arrays, skip = {name: values[skip:] for name, values in arrays.items()}, 0
                if carry:
                    arrays = {name: np.concatenate([carry[name], arrays[name]]) for name in arrays}
                start = 0
                while start + self.micro_batch_size <= len(arrays["input_ids"]):
                    yield {
                        name: values[start : start + self.micro_batch_size] for name, values in arrays.items()
                    }
                    start += self.micro_batch_size
                carry = {name: values[start:] for name, values in arrays.items()}
            epoch, first = epoch + 1, 0


def heldout_batches(
    shards: list[Shard],
    vocab_size: int,
    micro_batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    seed: int = 0,
    masking: DynamicMasking | None = None,
    max_predictions_per_seq: int = 0,
    max_sequences: int | None = None,
    *,
    next_sentence_prediction: bool = True,
) -> Iterator[Batch]:
    """One pass over held-out shards in file and row order, rank ``r`` taking rows r, r + world
    size, ...; the last batch may be short. Dynamic shards get masks drawn from ``seed`` alone,
    so every evaluation sees the same masks. ``max_sequences`` caps the rows of all ranks together.
    ``next_sentence_prediction`` false (objective ``mlm``) yields ``next_sentence_labels`` -100
    whatever the shards hold.

    Raises:
        ShardError: see :func:`load_shard`; dynamic shards without ``masking``; with
            ``next_sentence_prediction``, a shard without ``next_sentence_labels`` (before any batch).
    """
    _refuse_without_labels(shards, next_sentence_prediction)
    budget = None if max_sequences is None else -(-max_sequences // world_size)
    for index, shard in enumerate(shards):
        if budget is not None and budget <= 0:
            return
        loaded = _load(shard, vocab_size, next_sentence_prediction)
        arrays = {name: values[rank::world_size] for name, values in loaded.items()}
        if shard.dynamic:
            if masking is None:
                raise ShardError(f"{shard.path}: unmasked (dynamic) shard, but no masking was given")
            arrays = _masked(arrays, masking, max_predictions_per_seq, vocab_size, [seed, index, rank])
        count = len(arrays["input_ids"]) if budget is None else min(budget, len(arrays["input_ids"]))
        for start in range(0, count, micro_batch_size):
            end = min(start + micro_batch_size, count)
            yield to_batch({name: values[start:end] for name, values in arrays.items()})
        if budget is not None:
            budget -= count


def build_loader(
    shard_dir: Path,
    max_seq_length: int,
    max_predictions_per_seq: int,
    vocab_size: int,
    micro_batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    seed: int = 0,
    skip_batches: int = 0,
    num_workers: int = 0,
    pin_memory: bool = False,
    masking: DynamicMasking | None = None,
    *,
    next_sentence_prediction: bool = True,
) -> DataLoader[Batch]:
    """An endless DataLoader of one rank's batches (dicts of int64 tensors, see :func:`to_batch`).

    ``masking`` is needed for shards made with dynamic masking. ``next_sentence_prediction``: true
    for the objective ``mlm-nsp`` (every shard must hold ``next_sentence_labels``), false for
    ``mlm`` (``next_sentence_labels`` are -100, int64 [B], [B, S] packed, whatever the shards hold).

    Raises:
        ShardError: see :func:`find_shards`; later, while iterating, see :func:`load_shard`.
    """
    shards = find_shards(
        shard_dir, max_seq_length, max_predictions_per_seq, next_sentence_prediction=next_sentence_prediction
    )
    dataset = PretrainingBatches(
        shards,
        vocab_size,
        micro_batch_size,
        rank,
        world_size,
        seed,
        skip_batches,
        masking,
        max_predictions_per_seq,
        next_sentence_prediction=next_sentence_prediction,
    )
    # A generator of its own: otherwise starting the iterator draws from the global RNG, and a
    # resumed run's dropout would no longer follow the RNG state restored from the checkpoint.
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(
        dataset, batch_size=None, num_workers=num_workers, pin_memory=pin_memory, generator=generator
    )
