"""benchmarks/quality_stats.py on made-up curves: interpolation against hand-computed values, the
time-to-target ratio of curves shifted in time by known factors, the bootstrap's reproducibility,
its narrowing with replicates and what pairing documents buys, paired differences and the
replicates-needed estimate."""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
qs: ModuleType = importlib.import_module("quality_stats")

SECONDS = (10.0, 20.0, 40.0, 80.0)  # 1/8, 1/4, 1/2 and all of classic's budget
PER_DOC = 3000  # masked predictions per document: every accuracy below is a multiple of 1/3000


def curve(
    seconds: Sequence[float], accuracies: Sequence[float], recipe: str = "classic", replicate: int = 0
) -> object:
    """A curve whose points have the given accuracies, on two documents of PER_DOC predictions each,
    the first 0.05 harder than the second."""
    points = [
        qs.Point(s, np.rint(np.array([a - 0.05, a + 0.05]) * PER_DOC).astype(np.int64), np.full(2, PER_DOC))
        for s, a in zip(seconds, accuracies, strict=True)
    ]
    return qs.Curve(recipe, replicate, points)


def linear(seconds: float) -> float:
    """Classic's accuracy after ``seconds``, linear so that interpolation between points is exact."""
    return 0.1 + 0.002 * seconds


def shifted(factor: float, replicate: int = 0) -> tuple[object, object]:
    """(modern, classic): modern reaches every accuracy in ``factor`` times classic's seconds."""
    classic = curve(SECONDS, [linear(s) for s in SECONDS], "classic", replicate)
    modern = curve(SECONDS, [linear(s / factor) for s in SECONDS], "modern", replicate)
    return modern, classic


def varied(
    rng: np.random.Generator, replicate: int, factor: float, documents: int = 60, noise: int = 0
) -> tuple[object, object]:
    """(modern, classic) on documents of very different difficulty (per-document accuracy from about
    0.05 to 0.95) and length: modern's point k has classic's per-document correct counts of point
    k + 1, i.e. the same accuracies in half the seconds (``factor`` scales modern's seconds further),
    give or take ``noise`` predictions per document."""
    total = rng.integers(20, 200, size=documents)
    ease = rng.uniform(-3.0, 3.0, size=documents)
    skill = np.linspace(-1.0, 1.5, len(SECONDS) + 1)
    correct = [np.rint(total / (1 + np.exp(-(ease + k)))).astype(np.int64) for k in skill]

    def jitter(counts: np.ndarray) -> np.ndarray:
        return np.clip(counts + rng.integers(-noise, noise + 1, size=documents), 0, total)

    classic = [qs.Point(s, c, total) for s, c in zip(SECONDS, correct, strict=False)]
    modern = [qs.Point(s * factor, jitter(c), total) for s, c in zip(SECONDS, correct[1:], strict=True)]
    return qs.Curve("modern", replicate, modern), qs.Curve("classic", replicate, classic)


# (c) Interpolation against hand-computed values.
@pytest.mark.parametrize(
    ("seconds", "accuracies", "target", "expected", "bound"),
    [
        ((10, 20), (0.2, 0.4), 0.3, 15.0, "exact"),  # halfway
        ((10, 30, 50), (0.2, 0.5, 0.6), 0.35, 20.0, "exact"),  # 10 + (0.15 / 0.3) x 20
        ((10, 30, 50), (0.2, 0.5, 0.6), 0.55, 40.0, "exact"),  # 30 + (0.05 / 0.1) x 20
        ((10, 20, 40), (0.1, 0.3, 0.5), 0.3, 20.0, "exact"),  # on a point
        ((10, 20, 30, 40), (0.2, 0.5, 0.3, 0.6), 0.4, 10 + 20 / 3, "exact"),  # first of two crossings
        ((10, 20), (0.5, 0.6), 0.4, 10.0, "at_most"),  # already there at the first point
        ((10, 20), (0.2, 0.3), 0.5, None, None),  # never
    ],
)
def test_time_to_target_interpolates(
    seconds: tuple[float, ...],
    accuracies: tuple[float, ...],
    target: float,
    expected: float | None,
    bound: str,
) -> None:
    found = qs.time_to_target(curve(seconds, accuracies), target)
    assert found.bound == bound
    assert found.seconds == (None if expected is None else pytest.approx(expected, rel=1e-12))


