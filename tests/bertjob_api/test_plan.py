"""The resolved plan: batch split per world size, model dimensions, paths, and its one-line form."""

from pathlib import Path

import pytest

from bertjob_api.defaults import MODEL_PRESETS, ModelDims
from bertjob_api.plan import PhasePlan, Plan
from bertjob_api.spec import parse_job
from bertjob_api.validation import checked
from bertjob_testing.jobs import valid_job, with_value


def _spec(changes=None):
    document = valid_job()
    for field, value in (changes or {}).items():
        document = with_value(document, field, value)
    return parse_job(document).spec


# (changes to valid_job, world size detected or None for the topology's,
#  per phase (micro-batch, accumulation steps)); valid_job's global batches are 64 and 32.
SPLITS = [
    ({}, None, [(64, 1), (32, 1)]),
    ({"spec.topology": {"nodes": 2, "processesPerNode": 4}}, None, [(8, 1), (4, 1)]),
    ({"spec.phases.0.microBatchSize": 16, "spec.phases.1.microBatchSize": 8}, None, [(16, 4), (8, 4)]),
    (
        {"spec.topology": {"nodes": 2, "processesPerNode": 2}, "spec.phases.0.microBatchSize": 8},
        None,
        [(8, 2), (8, 1)],
    ),
    # Elastic: the micro-batch is the topology's default; the accumulation absorbs the difference.
    ({"spec.topology": {"nodes": 4, "processesPerNode": 1}}, 2, [(16, 2), (8, 2)]),
    ({"spec.topology": {"nodes": 4, "processesPerNode": 1}}, 1, [(16, 4), (8, 4)]),
    ({"spec.topology": {"nodes": 1, "processesPerNode": 2}}, 4, [(32, 0), (16, 0)]),
]


@pytest.mark.parametrize(("changes", "world", "splits"), SPLITS[:-1])
def test_the_batch_splits_for_the_world_that_runs(changes, world, splits):
    spec = _spec(changes)
    plan = Plan.resolve(checked(spec), world)
    assert plan.world_size == (world or spec.topology.world_size)
    assert [(phase.micro_batch_size, phase.accumulation_steps) for phase in plan.phases] == splits
    for phase, written in zip(plan.phases, spec.phases, strict=True):
        assert phase.global_batch_size == written.global_batch_size
        assert phase.global_batch_size == plan.world_size * phase.micro_batch_size * phase.accumulation_steps
        assert (phase.steps, phase.max_seq_length, phase.max_predictions_per_seq) == (
            written.steps,
            written.max_seq_length,
            written.max_predictions_per_seq,
        )


def test_a_world_the_global_batch_does_not_split_over_is_refused():
    changes, world, _ = SPLITS[-1]
    with pytest.raises(ValueError, match="not divisible by world size 4 x microBatchSize 32"):
        Plan.resolve(_spec(changes), world)
    with pytest.raises(ValueError, match="at least one process"):
        Plan.resolve(_spec(), 0)


@pytest.mark.parametrize(
    ("model", "dims"),
    [
        ({"preset": "bert-base"}, MODEL_PRESETS["bert-base"]),
        ({"preset": "bert-tiny", "numHiddenLayers": 1}, ModelDims(128, 1, 2, 512)),
        ({"preset": "bert-tiny", "hiddenSize": 256}, ModelDims(256, 2, 4, 1024)),
    ],
)
def test_the_model_dimensions_are_resolved(model, dims):
    assert Plan.resolve(_spec({"spec.model": model})).model == dims


@pytest.mark.parametrize(
    ("changes", "paths"),
    [
        ({}, ("/data/shards", "/data/checkpoints", "/data/checkpoints/logs", "/data/checkpoints/hf")),
        (
            {"spec.checkpoint.path": "/data/ckpt/", "spec.logging": {"path": "/logs"}},
            ("/data/shards", "/data/ckpt", "/logs", "/data/ckpt/hf"),
        ),
        (
            {"spec.export": {"path": "/out"}},
            ("/data/shards", "/data/checkpoints", "/data/checkpoints/logs", "/out"),
        ),
    ],
)
def test_the_paths_are_resolved(changes, paths):
    plan = Plan.resolve(_spec(changes))
    resolved = plan.paths
    assert (resolved.shards, resolved.checkpoints, resolved.logs, resolved.export) == tuple(map(Path, paths))
    assert plan.spec.export.path is not None and plan.spec.logging.path is not None


