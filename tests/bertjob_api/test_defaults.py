"""Defaults that depend on other fields (micro-batch, export and log paths, shard count) and
the model presets' dimensions."""

import pytest

from bertjob_api.defaults import (
    DEFAULT_NUM_SHARDS,
    MODEL_PRESETS,
    gradient_accumulation_steps,
    resolve_model,
    with_defaults,
)
from bertjob_api.spec import ModelSpec, parse_job
from bertjob_testing.jobs import valid_job, with_value


@pytest.mark.parametrize(
    ("preset", "layers", "hidden", "heads", "intermediate"),
    [
        ("bert-tiny", 2, 128, 2, 512),
        ("bert-mini", 4, 256, 4, 1024),
        ("bert-small", 4, 512, 8, 2048),
        ("bert-medium", 8, 512, 8, 2048),
        ("bert-base", 12, 768, 12, 3072),
        ("bert-large", 24, 1024, 16, 4096),
    ],
)
def test_presets_match_the_published_sizes(preset, layers, hidden, heads, intermediate):
    dims = MODEL_PRESETS[preset]
    assert (dims.num_hidden_layers, dims.hidden_size, dims.num_attention_heads, dims.intermediate_size) == (
        layers,
        hidden,
        heads,
        intermediate,
    )


def test_overrides_replace_preset_values():
    dims = resolve_model(ModelSpec(preset="bert-base", num_hidden_layers=6, hidden_dropout_prob=0.0))
    assert dims.num_hidden_layers == 6 and dims.hidden_size == 768 and dims.hidden_dropout_prob == 0.0


def test_hidden_size_override_keeps_head_width_and_ffn_ratio():
    dims = resolve_model(ModelSpec(preset="bert-tiny", hidden_size=256))
    assert (dims.num_attention_heads, dims.intermediate_size) == (4, 1024)


def test_micro_batch_defaults_to_global_over_world_size():
    document = with_value(valid_job(), "spec.topology", {"nodes": 2, "processesPerNode": 4})
    spec = with_defaults(parse_job(document).spec)
    assert [phase.micro_batch_size for phase in spec.phases] == [8, 4]
    assert gradient_accumulation_steps(spec.phases[0], 8) == 1


@pytest.mark.parametrize(
    ("global_batch", "micro", "world", "steps"), [(64, 8, 2, 4), (64, 32, 1, 2), (256, 4, 8, 8)]
)
def test_gradient_accumulation_steps_are_derived(global_batch, micro, world, steps):
    document = with_value(valid_job(), "spec.phases.0.globalBatchSize", global_batch)
    document = with_value(document, "spec.phases.0.microBatchSize", micro)
    phase = parse_job(document).spec.phases[0]
    assert gradient_accumulation_steps(phase, world) == steps


def test_a_world_that_does_not_split_the_global_batch_is_refused():
    # An elastic job may run at a world size its spec was not checked for.
    document = with_value(valid_job(), "spec.phases.0.globalBatchSize", 64)
    phase = parse_job(with_value(document, "spec.phases.0.microBatchSize", 8)).spec.phases[0]
    with pytest.raises(
        ValueError, match="globalBatchSize 64 is not divisible by world size 3 x microBatchSize 8"
    ):
        gradient_accumulation_steps(phase, 3)


def test_export_and_log_paths_default_under_checkpoints():
    spec = with_defaults(parse_job(valid_job()).spec)
    assert (spec.export.path, spec.logging.path) == ("/data/checkpoints/hf", "/data/checkpoints/logs")
    chosen = with_value(valid_job(), "spec.logging", {"path": "/logs"})
    assert with_defaults(parse_job(chosen).spec).logging.path == "/logs"


def test_shards_default_to_four_unless_sized_by_megabytes():
    spec = parse_job(valid_job()).spec
    assert spec.data.num_shards is None and with_defaults(spec).data.num_shards == DEFAULT_NUM_SHARDS == 4
    sized = parse_job(with_value(valid_job(), "spec.data.maxShardMB", 64.0)).spec
    assert with_defaults(sized).data.num_shards is None
    assert with_defaults(sized).data.max_shard_mb == 64.0


@pytest.mark.parametrize("masked_lm_prob", [0.01, 0.15, 0.25, 0.3, 0.4, 0.5])
def test_masked_count_is_the_trainers(masked_lm_prob: float) -> None:
    """The validation's count of masked tokens is the trainer's masking's, ties (2.5 -> 2, 3.5 ->
    4) included: numpy rounds half to even as Python does."""
    import numpy as np

    from bertjob_api.defaults import masked_count

    lengths = np.arange(8, 1025)
    trainer = np.maximum(1, np.round(lengths * masked_lm_prob).astype(np.int64))
    assert [masked_count(int(n), masked_lm_prob) for n in lengths] == trainer.tolist()
