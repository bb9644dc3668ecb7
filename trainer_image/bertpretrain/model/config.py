"""The BERT's config: its shape and constants, how it is built from the job's model spec, how two
configs' shapes are compared, and its Hugging Face ``config.json`` form, out and in.

As transformers keeps ``BertConfig`` in ``configuration_bert.py`` apart from ``modeling_bert.py``,
the model owns its config here; the field names are transformers' own, so that ``config.json``
and our checkpoints say the same thing in the same words. The presets (``bert-tiny`` to
``bert-large``) and the resolution of a spec's overrides stay in the job API
(:data:`bertjob_api.defaults.MODEL_PRESETS`, :func:`bertjob_api.defaults.resolve_model`): the API's
validation needs a job's dimensions to reject it (heads that do not divide the hidden size) before
any trainer runs, and the API imports no trainer code. :meth:`BertConfig.from_dims` builds the
config from what ``resolve_model`` returns and the vocabulary's size, which only the data stage
knows.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertjob_api.defaults import ModelDims

# The [PAD] token's id: the first entry of every vocabulary the data stage writes.
PAD_TOKEN_ID = 0
# Fields that fix the parameters' shapes; dropout may differ between saved weights and a model.
SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)
# Settings of transformers' BertConfig that change what the model computes, each with the one
# value our model implements, which is also transformers' default when config.json omits it.
HF_IMPLEMENTED = {
    "hidden_act": "gelu",
    "position_embedding_type": "absolute",
    "is_decoder": False,
    "add_cross_attention": False,
    "tie_word_embeddings": True,
}


class CheckpointError(ValueError):
    """Saved weights (a training checkpoint, a Hugging Face model directory) that cannot be read or
    do not fit the model; the message names the file."""


# The job's dimensions are the API's ModelDims, whose field names are transformers' own: this
# class extends it, so that its fields come first, then the vocabulary's size and the constants
# (the order of a checkpoint's config), and a dimension the API adds is the model's too.
@dataclass(frozen=True, kw_only=True)
class BertConfig(ModelDims):
    """A BERT's shape (the job's dimensions, :class:`bertjob_api.defaults.ModelDims`, and the
    vocabulary's size) and its initialisation and regularisation constants, under transformers'
    names. Its own fields are keyword-only.

    Raises:
        ValueError: ``hidden_size`` is not a multiple of ``num_attention_heads``.
    """

    vocab_size: int
    layer_norm_eps: float = 1e-12
    type_vocab_size: int = 2
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )

    @classmethod
    def from_dims(cls, dims: ModelDims, vocab_size: int) -> BertConfig:
        """The config of a model with the job's dimensions (``resolve_model(spec.model)``) and the
        vocabulary's size; the constants take their defaults.

        Raises:
            ValueError: see the class.
        """
        return cls(vocab_size=vocab_size, **dataclasses.asdict(dims))

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain Python values (for checkpoints)."""
        return dataclasses.asdict(self)

    def to_hf_dict(self, architecture: str = "BertForPreTraining") -> dict[str, Any]:
        """A ``config.json`` that ``transformers.BertConfig`` reads as this same model, saying that
        its weights are ``architecture``'s (``BertForPreTraining`` or ``BertForMaskedLM``)."""
        return {
            "architectures": [architecture],
            "model_type": "bert",
            **self.to_dict(),
            "hidden_act": "gelu",
            "pad_token_id": PAD_TOKEN_ID,
            "position_embedding_type": "absolute",
            "tie_word_embeddings": True,
            "classifier_dropout": None,
            "dtype": "float32",
        }

    @classmethod
    def from_hf_dict(cls, data: object) -> BertConfig:
        """Our config of the BERT a transformers ``config.json`` (parsed) describes.

        Fields absent from ``data`` take transformers' defaults, which are ours; fields we have no
        use for are ignored. Data without ``model_type`` is read as a BERT: Google's
        ``bert_config.json`` and the early Hugging Face configs (BioBERT's among them) have none.

        Raises:
            ValueError: with the reason and no file name, when ``data`` is not a JSON object, is of
                another ``model_type`` than ``"bert"``, lacks a field without a default
                (``vocab_size``, ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
                ``intermediate_size``), fails the class's check, or sets something our model does
                not implement (see ``HF_IMPLEMENTED``: a ``hidden_act`` other than exact ``gelu``,
                relative position embeddings, a decoder, untied word embeddings).
        """
        if not isinstance(data, Mapping):
            raise ValueError("not a config (a JSON object)")
        if data.get("model_type", "bert") != "bert":
            raise ValueError(f"model_type is {data['model_type']!r}, not a BERT")
        unsupported = [
            f"{name} {data[name]!r} (the model implements {value!r})"
            for name, value in HF_IMPLEMENTED.items()
            if name in data and data[name] != value
        ]
        if unsupported:
            raise ValueError(f"a BERT variant the model does not implement: {', '.join(unsupported)}")
        names = {field.name for field in dataclasses.fields(cls)}
        try:
            return cls(**{name: value for name, value in data.items() if name in names})
        except (TypeError, ValueError) as error:
            raise ValueError(f"not a BERT config ({error})") from None


def read_config(path: Path, missing: str) -> BertConfig:
    """Our config of the BERT that the JSON file at ``path`` describes in transformers' keys
    (:meth:`BertConfig.from_hf_dict`): a Hugging Face ``config.json`` or NVIDIA's
    ``bert_config.json``. ``missing``: why the file should be there, for the error.

    Raises:
        CheckpointError: naming ``path``, when it is missing, not JSON, or not a config of our model.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file ({missing})") from None
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: not a readable JSON file ({error})") from None
    try:
        return BertConfig.from_hf_dict(data)
    except ValueError as error:
        raise CheckpointError(f"{path}: {error}") from None


def shape_differences(found: BertConfig, model: BertConfig) -> list[str]:
    """``"<field> <found> (the model has <model's>)"`` for each of ``SHAPE_FIELDS`` that differs
    between the config of saved weights (``found``) and the model's; empty when the weights fit."""
    return [
        f"{name} {getattr(found, name)} (the model has {getattr(model, name)})"
        for name in SHAPE_FIELDS
        if getattr(found, name) != getattr(model, name)
    ]
