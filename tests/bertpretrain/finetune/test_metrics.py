"""Classification metrics and the seed summary, against values worked out by hand."""

from __future__ import annotations

import math
import re

import pytest

from bertpretrain.finetune.metrics import CLASSIFICATION_METRICS, classification_metrics, median, summarise

# Ten binary examples. Pair by pair (label, prediction): (1,1) (1,1) (1,0) (1,1) (0,0) (0,1) (0,0)
# (0,0) (0,1) (1,1): TP = 4, FN = 1, TN = 3, FP = 2.
BINARY_LABELS = [1, 1, 1, 1, 0, 0, 0, 0, 0, 1]
BINARY_PREDICTIONS = [1, 1, 0, 1, 0, 1, 0, 0, 1, 1]
TP, FN, TN, FP = 4, 1, 3, 2


def test_binary_metrics_follow_the_confusion_matrix() -> None:
    values = classification_metrics(BINARY_LABELS, BINARY_PREDICTIONS, 2, CLASSIFICATION_METRICS)

    assert list(values) == ["accuracy", "f1", "mcc"]
    assert values["accuracy"] == pytest.approx((TP + TN) / (TP + TN + FP + FN))  # 7/10
    precision, recall = TP / (TP + FP), TP / (TP + FN)
    assert values["f1"] == pytest.approx(2 * precision * recall / (precision + recall))  # 8/11
    mcc = (TP * TN - FP * FN) / math.sqrt((TP + FP) * (TP + FN) * (TN + FP) * (TN + FN))
    assert values["mcc"] == pytest.approx(mcc)  # 10/sqrt(600)
    assert all(type(value) is float for value in values.values())


def test_binary_f1_is_that_of_class_1() -> None:
    f1 = classification_metrics(BINARY_LABELS, BINARY_PREDICTIONS, 2, ["f1"])["f1"]
    # Class 0 as the positive class: its TP = TN, FP = FN, FN = FP; F1 = 6/9, not 8/11.
    assert f1 == pytest.approx(8 / 11)
    assert f1 != pytest.approx(2 * TN / (2 * TN + FN + FP))


def test_three_classes_give_macro_f1_and_multiclass_mcc() -> None:
    labels = [0, 0, 1, 1, 2, 2]
    predictions = [0, 1, 1, 1, 2, 0]
    values = classification_metrics(labels, predictions, 3, ["mcc", "f1", "accuracy"])

    assert list(values) == ["mcc", "f1", "accuracy"]
    assert values["accuracy"] == pytest.approx(4 / 6)
    # Per class (TP, FP, FN): 0 -> (1, 1, 1), 1 -> (2, 1, 0), 2 -> (1, 0, 1); F1 = 2TP/(2TP+FP+FN).
    assert values["f1"] == pytest.approx((2 / 4 + 4 / 5 + 2 / 3) / 3)
    # Gorodkin's multiclass MCC: (c*s - sum p_k t_k) / sqrt((s^2 - sum p_k^2)(s^2 - sum t_k^2)),
    # c = 4 correct, s = 6, predicted counts p = (2, 3, 1), true counts t = (2, 2, 2).
    assert values["mcc"] == pytest.approx((4 * 6 - (4 + 6 + 2)) / math.sqrt((36 - 14) * (36 - 12)))


def test_constant_predictions_score_zero_mcc_and_f1() -> None:
    values = classification_metrics([0, 1, 1, 0], [0, 0, 0, 0], 2, ["accuracy", "f1", "mcc"])
    assert values == {"accuracy": 0.5, "f1": 0.0, "mcc": 0.0}


@pytest.mark.parametrize(
    ("labels", "predictions", "names", "message"),
    [
        ([0, 1], [0, 1], ["accuracy", "auc"], "unknown metrics ['auc']"),
        ([0, 1], [0], ["accuracy"], "2 labels but 1 predictions"),
        ([], [], ["accuracy"], "no labels"),
        ([0, 2], [0, 1], ["accuracy"], "class indices [2] are outside [0, 2)"),
        ([0, 1], [-1, 1], ["accuracy"], "class indices [-1]"),
    ],
)
def test_bad_arguments_are_refused(
    labels: list[int], predictions: list[int], names: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        classification_metrics(labels, predictions, 2, names)


def test_median_of_odd_and_even_counts() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([1.0, 4.0, 2.0, 3.0]) == 2.5


def test_summarise_three_seeds() -> None:
    per_seed = [
        {"f1": 0.90, "accuracy": 0.80},
        {"f1": 0.95, "accuracy": 0.70},
        {"f1": 0.85, "accuracy": 0.90},
    ]
    summary = summarise(per_seed)

    assert list(summary) == ["f1", "accuracy"]
    # Deviations from the mean: f1 (0, +0.05, -0.05), accuracy (0, -0.1, +0.1); population std.
    assert summary["f1"] == pytest.approx(
        {"median": 0.90, "best": 0.95, "mean": 0.90, "std": math.sqrt(2 * 0.05**2 / 3)}
    )
    assert summary["accuracy"] == pytest.approx(
        {"median": 0.80, "best": 0.90, "mean": 0.80, "std": math.sqrt(2 * 0.1**2 / 3)}
    )
    assert list(summary["f1"]) == ["median", "best", "mean", "std"]


def test_summarise_one_seed_has_no_spread() -> None:
    assert summarise([{"mcc": 0.5}]) == {"mcc": {"median": 0.5, "best": 0.5, "mean": 0.5, "std": 0.0}}


def test_summarise_refuses_no_seeds_and_mismatched_metrics() -> None:
    with pytest.raises(ValueError, match="no seeds"):
        summarise([])
    with pytest.raises(ValueError, match="seed 2 has metrics"):
        summarise([{"f1": 0.5, "mcc": 0.1}, {"f1": 0.5}])