def test_another_world_makes_another_plan():
    plan = Plan.resolve(_spec({"spec.topology": {"nodes": 4, "processesPerNode": 1}}))
    assert plan.for_world(4) is plan
    smaller = plan.for_world(2)
    assert smaller.world_size == 2 and smaller.phases[0] == PhasePlan(
        0, 128, 20, 64, 16, 2, 100, 0.006, 1.0, 0.006
    )
    assert smaller.paths == plan.paths and smaller.model == plan.model


def test_the_plan_reads_in_one_line():
    plan = Plan.resolve(_spec({"spec.phases.0.microBatchSize": 16}))
    assert plan.describe() == (
        "world size 1; bert-tiny: 2 layers, hidden 128, 2 heads; "
        "phase 1: seq 128, global batch 64 = 1 x 16 x 4 accumulation, 100 steps, lr 0.006; "
        "phase 2: seq 512, global batch 32 = 1 x 32 x 1 accumulation, 20 steps, lr 0.004; "
        "shards /data/shards, checkpoints /data/checkpoints, logs /data/checkpoints/logs, "
        "export /data/checkpoints/hf"
    )


# (optimizer changes, each phase's learning rate used); valid_job's phases: global batches 64 and
# 32, learning rates 0.006 and 0.004. Worked by hand: linear 0.006 x 64/16, 0.004 x 32/16;
# sqrt 0.006 x sqrt(4), 0.004 x sqrt(2).
SCALINGS = [
    ({}, [0.006, 0.004]),
    ({"lrScaling": "none", "referenceGlobalBatchSize": 16}, [0.006, 0.004]),
    ({"lrScaling": "linear", "referenceGlobalBatchSize": 16}, [0.024, 0.008]),
    ({"lrScaling": "sqrt", "referenceGlobalBatchSize": 16}, [0.012, 0.004 * 1.4142135623730951]),
    ({"lrScaling": "linear", "referenceGlobalBatchSize": 128}, [0.003, 0.001]),
]


@pytest.mark.parametrize(("optimizer", "rates"), SCALINGS)
def test_the_learning_rate_is_scaled_by_the_global_batch(optimizer, rates):
    plan = Plan.resolve(checked(_spec({"spec.optimizer": optimizer})))
    assert [phase.learning_rate for phase in plan.phases] == pytest.approx(rates, rel=1e-12)
    assert [phase.written_learning_rate for phase in plan.phases] == [0.006, 0.004]
    record = plan.learning_rate(1)
    assert record["learning_rate"] == pytest.approx(rates[1], rel=1e-12)
    assert record["lr_scaling"] == optimizer.get("lrScaling", "none")
    assert record["global_batch_size"] == 32


def test_the_plan_line_shows_the_scaled_learning_rate():
    optimizer = {"lrScaling": "sqrt", "referenceGlobalBatchSize": 16}
    line = Plan.resolve(_spec({"spec.optimizer": optimizer})).describe()
    assert "100 steps, lr 0.012 = 0.006 x sqrt(64 / 16); " in line
    assert "20 steps, lr 0.00565685 = 0.004 x sqrt(32 / 16); " in line
    optimizer = {"lrScaling": "linear", "referenceGlobalBatchSize": 128}
    line = Plan.resolve(_spec({"spec.optimizer": optimizer})).describe()
    assert "100 steps, lr 0.003 = 0.006 x 64 / 128; " in line


def test_an_elastic_world_keeps_the_global_batch_and_learning_rate_and_says_so():
    optimizer = {"lrScaling": "sqrt", "referenceGlobalBatchSize": 16}
    plan = Plan.resolve(
        _spec({"spec.topology": {"nodes": 4, "processesPerNode": 1}, "spec.optimizer": optimizer})
    )
    assert "world size 4;" in plan.describe() and "keeps" not in plan.describe()
    smaller = plan.for_world(2)
    for before, after in zip(plan.phases, smaller.phases, strict=True):
        assert (after.global_batch_size, after.learning_rate) == (
            before.global_batch_size,
            before.learning_rate,
        )
    assert smaller.phases[0].learning_rate == pytest.approx(0.012, rel=1e-12)
    assert smaller.describe().startswith(
        "world size 2 (the topology's is 4: each phase keeps its global batch, and so its learning rate; "
        "the gradient accumulation steps absorb the difference); "
    )
