"""The model of ``objective: mlm``: masked LM alone, no pooler or NSP head.

It trains without an NSP term (every parameter it has gets a gradient, none is NSP's), exports a
``BertForMaskedLM`` that transformers loads with nothing missing or left over and that computes our
logits, and a fine-tuned classifier started from it has the pooler of a fresh initialisation
(transformers' behaviour when ``BertForSequenceClassification`` loads a ``BertForMaskedLM``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from bertjob_api.spec import FinetuneTaskSpec
from bertpretrain.finetune.train import build_model
from bertpretrain.model.bert import BertForPreTraining, pretraining_loss
from bertpretrain.model.config import BertConfig
from bertpretrain.training.accuracy import StepStatistics, prediction_counts
from bertpretrain.training.checkpoint import load_initial_weights, save_checkpoint
from bertpretrain.training.export import export_hf, export_nvidia

pytestmark = pytest.mark.usefixtures("one_thread")

TOLERANCE = 1e-5  # fp32 on the CPU: only the order of float operations differs
NSP_PARTS = ("bert.pooler.", "cls.seq_relationship.")


def _mlm_model(config: BertConfig, seed: int = 0) -> BertForPreTraining:
    torch.manual_seed(seed)
    model = BertForPreTraining(config, next_sentence_prediction=False)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # off the initialisation, so that a misplaced weight shows
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn(parameter.shape, generator=generator))
    return model


def _save(model: BertForPreTraining, root: Path) -> Path:
    optimizer = torch.optim.AdamW(model.parameters())
    return save_checkpoint(
        root,
        0,
        5,
        model=model,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        keep=1,
    )


def _batch(vocab_size: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(5, vocab_size, (3, 16), generator=generator)
    mask = torch.ones_like(ids)
    mask[2, 10:] = 0
    return {
        "input_ids": ids * mask,
        "token_type_ids": torch.zeros_like(ids),
        "attention_mask": mask,
        "masked_lm_positions": torch.tensor([[1, 4, 0], [2, 3, 7], [5, 0, 0]]),
        "masked_lm_labels": torch.tensor([[7, 9, -100], [11, 12, 13], [14, -100, -100]]),
        "next_sentence_labels": torch.full((3,), -100),
    }


def test_the_model_is_transformers_bert_for_masked_lm_parameter_for_parameter(
    tiny_config: BertConfig,
) -> None:
    ours = BertForPreTraining(tiny_config, next_sentence_prediction=False)
    theirs = transformers.BertForMaskedLM(transformers.BertConfig(**tiny_config.to_hf_dict()))
    assert set(ours.state_dict()) == set(theirs.state_dict())
    assert not [name for name, _ in ours.named_parameters() if name.startswith(NSP_PARTS)]


def test_it_trains_without_nsp(tiny_config: BertConfig) -> None:
    model = _mlm_model(tiny_config)
    batch = _batch(tiny_config.vocab_size)
    mlm_logits, nsp_logits = model(
        batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["masked_lm_positions"]
    )
    assert nsp_logits is None
    total, mlm_loss, nsp_loss = pretraining_loss(
        mlm_logits, batch["masked_lm_labels"], nsp_logits, batch["next_sentence_labels"]
    )
    expected = torch.nn.functional.cross_entropy(
        mlm_logits.reshape(-1, tiny_config.vocab_size), batch["masked_lm_labels"].reshape(-1)
    )
    assert torch.equal(total, expected) and torch.equal(mlm_loss, expected)
    assert nsp_loss.item() == 0.0 and not nsp_loss.requires_grad
    total.backward()
    # No parameter is left without a gradient, which DDP would refuse.
    assert all(parameter.grad is not None for parameter in model.parameters())


def test_statistics_count_sequences_without_nsp(tiny_config: BertConfig) -> None:
    model = _mlm_model(tiny_config)
    batch: Any = _batch(tiny_config.vocab_size)
    with torch.no_grad():
        outputs = model(
            batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["masked_lm_positions"]
        )
    stats = StepStatistics.of_batch(batch, outputs)
    accuracy = stats.accuracy()
    assert accuracy.sequences == 3 and not accuracy.has_nsp
    assert stats.mlm_total.item() == 6 and stats.nsp_total.item() == 0
    # Packed rows: each token carries its sequence's number, so a row's largest is its count.
    packed_mask = torch.tensor([[1, 1, 2, 2, 3, 0], [1, 1, 1, 0, 0, 0]])
    counts = prediction_counts(
        torch.zeros(2, 1, 4), torch.full((2, 1), -100), None, torch.full((2, 3), -100), packed_mask
    )
    assert counts.tolist() == [0.0, 0.0, 0.0, 0.0, 4.0]


def test_the_export_is_a_bert_for_masked_lm_with_our_logits(
    tiny_config: BertConfig, vocab_dir: Path, tmp_path: Path
) -> None:
    model = _mlm_model(tiny_config).eval()
    out = export_hf(_save(model, tmp_path / "checkpoints"), vocab_dir, tmp_path / "hf", lowercase=True)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    loaded, info = transformers.AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert isinstance(loaded, transformers.BertForMaskedLM)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"))
    batch = _batch(tiny_config.vocab_size)
    arguments = (batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    with torch.no_grad():
        ours, _ = model(*arguments)
        theirs = loaded.eval()(
            *arguments[:1], attention_mask=arguments[2], token_type_ids=arguments[1]
        ).logits
    assert (ours - theirs).abs().max() <= TOLERANCE


def test_nvidia_export_of_it_is_refused(tiny_config: BertConfig, vocab_dir: Path, tmp_path: Path) -> None:
    checkpoint = _save(_mlm_model(tiny_config), tmp_path / "checkpoints")
    with pytest.raises(ValueError, match="NVIDIA's format needs the NSP head"):
        export_nvidia(checkpoint, vocab_dir, tmp_path / "nvidia")
    assert not (tmp_path / "nvidia").exists()


def test_fine_tuning_after_mlm_starts_the_pooler_from_initialisation(
    tiny_config: BertConfig, tmp_path: Path
) -> None:
    """The documented rule (docs/training.md): the encoder is pretraining's, the pooler (which the
    classifier reads) is drawn as at a fresh start under the task's seed."""
    pretrained = _mlm_model(tiny_config)
    checkpoint = _save(pretrained, tmp_path / "checkpoints")
    task = FinetuneTaskSpec.model_validate(
        {"name": "sst2", "type": "classification", "train": "t.tsv", "validation": "v.tsv"}
    )
    torch.manual_seed(42)
    tuned: Any = build_model(task, tiny_config, 2, checkpoint)
    torch.manual_seed(42)
    baseline: Any = build_model(task, tiny_config, 2, None)
    pooler = tuned.bert.pooler.dense
    assert torch.equal(pooler.weight, baseline.bert.pooler.dense.weight)
    assert torch.equal(pooler.bias, torch.zeros_like(pooler.bias))
    assert 0.5 * tiny_config.initializer_range < pooler.weight.std() < 1.5 * tiny_config.initializer_range
    encoder = pretrained.bert.encoder.state_dict()
    assert all(torch.equal(tensor, encoder[name]) for name, tensor in tuned.bert.encoder.state_dict().items())


def test_loading_it_names_what_keeps_its_initialisation(tiny_config: BertConfig, tmp_path: Path) -> None:
    checkpoint = _save(_mlm_model(tiny_config), tmp_path / "checkpoints")
    initialised = load_initial_weights(checkpoint, BertForPreTraining(tiny_config))
    assert initialised.kept == [
        "bert.pooler.dense.weight",
        "bert.pooler.dense.bias",
        "cls.seq_relationship.weight",
        "cls.seq_relationship.bias",
    ]
    # An NSP checkpoint into a model without NSP: its pooler and NSP head are left out.
    torch.manual_seed(3)
    nsp_checkpoint = _save(BertForPreTraining(tiny_config), tmp_path / "nsp")
    assert load_initial_weights(nsp_checkpoint, BertForPreTraining(tiny_config, False)).kept == []
