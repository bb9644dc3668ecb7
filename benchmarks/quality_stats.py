"""Statistics for benchmarks/time_to_quality.py: how long one recipe takes to reach another's final
held-out accuracy, and paired differences, with intervals over replicates and held-out documents.

A replicate r runs every recipe on the same corpus split, seed and held-out set, so replicate r's
curves are paired document by document. The ratio's interval is a two-stage percentile bootstrap
(Davison & Hinkley, *Bootstrap Methods and their Application*, 1997, section 3.8, hierarchical data;
percentile interval: Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, chapter 13):
replicates are drawn with replacement, then within each drawn replicate its held-out documents, one
draw serving both recipes. Pure numpy; scipy only for Student's t quantile.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

Bound = Literal["exact", "at_most"]
Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
CONFIDENCE = 0.90
RESAMPLES = 2000


@dataclass(frozen=True, eq=False)  # eq=False: numpy arrays have no single truth value
class Point:
    """One evaluation of a run after ``seconds`` of training (float, seconds, finite, >= 0).
    ``correct``, ``total``: int64 [D], per held-out document d the masked-LM predictions whose argmax
    is the label and all its masked-LM predictions; ``total[d] >= 1`` (a document without masked
    positions carries nothing: leave it out), ``0 <= correct[d] <= total[d]``. Raises ValueError
    naming the field otherwise."""

    seconds: float
    correct: Ints
    total: Ints

    def __post_init__(self) -> None:
        correct, total = np.asarray(self.correct), np.asarray(self.total)
        if not math.isfinite(self.seconds) or self.seconds < 0:
            raise ValueError(f"Point.seconds must be finite and >= 0, got {self.seconds}")
        integer = all(np.issubdtype(v.dtype, np.integer) for v in (correct, total))
        if correct.ndim != 1 or correct.size == 0 or correct.shape != total.shape or not integer:
            raise ValueError("Point.correct, Point.total: need integers of one shape [D], D >= 1")
        if (total < 1).any():
            raise ValueError("Point.total must be >= 1 for every document (leave out empty ones)")
        if (correct < 0).any() or (correct > total).any():
            raise ValueError("Point.correct must lie in [0, total] for every document")
        object.__setattr__(self, "correct", correct.astype(np.int64))
        object.__setattr__(self, "total", total.astype(np.int64))

    @property
    def accuracy(self) -> float:
        """sum(correct) / sum(total), in [0, 1]."""
        return float(self.correct.sum() / self.total.sum())


@dataclass(frozen=True, eq=False)
class Curve:
    """One recipe's run in one replicate (``recipe`` e.g. "classic", ``replicate`` its index r):
    ``points`` with strictly increasing seconds, all scored on the same D documents in the same order.
    Raises ValueError when there are no points, seconds do not increase or D differs between points."""

    recipe: str
    replicate: int
    points: Sequence[Point]
    _correct: Ints = field(init=False, repr=False)  # [P, D]
    _total: Ints = field(init=False, repr=False)  # [P, D]

    def __post_init__(self) -> None:
        points = tuple(self.points)
        increasing = all(a.seconds < b.seconds for a, b in itertools.pairwise(points))
        if not points or not increasing or len({p.total.size for p in points}) != 1:
            raise ValueError(f"Curve {self.recipe} {self.replicate}: need points, increasing seconds, one D")
        object.__setattr__(self, "points", points)
        object.__setattr__(self, "_correct", np.stack([p.correct for p in points]))
        object.__setattr__(self, "_total", np.stack([p.total for p in points]))

    @property
    def documents(self) -> int:
        """D, the number of held-out documents."""
        return int(self._total.shape[1])

    @property
    def seconds(self) -> Floats:
        """float64 [P], the points' training seconds."""
        return np.array([p.seconds for p in self.points], dtype=np.float64)

    def accuracies(self, weights: Ints | None = None) -> Floats:
        """float64 [P], each point's accuracy over the documents drawn ``weights[d]`` times each
        (int [D]; None: each once): sum(w * correct) / sum(w * total)."""
        if weights is None:
            return self._correct.sum(axis=1) / self._total.sum(axis=1)
        return (self._correct @ weights) / (self._total @ weights)


@dataclass(frozen=True)
class TimeToTarget:
    """When a curve first reached a target accuracy: ``seconds`` (training seconds, None if never);
    ``bound`` "exact" when interpolated between the two points bracketing the target, "at_most" when
    its first point had already reached it (it took at most that long; no extrapolation toward 0 s,
    so a ratio built on it is an upper bound), None when never reached."""

    seconds: float | None
    bound: Bound | None


