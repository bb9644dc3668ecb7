"""The fine-tuning heads keep Hugging Face's names: their weights load into transformers'
BertForSequenceClassification and BertForQuestionAnswering (and back) and give the same logits."""

from __future__ import annotations

import math

import pytest
import torch

from bertpretrain.model.bert import BertForPreTraining
from bertpretrain.model.config import BertConfig
from bertpretrain.model.heads import (
    BertForQuestionAnswering,
    BertForSequenceClassification,
    classification_loss,
    span_loss,
)

transformers = pytest.importorskip("transformers")


def _inputs(config: BertConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, config.vocab_size, (3, 12), generator=generator)
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 6:] = 1
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 9:] = 0
    return input_ids, token_type_ids, attention_mask


def _hf_config(config: BertConfig, **extra: object) -> object:
    return transformers.BertConfig(**config.to_hf_dict(), **extra)


def test_classification_weights_load_into_transformers_and_back(tiny_config: BertConfig) -> None:
    torch.manual_seed(1)
    ours = BertForSequenceClassification(BertForPreTraining(tiny_config).bert, tiny_config, 3).eval()
    theirs = transformers.BertForSequenceClassification(_hf_config(tiny_config, num_labels=3)).eval()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    inputs = _inputs(tiny_config)
    expected = theirs(*inputs[:1], token_type_ids=inputs[1], attention_mask=inputs[2]).logits
    assert ours(*inputs).shape == (3, 3)
    torch.testing.assert_close(ours(*inputs), expected, atol=1e-5, rtol=1e-5)

    back = BertForSequenceClassification(BertForPreTraining(tiny_config).bert, tiny_config, 3).eval()
    back.load_state_dict(theirs.state_dict(), strict=True)
    torch.testing.assert_close(back(*inputs), expected, atol=1e-5, rtol=1e-5)


def test_question_answering_weights_load_into_transformers_and_back(tiny_config: BertConfig) -> None:
    torch.manual_seed(2)
    ours = BertForQuestionAnswering(BertForPreTraining(tiny_config).bert, tiny_config).eval()
    theirs = transformers.BertForQuestionAnswering(_hf_config(tiny_config)).eval()
    # transformers' QA model has no pooler; ours keeps pretraining's, unused.
    missing, unexpected = theirs.load_state_dict(ours.state_dict(), strict=False)
    assert missing == [] and sorted(unexpected) == ["bert.pooler.dense.bias", "bert.pooler.dense.weight"]
    inputs = _inputs(tiny_config)
    output = theirs(inputs[0], token_type_ids=inputs[1], attention_mask=inputs[2])
    start, end = ours(*inputs)
    assert start.shape == end.shape == (3, 12)
    torch.testing.assert_close(start, output.start_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(end, output.end_logits, atol=1e-5, rtol=1e-5)

    back = BertForQuestionAnswering(BertForPreTraining(tiny_config).bert, tiny_config).eval()
    missing, unexpected = back.load_state_dict(theirs.state_dict(), strict=False)
    assert unexpected == [] and sorted(missing) == ["bert.pooler.dense.bias", "bert.pooler.dense.weight"]
    torch.testing.assert_close(back(*inputs)[0], output.start_logits, atol=1e-5, rtol=1e-5)


def test_the_head_starts_from_the_encoder_it_is_given(tiny_config: BertConfig) -> None:
    pretrained = BertForPreTraining(tiny_config)
    model = BertForSequenceClassification(pretrained.bert, tiny_config, 2)
    assert model.bert is pretrained.bert
    # BERT's initialisation: normal(0, 0.02) weights, zero bias.
    spread = float(model.classifier.weight.detach().std())
    assert spread == pytest.approx(tiny_config.initializer_range, rel=0.3)
    assert torch.count_nonzero(model.classifier.bias) == 0


def test_losses_against_their_formulas() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    labels = torch.tensor([0, 0])
    # -log softmax by hand: row 0 picks 2 of (2, 0); row 1 picks 0 of (0, 1).
    e = math.e
    by_hand = ((math.log(e**2 + 1) - 2) + math.log(1 + e)) / 2
    assert float(classification_loss(logits, labels)) == pytest.approx(by_hand, rel=1e-6)
    start = torch.tensor([[0.0, 0.0, 0.0]])
    end = torch.tensor([[0.0, 3.0, 0.0]])
    # Uniform start: log 3; end picks 3 of (0, 3, 0): log(2 + e^3) - 3.
    expected = (math.log(3) + math.log(2 + e**3) - 3) / 2
    loss = span_loss(start, end, torch.tensor([2]), torch.tensor([1]))
    assert float(loss) == pytest.approx(expected, rel=1e-6)
