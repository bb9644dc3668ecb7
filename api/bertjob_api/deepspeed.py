"""The DeepSpeed config a job makes, and the user's keys merged into it.

A job already says what DeepSpeed's config would otherwise say: the batch split of each phase
(:class:`bertjob_api.plan.PhasePlan`), the precision, the optimizer and its clipping, the ZeRO
stage. Those keys are the job's; ``spec.distributed.deepspeed.config`` may add any other key
(``zero_optimization.overlap_comm``, ``communication_data_type``, ``fp16.initial_scale_power``,
...) and may repeat a job key only with the job's own value. Keys named in
https://www.deepspeed.ai/docs/config-json/.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertjob_api.spec import JobSpec

FIELD = "spec.distributed.deepspeed.config"
# The ZeRO stages the trainer runs: 1 (optimizer state), 2 (and gradients) and 3 (and parameters)
# sharded.
TRAINED_STAGES = (1, 2, 3)

# Keys that follow from the phases: a value in the user's config would hold for one phase at most.
_PER_PHASE_KEYS = {
    "train_batch_size": "spec.phases[].globalBatchSize",
    "train_micro_batch_size_per_gpu": "spec.phases[].microBatchSize",
    "gradient_accumulation_steps": "spec.phases[] (global batch / (micro batch x world size))",
}
# Sections the trainer owns outright: it builds the optimizer and the learning-rate schedule.
_OWNED_SECTIONS = {
    "optimizer": "spec.optimizer",
    "scheduler": "spec.optimizer (schedule) and spec.phases[] (warm-up, steps)",
    "amp": "spec.precision (apex AMP is not used)",
}


def job_keys(spec: JobSpec) -> dict[str, Any]:
    """The keys every phase's config gets from the job, besides the batch split.

    ``gradient_clipping`` is the job's ``maxGradNorm`` for AdamW and 0 for LAMB, which clips
    inside its step (over all ranks' gradients, see ``bertpretrain.training.optimizer``).
    ``zero_allow_untested_optimizer`` is true for LAMB: DeepSpeed lets ZeRO shard only the
    optimizers it lists, and the trainer's LAMB computes its norms over the shards itself; it
    clips by the global gradient norm ZeRO computes, hence ``zero_optimization.compute_grad_norm``.
    """
    assert spec.distributed.deepspeed is not None
    keys: dict[str, Any] = {
        "zero_optimization": {"stage": spec.distributed.deepspeed.zero_stage},
        "fp16": {"enabled": spec.precision == "fp16"},
        "bf16": {"enabled": spec.precision == "bf16"},
        "gradient_clipping": spec.optimizer.max_grad_norm if spec.optimizer.name == "adamw" else 0.0,
    }
    if spec.optimizer.name == "lamb":
        keys["zero_allow_untested_optimizer"] = True
        # LAMB clips by the global gradient norm ZeRO computes before it steps the groups.
        keys["zero_optimization"]["compute_grad_norm"] = True
    return keys


def conflicts(spec: JobSpec) -> list[tuple[str, str]]:
    """The user's config keys that contradict the job, as ``(field, message)`` pairs naming the key
    and the job field that sets it; empty without ``spec.distributed.deepspeed``."""
    if spec.distributed.deepspeed is None:
        return []
    user = spec.distributed.deepspeed.config
    found: list[tuple[str, str]] = []
    for key, owner in {**_PER_PHASE_KEYS, **_OWNED_SECTIONS}.items():
        if key in user:
            found.append((f"{FIELD}.{key}", f"is set by the job ({owner}); remove it"))
    for path, (value, wanted) in _differences(user, job_keys(spec)).items():
        found.append(
            (f"{FIELD}.{path}", f"is {value!r} but the job sets {wanted!r}; remove it or make them agree")
        )
    return found


def _differences(
    user: Mapping[str, Any], job: Mapping[str, Any], prefix: str = ""
) -> dict[str, tuple[Any, Any]]:
    found: dict[str, tuple[Any, Any]] = {}
    for key, wanted in job.items():
        if key not in user:
            continue
        value = user[key]
        if isinstance(wanted, Mapping) and isinstance(value, Mapping):
            found.update(_differences(value, wanted, f"{prefix}{key}."))
        elif value != wanted:
            found[f"{prefix}{key}"] = (value, wanted)
    return found


def merged(user: Mapping[str, Any], job: Mapping[str, Any]) -> dict[str, Any]:
    """``user`` with ``job``'s keys laid over it, sections merged key by key (a new dict)."""
    result: dict[str, Any] = dict(user)
    for key, value in job.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


def phase_config(
    spec: JobSpec, micro_batch_size: int, accumulation_steps: int, world_size: int
) -> dict[str, Any]:
    """The whole DeepSpeed config for one phase: the user's keys, then the job's.

    ``micro_batch_size`` sequences per rank per forward pass, ``accumulation_steps`` of them per
    optimizer step, on ``world_size`` ranks (a :class:`bertjob_api.plan.PhasePlan`'s split).
    """
    assert spec.distributed.deepspeed is not None
    job = {
        **job_keys(spec),
        "train_batch_size": micro_batch_size * accumulation_steps * world_size,
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": accumulation_steps,
        # The trainer prints its own progress lines.
        "steps_per_print": 2**31 - 1,
    }
    return merged(spec.distributed.deepspeed.config, job)