def _crossing(seconds: Floats, accuracy: Floats, target: float) -> TimeToTarget:
    reached = np.flatnonzero(accuracy >= target)
    if reached.size == 0:
        return TimeToTarget(None, None)
    i = int(reached[0])
    if i == 0:
        return TimeToTarget(float(seconds[0]), "at_most")
    # accuracy[i - 1] < target <= accuracy[i], so the slope is positive.
    share = (target - accuracy[i - 1]) / (accuracy[i] - accuracy[i - 1])
    return TimeToTarget(float(seconds[i - 1] + share * (seconds[i] - seconds[i - 1])), "exact")


def time_to_target(curve: Curve, target_accuracy: float) -> TimeToTarget:
    """The seconds at which ``curve`` first reaches ``target_accuracy`` (a fraction): the first point
    at or above it, interpolated linearly in (seconds, accuracy) with the point before it, so a
    non-monotone curve gives its first crossing. See :class:`TimeToTarget` for the first point and for
    a curve that never reaches it. Raises ValueError when the target is not finite."""
    if not math.isfinite(target_accuracy):
        raise ValueError(f"target_accuracy must be finite, got {target_accuracy}")
    return _crossing(curve.seconds, curve.accuracies(), target_accuracy)


@dataclass(frozen=True)
class RatioResult:
    """modern's time to classic's final accuracy / classic's last point's seconds. ``estimate``: the
    median of the per-replicate ``ratios`` (+inf where modern missed ``targets[r]``, classic's final
    accuracy; see ``per_replicate``); ``low``, ``high``: percentile interval at ``confidence``, ``width``
    = high - low (inf when high is), all None with one replicate; ``resamples`` drawn (0 with one
    replicate); ``unreached``: resamples with a drawn replicate whose modern missed its target (+inf)."""

    estimate: float
    low: float | None
    high: float | None
    width: float | None
    replicates: int
    resamples: int
    unreached: int
    confidence: float
    targets: tuple[float, ...]
    ratios: tuple[float, ...]
    per_replicate: tuple[TimeToTarget, ...]

    @property
    def upper_bound(self) -> bool:
        """True when some replicate's time is "at_most": the estimate may then be too high."""
        return any(t.bound == "at_most" for t in self.per_replicate)


def _ratio(m: Curve, c: Curve, wm: Ints | None, wc: Ints | None) -> tuple[float, float, TimeToTarget]:
    target = float(c.accuracies(wc)[-1])
    reached = _crossing(m.seconds, m.accuracies(wm), target)
    return target, math.inf if reached.seconds is None else reached.seconds / c.points[-1].seconds, reached


def time_to_target_ratio(
    modern_curves: Sequence[Curve],
    classic_curves: Sequence[Curve],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
    paired: bool = True,
) -> RatioResult:
    """Per replicate r: target = classic_curves[r]'s last point's accuracy, ratio_r =
    time_to_target(modern_curves[r], target).seconds / classic's last point's seconds (+inf when
    modern never reaches it). The estimate is the median over replicates, not the mean: a replicate
    that never reaches the target leaves it finite while fewer than half do, one replicate slowed by a
    shared machine moves it less, and time_to_quality's table takes medians over replicates too.

    Interval: ``resamples`` resamples from ``np.random.default_rng(seed)``, each drawing R replicates
    with replacement and, within each, D documents with replacement, recomputing both curves'
    accuracies, the target, the interpolated time and the median; percentiles (1 -+ confidence) / 2
    (method "inverted_cdf": actual resampled values, never arithmetic on inf). With one replicate no
    interval: a document bootstrap alone measures the held-out set's sampling noise, not the
    run-to-run spread replicates are for. ``paired=False`` draws separate documents for each recipe;
    it exists to show what pairing buys, not for reporting. Raises ValueError on unpaired input.
    """
    if not classic_curves or len(modern_curves) != len(classic_curves):
        raise ValueError(f"got {len(modern_curves)} modern curves for {len(classic_curves)} classic ones")
    if not 0 < confidence < 1 or resamples < 1:
        raise ValueError(f"need confidence in (0, 1), resamples >= 1: {confidence}, {resamples}")
    for m, c in zip(modern_curves, classic_curves, strict=True):
        if (m.replicate, m.documents) != (c.replicate, c.documents):
            raise ValueError(f"replicate {m.replicate} vs {c.replicate}, D {m.documents} vs {c.documents}")
        if c.points[-1].seconds <= 0:
            raise ValueError(f"classic replicate {c.replicate}: its last point's seconds must be > 0")
    observed = [_ratio(m, c, None, None) for m, c in zip(modern_curves, classic_curves, strict=True)]
    targets, ratios, reached = (tuple(column) for column in zip(*observed, strict=True))
    estimate, n = float(np.median(ratios)), len(ratios)
    if n == 1:
        return RatioResult(estimate, None, None, None, 1, 0, 0, confidence, targets, ratios, reached)
    rng = np.random.default_rng(seed)
    medians, unreached = np.empty(resamples), 0
    for b in range(resamples):
        drawn = []
        for r in rng.integers(0, n, size=n):
            m, c, d = modern_curves[r], classic_curves[r], classic_curves[r].documents
            wc = np.bincount(rng.integers(0, d, size=d), minlength=d)
            # One draw scores both recipes: a hard document drawn twice lowers the target and
            # modern's curve alike, so document difficulty cancels from the ratio.
            wm = wc if paired else np.bincount(rng.integers(0, d, size=d), minlength=d)
            drawn.append(_ratio(m, c, wm, wc)[1])
        unreached += math.inf in drawn
        medians[b] = np.median(drawn)
    tails = [(1 - confidence) / 2, (1 + confidence) / 2]
    low, high = (float(q) for q in np.quantile(medians, tails, method="inverted_cdf"))
    width = math.inf if math.isinf(high) else high - low  # inf - inf, both ends unreached, is not NaN
    return RatioResult(
        estimate, low, high, width, n, resamples, unreached, confidence, targets, ratios, reached
    )


