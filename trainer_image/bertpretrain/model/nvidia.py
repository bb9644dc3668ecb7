"""NVIDIA DeepLearningExamples' BERT checkpoints (PyTorch/LanguageModeling/BERT): import for
continued pretraining, and export for NVIDIA's fine-tuning scripts.

Their format, as their ``modeling.py``, ``run_pretraining.py`` and ``run_squad.py`` write and read
it:

- ``ckpt_<step>.pt``: a pickled dict whose ``model`` entry is the ``state_dict`` of their
  ``BertForPreTraining`` (``run_pretraining.py`` adds the optimizer, the data files and the
  phase beside it; the fine-tuning scripts read ``model`` alone, with ``strict=False``).
  The parameter names are Hugging Face's, but for the three linear layers that NVIDIA fuses with
  their activation (``LinearActivation``): ``intermediate.dense_act``, ``pooler.dense_act`` and
  ``cls.predictions.transform.dense_act`` for our ``dense``. The MLM decoder has no bias of its
  own (``cls.predictions.bias`` is added after it) and its weight, tied to the word embeddings,
  appears in the state dict. A model saved from inside ``DistributedDataParallel`` has every
  name prefixed by ``module.``; converted TensorFlow checkpoints may name LayerNorm's parameters
  ``gamma`` and ``beta``.
- ``bert_config.json``: Google's BERT config fields (``vocab_size``, ``hidden_size``, ...,
  ``hidden_act``), read by their ``BertConfig.from_json_file``; no ``model_type``.
- The vocabulary: every NVIDIA script pads ``vocab_size`` up to a multiple of 8 before building
  the model, so the word embeddings, the decoder and ``cls.predictions.bias`` have
  ``ceil(vocab_size / 8) * 8`` rows although ``bert_config.json`` and ``vocab.txt`` say
  ``vocab_size`` (30522 tokens, 30528 rows for BERT's uncased vocabulary). The extra rows belong
  to no token.

Import (:func:`load_nvidia_weights`) maps the names to ours and drops padding rows that our
model's vocabulary does not have; export (:func:`save_nvidia`) maps ours to NVIDIA's and pads the
vocabulary's rows with zeros to a multiple of 8, so that ``run_squad.py``'s padded model loads
the file. The files are written as :func:`bertpretrain.model.huggingface.write_directory` writes
a directory: staged beside it, then renamed into place.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Container, Mapping
from pathlib import Path
from typing import Any, TypeGuard

import torch

from bertjob_api.contract import VOCAB_FILE
from bertpretrain.model.bert import BertForPreTraining
from bertpretrain.model.config import BertConfig, CheckpointError, read_config, shape_differences
from bertpretrain.model.huggingface import load_weights, our_name, write_directory

CONFIG_FILE = "bert_config.json"
CHECKPOINT_NAME = re.compile(r"^ckpt_(\d+)\.pt$")
# NVIDIA's scripts pad the vocabulary's rows to a multiple of this (for tensor cores).
VOCAB_MULTIPLE = 8
# NVIDIA's LayerNorm epsilon: fixed in their modeling.py, not a config field.
LAYER_NORM_EPS = 1e-12
DDP_PREFIX = "module."
# Our names of the linear layers NVIDIA fuses with their activation, and the fused name's part.
_FUSED = re.compile(r"(\.intermediate|\.pooler|^cls\.predictions\.transform)\.dense\.")
_NVIDIA_FUSED = re.compile(r"(\.intermediate|\.pooler|^cls\.predictions\.transform)\.dense_act\.")
# Our MLM decoder's bias is an alias of cls.predictions.bias; NVIDIA's decoder has none.
_DECODER_BIAS = "cls.predictions.decoder.bias"
# The tensors with a row per token (NVIDIA's names after the prefix is stripped; ours too).
_VOCAB_ROWS = (
    "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.weight",
    "cls.predictions.bias",
)
_EMBEDDINGS = "embeddings.word_embeddings.weight"
# pytorch-pretrained-BERT's and NVIDIA's from_pretrained weights file, beside bert_config.json.
LEGACY_WEIGHTS_FILE = "pytorch_model.bin"
# The fields of NVIDIA's BertConfig that bert_config.json holds.
_CONFIG_FIELDS = (
    "attention_probs_dropout_prob",
    "hidden_dropout_prob",
    "hidden_size",
    "initializer_range",
    "intermediate_size",
    "max_position_embeddings",
    "num_attention_heads",
    "num_hidden_layers",
    "type_vocab_size",
    "vocab_size",
)


def padded_vocab_size(vocab_size: int) -> int:
    """``vocab_size`` rounded up to a multiple of 8, as NVIDIA's scripts size the model."""
    return -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def checkpoint_name(step: int) -> str:
    """``ckpt_<step>.pt``, the name ``run_pretraining.py`` gives its checkpoints (and looks for when
    resuming)."""
    return f"ckpt_{step}.pt"


