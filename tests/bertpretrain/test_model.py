"""The model against transformers' BertForPreTraining, and the pretraining loss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers

from bertpretrain.model import BertConfig, BertForPreTraining, pretraining_loss

pytestmark = pytest.mark.usefixtures("one_thread")


def hf_model(config: BertConfig) -> transformers.BertForPreTraining:
    return transformers.BertForPreTraining(transformers.BertConfig(**config.to_hf_dict())).eval()


def padded_batch(vocab_size: int) -> dict[str, torch.Tensor]:
    """Three sequences of 24 tokens, two of them padded, with two segments each."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, vocab_size, (3, 24), generator=generator)
    attention_mask = torch.ones(3, 24, dtype=torch.long)
    attention_mask[1, 15:] = 0
    attention_mask[2, 7:] = 0
    input_ids[attention_mask == 0] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 5:] = 1
    token_type_ids[attention_mask == 0] = 0
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}


def test_parameter_names_are_transformers(tiny_config: BertConfig) -> None:
    ours, theirs = BertForPreTraining(tiny_config), hf_model(tiny_config)
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    assert sorted(name for name, _ in ours.named_parameters()) == sorted(
        name for name, _ in theirs.named_parameters()
    )
    for name, tensor in ours.state_dict().items():
        assert tensor.shape == theirs.state_dict()[name].shape, name


def test_decoder_is_tied_to_word_embeddings(tiny_config: BertConfig) -> None:
    model = BertForPreTraining(tiny_config)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias


def test_initialisation_is_googles(tiny_config: BertConfig) -> None:
    model = BertForPreTraining(
        BertConfig(**{**tiny_config.to_dict(), "hidden_size": 128, "intermediate_size": 512})
    )
    weight = model.get_parameter("bert.encoder.layer.0.intermediate.dense.weight")
    assert abs(weight.std().item() - 0.02) < 1e-3
    assert torch.all(model.get_parameter("bert.encoder.layer.0.intermediate.dense.bias") == 0)
    assert torch.all(model.get_parameter("bert.encoder.layer.1.output.LayerNorm.weight") == 1)
    assert torch.all(model.cls.predictions.bias == 0)
    assert torch.all(model.bert.embeddings.word_embeddings.weight[0] == 0)


@pytest.mark.parametrize("direction", ["ours_into_hf", "hf_into_ours"])
def test_logits_equal_transformers(tiny_config: BertConfig, direction: str) -> None:
    torch.manual_seed(1)
    ours, theirs = BertForPreTraining(tiny_config).eval(), hf_model(tiny_config)
    with torch.no_grad():
        # Weights of a trained model's size, not 0.02: differences such as GELU's tanh
        # approximation would vanish in the near-zero activations of a fresh model.
        for parameter in ours.parameters():
            parameter.normal_(0.0, 0.3)
    if direction == "ours_into_hf":
        theirs.load_state_dict(ours.state_dict())
    else:
        ours.load_state_dict(theirs.state_dict())
    batch = padded_batch(tiny_config.vocab_size)
    with torch.no_grad():
        mlm_logits, nsp_logits = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        expected = theirs(**batch)
    assert mlm_logits.shape == (3, 24, tiny_config.vocab_size)
    assert (mlm_logits - expected.prediction_logits).abs().max() <= 1e-4
    assert (nsp_logits - expected.seq_relationship_logits).abs().max() <= 1e-4


def test_gathered_positions_equal_full_logits(tiny_config: BertConfig) -> None:
    model = BertForPreTraining(tiny_config).eval()
    batch = padded_batch(tiny_config.vocab_size)
    positions = torch.tensor([[1, 4, 20, 0], [2, 3, 14, 0], [6, 0, 0, 0]])
    with torch.no_grad():
        full, nsp_full = model(**batch)
        gathered, nsp_gathered = model(**batch, masked_lm_positions=positions)
    assert gathered.shape == (3, 4, tiny_config.vocab_size)
    expected = torch.stack([full[row, positions[row]] for row in range(3)])
    torch.testing.assert_close(gathered, expected)
    torch.testing.assert_close(nsp_gathered, nsp_full)


def test_padding_does_not_leak_into_tokens(tiny_config: BertConfig) -> None:
    model = BertForPreTraining(tiny_config).eval()
    batch = padded_batch(tiny_config.vocab_size)
    changed = {**batch, "input_ids": batch["input_ids"].clone()}
    changed["input_ids"][batch["attention_mask"] == 0] = 9
    with torch.no_grad():
        before, _ = model(**batch)
        after, _ = model(**changed)
    keep = batch["attention_mask"].bool()
    torch.testing.assert_close(before[keep], after[keep])


def test_pretraining_loss_ignores_padding() -> None:
    generator = torch.Generator().manual_seed(0)
    mlm_logits = torch.randn(2, 3, 11, generator=generator)
    labels = torch.tensor([[4, 7, -100], [2, -100, -100]])
    nsp_logits = torch.randn(2, 2, generator=generator)
    nsp_labels = torch.tensor([0, 1])
    total, mlm, nsp = pretraining_loss(mlm_logits, labels, nsp_logits, nsp_labels)
    log_probs = mlm_logits.log_softmax(-1)
    expected_mlm = -(log_probs[0, 0, 4] + log_probs[0, 1, 7] + log_probs[1, 0, 2]) / 3
    torch.testing.assert_close(mlm, expected_mlm)
    torch.testing.assert_close(nsp, F.cross_entropy(nsp_logits, nsp_labels))
    torch.testing.assert_close(total, mlm + nsp)


def test_config_round_trips_through_transformers(tiny_config: BertConfig) -> None:
    hf = transformers.BertConfig(**tiny_config.to_hf_dict())
    for name, value in tiny_config.to_dict().items():
        assert getattr(hf, name) == value, name
    assert hf.hidden_act == "gelu"
    assert hf.model_type == "bert"


def test_config_rejects_heads_that_do_not_divide_hidden(tiny_config: BertConfig) -> None:
    with pytest.raises(ValueError, match="num_attention_heads 3"):
        BertConfig(**{**tiny_config.to_dict(), "num_attention_heads": 3})
