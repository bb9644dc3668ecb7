"""The DeepSpeed config a job makes (bertjob_api.deepspeed): the job's keys, the user's keys merged
beside them, and every user key that contradicts the job refused by name (also through
validation.problems)."""

from __future__ import annotations

from typing import Any

import pytest

from bertjob_api import deepspeed
from bertjob_api.defaults import with_defaults
from bertjob_api.spec import JobSpec, parse_job
from bertjob_api.validation import problems
from bertjob_testing.jobs import valid_job


def _spec(**spec: Any) -> JobSpec:
    document = valid_job()
    document["spec"].update(spec)
    return with_defaults(parse_job(document).spec)


def _deepspeed(config: dict[str, Any] | None = None, stage: int = 1, **spec: Any) -> JobSpec:
    return _spec(distributed={"deepspeed": {"zeroStage": stage, "config": config or {}}}, **spec)


@pytest.mark.parametrize(
    ("optimizer", "precision", "stage", "expected"),
    [
        (
            "lamb",
            "fp32",
            1,
            {
                "zero_optimization": {"stage": 1, "compute_grad_norm": True},
                "fp16": {"enabled": False},
                "bf16": {"enabled": False},
                "gradient_clipping": 0.0,
                "zero_allow_untested_optimizer": True,
            },
        ),
        (
            "adamw",
            "bf16",
            2,
            {
                "zero_optimization": {"stage": 2},
                "fp16": {"enabled": False},
                "bf16": {"enabled": True},
                "gradient_clipping": 0.5,
            },
        ),
        (
            "adamw",
            "fp16",
            1,
            {
                "zero_optimization": {"stage": 1},
                "fp16": {"enabled": True},
                "bf16": {"enabled": False},
                "gradient_clipping": 0.5,
            },
        ),
    ],
)
def test_job_keys(optimizer: str, precision: str, stage: int, expected: dict[str, Any]) -> None:
    spec = _deepspeed(stage=stage, precision=precision, optimizer={"name": optimizer, "maxGradNorm": 0.5})
    assert deepspeed.job_keys(spec) == expected


@pytest.mark.parametrize(
    ("config", "field", "message"),
    [
        ({"train_batch_size": 64}, "train_batch_size", "is set by the job (spec.phases[].globalBatchSize)"),
        ({"train_micro_batch_size_per_gpu": 4}, "train_micro_batch_size_per_gpu", "is set by the job"),
        ({"gradient_accumulation_steps": 2}, "gradient_accumulation_steps", "is set by the job"),
        ({"optimizer": {"type": "Adam"}}, "optimizer", "is set by the job (spec.optimizer)"),
        ({"scheduler": {"type": "WarmupLR"}}, "scheduler", "is set by the job"),
        ({"amp": {"enabled": True}}, "amp", "apex AMP is not used"),
        ({"zero_optimization": {"stage": 2}}, "zero_optimization.stage", "is 2 but the job sets 1"),
        ({"fp16": {"enabled": True}}, "fp16.enabled", "is True but the job sets False"),
        ({"bf16": {"enabled": True}}, "bf16.enabled", "is True but the job sets False"),
        ({"gradient_clipping": 1.0}, "gradient_clipping", "is 1.0 but the job sets 0.0"),
        (
            {"zero_optimization": {"compute_grad_norm": False}},
            "zero_optimization.compute_grad_norm",
            "is False but the job sets True",
        ),
    ],
)
def test_a_user_key_that_contradicts_the_job_is_refused_by_name(
    config: dict[str, Any], field: str, message: str
) -> None:
    spec = _deepspeed(config, precision="fp32", optimizer={"name": "lamb"})
    found = dict(deepspeed.conflicts(spec))
    assert list(found) == [f"spec.distributed.deepspeed.config.{field}"]
    assert message in found[f"spec.distributed.deepspeed.config.{field}"]
    assert message in dict(problems(spec))[f"spec.distributed.deepspeed.config.{field}"]


def test_user_keys_that_agree_or_add_are_merged() -> None:
    config = {
        "zero_optimization": {"stage": 1, "overlap_comm": True, "reduce_bucket_size": 5000},
        "fp16": {"enabled": False, "initial_scale_power": 12},
        "communication_data_type": "fp32",
    }
    spec = _deepspeed(config)
    assert deepspeed.conflicts(spec) == []
    assert problems(spec) == []
    merged = deepspeed.phase_config(spec, micro_batch_size=4, accumulation_steps=3, world_size=2)
    assert merged["zero_optimization"] == {
        "stage": 1,
        "overlap_comm": True,
        "reduce_bucket_size": 5000,
        "compute_grad_norm": True,
    }
    assert merged["fp16"] == {"enabled": False, "initial_scale_power": 12}
    assert merged["communication_data_type"] == "fp32"
    assert merged["train_batch_size"] == 24
    assert merged["train_micro_batch_size_per_gpu"] == 4
    assert merged["gradient_accumulation_steps"] == 3
    assert config["zero_optimization"] == {"stage": 1, "overlap_comm": True, "reduce_bucket_size": 5000}


@pytest.mark.parametrize(
    ("user", "job", "expected"),
    [
        ({}, {"a": 1}, {"a": 1}),
        ({"a": 2}, {"a": 1}, {"a": 1}),
        ({"s": {"x": 1}}, {"s": {"y": 2}}, {"s": {"x": 1, "y": 2}}),
        ({"s": {"x": 1, "y": 3}}, {"s": {"y": 2}}, {"s": {"x": 1, "y": 2}}),
        ({"s": 5}, {"s": {"y": 2}}, {"s": {"y": 2}}),
        ({"other": [1]}, {"s": {"y": 2}}, {"other": [1], "s": {"y": 2}}),
    ],
)
def test_merged_lays_the_job_over_the_user(
    user: dict[str, Any], job: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert deepspeed.merged(user, job) == expected


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"stage": 0}, "spec.distributed.deepspeed.zeroStage", "0 is DeepSpeed without ZeRO"),
        (
            {"distributed": {"gradientCompression": "fp16", "deepspeed": {}}},
            "spec.distributed.gradientCompression",
            "communication_data_type",
        ),
        (
            {"launcher": "mpijob", "mpi": {"command": "horovodrun"}},
            "spec.mpi.command",
            "DeepSpeed runs under mpirun",
        ),
        ({"accelerator": "xeon-cpu", "precision": "fp16"}, "spec.precision", "on xeon-cpu use bf16 or fp32"),
    ],
)
def test_what_deepspeed_cannot_run_is_refused(changes: dict[str, Any], field: str, message: str) -> None:
    stage = changes.pop("stage", 1)
    spec = _spec(**{"distributed": {"deepspeed": {"zeroStage": stage}}, **changes})
    found = dict(problems(spec))
    assert field in found, found
    assert message in found[field]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_the_stages_the_trainer_runs_are_accepted(stage: int) -> None:
    assert problems(_deepspeed(stage=stage)) == []
    assert problems(_deepspeed(stage=stage, launcher="mpijob", mpi={"command": "mpirun"})) == []
