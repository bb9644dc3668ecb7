"""BERT with a fine-tuning head: sequence classification (GLUE) and extractive question answering
(SQuAD), as Devlin et al. 2019 (section 4) fine-tune it.

The encoder is the pretraining model's :class:`bertpretrain.model.bert.BertModel`, passed in, so
that a fine-tuned model starts from exactly the weights pretraining left (or from the same
initialisation, for a random-weights baseline). Names are Hugging Face's (``bert.*``,
``classifier.*``, ``qa_outputs.*``): a ``state_dict`` of these modules loads into transformers'
``BertForSequenceClassification`` and ``BertForQuestionAnswering`` and back, which the tests check.
Ours rather than transformers' because the job's engine (device, precision, DDP, Horovod,
DeepSpeed) already runs this encoder, with its SDPA attention; the heads are two linear layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertpretrain.model.bert import BertModel
from bertpretrain.model.config import BertConfig


def _init_head(layer: nn.Linear, config: BertConfig) -> None:
    # As every other matrix of BERT: normal(0, initializer_range), zero bias.
    nn.init.normal_(layer.weight, std=config.initializer_range)
    nn.init.zeros_(layer.bias)


class BertForSequenceClassification(nn.Module):
    """``classifier(dropout(pooled [CLS]))``: ``(input_ids, token_type_ids, attention_mask)``, each
    ``[B, L]`` int64 (mask 1 for tokens, 0 for padding), ``-> logits [B, num_labels]`` in the
    parameters' dtype (or autocast's)."""

    def __init__(self, bert: BertModel, config: BertConfig, num_labels: int):
        super().__init__()
        self.config = config
        self.num_labels = num_labels
        self.bert = bert
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        _init_head(self.classifier, config)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        _, pooled = self.bert(input_ids, token_type_ids, attention_mask)
        return self.classifier(self.dropout(pooled))


class BertForQuestionAnswering(nn.Module):
    """A start and an end logit per token: ``(input_ids, token_type_ids, attention_mask)``, each
    ``[B, L]`` int64, ``-> (start_logits [B, L], end_logits [B, L])``. The encoder's pooler is kept
    (and unused), so that the encoder's parameters stay those of pretraining; transformers'
    model has none and ignores it on load."""

    def __init__(self, bert: BertModel, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = bert
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        _init_head(self.qa_outputs, config)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, _ = self.bert(input_ids, token_type_ids, attention_mask)
        start, end = self.qa_outputs(hidden).unbind(-1)
        return start, end


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits [B, C]`` against ``labels [B]`` int64, an fp32 scalar (nats)."""
    return F.cross_entropy(logits.float(), labels)


def span_loss(
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    start_positions: torch.Tensor,
    end_positions: torch.Tensor,
) -> torch.Tensor:
    """The mean of the start and end cross-entropies over ``[B, L]`` logits, against ``[B]`` int64
    token positions (0, the ``[CLS]``, for no answer in the window), as Google's ``run_squad.py``
    computes it; an fp32 scalar (nats)."""
    start = F.cross_entropy(start_logits.float(), start_positions)
    end = F.cross_entropy(end_logits.float(), end_positions)
    return (start + end) / 2
