"""The masking-rate schedule: the rate along a phase, and thinning a batch masked at the highest
rate down to a lower one, which must look as if masked at the lower rate directly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertpretrain.data.format.masking import mask_tokens
from bertpretrain.data.format.vocab import SpecialIds
from bertpretrain.data.load.loader import to_batch
from bertpretrain.data.load.mask_schedule import scheduled_rate, thin_masks

SPECIAL = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
VOCAB, LENGTH, SLOTS = 1000, 64, 20


@pytest.mark.parametrize(
    ("progress", "rate"), [(0.0, 0.3), (0.5, 0.225), (1.0, 0.15), (-0.1, 0.3), (1.2, 0.15)]
)
def test_the_rate_falls_linearly_over_the_phase(progress: float, rate: float) -> None:
    assert scheduled_rate(0.3, 0.15, progress) == pytest.approx(rate)


def _rows(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``count`` rows of random lengths: ``[CLS] tokens [SEP]`` then padding (int32, int8 [N, L])."""
    rng = np.random.default_rng(seed)
    ids, mask = np.zeros((count, LENGTH), np.int32), np.zeros((count, LENGTH), np.int8)
    for row, length in enumerate(rng.integers(10, LENGTH + 1, count)):
        ids[row, :length] = np.concatenate(
            [[SPECIAL.cls], rng.integers(10, VOCAB, length - 2), [SPECIAL.sep]]
        )
        mask[row, :length] = 1
    return ids, mask


def _masked(ids: np.ndarray, mask: np.ndarray, rate: float, seed: int) -> dict[str, torch.Tensor]:
    masked = mask_tokens(ids, mask, SLOTS, rate, SPECIAL, VOCAB, np.random.default_rng(seed))
    arrays = {"segment_ids": np.zeros_like(ids), "input_mask": mask, **masked}
    return dict(to_batch(arrays))


def test_thinning_keeps_the_count_of_the_lower_rate_and_unmasks_the_rest() -> None:
    ids, mask = _rows(200)
    batch = _masked(ids, mask, 0.3, seed=1)
    thinned = thin_masks(batch, 0.15, torch.Generator().manual_seed(0))  # type: ignore[arg-type]
    lengths = mask.sum(axis=1)
    expected = np.maximum(1, np.round(lengths * 0.15))
    kept = (thinned["masked_lm_labels"] != -100).sum(dim=1).numpy()
    assert (kept == expected).all()
    for row in range(len(ids)):
        count = int(kept[row])
        positions = thinned["masked_lm_positions"][row]
        # Kept slots first, increasing, then padding; each kept one was masked before, with its label.
        assert (
            positions[:count].tolist() == sorted(positions[:count].tolist()) and not positions[count:].any()
        )
        before = dict(
            zip(
                batch["masked_lm_positions"][row].tolist(),
                batch["masked_lm_labels"][row].tolist(),
                strict=True,
            )
        )
        assert all(
            before[p] == label
            for p, label in zip(
                positions[:count].tolist(), thinned["masked_lm_labels"][row][:count].tolist(), strict=True
            )
        )
        # Every token not kept is the original again; kept ones keep their corruption.
        chosen = set(positions[:count].tolist())
        for column in range(LENGTH):
            token = int(thinned["input_ids"][row, column])
            assert token == (
                int(batch["input_ids"][row, column]) if column in chosen else int(ids[row, column])
            )
    assert not torch.equal(thinned["input_ids"], batch["input_ids"])
    assert torch.equal(batch["input_ids"], _masked(ids, mask, 0.3, seed=1)["input_ids"])  # not modified


def test_thinned_masks_look_like_masks_drawn_at_the_lower_rate() -> None:
    """Each position as likely to be kept as any other (uniform), and 80% of the kept tokens
    [MASK], as masking at 15% directly gives."""
    ids, mask = _rows(1, seed=3)
    ids, mask = np.repeat(ids, 4000, axis=0), np.repeat(mask, 4000, axis=0)
    thinned = thin_masks(_masked(ids, mask, 0.3, seed=4), 0.15, torch.Generator().manual_seed(5))  # type: ignore[arg-type]
    direct = _masked(ids, mask, 0.15, seed=6)
    counts = {}
    for name, batch in (("thinned", thinned), ("direct", direct)):
        positions, labels = batch["masked_lm_positions"], batch["masked_lm_labels"]
        valid = labels != -100
        counts[name] = np.bincount(positions[valid].numpy(), minlength=LENGTH) / len(ids)
        masked_share = (batch["input_ids"].gather(1, positions)[valid] == SPECIAL.mask).float().mean()
        assert masked_share == pytest.approx(0.8, abs=0.02), name
    length = int(mask[0].sum())
    # Each of the length - 2 candidates is kept with probability k / (length - 2), within 4 sd.
    share = round(length * 0.15) / (length - 2)
    sd = (share * (1 - share) / len(ids)) ** 0.5
    for name, count in counts.items():
        assert np.abs(count[1 : length - 1] - share).max() < 4 * sd, name
        assert count[0] == 0 and count[length - 1] == 0  # [CLS] and [SEP] never


def test_the_same_seed_draws_the_same_masks() -> None:
    ids, mask = _rows(50)
    batch = _masked(ids, mask, 0.3, seed=1)
    first, again, other = (thin_masks(batch, 0.2, torch.Generator().manual_seed(s)) for s in (7, 7, 8))  # type: ignore[arg-type]
    assert all(torch.equal(first[key], again[key]) for key in first)
    assert not torch.equal(first["masked_lm_positions"], other["masked_lm_positions"])
