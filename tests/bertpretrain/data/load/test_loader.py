"""Batches from HDF5 shards: contents, rank split, determinism, resumption and bad input."""

from __future__ import annotations

import itertools
import re
import threading
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from bertpretrain.data.format.shards import read_shard
from bertpretrain.data.format.vocab import SpecialIds
from bertpretrain.data.load.loader import (
    DynamicMasking,
    PretrainingBatches,
    ShardError,
    build_loader,
    find_shards,
    heldout_batches,
    to_batch,
    used_prediction_slots,
    verify_phases,
    verify_shards,
)
from bertpretrain.data.prepare.shard_writer import write_shard

pytestmark = pytest.mark.usefixtures("one_thread")

SEQ, PRED = 32, 5


def take(directory: Path, count: int, vocab_size: int, **options: Any) -> list[dict[str, torch.Tensor]]:
    loader = build_loader(directory, SEQ, PRED, vocab_size, options.pop("micro_batch_size", 8), **options)
    return list(itertools.islice(loader, count))


def rows(batches: list[dict[str, torch.Tensor]]) -> list[bytes]:
    """Each sequence's identity: its token ids with the masked tokens restored."""
    identities = []
    for batch in batches:
        ids = batch["input_ids"].clone()
        for row in range(len(ids)):
            real = batch["masked_lm_positions"][row] > 0
            ids[row, batch["masked_lm_positions"][row][real]] = batch["masked_lm_labels"][row][real]
            identities.append(ids[row].numpy().tobytes())
    return identities


def test_batches_have_the_models_dtypes_and_shapes(shard_dir: Path, vocab_size: int) -> None:
    (batch,) = take(shard_dir, 1, vocab_size, micro_batch_size=6)
    shapes = {name: tuple(tensor.shape) for name, tensor in batch.items()}
    assert shapes == {
        "input_ids": (6, SEQ),
        "token_type_ids": (6, SEQ),
        "attention_mask": (6, SEQ),
        "masked_lm_positions": (6, PRED),
        "masked_lm_labels": (6, PRED),
        "next_sentence_labels": (6,),
    }
    assert all(tensor.dtype == torch.int64 for tensor in batch.values())
    padding = batch["masked_lm_positions"] == 0
    assert padding.any() and (~padding).any()
    assert torch.all(batch["masked_lm_labels"][padding] == -100)
    assert torch.all(batch["masked_lm_labels"][~padding] >= 5)
    masked = torch.gather(batch["input_ids"], 1, batch["masked_lm_positions"])[~padding]
    assert torch.all(masked == 4)  # the fixture writes [MASK] at every masked position
    assert torch.all(batch["input_ids"][batch["attention_mask"] == 0] == 0)


def test_batches_match_the_shard_rows(shard_dir: Path, vocab_size: int) -> None:
    with h5py.File(shard_dir / "shard_0000.hdf5") as file:
        stored = {row.tobytes() for row in file["input_ids"][()].astype(np.int64)}
    seen = {
        batch_row.numpy().tobytes()
        for batch in take(shard_dir, 15, vocab_size)
        for batch_row in batch["input_ids"]
    }
    assert stored <= seen  # one epoch (3 x 40 = 15 x 8) holds every row of every shard


def test_ranks_get_disjoint_parts_of_equal_size(shard_dir: Path, vocab_size: int) -> None:
    # 3 shards x 40 rows over 4 ranks: 30 rows per rank and epoch, 5 batches of 6.
    per_rank = [
        rows(take(shard_dir, 5, vocab_size, micro_batch_size=6, rank=rank, world_size=4)) for rank in range(4)
    ]
    assert all(len(part) == len(set(part)) == 30 for part in per_rank)
    for a, b in itertools.combinations(per_rank, 2):
        assert not set(a) & set(b)
    assert len(set().union(*per_rank)) == 120


def test_uneven_shards_drop_the_remainder(shard_dir: Path, vocab_size: int) -> None:
    # 40 rows over 3 ranks: 13 rows of each shard per rank, 39 per epoch; batches span shards.
    per_rank = [
        rows(take(shard_dir, 13, vocab_size, micro_batch_size=3, rank=rank, world_size=3))
        for rank in range(3)
    ]
    assert all(len(set(part)) == 39 for part in per_rank)
    assert len(set().union(*per_rank)) == 117


