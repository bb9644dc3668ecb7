"""The trained model as a Hugging Face model directory, and a fill-mask check of it.

The directory is what ``transformers.BertForPreTraining.from_pretrained`` and
``AutoTokenizer.from_pretrained`` read: ``config.json``, ``model.safetensors``, ``vocab.txt``,
``tokenizer.json`` (when the vocabulary directory has one), ``tokenizer_config.json`` and
``special_tokens_map.json``. As ``save_pretrained`` does, the weights omit the MLM decoder's
weight and bias, which are tied to the word embeddings and ``cls.predictions.bias``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from bertpretrain.checkpoint import read_checkpoint
from bertpretrain.model import BertConfig
from bertpretrain.vocab import TOKENIZER_FILE, VOCAB_FILE

# Aliases of other tensors in the state_dict (see BertLMPredictionHead).
_TIED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
SPECIAL_TOKENS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


def export_hf(checkpoint: Path, vocab_dir: Path, out_dir: Path, lowercase: bool) -> Path:
    """Write the model of ``checkpoint`` and the vocabulary of ``vocab_dir`` to ``out_dir``.

    The files are written to a temporary directory beside ``out_dir`` that then replaces it.

    Returns:
        ``out_dir``.

    Raises:
        bertpretrain.checkpoint.CheckpointError: the checkpoint cannot be read.
        FileNotFoundError: ``vocab_dir`` has no ``vocab.txt``.
    """
    state = read_checkpoint(checkpoint)
    config = BertConfig(**state["config"])
    vocab = vocab_dir / VOCAB_FILE
    if not vocab.is_file():
        raise FileNotFoundError(f"{vocab_dir}: no vocab.txt to export with the model")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        _write_json(staging / "config.json", config.to_hf_dict())
        weights = {
            name: tensor.contiguous() for name, tensor in state["model"].items() if name not in _TIED_KEYS
        }
        save_file(weights, staging / "model.safetensors", metadata={"format": "pt"})
        shutil.copyfile(vocab, staging / VOCAB_FILE)
        if (vocab_dir / TOKENIZER_FILE).is_file():
            shutil.copyfile(vocab_dir / TOKENIZER_FILE, staging / TOKENIZER_FILE)
        _write_json(staging / "tokenizer_config.json", _tokenizer_config(config, lowercase))
        _write_json(staging / "special_tokens_map.json", SPECIAL_TOKENS)
        _replace_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def _tokenizer_config(config: BertConfig, lowercase: bool) -> dict[str, Any]:
    return {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": lowercase,
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "model_max_length": config.max_position_embeddings,
        **SPECIAL_TOKENS,
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _replace_dir(new: Path, target: Path) -> None:
    # os.replace cannot overwrite a non-empty directory: move the old one aside first.
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
        new.rename(target)
        shutil.rmtree(old)
    else:
        new.rename(target)


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
