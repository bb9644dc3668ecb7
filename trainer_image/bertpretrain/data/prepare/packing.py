"""Sequence packing: several pretraining instances per row, with no attention between them.

Krell, Kosec, Perez and Fitzgibbon (Graphcore), 2021, "Efficient Sequence Packing without
Cross-contamination: Accelerating Large Language Models without Impacting Performance"
(arXiv:2107.02027). Instances made by Google's algorithm are mostly ``max_seq_length`` long, but a
tail of short ones (``short_seq_prob``, and every document's last chunk) leaves a fair share of
each batch as padding; on corpora of short documents more than a third. Packing puts several
instances in one row, so the same compute sees more tokens, and the model is kept from seeing
across instances by the attention mask, the position ids and per-instance heads.

Planning works on the HISTOGRAM of lengths, not on the instances, so its cost does not grow with
the number of instances. Both of the paper's algorithms are here:

* **SPFHP** (shortest-pack-first histogram packing): lengths from the longest to the shortest;
  each length's count goes to the pack strategies (multisets of lengths, with a count of packs
  each) that have the least free space that fits it (best fit), splitting a strategy when it
  has more packs than there are sequences, and starting new packs for what fits nowhere (each
  taking as many of that length as fit, as best fit one sequence at a time would). A strategy
  stops taking sequences at ``max_sequences_per_pack``.
* **NNLSHP** (non-negative least-squares histogram packing): enumerate the strategies that fill
  a row exactly with up to three sequences (the paper's depth 3; deeper would not be tractable
  at 512), solve ``min ||W (A x - h)||`` for ``x >= 0`` with ``scipy.optimize.nnls`` (column j of
  ``A`` counts each length in strategy j, ``h`` is the histogram, ``W`` weighs each length by its
  own size because a long sequence left over is what costs padding later), round ``x`` to whole
  packs that the histogram can fill, and pack the sequences left over with SPFHP (using all of
  ``max_sequences_per_pack``, also above 3). NNLS runs by column generation, which reaches the
  same optimum as one NNLS over all columns in a few seconds at 512 instead of 15-20. Where
  rounding leaves NNLSHP a pack or two worse than SPFHP alone, SPFHP's plan is taken.

NNLSHP pays off on corpora with many short instances: at three sequences per pack, SPFHP pairs
medium lengths with each other and is left with short ones that share rows three at a time
(5-6% padding on the tests' short-document lengths, against under 0.1% for NNLSHP). On Google's
usual lengths (mostly full rows) the two are within a pack of each other.

Then ``rng`` deals the sequences of each length to the slots of that length at random, so that
a pack does not group instances made one after the other, and shuffles the packs.

The packed schema (what ``pack_instances`` makes and the loader reads) is in
:mod:`bertpretrain.data.format.packed`.
"""

from __future__ import annotations

import bisect
from typing import Literal, get_args

import numpy as np

from bertpretrain.data.format.packed import PACKED_DTYPES, packed_shapes
from bertpretrain.data.format.shards import NEXT_SENTENCE_LABELS, SHARD_DTYPES

Algorithm = Literal["spfhp", "nnlshp"]

# NVIDIA's unpacked schema, the input of pack_instances.
INSTANCE_DATASETS = tuple(SHARD_DTYPES)

# The paper's depth: strategies of up to 3 sequences keep NNLS at about L^2 / 12 columns (22,000
# at max_seq_length 512); 4 would be about L^3 / 144 (almost a million).
NNLS_DEPTH = 3
# x = 2.9999999 from the solver is 3 packs.
_ROUNDING_SLACK = 1e-6
# Column generation stops when no column outside the working set would lower the objective by
# more than this share of the largest weighted histogram bin, or after this many rounds.
_GAIN_TOLERANCE = 1e-9
_MAX_ROUNDS = 100

Strategy = tuple[int, ...]
"""The lengths of the sequences of one kind of pack, longest first."""