def test_shuffling_is_deterministic_per_seed_and_epoch(shard_dir: Path, vocab_size: int) -> None:
    first = rows(take(shard_dir, 30, vocab_size, seed=3))
    again = rows(take(shard_dir, 30, vocab_size, seed=3))
    other_seed = rows(take(shard_dir, 30, vocab_size, seed=4))
    assert first == again
    assert first != other_seed
    epoch_0, epoch_1 = first[:120], first[120:]
    assert set(epoch_0) == set(epoch_1)
    assert epoch_0 != epoch_1


def test_skip_batches_continues_the_same_stream(shard_dir: Path, vocab_size: int) -> None:
    whole = rows(take(shard_dir, 40, vocab_size, micro_batch_size=7))
    resumed = rows(take(shard_dir, 23, vocab_size, micro_batch_size=7, skip_batches=17))
    assert resumed == whole[17 * 7 :]


def test_workers_keep_the_order(shard_dir: Path, vocab_size: int) -> None:
    assert rows(take(shard_dir, 9, vocab_size, num_workers=2)) == rows(take(shard_dir, 9, vocab_size))


def test_too_few_sequences_for_the_ranks(tmp_path: Path, make_shards, vocab_size: int) -> None:
    directory = make_shards("small", num_shards=1, sequences_per_shard=2)
    shards = find_shards(directory, SEQ, PRED)
    with pytest.raises(ShardError, match="world size 4"):
        PretrainingBatches(shards, vocab_size, 2, rank=0, world_size=4)


def test_missing_and_empty_directories(tmp_path: Path) -> None:
    with pytest.raises(ShardError, match="does not exist"):
        find_shards(tmp_path / "absent", SEQ, PRED)
    with pytest.raises(ShardError, match=r"no shard_\*\.hdf5"):
        find_shards(tmp_path, SEQ, PRED)


def test_corrupt_shard_is_named(shard_dir: Path) -> None:
    (shard_dir / "shard_0001.hdf5").write_bytes(b"not hdf5 at all")
    with pytest.raises(ShardError, match=r"shard_0001\.hdf5: not a readable HDF5 file"):
        find_shards(shard_dir, SEQ, PRED)


def test_missing_dataset_is_named(shard_dir: Path) -> None:
    with h5py.File(shard_dir / "shard_0002.hdf5", "a") as file:
        del file["segment_ids"]
    with pytest.raises(ShardError, match=r"shard_0002\.hdf5: missing dataset.*segment_ids"):
        find_shards(shard_dir, SEQ, PRED)


def test_wrong_sequence_length_is_named(shard_dir: Path) -> None:
    with pytest.raises(
        ShardError, match=r"shard_0000.hdf5: dataset input_ids has width 32.*max_seq_length is 64"
    ):
        find_shards(shard_dir, 64, PRED)
    with pytest.raises(ShardError, match="max_predictions_per_seq is 6"):
        find_shards(shard_dir, SEQ, 6)


def test_ids_outside_the_vocabulary_are_named(shard_dir: Path, vocab_size: int) -> None:
    with pytest.raises(ShardError, match=r"shard_000\d.hdf5: input_ids holds ids .* vocabulary of 20"):
        take(shard_dir, 1, 20)


@pytest.mark.parametrize("checksums", [True, False], ids=["fletcher32", "nvidia-gzip"])
def test_damaged_shard_is_named_before_any_batch(
    shard_dir: Path, vocab_size: int, damage_shard, checksums: bool
) -> None:
    if checksums:  # as the data stage writes them; the fixture's are NVIDIA's, without checksums
        for path in shard_dir.glob("shard_*.hdf5"):
            write_shard(path, read_shard(path))
    damage_shard(shard_dir / "shard_0001.hdf5")
    shards = find_shards(shard_dir, SEQ, PRED)  # the structure is intact
    with pytest.raises(
        ShardError, match=r"shard_0001\.hdf5: dataset input_ids cannot be read, the file is damaged"
    ):
        verify_shards(shards, vocab_size)


def test_verification_finds_ids_outside_the_vocabulary(shard_dir: Path) -> None:
    with pytest.raises(ShardError, match=r"shard_0000.hdf5: input_ids holds ids .* vocabulary of 20"):
        verify_shards(find_shards(shard_dir, SEQ, PRED), 20)


