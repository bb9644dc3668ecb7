"""Classification metrics (GLUE's) and their summary over fine-tuning seeds.

Every value is a fraction from 0 to 1 (MCC from -1 to 1), not a percentage. scikit-learn is
imported inside the functions, so that importing this module stays cheap.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

CLASSIFICATION_METRICS = ("accuracy", "f1", "mcc")


def classification_metrics(
    labels: Sequence[int], predictions: Sequence[int], num_labels: int, names: Sequence[str]
) -> dict[str, float]:
    """The metrics ``names`` (a subset of :data:`CLASSIFICATION_METRICS`, in that order) of
    ``predictions`` against the true ``labels`` (class indices in ``[0, num_labels)``).

    - ``accuracy``: the fraction of correct predictions (scikit-learn ``accuracy_score``).
    - ``f1``: with two labels, the binary F1 of class 1, the second declared label (GLUE's
      convention for MRPC and QQP, whose positive class is ``1``); otherwise the macro average
      of the per-class F1 over the classes that occur in ``labels`` or ``predictions``
      (scikit-learn ``f1_score``; a class with no true or predicted example scores 0).
    - ``mcc``: Matthews correlation coefficient (scikit-learn ``matthews_corrcoef``; GLUE's
      metric for CoLA), 0 when every prediction or every label is the same class.

    Returns:
        ``{name: value}`` as Python floats, in the order of ``names``.

    Raises:
        ValueError: an unknown metric name; ``labels`` and ``predictions`` differ in length or
            are empty; a class index outside ``[0, num_labels)``.
    """
    unknown = [name for name in names if name not in CLASSIFICATION_METRICS]
    if unknown:
        raise ValueError(f"unknown metrics {unknown}: use some of {', '.join(CLASSIFICATION_METRICS)}")
    if len(labels) != len(predictions):
        raise ValueError(f"{len(labels)} labels but {len(predictions)} predictions")
    if not labels:
        raise ValueError("no labels to score predictions against")
    outside = sorted({int(value) for value in [*labels, *predictions] if not 0 <= value < num_labels})
    if outside:
        raise ValueError(f"class indices {outside} are outside [0, {num_labels})")
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    values: dict[str, float] = {}
    for name in names:
        if name == "accuracy":
            values[name] = float(accuracy_score(labels, predictions))
        elif name == "f1" and num_labels == 2:
            f1 = f1_score(labels, predictions, average="binary", pos_label=1, zero_division=0)
            values[name] = float(f1)
        elif name == "f1":
            values[name] = float(f1_score(labels, predictions, average="macro", zero_division=0))
        else:
            values[name] = float(matthews_corrcoef(labels, predictions))
    return values


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (``statistics.median``: the mean of the middle two for an even count).

    Raises:
        statistics.StatisticsError: ``values`` is empty.
    """
    return float(statistics.median(values))


def summarise(per_seed: Sequence[Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Summarise one metric mapping per fine-tuning seed: for each metric, in the order of the
    first mapping, ``{"median", "best" (the maximum), "mean", "std"}``.

    ``std`` is the population standard deviation (``statistics.pstdev``): it describes the
    spread of these seeds' results, and is 0 for one seed. The median is what RoBERTa and ELECTRA
    report over fine-tuning restarts: one unlucky seed (a diverged run) moves it least.

    Raises:
        ValueError: ``per_seed`` is empty, or its mappings name different metrics.
    """
    if not per_seed:
        raise ValueError("no seeds to summarise")
    names = list(per_seed[0])
    for index, metrics in enumerate(per_seed):
        if set(metrics) != set(names):
            raise ValueError(f"seed {index + 1} has metrics {sorted(metrics)}, the first has {sorted(names)}")
    summary: dict[str, dict[str, float]] = {}
    for name in names:
        values = [float(metrics[name]) for metrics in per_seed]
        summary[name] = {
            "median": median(values),
            "best": max(values),
            "mean": statistics.fmean(values),
            "std": statistics.pstdev(values),
        }
    return summary
