"""The Hugging Face export: transformers loads it cleanly and computes what our model computes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
import torch
import transformers

from bertpretrain.checkpoint import save_checkpoint
from bertpretrain.export import export_hf, fill_mask
from bertpretrain.model import BertConfig, BertForPreTraining
from bertpretrain.optimizer import Lamb
from bertpretrain.schedule import poly_warmup_schedule

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def trained(tmp_path: Path, tiny_config: BertConfig) -> tuple[BertForPreTraining, Path]:
    """A model with non-trivial weights (biases included) and its checkpoint."""
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    optimizer = Lamb(model.parameters())
    path = save_checkpoint(
        tmp_path / "checkpoints",
        0,
        7,
        model=model,
        optimizer=optimizer,
        scheduler=poly_warmup_schedule(optimizer, 10, 0.1),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        keep=1,
    )
    return model.eval(), path


def test_files(trained: tuple[BertForPreTraining, Path], vocab_dir: Path, tmp_path: Path) -> None:
    out = export_hf(trained[1], vocab_dir, tmp_path / "hf", lowercase=True)
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForPreTraining"]
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is True
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".hf")]  # no staging left behind


def test_transformers_loads_it_without_missing_keys_and_agrees(
    trained: tuple[BertForPreTraining, Path], vocab_dir: Path, tmp_path: Path
) -> None:
    model, checkpoint = trained
    out = export_hf(checkpoint, vocab_dir, tmp_path / "hf", lowercase=True)
    loaded, info = cast(
        tuple[transformers.BertForPreTraining, dict[str, Any]],
        transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True),
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert not info["error_msgs"]
    loaded.eval()
    assert (
        loaded.cls.predictions.decoder.weight.data_ptr()
        == loaded.bert.embeddings.word_embeddings.weight.data_ptr()
    )

    ids = torch.randint(5, model.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    types = (torch.arange(20) >= 8).long().expand(2, -1) * mask
    with torch.no_grad():
        mlm, nsp = model(ids, types, mask)
        expected = loaded(input_ids=ids, token_type_ids=types, attention_mask=mask)
    assert (mlm - expected.prediction_logits).abs().max() <= 1e-4
    assert (nsp - expected.seq_relationship_logits).abs().max() <= 1e-4


def test_tokenizer_and_fill_mask(
    trained: tuple[BertForPreTraining, Path], vocab_dir: Path, tmp_path: Path
) -> None:
    out = export_hf(trained[1], vocab_dir, tmp_path / "hf", lowercase=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    encoded = tokenizer("The cat", "was here")
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and "the" in tokens
    assert tokenizer.mask_token == "[MASK]" and tokenizer.mask_token_id == 4

    predictions = fill_mask(out, "the [MASK] was here .", top_k=3)
    assert len(predictions) == 3
    assert all(isinstance(token, str) and 0.0 <= score <= 1.0 for token, score in predictions)
    assert [score for _, score in predictions] == sorted((score for _, score in predictions), reverse=True)


def test_export_replaces_an_earlier_one(
    trained: tuple[BertForPreTraining, Path], vocab_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "hf"
    out.mkdir()
    (out / "stale.bin").write_bytes(b"old")
    export_hf(trained[1], vocab_dir, out, lowercase=False)
    assert not (out / "stale.bin").exists()
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is False


def test_errors(trained: tuple[BertForPreTraining, Path], tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no vocab\.txt"):
        export_hf(trained[1], tmp_path, tmp_path / "hf", lowercase=True)
    with pytest.raises(ValueError, match="exactly one"):
        fill_mask(tmp_path, "no mask here")