def is_nvidia_state_dict(weights: object) -> TypeGuard[Mapping[str, torch.Tensor]]:
    """Whether ``weights`` is a state dict in NVIDIA's names: a mapping of names to tensors with at
    least one fused ``dense_act`` layer (every BERT NVIDIA's ``modeling.py`` builds has one in each
    encoder layer)."""
    return (
        isinstance(weights, Mapping)
        and bool(weights)
        and all(isinstance(key, str) and isinstance(value, torch.Tensor) for key, value in weights.items())
        and any(".dense_act." in key for key in weights)
    )


def is_bert_state_dict(weights: object) -> TypeGuard[Mapping[str, torch.Tensor]]:
    """Whether ``weights`` is a mapping of names to tensors with a BERT's word embeddings
    (``[module.][bert.]embeddings.word_embeddings.weight``): a state dict in Hugging Face's names,
    as pytorch-pretrained-BERT saved them beside a ``bert_config.json``, or in NVIDIA's."""
    return (
        isinstance(weights, Mapping)
        and all(isinstance(key, str) and isinstance(value, torch.Tensor) for key, value in weights.items())
        and any(strip_ddp_prefix(key).endswith(_EMBEDDINGS) for key in weights)
    )


def strip_ddp_prefix(key: str) -> str:
    """``key`` without the ``module.`` prefixes that wrappers (DDP, DataParallel, apex's DDP) add."""
    while key.startswith(DDP_PREFIX):
        key = key.removeprefix(DDP_PREFIX)
    return key


def nvidia_to_ours(key: str, ours: Container[str]) -> str | None:
    """The name in our state dict (whose names are ``ours``) of NVIDIA's parameter ``key``; None
    for a tensor our model has no parameter for (a fine-tuning head)."""
    key = _NVIDIA_FUSED.sub(r"\1.dense.", strip_ddp_prefix(key))
    return our_name(key, ours)


def ours_to_nvidia(name: str) -> str | None:
    """NVIDIA's name of our parameter ``name``; None for our MLM decoder's bias, which NVIDIA's
    model has not (it adds ``cls.predictions.bias`` itself, as ours does through the alias)."""
    if name == _DECODER_BIAS:
        return None
    return _FUSED.sub(r"\1.dense_act.", name)


def to_nvidia(weights: Mapping[str, torch.Tensor], vocab_size: int) -> dict[str, torch.Tensor]:
    """Our state dict (``BertForPreTraining``'s, ``vocab_size`` tokens) in NVIDIA's names, with the
    vocabulary's rows padded with zeros to a multiple of 8.

    The padding rows belong to no token of ``vocab.txt``, so no input uses their embedding; the
    MLM scores over them (0 before the bias, whose padding is 0 too) are never a label, and
    NVIDIA's own padding rows are likewise trained only to score low. The decoder's weight is the
    same tensor as the word embeddings, as in NVIDIA's tied model, so ``torch.save`` stores it once.

    Returns:
        NVIDIA's names mapped to contiguous tensors, in our state dict's order.
    """
    rows = padded_vocab_size(vocab_size)
    out: dict[str, torch.Tensor] = {}
    embeddings = _pad_rows(weights[_VOCAB_ROWS[0]], rows)
    for name, tensor in weights.items():
        nvidia = ours_to_nvidia(name)
        if nvidia is None:
            continue
        if name in _VOCAB_ROWS:
            out[nvidia] = embeddings if name != "cls.predictions.bias" else _pad_rows(tensor, rows)
        else:
            out[nvidia] = tensor.contiguous()
    return out


def _pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """``tensor`` with zero rows appended up to ``rows`` rows."""
    padding = tensor.new_zeros((rows - tensor.shape[0], *tensor.shape[1:]))
    return torch.cat([tensor, padding]).contiguous()


def config_to_nvidia(config: BertConfig) -> dict[str, Any]:
    """The ``bert_config.json`` of ``config``: NVIDIA's fields, ``vocab_size`` unpadded (NVIDIA's
    scripts pad it themselves), ``hidden_act`` ``gelu``.

    Raises:
        ValueError: ``config.layer_norm_eps`` is not NVIDIA's fixed 1e-12.
    """
    if config.layer_norm_eps != LAYER_NORM_EPS:
        raise ValueError(
            f"layer_norm_eps {config.layer_norm_eps}: NVIDIA's model fixes it at {LAYER_NORM_EPS}"
        )
    fields = config.to_dict()
    return {"hidden_act": "gelu", **{name: fields[name] for name in _CONFIG_FIELDS}}


def read_nvidia_config(path: Path) -> BertConfig:
    """Our config of the BERT an NVIDIA ``bert_config.json`` at ``path`` describes (its
    ``vocab_size`` as written, which may be the unpadded size).

    Raises:
        CheckpointError: naming ``path``, when it is missing, not JSON, or not a config of our model
            (see :meth:`BertConfig.from_hf_dict`).
    """
    return read_config(path, "NVIDIA's checkpoints need their bert_config.json beside them")