def plan_packs(
    lengths: np.ndarray,
    max_seq_length: int,
    max_sequences_per_pack: int,
    algorithm: Algorithm,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Group sequences into packs.

    Args:
        lengths: int [N], each in 1..``max_seq_length``.
        max_seq_length: a pack's lengths sum to at most this.
        max_sequences_per_pack: a pack holds at most this many sequences.
        algorithm: ``"spfhp"`` or ``"nnlshp"`` (see the module docstring).
        rng: decides which sequences of a given length go to which pack (so that packs do not
            group sequences by their order of creation) and the order of the packs.

    The plan (which multisets of lengths, how many of each) depends on the lengths only. On 2
    cores NNLSHP takes 2-6 s at ``max_seq_length`` 512 (its NNLS has up to 22,000 columns there;
    at 1024, 80 s), a tenth of a second at 128; SPFHP milliseconds.

    Returns:
        One int64 array of indices into ``lengths`` per pack, longest sequence first; every
        index 0..N-1 appears exactly once. The same ``rng`` state gives the same packs.

    Raises:
        ValueError: ``lengths`` is not a 1-D integer array with values in 1..``max_seq_length``,
            or ``max_seq_length``, ``max_sequences_per_pack`` or ``algorithm`` is invalid.
    """
    order, sizes = _plan(lengths, max_seq_length, max_sequences_per_pack, algorithm, rng)
    return np.split(order, np.cumsum(sizes)[:-1]) if len(sizes) else []


def pack_instances(
    arrays: dict[str, np.ndarray],
    max_sequences_per_pack: int,
    algorithm: Algorithm,
    rng: np.random.Generator,
    next_sentence_prediction: bool = True,
) -> dict[str, np.ndarray]:
    """Pack a shard's worth of instances into rows.

    Args:
        arrays: the six datasets of NVIDIA's schema as ``shards.read_shard`` returns them, for N
            instances: ``input_ids`` [N, L], ``input_mask`` [N, L] (1 then 0), ``segment_ids``
            [N, L], ``masked_lm_positions`` and ``masked_lm_ids`` [N, P] (at least one
            prediction each), ``next_sentence_labels`` [N]. L and P are read from the shapes.
        max_sequences_per_pack: S, at most 127 (``input_mask`` is int8).
        algorithm, rng: as for ``plan_packs``.
        next_sentence_prediction: false for instances of the objective ``mlm``: their
            ``next_sentence_labels`` are neither needed nor packed.

    Returns:
        The packed schema (:mod:`bertpretrain.data.format.packed`): the nine datasets of
        ``PACKED_DTYPES`` (eight, without ``next_sentence_labels``, when ``next_sentence_prediction``
        is false), shaped as ``packed_shapes`` says, for R rows (R = N when no two instances
        fit in one row; 0 when N = 0). Row r holds the instances of
        ``plan_packs(lengths, L, S, algorithm, rng)[r]``, in that order, for the same ``rng`` state.

    Raises:
        ValueError: a dataset is missing or has the wrong shape, ``input_mask`` is not ones
            then zeros or is empty, masked positions are not a zero-padded prefix inside the
            sequence, L is over 32768 (``position_ids`` are int16), or ``max_sequences_per_pack``
            is outside 1..127.
    """
    lengths, counts = _check_instances(arrays, next_sentence_prediction)
    n, max_seq_length = arrays["input_ids"].shape
    width = arrays["masked_lm_positions"].shape[1]
    if not 1 <= max_sequences_per_pack <= np.iinfo(np.int8).max:
        raise ValueError(
            f"max_sequences_per_pack must be in 1..127 (input_mask is int8), got {max_sequences_per_pack}"
        )
    if max_seq_length > np.iinfo(np.int16).max + 1:
        raise ValueError(f"input_ids is {max_seq_length} wide; position_ids (int16) allow at most 32768")
    order, sizes = _plan(lengths, max_seq_length, max_sequences_per_pack, algorithm, rng)
    rows = len(sizes)
    shapes = packed_shapes(rows, max_seq_length, max_sequences_per_pack, width)
    packed = {
        name: np.zeros(shapes[name], dtype)
        for name, dtype in PACKED_DTYPES.items()
        if next_sentence_prediction or name != NEXT_SENTENCE_LABELS
    }

    # Entry m of the plan is instance order[m], the k[m]-th of row row_of[m], from column start[m].
    row_of = np.repeat(np.arange(rows), sizes)
    first = np.cumsum(sizes) - sizes
    k = np.arange(n) - np.repeat(first, sizes)
    slot_lengths = lengths[order]
    ends = np.cumsum(slot_lengths)
    start = ends - slot_lengths - np.repeat(ends[first] - slot_lengths[first], sizes)
    slot_counts = counts[order]

    # Row-major boolean indexing visits the real tokens of the reordered instances in exactly the
    # order they take in the packed rows, so one mask on each side moves every token at once.
    columns = np.arange(max_seq_length)
    source = columns < slot_lengths[:, None]
    target = columns < np.bincount(row_of, weights=slot_lengths, minlength=rows)[:, None]
    for name in ("input_ids", "segment_ids"):
        packed[name][target] = arrays[name][order][source]
    packed["input_mask"][target] = np.repeat(k + 1, slot_lengths)
    packed["position_ids"][target] = np.broadcast_to(columns, source.shape)[source]

    source = np.arange(width) < slot_counts[:, None]
    target = (
        np.arange(max_sequences_per_pack * width)
        < np.bincount(row_of, weights=slot_counts, minlength=rows)[:, None]
    )
    packed["masked_lm_positions"][target] = arrays["masked_lm_positions"][order][source] + np.repeat(
        start, slot_counts
    )
    packed["masked_lm_ids"][target] = arrays["masked_lm_ids"][order][source]

    packed["next_sentence_positions"][row_of, k] = start
    if next_sentence_prediction:
        packed["next_sentence_labels"][row_of, k] = arrays["next_sentence_labels"][order]
    packed["next_sentence_weights"][row_of, k] = 1
    return packed


def padding_fraction(lengths: np.ndarray, rows: int, max_seq_length: int) -> float:
    """Share of the rows' token slots that are padding: 1 - sum(lengths) / (rows * max_seq_length).

    ``lengths`` are the real tokens held by ``rows`` rows of ``max_seq_length`` slots (the
    instances' lengths, packed or not). No rows means no padding: 0.0.

    Raises:
        ValueError: ``rows`` is negative, ``max_seq_length`` is not positive, or the lengths
            hold more tokens than the rows have slots.
    """
    if rows < 0:
        raise ValueError(f"rows must be >= 0, got {rows}")
    if max_seq_length < 1:
        raise ValueError(f"max_seq_length must be >= 1, got {max_seq_length}")
    tokens = int(np.sum(lengths, dtype=np.int64))
    slots = rows * max_seq_length
    if tokens > slots:
        raise ValueError(f"lengths hold {tokens} tokens, more than {rows} rows x {max_seq_length} slots")
    return 0.0 if slots == 0 else 1.0 - tokens / slots


def _plan(
    lengths: np.ndarray,
    max_seq_length: int,
    max_sequences_per_pack: int,
    algorithm: str,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """``plan_packs`` flat: the indices pack after pack (int64 [N]) and each pack's size (int64 [R])."""
    if max_seq_length < 1:
        raise ValueError(f"max_seq_length must be >= 1, got {max_seq_length}")
    if max_sequences_per_pack < 1:
        raise ValueError(f"max_sequences_per_pack must be >= 1, got {max_sequences_per_pack}")
    if algorithm not in get_args(Algorithm):
        raise ValueError(f"algorithm must be one of {get_args(Algorithm)}, got {algorithm!r}")
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or not (np.issubdtype(lengths.dtype, np.integer) or lengths.size == 0):
        raise ValueError(f"lengths must be a 1-D integer array, got {lengths.dtype} {lengths.shape}")
    lengths = lengths.astype(np.int64)
    if lengths.size and (lengths.min() < 1 or lengths.max() > max_seq_length):
        raise ValueError(
            f"lengths must be in 1..max_seq_length={max_seq_length}, found {lengths.min()}..{lengths.max()}"
        )

    histogram = np.bincount(lengths, minlength=max_seq_length + 1)
    if algorithm == "spfhp":
        strategies = _spfhp(histogram, max_seq_length, max_sequences_per_pack)
    else:
        strategies = _nnlshp(histogram, max_seq_length, max_sequences_per_pack)
    return _deal(lengths, strategies, rng)


def _spfhp(
    histogram: np.ndarray, max_seq_length: int, max_sequences_per_pack: int
) -> list[tuple[Strategy, int]]:
    """Shortest-pack-first histogram packing: (strategy, number of packs) pairs covering ``histogram``.

    ``histogram[l]`` is the number of sequences of length l (index 0 unused).
    """
    done: list[tuple[Strategy, int]] = []
    # Strategies that can still take a sequence, by free space; spaces is their sorted key list.
    open_: dict[int, list[tuple[Strategy, int]]] = {}
    spaces: list[int] = []

    def put(strategy: Strategy, count: int, space: int) -> None:
        if space == 0 or len(strategy) == max_sequences_per_pack:
            done.append((strategy, count))
            return
        if space not in open_:
            open_[space] = []
            bisect.insort(spaces, space)
        open_[space].append((strategy, count))

    for length in range(max_seq_length, 0, -1):
        left = int(histogram[length])
        while left:
            i = bisect.bisect_left(spaces, length)
            if i == len(spaces):
                # Fits nowhere: new packs, and (as best fit one sequence at a time would) each new
                # pack takes more of this length while they fit.
                per_pack = min(max_sequences_per_pack, max_seq_length // length)
                full, rest = divmod(left, per_pack)
                if full:
                    put((length,) * per_pack, full, max_seq_length - per_pack * length)
                if rest:
                    put((length,) * rest, 1, max_seq_length - rest * length)
                break
            space = spaces[i]
            strategy, count = open_[space].pop()
            if not open_[space]:
                del open_[space]
                del spaces[i]
            taken = min(count, left)
            if count > taken:
                put(strategy, count - taken, space)
            put((*strategy, length), taken, space - length)
            left -= taken
    return done + [item for space in spaces for item in open_[space]]


def _nnlshp(
    histogram: np.ndarray, max_seq_length: int, max_sequences_per_pack: int
) -> list[tuple[Strategy, int]]:
    """Non-negative least-squares histogram packing, the rest by SPFHP; as ``_spfhp``.

    Where rounding costs NNLSHP more packs than SPFHP needs (it happens on histograms that SPFHP
    packs to within a few tenths of a percent of the bound already), SPFHP's plan: it costs
    milliseconds, and so NNLSHP never packs worse than SPFHP.
    """
    fallback = _spfhp(histogram, max_seq_length, max_sequences_per_pack)
    plan = _nnls_plan(histogram, max_seq_length, max_sequences_per_pack)
    return plan if _pack_count(plan) <= _pack_count(fallback) else fallback


def _nnls_plan(
    histogram: np.ndarray, max_seq_length: int, max_sequences_per_pack: int
) -> list[tuple[Strategy, int]]:
    """NNLSHP proper: the strategies NNLS picks, rounded, then SPFHP on the sequences left."""
    # Imported here: scipy costs a third of a second to import, and only this packing needs it.

    depth = min(max_sequences_per_pack, NNLS_DEPTH)
    strategies = _filling_strategies(histogram > 0, max_seq_length, depth)
    if not len(strategies):
        return _spfhp(histogram, max_seq_length, max_sequences_per_pack)
    repeats = _strategy_repeats(strategies, histogram, max_seq_length)

    # Rounding to whole packs within what the histogram holds: first every strategy's whole part
    # (most wanted first, as an earlier strategy may use up sequences a later one needs), then one
    # more pack where the fraction is at least a half, largest fractions first.
    left = histogram.copy()
    plan: list[tuple[Strategy, int]] = []
    whole = np.floor(repeats + _ROUNDING_SLACK)
    fraction = repeats - whole
    wanted = [(j, int(whole[j])) for j in np.argsort(-repeats, kind="stable") if whole[j] > 0]
    wanted += [(j, 1) for j in np.argsort(-fraction, kind="stable") if fraction[j] >= 0.5]
    for j, want in wanted:
        strategy = tuple(int(x) for x in strategies[j][::-1] if x)
        lens, multiplicity = np.unique(strategy, return_counts=True)
        take = min(want, int(np.min(left[lens] // multiplicity)))
        if take:
            left[lens] -= multiplicity * take
            plan.append((strategy, take))
    return plan + _spfhp(left, max_seq_length, max_sequences_per_pack)


def _strategy_repeats(strategies: np.ndarray, histogram: np.ndarray, max_seq_length: int) -> np.ndarray:
    """float [K]: x >= 0 minimising ``||W (A x - h)||``, A [lengths, K] counting each strategy's lengths.

    ``strategies`` is int [K, depth] as ``_filling_strategies`` gives it, ``histogram`` int [L + 1].
    W weighs length l by l / L: a long sequence left over costs padding later (SPFHP finds it few
    partners), a short one fills some gap; on the histograms tried, weighing by l did at least as
    well as by 1, sqrt(l) or l ** 2.

    NNLS on all K columns (about 20,000 at L = 512) takes scipy's active-set solver 15-20 s on 2
    cores, and its cost grows faster than K. Column generation gives the same optimum in a few seconds: solve
    on a working set of columns, price every column by the gradient (which needs no matrix: the
    sum of the weighted residuals of the strategy's lengths), add the ``len(used)`` most promising
    ones to the columns in use, and repeat until no column would help. The objective falls
    strictly each round, so no working set comes back and the loop ends.
    """
    # Imported here: scipy takes a third of a second to import, and only this packing needs it.
    import scipy.optimize

    weights = np.arange(max_seq_length + 1) / max_seq_length
    weights[0] = 0.0  # the empty slots of short strategies
    used = np.flatnonzero(histogram)
    row = np.zeros(max_seq_length + 1, np.int64)
    row[used] = np.arange(len(used))
    target = histogram[used] * weights[used]
    tolerance = _GAIN_TOLERANCE * float(np.max(target))
    repeats = np.zeros(len(strategies))
    working = np.zeros(0, np.int64)
    for _ in range(_MAX_ROUNDS):
        packed = np.bincount(
            strategies.ravel(), weights=np.repeat(repeats, strategies.shape[1]), minlength=max_seq_length + 1
        )
        gain = (weights**2 * (histogram - packed))[strategies].sum(axis=1)
        gain[working] = 0.0  # optimal on the working set already
        candidates = np.flatnonzero(gain > tolerance)
        if not len(candidates):
            break
        best = candidates[np.argsort(-gain[candidates], kind="stable")[: len(used)]]
        working = np.union1d(working[repeats[working] > 0], best)
        matrix = np.zeros((len(used), len(working)))
        for column in strategies[working].T:
            real = column > 0
            np.add.at(matrix, (row[column[real]], np.flatnonzero(real)), weights[column[real]])
        try:
            solution, _ = scipy.optimize.nnls(matrix, target, maxiter=50 * len(used))
        except RuntimeError:  # out of iterations: keep the last solution, rounding copes with any x
            break
        repeats[:] = 0.0
        repeats[working] = solution
    return repeats


def _pack_count(plan: list[tuple[Strategy, int]]) -> int:
    return sum(count for _, count in plan)


def _filling_strategies(present: np.ndarray, max_seq_length: int, depth: int) -> np.ndarray:
    """Multisets of up to ``depth`` present lengths that sum to exactly ``max_seq_length``.

    Returns int64 [K, depth]: one strategy a row, increasing, 0-padded on the left.
    """
    lengths = np.flatnonzero(present)
    found: list[np.ndarray] = []
    partial = np.zeros((1, 0), np.int64)
    for level in range(1, depth + 1):
        sums = partial.sum(axis=1)
        last = partial[:, -1] if level > 1 else np.ones(len(partial), np.int64)
        # The level-th length is decided by the others; it keeps the multiset increasing.
        closing = max_seq_length - sums
        fits = (closing >= last) & present[closing]
        complete = np.column_stack([partial[fits], closing[fits]])
        found.append(np.pad(complete, ((0, 0), (depth - level, 0))))
        if level == depth:
            break
        grow = (lengths[None, :] >= last[:, None]) & (sums[:, None] + lengths[None, :] < max_seq_length)
        which, new = np.nonzero(grow)
        partial = np.column_stack([partial[which], lengths[new]])
    return np.concatenate(found)


def _deal(
    lengths: np.ndarray, strategies: list[tuple[Strategy, int]], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Sequences to the strategies' slots, at random among equal lengths; packs in random order."""
    shapes = np.array([len(strategy) for strategy, _ in strategies], np.int64)
    counts = np.array([count for _, count in strategies], np.int64)
    sizes = np.repeat(shapes, counts)
    # Slot lengths pack after pack: each strategy's tuple, repeated for each of its packs.
    slot_lengths = np.concatenate(
        [np.tile(np.array(strategy, np.int64), count) for strategy, count in strategies]
        or [np.zeros(0, np.int64)]
    )
    if not np.array_equal(np.sort(slot_lengths), np.sort(lengths)):
        raise AssertionError("packing plan does not match the lengths")  # a bug here, not bad input
    # The k-th slot of length l (in slot order) takes the k-th sequence of length l (in random order).
    sequences = np.lexsort((rng.permutation(len(lengths)), lengths))
    slots = np.argsort(slot_lengths, kind="stable")
    order = np.empty(len(lengths), np.int64)
    order[slots] = sequences

    packs = rng.permutation(len(sizes))
    first = np.cumsum(sizes) - sizes
    new_sizes = sizes[packs]
    new_first = np.cumsum(new_sizes) - new_sizes
    moved = np.repeat(first[packs] - new_first, new_sizes) + np.arange(len(lengths))
    return order[moved], new_sizes


def _check_instances(
    arrays: dict[str, np.ndarray], next_sentence_prediction: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Each instance's length and number of predictions (int64 [N]), after checking the schema
    (without ``next_sentence_labels`` when ``next_sentence_prediction`` is false)."""
    required = [
        name for name in INSTANCE_DATASETS if next_sentence_prediction or name != NEXT_SENTENCE_LABELS
    ]
    missing = [name for name in required if name not in arrays]
    if missing:
        raise ValueError(f"arrays lacks datasets {missing}")
    ids, positions = arrays["input_ids"], arrays["masked_lm_positions"]
    if ids.ndim != 2 or positions.ndim != 2:
        raise ValueError(
            f"arrays['input_ids'] and arrays['masked_lm_positions'] must be 2-D [N, max_seq_length] and "
            f"[N, max_predictions_per_seq], got shapes {ids.shape} and {positions.shape}"
        )
    n, max_seq_length = ids.shape
    width = positions.shape[1]
    expected = {
        "input_mask": (n, max_seq_length),
        "segment_ids": (n, max_seq_length),
        "masked_lm_positions": (n, width),
        "masked_lm_ids": (n, width),
        "next_sentence_labels": (n,),
    }
    if not next_sentence_prediction:
        del expected[NEXT_SENTENCE_LABELS]
    for name, shape in expected.items():
        if arrays[name].shape != shape:
            found = arrays[name].shape
            raise ValueError(
                f"arrays[{name!r}] should have shape {shape} for input_ids {ids.shape}, got {found}"
            )
    lengths = np.count_nonzero(arrays["input_mask"], axis=1).astype(np.int64)
    if (lengths == 0).any() or not np.array_equal(
        arrays["input_mask"], np.arange(max_seq_length) < lengths[:, None]
    ):
        raise ValueError("arrays['input_mask'] must be 1 on each instance's tokens then 0, with >= 1 token")
    counts = np.count_nonzero(positions, axis=1).astype(np.int64)
    prefix = np.arange(width) < counts[:, None]
    if (
        (counts == 0).any()
        or not np.array_equal(positions != 0, prefix)
        or (positions >= lengths[:, None]).any()
        or ((np.diff(positions, axis=1) <= 0) & prefix[:, 1:]).any()
    ):
        raise ValueError(
            "arrays['masked_lm_positions'] must hold, per instance, >= 1 increasing position inside the "
            "instance, then 0s"
        )
    return lengths, counts