@pytest.mark.parametrize("damaged", [0, 1, 2])
def test_each_rank_verifies_its_share_of_the_shards(
    shard_dir: Path, vocab_size: int, damage_shard, damaged: int
) -> None:
    damage_shard(shard_dir / f"shard_000{damaged}.hdf5")
    shards = find_shards(shard_dir, SEQ, PRED)
    failed = set()
    for rank in range(2):
        try:
            verify_shards(shards, vocab_size, rank, world_size=2)
        except ShardError:
            failed.add(rank)
    assert failed == {damaged % 2}


def test_every_rank_stops_on_damage_any_rank_found_in_any_phase(
    make_shards, make_spec, vocab_size: int, damage_shard
) -> None:
    phases = make_spec(
        [{"maxSeqLength": SEQ, "maxPredictionsPerSeq": PRED, "globalBatchSize": 8, "learningRate": 1e-3,
          "steps": 1},
         {"maxSeqLength": 64, "maxPredictionsPerSeq": 9, "globalBatchSize": 8, "learningRate": 1e-3,
          "steps": 1}]
    ).phases  # fmt: skip
    directories = [make_shards("phase1", num_shards=1), make_shards("phase2", 64, 9, num_shards=2)]
    make_shards("phase2", 64, 9, num_shards=1, prefix="heldout")
    damaged = directories[1] / "heldout_0000.hdf5"
    damage_shard(damaged)
    # Shards in order: phase1/shard_0000, phase2/shard_0000, phase2/shard_0001, phase2/heldout_0000:
    # rank 1 of 2 reads the damaged one. Two threads stand in for the ranks, meeting in an all-gather.
    values: list[object] = [None, None]
    meeting = threading.Barrier(2)
    errors: list[BaseException | None] = [None, None]

    def rank(number: int) -> None:
        def gather(value: object) -> list[object]:
            values[number] = value
            meeting.wait()
            return list(values)

        try:
            verify_phases(phases, directories, vocab_size, number, 2, gather)
        except ShardError as error:
            errors[number] = error

    threads = [threading.Thread(target=rank, args=(number,)) for number in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert [str(error).startswith(f"{damaged}: dataset input_ids cannot be read") for error in errors] == [
        True,
        True,
    ]
    with pytest.raises(ShardError, match=re.escape(str(damaged))):
        verify_phases(phases, directories, vocab_size)  # one process reads them all


@pytest.fixture
def dynamic_dir(shard_dir: Path) -> Path:
    """The fixture's shards as dynamic masking stores them: unmasked ids, no masked_lm_* datasets."""
    for path in shard_dir.glob("shard_*.hdf5"):
        with h5py.File(path, "a") as file:
            ids = file["input_ids"][()]
            positions, labels = file["masked_lm_positions"][()], file["masked_lm_ids"][()]
            rows_, columns = np.nonzero(positions)
            ids[rows_, positions[rows_, columns]] = labels[rows_, columns]
            file["input_ids"][...] = ids
            del file["masked_lm_positions"], file["masked_lm_ids"]
    return shard_dir


DYNAMIC = DynamicMasking(masked_lm_prob=0.15, special=SpecialIds(0, 1, 2, 3, 4), continuation=None)


def test_dynamic_shards_are_masked_by_the_loader(dynamic_dir: Path, vocab_size: int) -> None:
    batches = take(dynamic_dir, 15, vocab_size, masking=DYNAMIC)
    for batch in batches:
        real = batch["masked_lm_positions"] > 0
        assert real.sum(dim=1).min() >= 1 and real.sum(dim=1).max() <= PRED
        shown = torch.gather(batch["input_ids"], 1, batch["masked_lm_positions"])[real]
        labels = batch["masked_lm_labels"][real]
        assert (labels >= 5).all()  # never [CLS], [SEP] or padding
        assert 0.6 < (shown == 4).float().mean() < 0.95
    # Unmasking gives back the stored rows, so the same sequences come in the same order.
    with h5py.File(dynamic_dir / "shard_0000.hdf5") as file:
        stored = {row.tobytes() for row in file["input_ids"][()].astype(np.int64)}
    assert set(rows(batches)) & stored


def test_dynamic_masks_change_each_epoch_and_survive_resumption(dynamic_dir: Path, vocab_size: int) -> None:
    per_epoch = 3 * 40 // 8
    batches = take(dynamic_dir, 2 * per_epoch, vocab_size, masking=DYNAMIC)
    first, second = batches[:per_epoch], batches[per_epoch:]
    assert sorted(rows(first)) == sorted(rows(second))
    masks = [torch.cat([b["masked_lm_positions"] for b in epoch]) for epoch in (first, second)]
    assert not all(torch.equal(a, b) for a, b in zip(masks[0], masks[1], strict=True))
    resumed = take(dynamic_dir, 7, vocab_size, masking=DYNAMIC, skip_batches=per_epoch + 4)
    for again, original in zip(resumed, batches[per_epoch + 4 :], strict=False):
        assert all(torch.equal(again[name], original[name]) for name in original)


def test_dynamic_shards_without_masking_are_refused(dynamic_dir: Path, vocab_size: int) -> None:
    with pytest.raises(ShardError, match="unmasked \\(dynamic\\) shards, but no masking was given"):
        take(dynamic_dir, 1, vocab_size)


def test_packed_shards_give_packed_batches(packed_shard_dir: Path, shard_dir: Path, vocab_size: int) -> None:
    (shard,) = find_shards(packed_shard_dir, SEQ, PRED)[:1]
    assert shard.kind == "packed" and shard.num_sequences < 40  # some rows hold several instances
    (batch,) = take(packed_shard_dir, 1, vocab_size, micro_batch_size=6)
    width = batch["masked_lm_positions"].shape[1]
    assert width <= 3 * PRED
    shapes = {name: tuple(tensor.shape) for name, tensor in batch.items()}
    assert shapes == {
        "input_ids": (6, SEQ),
        "token_type_ids": (6, SEQ),
        "attention_mask": (6, SEQ),
        "position_ids": (6, SEQ),
        "masked_lm_positions": (6, width),
        "masked_lm_labels": (6, width),
        "next_sentence_positions": (6, 3),
        "next_sentence_labels": (6, 3),
    }
    empty = batch["next_sentence_labels"] == -100
    sequences = batch["attention_mask"].amax(dim=1)
    assert torch.equal((~empty).sum(dim=1), sequences)  # one NSP label per instance in the row
    starts = torch.gather(batch["input_ids"], 1, batch["next_sentence_positions"])[~empty]
    assert torch.all(starts == 2)  # each instance's [CLS]
    assert torch.all(torch.gather(batch["position_ids"], 1, batch["next_sentence_positions"])[~empty] == 0)
    masked = batch["masked_lm_positions"] > 0
    assert torch.all(torch.gather(batch["input_ids"], 1, batch["masked_lm_positions"])[masked] == 4)
    assert torch.all(batch["masked_lm_labels"][~masked] == -100)


@pytest.mark.parametrize(
    ("last_used", "width"),
    [(None, 8), (0, 8), (7, 8), (8, 16), (30, 32), (33, 40), (112, 114), (113, 114)],
)
def test_packed_batches_keep_only_the_prediction_slots_a_row_uses(last_used: int | None, width: int) -> None:
    positions = np.zeros((4, 114), np.int64)  # 3 x 38 slots, as 30% masking at 128 tokens packs 3
    if last_used is not None:
        positions[2, : last_used + 1] = np.arange(1, last_used + 2)
        positions[0, :3] = [5, 6, 7]
    labels = np.where(positions == 0, -100, positions + 1000)
    kept_positions, kept_labels = used_prediction_slots(positions, labels)
    assert kept_positions.shape == kept_labels.shape == (4, width)
    assert np.array_equal(kept_positions, positions[:, :width])
    assert np.array_equal(kept_labels, labels[:, :width])
    assert not positions[:, width:].any()  # nothing dropped was a prediction


def test_packed_batches_predict_what_the_shard_rows_hold(packed_shard_dir: Path) -> None:
    shard = sorted(packed_shard_dir.glob("shard_*.hdf5"))[0]
    every = read_shard(shard)
    few = np.flatnonzero((every["masked_lm_positions"] != 0).sum(axis=1) <= 8)[:6]  # of 15 slots
    assert len(few) >= 2
    arrays = {name: values[few] for name, values in every.items()}
    batch = to_batch(arrays)
    width = batch["masked_lm_positions"].shape[1]
    assert width == 8  # the slots these rows use, a multiple of 8, not 3 x PRED
    full = arrays["masked_lm_positions"]
    assert np.array_equal(batch["masked_lm_positions"].numpy(), full[:, :width])
    assert not full[:, width:].any()
    real = full[:, :width] != 0
    assert np.array_equal(batch["masked_lm_labels"].numpy()[real], arrays["masked_lm_ids"][:, :width][real])
    assert torch.all(batch["masked_lm_labels"][torch.from_numpy(~real)] == -100)


def test_packed_predictions_must_fit_the_phase(packed_shard_dir: Path) -> None:
    with pytest.raises(ShardError, match=r"max_predictions_per_seq is 6 \(x 3 instances per row = 18\)"):
        find_shards(packed_shard_dir, SEQ, 6)


def test_position_names_shard_and_row(shard_dir: Path, vocab_size: int) -> None:
    dataset = build_loader(shard_dir, SEQ, PRED, vocab_size, 8, seed=3).dataset
    assert isinstance(dataset, PretrainingBatches)
    order = [dataset.shards[i].path.name for i in np.random.default_rng([3, 0]).permutation(3)]
    assert dataset.position(0).to_dict() == {"epoch": 0, "shard": order[0], "sample": 0, "sequences": 0}
    assert dataset.position(6).to_dict() == {"epoch": 0, "shard": order[1], "sample": 8, "sequences": 48}
    assert dataset.position(16).to_dict() == {"epoch": 1, "shard": dataset.position(15).shard, "sample": 8,
                                              "sequences": 128}  # fmt: skip


@pytest.mark.parametrize("world_size", [1, 2])
def test_heldout_batches_read_every_row_once_in_order(make_shards, vocab_size: int, world_size: int) -> None:
    directory = make_shards("phase1", num_shards=2, sequences_per_shard=11, prefix="heldout")
    shards = find_shards(directory, SEQ, PRED, pattern="heldout_*.hdf5")
    per_rank = [
        rows(list(heldout_batches(shards, vocab_size, 4, rank=rank, world_size=world_size)))
        for rank in range(world_size)
    ]
    assert sum(len(part) for part in per_rank) == 22
    assert len(set().union(*per_rank)) == 22
    whole = rows(list(heldout_batches(shards, vocab_size, 4)))
    capped = [
        rows(list(heldout_batches(shards, vocab_size, 4, rank, world_size, max_sequences=7)))
        for rank in range(world_size)
    ]
    assert [len(part) for part in capped] == ([7] if world_size == 1 else [4, 4])  # ceil(7 / 2) per rank
    assert capped[0] == whole[: len(capped[0])] if world_size == 1 else not set(capped[0]) & set(capped[1])


def test_heldout_masks_are_the_same_every_time(dynamic_dir: Path, vocab_size: int) -> None:
    shards = find_shards(dynamic_dir, SEQ, PRED)
    first, again = (
        list(heldout_batches(shards, vocab_size, 8, seed=5, masking=DYNAMIC, max_predictions_per_seq=PRED))
        for _ in range(2)
    )
    assert all(torch.equal(a[name], b[name]) for a, b in zip(first, again, strict=True) for name in a)
    with pytest.raises(ShardError, match="no masking was given"):
        next(heldout_batches(shards, vocab_size, 8))


# Objective mlm: shards without next_sentence_labels.


def drop_labels(directory: Path, pattern: str = "*.hdf5") -> Path:
    """``directory``'s shards as the objective mlm makes them: without next_sentence_labels."""
    for path in directory.glob(pattern):
        with h5py.File(path, "a") as file:
            del file["next_sentence_labels"]
    return directory


@pytest.mark.parametrize("kind", ["static", "dynamic", "packed"])
def test_shards_without_next_sentence_labels_give_ignored_labels(
    request: pytest.FixtureRequest, vocab_size: int, kind: str
) -> None:
    directory = request.getfixturevalue({"static": "shard_dir", "dynamic": "dynamic_dir",
                                         "packed": "packed_shard_dir"}[kind])  # fmt: skip
    options: dict[str, Any] = {"masking": DYNAMIC} if kind == "dynamic" else {}
    with_labels = take(directory, 5, vocab_size, micro_batch_size=6, **options)
    drop_labels(directory)
    shards = find_shards(directory, SEQ, PRED, next_sentence_prediction=False)
    assert not any(shard.next_sentence_labels for shard in shards)
    batches = take(directory, 5, vocab_size, micro_batch_size=6, next_sentence_prediction=False, **options)
    for batch, original in zip(batches, with_labels, strict=True):
        labels = batch["next_sentence_labels"]
        assert labels.dtype == torch.int64 and labels.shape == ((6, 3) if kind == "packed" else (6,))
        assert torch.all(labels == -100)
        # Everything else as the same shards with their labels give it.
        assert batch.keys() == original.keys()
        assert all(
            torch.equal(batch[name], original[name]) for name in batch if name != "next_sentence_labels"
        )


def test_labels_of_mlm_nsp_shards_are_ignored_without_next_sentence_prediction(
    make_shards, shard_dir: Path, vocab_size: int
) -> None:
    (batch,) = take(shard_dir, 1, vocab_size, next_sentence_prediction=False)
    assert batch["next_sentence_labels"].shape == (8,) and torch.all(batch["next_sentence_labels"] == -100)
    (original,) = take(shard_dir, 1, vocab_size)
    assert torch.equal(batch["input_ids"], original["input_ids"])
    assert set(original["next_sentence_labels"].tolist()) == {0, 1}
    directory = make_shards("held", num_shards=2, sequences_per_shard=5, prefix="heldout")
    drop_labels(directory, "heldout_0001.hdf5")  # one of each: both are read alike
    shards = find_shards(directory, SEQ, PRED, "heldout_*.hdf5", next_sentence_prediction=False)
    assert [shard.next_sentence_labels for shard in shards] == [True, False]
    heldout = list(heldout_batches(shards, vocab_size, 4, next_sentence_prediction=False))
    assert [len(batch["input_ids"]) for batch in heldout] == [4, 1, 4, 1]
    assert all(torch.all(batch["next_sentence_labels"] == -100) for batch in heldout)
    assert all(batch["next_sentence_labels"].shape == batch["input_ids"].shape[:1] for batch in heldout)


def test_shards_without_next_sentence_labels_are_refused_for_next_sentence_prediction(
    make_spec, shard_dir: Path, vocab_size: int
) -> None:
    drop_labels(shard_dir, "shard_0001.hdf5")
    refusal = (
        rf"{re.escape(str(shard_dir / 'shard_0001.hdf5'))}: no dataset next_sentence_labels, which the "
        r"objective mlm-nsp needs \(.*made for the objective mlm.*set spec\.objective mlm to train on it\)"
    )
    with pytest.raises(ShardError, match=refusal):
        find_shards(shard_dir, SEQ, PRED)
    with pytest.raises(ShardError, match=refusal):
        build_loader(shard_dir, SEQ, PRED, vocab_size, 8)
    phases = make_spec(
        [{"maxSeqLength": SEQ, "maxPredictionsPerSeq": PRED, "globalBatchSize": 8, "learningRate": 1e-3,
          "steps": 1}]
    ).phases  # fmt: skip
    with pytest.raises(ShardError, match=refusal):
        verify_phases(phases, [shard_dir], vocab_size)
    verify_phases(phases, [shard_dir], vocab_size, next_sentence_prediction=False)
    # Shards found for mlm, then given to a stream that needs the labels.
    shards = find_shards(shard_dir, SEQ, PRED, next_sentence_prediction=False)
    with pytest.raises(ShardError, match=refusal):
        PretrainingBatches(shards, vocab_size, 8)
    with pytest.raises(ShardError, match=refusal):
        next(heldout_batches(shards, vocab_size, 8))
    # A shard that lacks another dataset too is damaged, whatever the objective.
    with h5py.File(shard_dir / "shard_0001.hdf5", "a") as file:
        del file["segment_ids"]
    for next_sentence_prediction in (True, False):
        with pytest.raises(
            ShardError, match=r"shard_0001\.hdf5: missing dataset\(s\) next_sentence_labels, segment_ids"
        ):
            find_shards(shard_dir, SEQ, PRED, next_sentence_prediction=next_sentence_prediction)
