"""Hugging Face model directories: export of the model's weights with its vocabulary, a fill-mask
check of the export, and import of a Hugging Face BERT's config and weights for continued
pretraining.

The directory is what ``transformers.BertForPreTraining.from_pretrained`` (``BertForMaskedLM`` for
a model trained without NSP, whose weights have no pooler or NSP head) and
``AutoTokenizer.from_pretrained`` read: ``config.json``, ``model.safetensors``, ``vocab.txt``,
``tokenizer.json`` (when the vocabulary directory has one), ``tokenizer_config.json`` and
``special_tokens_map.json``. As ``save_pretrained`` does, the weights omit the MLM decoder's
weight and bias, which are tied to the word embeddings and ``cls.predictions.bias``.

Import reads ``config.json`` and ``model.safetensors`` (or, without it, ``pytorch_model.bin``)
as written by ``save_pretrained`` from ``BertForPreTraining``, ``BertForMaskedLM`` or
``BertModel``, and by transformers' early versions (``LayerNorm.gamma``/``beta``).

The module knows the model and the format, nothing of training: exporting a training checkpoint
(reading it, then :func:`save_hf`) is :func:`bertpretrain.training.export.export_hf`, and the
vocabulary's file names are the contract's (:mod:`bertjob_api.contract`), which the data stage
writes by.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Container, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

from bertjob_api.contract import TOKENIZER_FILE, VOCAB_FILE
from bertjob_api.files import DiskFullError, free_bytes, fsync_directory, is_disk_full
from bertpretrain.common import files
from bertpretrain.model.bert import BertForPreTraining
from bertpretrain.model.config import BertConfig, CheckpointError, read_config, shape_differences

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
PYTORCH_FILE = "pytorch_model.bin"
# Aliases in the state_dict (see BertLMPredictionHead), each of the tensor it is tied to.
_TIES = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}
# transformers' first versions kept the names of Google's TensorFlow checkpoints for LayerNorm.
_OLD_NAMES = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}
# Every checkpoint import accepts holds these; only the pooler and the heads may be absent.
_ENCODER_PREFIXES = ("bert.embeddings.", "bert.encoder.")
SPECIAL_TOKENS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


def save_hf(
    weights: Mapping[str, torch.Tensor], config: BertConfig, vocab_dir: Path, out_dir: Path, lowercase: bool
) -> Path:
    """Write a model's weights and config and the vocabulary of ``vocab_dir`` to ``out_dir``.

    ``weights`` is a ``BertForPreTraining`` state dict (the tied MLM decoder's entries are left
    out), its tensors on the CPU; without the NSP head (``objective: mlm``) the config names the
    architecture ``BertForMaskedLM``, whose weights they then are; they are written as they are
    (fp32 for every precision the trainer runs). ``lowercase`` is the tokenizer's ``do_lower_case``.
    The files are written and synced in a staging directory beside ``out_dir``
    (``.<name>.partial-<random>``), which then replaces it; the parent directory is synced after the
    rename. Directories and files get the modes the umask gives (0755 and 0644 under the usual 022).
    Exports to one ``out_dir`` take turns on the lock ``.<name>.lock`` beside it, and each removes
    the staging directories that killed exports left.

    Returns:
        ``out_dir``.

    Raises:
        FileNotFoundError: ``vocab_dir`` has no ``vocab.txt``.
        bertjob_api.files.DiskFullError: the export does not fit (naming ``out_dir``, the free
            space and the export's size); nothing of it is left.
    """
    vocab = vocab_dir / VOCAB_FILE
    if not vocab.is_file():
        raise FileNotFoundError(f"{vocab_dir}: no vocab.txt to export with the model")
    untied = {name: tensor.contiguous() for name, tensor in weights.items() if name not in _TIES}
    contents = {
        CONFIG_FILE: _json(config.to_hf_dict(architecture(weights))),
        SAFETENSORS_FILE: save(untied, metadata={"format": "pt"}),
        VOCAB_FILE: vocab.read_bytes(),
        "tokenizer_config.json": _json(_tokenizer_config(config, lowercase)),
        "special_tokens_map.json": _json(SPECIAL_TOKENS),
    }
    if (vocab_dir / TOKENIZER_FILE).is_file():
        contents[TOKENIZER_FILE] = (vocab_dir / TOKENIZER_FILE).read_bytes()
    return write_directory(out_dir, contents)


def architecture(weights: Container[str]) -> str:
    """The transformers class whose parameters ``weights`` (a state dict's names) are:
    ``BertForPreTraining`` with the NSP classifier, ``BertForMaskedLM`` without it."""
    return "BertForPreTraining" if "cls.seq_relationship.weight" in weights else "BertForMaskedLM"


def write_directory(out_dir: Path, contents: Mapping[str, bytes]) -> Path:
    """Make ``out_dir`` a directory of exactly the files ``contents`` names (name: bytes), replacing
    it whole: the files are written and synced in a staging directory beside it
    (``.<name>.partial-<random>``), which is then renamed to ``out_dir``, and the parent directory
    synced. Writers to one ``out_dir`` take turns on the lock ``.<name>.lock`` beside it, and each
    removes the staging directories that killed writers left (see :func:`clean_staging`).

    Returns:
        ``out_dir``.

    Raises:
        bertjob_api.files.DiskFullError: the files do not fit (naming ``out_dir``, the free
            space and their size); nothing of them is left.
    """
    with files.writing(out_dir.parent, _staging_names(out_dir), _lock_name(out_dir)):
        staging = _staging_dir(out_dir)
        try:
            for name, data in contents.items():
                files.write_file(staging / name, data)
            fsync_directory(staging)
            _replace_dir(staging, out_dir)
        except BaseException as error:
            shutil.rmtree(staging, ignore_errors=True)
            if is_disk_full(error):
                size = sum(len(data) for data in contents.values())
                raise DiskFullError(out_dir, free_bytes(out_dir.parent), size) from None
            raise
    return out_dir


def _lock_name(out_dir: Path) -> str:
    return f".{out_dir.name}.lock"


def _staging_names(out_dir: Path) -> re.Pattern[str]:
    """The names of the staging directories of exports to ``out_dir`` (``.<name>.partial-<hex>``;
    ``.<name>.<8 characters>`` from ``tempfile.mkdtemp`` in earlier versions) and of the old
    export moved aside (``.<name>.old``)."""
    return re.compile(rf"^\.{re.escape(out_dir.name)}\.(partial-[0-9a-f]{{8}}|[a-z0-9_]{{8}}|old)$")


def clean_staging(out_dir: Path) -> list[Path]:
    """Remove what killed exports to ``out_dir`` left beside it; nothing while an export to it
    runs (see :func:`bertpretrain.common.files.remove_stale`). Returns the paths removed."""
    return files.remove_stale(out_dir.parent, _staging_names(out_dir), _lock_name(out_dir))


def _staging_dir(out_dir: Path) -> Path:
    """A new, empty directory beside ``out_dir``, made with the mode the umask gives (unlike
    ``tempfile.mkdtemp``'s 0700)."""
    while True:
        staging = out_dir.with_name(f".{out_dir.name}.partial-{secrets.token_hex(4)}")
        try:
            staging.mkdir()
            return staging
        except FileExistsError:
            continue


def _tokenizer_config(config: BertConfig, lowercase: bool) -> dict[str, Any]:
    return {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": lowercase,
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "model_max_length": config.max_position_embeddings,
        **SPECIAL_TOKENS,
    }


def _json(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def _replace_dir(new: Path, target: Path) -> None:
    """Move directory ``new`` to ``target``, replacing it, and sync their parent directory."""
    # os.replace cannot overwrite a non-empty directory: move the old one aside first.
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(target, old)
        os.rename(new, target)
        fsync_directory(target.parent)
        shutil.rmtree(old)
    else:
        os.rename(new, target)
        fsync_directory(target.parent)


def fill_mask(export_dir: Path, text: str, top_k: int = 5) -> list[tuple[str, float]]:
    """The ``top_k`` tokens the exported model predicts for the one ``[MASK]`` in ``text``.

    Uses transformers' ``fill-mask`` pipeline (imported here: the trainer does not need it).

    Returns:
        ``(token, probability)`` pairs, most probable first.

    Raises:
        ValueError: ``text`` does not contain exactly one ``[MASK]``.
    """
    if text.count(SPECIAL_TOKENS["mask_token"]) != 1:
        raise ValueError(f"text must contain exactly one [MASK]: {text!r}")
    from transformers import pipeline
    from transformers.utils import logging as hf_logging

    # The pipeline loads the export as BertForMaskedLM, which has no pooler or NSP head; its load
    # report on those unused weights and its progress bar would only clutter the demo's output.
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        unmasker = pipeline("fill-mask", model=str(export_dir), tokenizer=str(export_dir), device="cpu")
        predictions = unmasker(text, top_k=top_k)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    return [(prediction["token_str"], float(prediction["score"])) for prediction in predictions]


def read_hf_config(hf_dir: Path) -> BertConfig:
    """Our config of the BERT whose transformers ``config.json`` is in ``hf_dir``
    (:meth:`BertConfig.from_hf_dict` of its contents).

    Raises:
        CheckpointError: naming ``config.json``, when it is missing or not JSON, or with
            :meth:`BertConfig.from_hf_dict`'s reason when it is not a config of our model.
    """
    return read_config(hf_dir / CONFIG_FILE, "a Hugging Face model directory has one")


def load_hf_weights(hf_dir: Path, model: BertForPreTraining) -> list[str]:
    """Copy the weights of the Hugging Face BERT in ``hf_dir`` into ``model``.

    Reads ``model.safetensors``, or ``pytorch_model.bin`` (a pickled ``state_dict``, loaded with
    ``torch.load(weights_only=True)``) when there is none; a sharded checkpoint is not read. The
    file may come from ``BertForPreTraining``, ``BertForMaskedLM`` (no pooler, no NSP head) or
    ``BertModel`` (names without the ``bert.`` prefix, no heads), and may use the old
    ``LayerNorm.gamma``/``beta`` names. Tensors of any floating dtype are cast to the model's
    parameters' dtype and device; tensors of other models (a fine-tuned classifier, the
    ``position_ids`` buffer of old checkpoints) are ignored. The MLM decoder's weight and bias
    need not be in the file: the model ties them to the word embeddings and
    ``cls.predictions.bias``.

    Returns:
        The names of the model's parameters that the file has no weights for and that keep their
        initialisation (the pooler, the NSP head or the MLM head), in the model's order.

    Raises:
        CheckpointError: naming the file, when ``config.json`` cannot be read (see
            :func:`read_hf_config`) or describes a model of another shape (naming each field that
            differs: ``vocab_size``, ``hidden_size``, ``num_hidden_layers``,
            ``num_attention_heads``, ``intermediate_size``, ``max_position_embeddings``,
            ``type_vocab_size``); when there is no weights file or it cannot be read; when a
            tensor has another shape than the model's (naming the tensor), none of its names is a
            BERT parameter's, the embeddings or an encoder layer are incomplete, or a copy of a
            tied tensor differs from the tensor it is tied to (an untied checkpoint).
    """
    differences = shape_differences(read_hf_config(hf_dir), model.config)
    if differences:
        raise CheckpointError(f"{hf_dir / CONFIG_FILE}: a model of another shape: {', '.join(differences)}")
    path, weights = _read_weights(hf_dir)
    return load_weights(path, weights, model, our_name)


def load_weights(
    path: Path,
    weights: Mapping[str, torch.Tensor],
    model: BertForPreTraining,
    rename: Callable[[str, Container[str]], str | None],
) -> list[str]:
    """Copy ``weights`` (a state dict read from ``path``, in another model's names) into ``model``.

    ``rename(key, ours)`` is the name in our state dict (whose names are ``ours``) of the file's
    ``key``, or None for a tensor our model has no use for. Tensors are cast to the model's
    parameters' dtype and device. A copy of a tied tensor (the MLM decoder's weight or bias) is
    checked against the tensor it is tied to, not loaded.

    Returns:
        The names of the model's parameters that ``weights`` has nothing for and that keep their
        initialisation (the pooler or the heads), in the model's order.

    Raises:
        CheckpointError: naming ``path``, when a tensor has another shape than the model's (naming
            the file's key and ours), none of the keys is a parameter's, the embeddings or an
            encoder layer are incomplete, or a copy of a tied tensor differs from the tensor it is
            tied to (an untied checkpoint).
    """
    ours = model.state_dict()
    loaded: dict[str, torch.Tensor] = {}
    for key, tensor in weights.items():
        name = rename(key, ours.keys())
        if name is None:
            continue
        if tensor.shape != ours[name].shape:
            raise CheckpointError(
                f"{path}: {key} has shape {list(tensor.shape)}, the model's {name} {list(ours[name].shape)}"
            )
        loaded[name] = tensor
    if not loaded:
        raise CheckpointError(
            f"{path}: none of its {len(weights)} tensors is named as a parameter of BertForPreTraining, "
            "BertForMaskedLM or BertModel"
        )
    # The aliases are the very parameters they are tied to, so loading those fills them; a copy
    # in the file is only checked, since our model cannot hold a decoder of its own.
    for tied, source in _TIES.items():
        copy = loaded.pop(tied, None)
        if copy is not None and source in loaded and not torch.equal(copy, loaded[source]):
            raise CheckpointError(
                f"{path}: {tied} differs from {source}, which the model ties it to (an untied checkpoint)"
            )
    missing = set(model.load_state_dict(loaded, strict=False).missing_keys)
    kept = [name for name, _ in model.named_parameters() if name in missing]
    incomplete = [name for name in kept if name.startswith(_ENCODER_PREFIXES)]
    if incomplete:
        raise CheckpointError(f"{path}: no weights for {', '.join(incomplete)}")
    return kept


def _read_weights(hf_dir: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """The weights file of ``hf_dir`` and its tensors, on the CPU."""
    safetensors = hf_dir / SAFETENSORS_FILE
    path = safetensors if safetensors.is_file() else hf_dir / PYTORCH_FILE
    if not path.is_file():
        raise CheckpointError(f"{hf_dir}: neither {SAFETENSORS_FILE} nor {PYTORCH_FILE} to load weights from")
    try:
        weights = (
            load_file(path)
            if path == safetensors
            else torch.load(path, map_location="cpu", weights_only=True)
        )
    except Exception as error:  # safetensors and torch.load raise their own or bare errors
        raise CheckpointError(f"{path}: not a readable weights file ({error})") from None
    if not isinstance(weights, dict) or not all(
        isinstance(value, torch.Tensor) for value in weights.values()
    ):
        raise CheckpointError(f"{path}: not a state_dict (a mapping of names to tensors)")
    return path, weights


def our_name(key: str, ours: Container[str]) -> str | None:
    """The name in our ``state_dict`` (whose names are ``ours``) of a Hugging Face checkpoint's
    ``key`` (old ``LayerNorm.gamma``/``beta`` names and ``BertModel``'s names without ``bert.``
    included); None when it names none of our parameters."""
    for old, new in _OLD_NAMES.items():
        if key.endswith(old):
            key = key.removesuffix(old) + new
    # BertModel's checkpoints name the encoder without BertForPreTraining's "bert." prefix.
    for name in (key, f"bert.{key}"):
        if name in ours:
            return name
    return None
