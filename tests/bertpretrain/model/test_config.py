"""The model's config: built from the job's model spec, compared by shape, and read and written as
transformers' ``config.json``."""

from __future__ import annotations

import dataclasses

import pytest
import transformers

from bertjob_api.defaults import MODEL_PRESETS, ModelDims, resolve_model
from bertjob_api.spec import ModelSpec
from bertpretrain.model.config import BertConfig, shape_differences


def test_from_dims_carries_every_dimension_of_the_spec() -> None:
    dims = resolve_model(ModelSpec(preset="bert-mini", max_position_embeddings=128, hidden_dropout_prob=0.0))
    config = BertConfig.from_dims(dims, vocab_size=1000)
    for field in dataclasses.fields(ModelDims):
        assert getattr(config, field.name) == getattr(dims, field.name), field.name
    assert config.vocab_size == 1000
    assert (config.layer_norm_eps, config.type_vocab_size, config.initializer_range) == (1e-12, 2, 0.02)


def test_the_dimensions_are_declared_once_by_the_api() -> None:
    # BertConfig extends ModelDims: a dimension the API adds is the model's, under the same name.
    assert issubclass(BertConfig, ModelDims)
    dims = [field.name for field in dataclasses.fields(ModelDims)]
    assert [field.name for field in dataclasses.fields(BertConfig)][: len(dims)] == dims
    assert set(BertConfig.__annotations__).isdisjoint(dims)


def test_fields_keep_the_order_of_checkpoints_written_before() -> None:
    # The order the config had when it extended ModelDims, which checkpoints' "config" holds.
    assert list(BertConfig.from_dims(MODEL_PRESETS["bert-tiny"], 100).to_dict()) == [
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
        "vocab_size",
        "layer_norm_eps",
        "type_vocab_size",
        "initializer_range",
    ]


def test_config_is_frozen(tiny_config: BertConfig) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny_config.hidden_size = 64  # type: ignore[misc]


def test_config_round_trips_through_transformers(tiny_config: BertConfig) -> None:
    hf = transformers.BertConfig(**tiny_config.to_hf_dict())
    for name, value in tiny_config.to_dict().items():
        assert getattr(hf, name) == value, name
    assert hf.hidden_act == "gelu"
    assert hf.model_type == "bert"


def test_config_rejects_heads_that_do_not_divide_hidden(tiny_config: BertConfig) -> None:
    with pytest.raises(ValueError, match="num_attention_heads 3"):
        BertConfig(**{**tiny_config.to_dict(), "num_attention_heads": 3})


def test_hf_dict_reads_back_as_the_same_config(tiny_config: BertConfig) -> None:
    assert BertConfig.from_hf_dict(tiny_config.to_hf_dict()) == tiny_config
    assert (
        BertConfig.from_hf_dict(transformers.BertConfig(**tiny_config.to_hf_dict()).to_dict()) == tiny_config
    )


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ([1, 2], "not a config (a JSON object)"),
        ({"model_type": "roberta"}, "model_type is 'roberta', not a BERT"),
        ({"hidden_act": "gelu_new"}, "hidden_act 'gelu_new' (the model implements 'gelu')"),
        ({"hidden_size": 32}, "not a BERT config ("),
    ],
)
def test_hf_dict_that_is_not_our_bert_says_why(data: object, reason: str) -> None:
    with pytest.raises(ValueError) as raised:
        BertConfig.from_hf_dict(data)
    assert reason in str(raised.value)


def test_shape_differences_name_shape_fields_only(tiny_config: BertConfig) -> None:
    other = dataclasses.replace(tiny_config, hidden_size=64, intermediate_size=128, hidden_dropout_prob=0.0)
    assert shape_differences(other, tiny_config) == [
        "hidden_size 64 (the model has 32)",
        "intermediate_size 128 (the model has 64)",
    ]
    assert shape_differences(tiny_config, tiny_config) == []