def test_accuracy_counts_each_document_as_often_as_drawn() -> None:
    point = qs.Point(5.0, np.array([1, 9, 4]), np.array([10, 10, 5]))
    assert point.accuracy == pytest.approx(14 / 25)
    drawn = qs.Curve("classic", 0, [point]).accuracies(np.array([2, 0, 1]))
    assert drawn == pytest.approx([(2 * 1 + 4) / (2 * 10 + 5)])


# (a) identical curves, (b) modern shifted by known factors.
@pytest.mark.parametrize("factor", [1.0, 0.75, 0.5, 0.25])
def test_ratio_of_shifted_curves_is_the_shift(factor: float) -> None:
    pairs = [shifted(factor, r) for r in range(3)]
    result = qs.time_to_target_ratio([m for m, _ in pairs], [c for _, c in pairs], resamples=200)
    assert result.estimate == pytest.approx(factor, rel=1e-12)
    # Every document draw keeps both curves linear in seconds and modern's a stretch of classic's.
    assert result.low <= factor + 1e-12 and result.high >= factor - 1e-12
    assert result.width == pytest.approx(0.0, abs=1e-12)
    assert [t.bound for t in result.per_replicate] == ["exact"] * 3 and not result.upper_bound


def test_identical_noisy_curves_give_one() -> None:
    rng = np.random.default_rng(1)
    classic = [varied(rng, r, 1.0)[1] for r in range(5)]
    result = qs.time_to_target_ratio(classic, classic, resamples=300)
    assert result.ratios == (1.0,) * 5
    assert result.low <= 1.0 <= result.high


def test_shifting_further_lowers_the_ratio() -> None:
    factors = [1.0, 0.9, 0.75, 0.6, 0.5, 0.4, 0.25]
    estimates = [qs.time_to_target_ratio([shifted(f)[0]], [shifted(f)[1]]).estimate for f in factors]
    assert estimates == sorted(estimates, reverse=True) and len(set(estimates)) == len(factors)


def test_modern_reaching_the_target_at_its_first_point_is_an_upper_bound() -> None:
    classic = shifted(1.0)[1]  # 0.26 after 80 s
    modern = curve(SECONDS, [0.3, 0.4, 0.5, 0.6], "modern")
    result = qs.time_to_target_ratio([modern], [classic])
    assert result.per_replicate[0] == qs.TimeToTarget(10.0, "at_most")
    assert result.estimate == 10.0 / 80.0 and result.upper_bound


# (d) One replicate: an estimate and no interval.
def test_one_replicate_has_no_interval() -> None:
    modern, classic = shifted(0.5)
    result = qs.time_to_target_ratio([modern], [classic])
    assert (result.estimate, result.replicates, result.resamples) == (pytest.approx(0.5), 1, 0)
    assert (result.low, result.high, result.width) == (None, None, None)
    difference = qs.paired_difference([0.61], [0.58])
    assert difference.estimate == pytest.approx(0.03)
    assert (difference.low, difference.high, difference.width) == (None, None, None)


# (e) Modern never reaching the target.
def test_never_reaching_the_target_counts_as_infinity() -> None:
    pairs = [shifted(0.5, r) for r in range(3)]
    flat = curve(SECONDS, [0.11] * 4, "modern", 2)  # below classic's final 0.26 throughout
    assert qs.time_to_target(flat, 0.26) == qs.TimeToTarget(None, None)
    result = qs.time_to_target_ratio(
        [pairs[0][0], pairs[1][0], flat], [c for _, c in pairs], resamples=500, seed=3
    )
    assert result.ratios == (pytest.approx(0.5), pytest.approx(0.5), math.inf)
    assert result.per_replicate[2] == qs.TimeToTarget(None, None)
    assert result.estimate == pytest.approx(0.5)  # the median: one of three unreached
    assert result.high == math.inf and result.width == math.inf
    # P(a resample draws replicate 2 at least once) = 1 - (2/3)^3, about 0.70.
    assert 0.6 < result.unreached / result.resamples < 0.8
    assert qs.replicates_needed(result.width, 3) is None
    none = qs.time_to_target_ratio([flat, flat], [pairs[2][1], pairs[2][1]], resamples=50)
    assert none.estimate == math.inf and none.unreached == 50
    # Every resample's median unreached: both ends inf, and the width inf rather than inf - inf (NaN).
    assert (none.low, none.high, none.width) == (math.inf, math.inf, math.inf)
    assert qs.replicates_needed(none.width, 2) is None