def find_nvidia_checkpoint(directory: Path) -> Path | None:
    """The ``ckpt_<step>.pt`` with the highest step in ``directory`` (the one ``run_pretraining.py``
    resumes from); else its ``pytorch_model.bin`` (what ``from_pretrained`` reads beside
    ``bert_config.json``); else None."""
    found = [
        (int(match[1]), path) for path in directory.iterdir() if (match := CHECKPOINT_NAME.match(path.name))
    ]
    if found:
        return max(found)[1]
    legacy = directory / LEGACY_WEIGHTS_FILE
    return legacy if legacy.is_file() else None


def load_nvidia_weights(
    path: Path, weights: Mapping[str, torch.Tensor], model: BertForPreTraining, config_file: Path
) -> list[str]:
    """Copy the NVIDIA state dict ``weights`` (the ``model`` entry of the checkpoint ``path``, or
    the file itself) into ``model``; ``config_file`` is its ``bert_config.json``. A state dict in
    Hugging Face's names (pytorch-pretrained-BERT's ``pytorch_model.bin``) loads the same way.

    Names may carry ``module.`` prefixes and LayerNorm's ``gamma``/``beta``; the decoder's weight
    may be in the file (it must then equal the word embeddings) or not. Rows of the vocabulary's
    tensors beyond ``model``'s vocabulary are dropped when they are NVIDIA's padding: the file has
    ``ceil(V / 8) * 8`` rows for the model's ``V`` tokens, and ``bert_config.json`` says ``V`` or
    that padded size. Tensors of fine-tuning heads are ignored.

    Returns:
        The model's parameters the file has no weights for (they keep their initialisation).

    Raises:
        CheckpointError: naming the file, when ``bert_config.json`` cannot be read or describes a
            model of another shape (each field that differs), the vocabulary's rows fit neither the
            model's vocabulary nor its padding, or the tensors do not fit (see
            :func:`bertpretrain.model.huggingface.load_weights`).
    """
    found = read_nvidia_config(config_file)
    vocab_size = model.config.vocab_size
    stripped = {strip_ddp_prefix(key): (key, tensor) for key, tensor in weights.items()}
    embeddings = stripped.get(_VOCAB_ROWS[0])
    rows = embeddings[1].shape[0] if embeddings is not None else found.vocab_size
    padding = rows == padded_vocab_size(vocab_size) and found.vocab_size in (vocab_size, rows)
    if rows != vocab_size and not padding:
        raise CheckpointError(
            f"{path}: vocab_size {found.vocab_size} in {config_file.name}, {rows} rows in "
            f"{_VOCAB_ROWS[0]} (the model has {vocab_size} tokens, padded to a multiple of 8: "
            f"{padded_vocab_size(vocab_size)})"
        )
    differences = shape_differences(found, model.config)
    differences = [line for line in differences if not line.startswith("vocab_size ")]
    if differences:
        raise CheckpointError(f"{config_file}: a model of another shape: {', '.join(differences)}")
    trimmed = {
        key: tensor[:vocab_size] if name in _VOCAB_ROWS and tensor.shape[:1] == (rows,) else tensor
        for name, (key, tensor) in stripped.items()
    }
    return load_weights(path, trimmed, model, nvidia_to_ours)


def save_nvidia(
    weights: Mapping[str, torch.Tensor], config: BertConfig, vocab_dir: Path, out_dir: Path, step: int
) -> Path:
    """Write ``out_dir`` as NVIDIA's fine-tuning scripts read a pretrained model:
    ``ckpt_<step>.pt`` (``{"model": state dict}`` in NVIDIA's names, vocabulary padded to a
    multiple of 8, see :func:`to_nvidia`), ``bert_config.json`` (:func:`config_to_nvidia`) and
    ``vocab.txt`` from ``vocab_dir``.

    ``weights`` is our ``BertForPreTraining`` state dict, on the CPU; ``step`` the optimizer step
    it was saved after. ``out_dir`` is replaced whole, as
    :func:`bertpretrain.model.huggingface.write_directory` does (a reader never sees half of it).

    Returns:
        ``out_dir``.

    Raises:
        FileNotFoundError: ``vocab_dir`` has no ``vocab.txt``.
        ValueError: see :func:`config_to_nvidia`.
        bertjob_api.files.DiskFullError: the files do not fit; nothing of them is left.
    """
    vocab = vocab_dir / VOCAB_FILE
    if not vocab.is_file():
        raise FileNotFoundError(f"{vocab_dir}: no vocab.txt to export with the model")
    checkpoint = io.BytesIO()
    torch.save({"model": to_nvidia(weights, config.vocab_size)}, checkpoint)
    contents = {
        checkpoint_name(step): checkpoint.getvalue(),
        CONFIG_FILE: (json.dumps(config_to_nvidia(config), indent=2, sort_keys=True) + "\n").encode(),
        VOCAB_FILE: vocab.read_bytes(),
    }
    return write_directory(out_dir, contents)