@dataclass(frozen=True)
class Difference:
    """mean(a - b) over paired replicates (``estimate``, in the values' unit) with its Student t
    interval ``low``..``high`` at ``confidence``, ``width`` = high - low; None with one replicate."""

    estimate: float
    low: float | None
    high: float | None
    width: float | None
    replicates: int
    confidence: float


def paired_difference(
    a_values: Sequence[float], b_values: Sequence[float], confidence: float = CONFIDENCE
) -> Difference:
    """Mean of a_values[r] - b_values[r] (float [R] each, replicate r paired: e.g. two recipes'
    fine-tuned accuracies) with the t interval mean +- t(R-1) s / sqrt(R) (Student, 1908). Not a
    bootstrap: with 3-5 replicates a bootstrap interval of a mean cannot leave the values' range and
    covers less than its nominal level. One replicate: no interval. Raises ValueError on empty,
    unequally long or non-finite values, or a confidence outside (0, 1)."""
    if len(a_values) != len(b_values) or len(a_values) == 0 or not 0 < confidence < 1:
        raise ValueError(f"need equally long a_values, b_values and confidence in (0, 1): {confidence}")
    differences = np.asarray(a_values, dtype=np.float64) - np.asarray(b_values, dtype=np.float64)
    if differences.ndim != 1 or not np.isfinite(differences).all():
        raise ValueError("a_values and b_values must be finite numbers")
    estimate, n = float(differences.mean()), differences.size
    if n == 1:
        return Difference(estimate, None, None, None, 1, confidence)
    from scipy import stats  # here: scipy.stats takes a noticeable part of a second to import

    half = float(stats.t.ppf((1 + confidence) / 2, n - 1) * differences.std(ddof=1) / math.sqrt(n))
    return Difference(estimate, estimate - half, estimate + half, 2 * half, n, confidence)


def replicates_needed(width: float, replicates: int, target_width: float = 0.15) -> int | None:
    """Replicates that would make an interval of ``width`` from ``replicates`` replicates no wider
    than ``target_width``, width taken as proportional to 1 / sqrt(replicates): ceil(replicates x
    (width / target_width)^2), at least 2; a rough guide, as a few replicates' interval is itself
    noisy. None when ``width`` is inf (a recipe missing its target is not narrowed by repeats).
    Raises ValueError on replicates < 2, a negative or NaN width, or target_width <= 0."""
    if replicates < 2 or math.isnan(width) or width < 0 or target_width <= 0:
        raise ValueError(f"need replicates >= 2, width >= 0, target_width > 0: {replicates} {width}")
    if math.isinf(width):
        return None
    # The tolerance keeps a float product such as 12.000000000000002 from asking for 13.
    return max(2, math.ceil(replicates * (width / target_width) ** 2 - 1e-9))