# (f) Reproducibility and narrowing.
def noisy_replicates(count: int, seed: int = 7) -> tuple[list[object], list[object]]:
    """``count`` replicates whose modern reaches classic's accuracy in 0.5 x exp(N(0, 0.15)) of its
    seconds, give or take 2 predictions per document."""
    rng = np.random.default_rng(seed)
    pairs = [varied(rng, r, float(np.exp(rng.normal(0, 0.15))), noise=2) for r in range(count)]
    return [m for m, _ in pairs], [c for _, c in pairs]


def test_bootstrap_is_reproducible() -> None:
    modern, classic = noisy_replicates(5)
    first = qs.time_to_target_ratio(modern, classic, resamples=300, seed=11)
    assert qs.time_to_target_ratio(modern, classic, resamples=300, seed=11) == first
    other = qs.time_to_target_ratio(modern, classic, resamples=300, seed=12)
    assert (other.low, other.high) != (first.low, first.high) and other.estimate == first.estimate


def test_interval_narrows_with_replicates() -> None:
    widths = [qs.time_to_target_ratio(*noisy_replicates(n), resamples=400).width for n in (4, 16, 64)]
    # 1 / sqrt(n) would halve the width with each fourfold more replicates; measured 0.118, 0.051,
    # 0.037 (the median of few replicates is lumpy), so only the fall and a halving over 16-fold.
    assert widths[0] > widths[1] > widths[2] and widths[2] < 0.5 * widths[0], widths


# (g) Pairing: the same documents for both recipes.
def test_pairing_documents_cancels_their_difficulty() -> None:
    rng = np.random.default_rng(5)
    pairs = [varied(rng, r, 1.0, noise=1) for r in range(5)]
    modern, classic = [m for m, _ in pairs], [c for _, c in pairs]
    paired = qs.time_to_target_ratio(modern, classic, resamples=500)
    unpaired = qs.time_to_target_ratio(modern, classic, resamples=500, paired=False)
    assert paired.estimate == unpaired.estimate == pytest.approx(0.5, abs=0.02)
    assert paired.low <= 0.5 <= paired.high and paired.width < 0.02, paired
    assert unpaired.width > 5 * paired.width, (paired.width, unpaired.width)


# paired_difference and replicates_needed.
def test_paired_difference_is_a_t_interval() -> None:
    # Differences 0.1, 0.2, 0.3: mean 0.2, s = 0.1, t(0.95, 2 df) = 2.920 from a t table.
    result = qs.paired_difference([0.5, 0.6, 0.7], [0.4, 0.4, 0.4])
    half = 2.920 * 0.1 / math.sqrt(3)
    assert (result.estimate, result.low, result.high) == pytest.approx(
        (0.2, 0.2 - half, 0.2 + half), abs=1e-3
    )
    assert (result.replicates, result.width) == (3, pytest.approx(2 * half, abs=2e-3))


@pytest.mark.parametrize(
    ("width", "replicates", "target", "needed"),
    [(0.3, 3, 0.15, 12), (0.15, 3, 0.15, 3), (0.2, 5, 0.1, 20), (0.05, 5, 0.15, 2), (0.0, 4, 0.15, 2)],
)
def test_replicates_needed(width: float, replicates: int, target: float, needed: int) -> None:
    assert qs.replicates_needed(width, replicates, target) == needed


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: qs.Point(-1.0, np.array([1]), np.array([2])), "Point.seconds"),
        (lambda: qs.Point(1.0, np.array([3]), np.array([2])), "Point.correct"),
        (lambda: qs.Point(1.0, np.array([0]), np.array([0])), "Point.total"),
        (lambda: qs.Point(1.0, np.array([0.5]), np.array([1])), "Point.correct"),
        (lambda: curve((20, 10), (0.2, 0.3)), "increasing seconds"),
        (lambda: qs.time_to_target_ratio([shifted(0.5, 1)[0]], [shifted(0.5, 0)[1]]), "replicate"),
        (lambda: qs.time_to_target_ratio([], []), "modern curves for"),
        (lambda: qs.time_to_target_ratio([shifted(0.5)[0]], [shifted(0.5)[1]], resamples=0), "resamples"),
        (lambda: qs.Curve("classic", 0, []), "need points"),
        (lambda: qs.paired_difference([0.1, 0.2], [0.1]), "equally long a_values"),
        (lambda: qs.paired_difference([0.1, math.nan], [0.1, 0.2]), "finite"),
        (lambda: qs.time_to_target(curve((10, 20), (0.2, 0.3)), math.nan), "target_accuracy"),
        (lambda: qs.replicates_needed(0.2, 1), "replicates >= 2"),
    ],
)
def test_bad_input_is_named(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
