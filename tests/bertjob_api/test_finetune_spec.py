"""spec.finetune: the checks of one task (its schema), across fields (validation), its defaults by
type, and what a cluster job needs (absolute paths)."""

from __future__ import annotations

from typing import Any

import pytest

from bertjob_api.defaults import with_defaults
from bertjob_api.spec import SpecError, parse_job
from bertjob_api.validation import cluster_problems, problems
from bertjob_testing.jobs import valid_job, with_value

CLASSIFICATION = {
    "name": "mrpc",
    "type": "classification",
    "train": "/d/train.tsv",
    "validation": "/d/dev.tsv",
}
SQUAD = {"name": "squad", "type": "squad", "train": "/d/train-v1.1.json", "validation": "/d/dev-v1.1.json"}


def _job(*tasks: dict[str, Any], **changes: Any) -> dict[str, Any]:
    document = with_value(valid_job(), "spec.finetune", list(tasks))
    for field, value in changes.items():
        document = with_value(document, field, value)
    return document


def test_defaults_depend_on_the_type() -> None:
    spec = with_defaults(parse_job(_job(CLASSIFICATION, SQUAD)).spec)
    classification, squad = spec.finetune
    assert (classification.learning_rate, classification.max_seq_length, classification.metrics) == (
        2e-5,
        128,
        ["accuracy", "f1"],
    )
    assert (squad.learning_rate, squad.max_seq_length, squad.metrics) == (3e-5, 384, ["exact_match", "f1"])
    # No accumulation by default: the micro-batch is the global batch over the run's processes.
    assert classification.micro_batch_size == 32
    # Written values stay.
    written = with_defaults(parse_job(_job({**SQUAD, "learningRate": 5e-5, "maxSeqLength": 256})).spec)
    assert (written.finetune[0].learning_rate, written.finetune[0].max_seq_length) == (5e-5, 256)


def test_a_task_fine_tunes_with_dropout_0_1_whatever_pretraining_uses() -> None:
    no_dropout = {"preset": "bert-tiny", "hiddenDropoutProb": 0, "attentionProbsDropoutProb": 0}
    spec = with_defaults(parse_job(_job(CLASSIFICATION, **{"spec.model": no_dropout})).spec)
    assert (spec.model.hidden_dropout_prob, spec.finetune[0].dropout) == (0, 0.1)
    written = parse_job(_job({**CLASSIFICATION, "dropout": 0})).spec
    assert written.finetune[0].dropout == 0


def test_the_micro_batch_splits_over_the_ranks_only_in_data_parallel_mode() -> None:
    topology = {"spec.topology": {"nodes": 2, "processesPerNode": 2}}
    data = with_defaults(parse_job(_job(CLASSIFICATION, **topology)).spec).finetune[0]
    seeds = with_defaults(
        parse_job(_job({**CLASSIFICATION, "parallelism": "seeds"}, **topology)).spec
    ).finetune[0]
    assert (data.micro_batch_size, seeds.micro_batch_size) == (8, 32)


@pytest.mark.parametrize(
    ("task", "path", "message"),
    [
        ({**CLASSIFICATION, "validation": None}, "spec.finetune[0]", "validation missing"),
        ({**CLASSIFICATION, "builtin": "python-docs-modules"}, "spec.finetune[0]", "not both"),
        (
            {"name": "m", "type": "squad", "builtin": "python-docs-modules"},
            "spec.finetune[0]",
            "a classification task, not squad",
        ),
        ({**SQUAD, "format": "tsv"}, "spec.finetune[0]", "format tsv does not hold squad data"),
        (
            {**CLASSIFICATION, "format": "squad"},
            "spec.finetune[0]",
            "format squad does not hold classification",
        ),
        ({**SQUAD, "textPairField": "b"}, "spec.finetune[0]", "textPairField is for classification"),
        ({**SQUAD, "metrics": ["accuracy"]}, "spec.finetune[0]", "metrics accuracy are not for squad"),
        ({**CLASSIFICATION, "metrics": ["exact_match"]}, "spec.finetune[0]", "not for classification"),
        ({**CLASSIFICATION, "name": "MRPC"}, "spec.finetune[0].name", "should match pattern"),
        ({**CLASSIFICATION, "labels": ["only"]}, "spec.finetune[0].labels", "at least 2"),
        ({**CLASSIFICATION, "seeds": 0}, "spec.finetune[0].seeds", "greater than or equal to 1"),
        ({**CLASSIFICATION, "parallelism": "ranks"}, "spec.finetune[0].parallelism", "'data' or 'seeds'"),
        ({**CLASSIFICATION, "epoch": 3}, "spec.finetune[0].epoch", "unknown field"),
        ({**CLASSIFICATION, "dropout": 1}, "spec.finetune[0].dropout", "less than 1"),
        ({**CLASSIFICATION, "dropout": -0.1}, "spec.finetune[0].dropout", "greater than or equal to 0"),
    ],
)
def test_a_bad_task_is_refused_naming_the_field(task: dict[str, Any], path: str, message: str) -> None:
    task = {key: value for key, value in task.items() if value is not None}
    with pytest.raises(SpecError) as caught:
        parse_job(_job(task))
    assert any(where == path and message in text for where, text in caught.value.problems), caught.value


@pytest.mark.parametrize(
    ("tasks", "changes", "path", "message"),
    [
        ([CLASSIFICATION, {**SQUAD, "name": "mrpc"}], {}, "spec.finetune[1].name", "also spec.finetune[0]"),
        (
            [{**CLASSIFICATION, "globalBatchSize": 30}],
            {"spec.topology": {"nodes": 1, "processesPerNode": 4}},
            "spec.finetune[0].globalBatchSize",
            "not divisible by world size 4",
        ),
        (
            [{**CLASSIFICATION, "maxSeqLength": 1024}],
            {},
            "spec.finetune[0].maxSeqLength",
            "maxPositionEmbeddings 512",
        ),
        (
            [{**SQUAD, "maxSeqLength": 64, "maxQueryLength": 64}],
            {},
            "spec.finetune[0].maxQueryLength",
            "no room",
        ),
        ([{**SQUAD, "maxSeqLength": 128, "docStride": 100}], {}, "spec.finetune[0].docStride", "skip text"),
    ],
)
def test_inconsistent_tasks_are_refused_naming_the_field(
    tasks: list[dict[str, Any]], changes: dict[str, Any], path: str, message: str
) -> None:
    found = problems(with_defaults(parse_job(_job(*tasks, **changes)).spec))
    assert any(where == path and message in text for where, text in found), found


def test_consistent_tasks_pass() -> None:
    seeds_mode = {**CLASSIFICATION, "name": "odd", "globalBatchSize": 30, "parallelism": "seeds"}
    spec = with_defaults(
        parse_job(
            _job(CLASSIFICATION, SQUAD, seeds_mode, **{"spec.topology": {"nodes": 1, "processesPerNode": 4}})
        ).spec
    )
    # 30 does not split over 4 ranks, but in seeds mode each rank runs alone.
    assert problems(spec) == []


def test_a_cluster_job_needs_absolute_task_paths() -> None:
    task = {**CLASSIFICATION, "train": "glue/train.tsv", "initFrom": "ckpt"}
    found = dict(cluster_problems(with_defaults(parse_job(_job(task)).spec)))
    assert "must be an absolute path" in found["spec.finetune[0].train"]
    assert "must be an absolute path" in found["spec.finetune[0].initFrom"]
    assert "spec.finetune[0].validation" not in found
