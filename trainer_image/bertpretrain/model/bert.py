"""BERT for pretraining: masked language modelling (MLM) and next sentence prediction (NSP), or MLM
alone.

Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding". The modules and their attribute names mirror Hugging Face's
``BertForPreTraining`` (``modeling_bert.py``) one for one, so that a ``state_dict`` of this model
loads into transformers and back without renaming. Two things differ from that code: attention
is one call to :func:`torch.nn.functional.scaled_dot_product_attention`, and the MLM head can run
on the masked positions only, as NVIDIA's DeepLearningExamples BERT does, which saves most of the
``[tokens, vocabulary]`` projection during pretraining.

The model also takes packed rows, several sequences one after the other in one row, as Graphcore's
packed BERT does (Krell, Kosec, Perez and Fitzgibbon 2021, "Efficient Sequence Packing without
Cross-contamination", arXiv:2107.02027; the data schema is in :mod:`bertpretrain.data.prepare.packing`). Three
things keep a packed sequence from seeing its neighbours, so that its outputs are those it has
alone: a block-diagonal attention mask, position ids that restart at each sequence, and the pooler
and NSP classifier run at each sequence's own ``[CLS]``.

Without NSP (the job's ``objective: mlm``, as RoBERTa, Liu et al. 2019, trains) the model has no
pooler and no NSP classifier, parameter for parameter transformers' ``BertForMaskedLM``: nothing
is built that the loss would leave without gradients (which DDP refuses), and the export is a
``BertForMaskedLM``.

The config is :class:`bertpretrain.model.config.BertConfig`. Read top to bottom: embeddings, one
encoder layer, the encoder, the attention masks, pooler, heads, the whole model, the loss.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertpretrain.common.labels import IGNORE_INDEX
from bertpretrain.model.config import PAD_TOKEN_ID, BertConfig


class BertEmbeddings(nn.Module):
    """Sum of token, position and segment embeddings, then LayerNorm and dropout.

    ``(input_ids [B, L] int64, token_type_ids [B, L] int64, position_ids [B, L] int64 or None)
    -> [B, L, H]``; ``position_ids`` None means ``0 .. L-1`` in every row.
    """

    # Compiled on its own (bertpretrain.runtime.compiling) when the job compiles.
    compile_region: ClassVar[bool] = True

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=PAD_TOKEN_ID)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(position_ids)
            + self.token_type_embeddings(token_type_ids)
        )
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    """Multi-head scaled dot-product attention, restricted by a mask.

    ``(x [B, L, H], mask [B, 1, 1, L] or [B, 1, L, L] bool, True = may attend) -> [B, L, H]``;
    see :func:`sdpa_mask`.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.num_heads, hidden // self.num_heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            heads(self.query(x)),
            heads(self.key(x)),
            heads(self.value(x)),
            attn_mask=mask,
            dropout_p=self.dropout_p if self.training else 0.0,
        )
        return out.transpose(1, 2).reshape(batch, length, hidden)


class BertOutput(nn.Module):
    """Projection back to the hidden size, dropout, residual and post-LayerNorm.

    ``(x [B, L, in_features], residual [B, L, H]) -> [B, L, H]``; after attention ``in_features``
    is H (Hugging Face's ``BertSelfOutput``), after the feed-forward it is I (``BertOutput``).
    """

    def __init__(self, config: BertConfig, in_features: int):
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class BertAttention(nn.Module):
    """Self-attention block: ``[B, L, H] -> [B, L, H]``."""

    def __init__(self, config: BertConfig):
        super().__init__()
        # "self" is the submodule name in Hugging Face's checkpoints (attention.self.query ...).
        self.self = BertSelfAttention(config)
        self.output = BertOutput(config, config.hidden_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, mask), x)


class BertIntermediate(nn.Module):
    """First feed-forward layer with exact (erf) GELU: ``[B, L, H] -> [B, L, I]``."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))


class BertLayer(nn.Module):
    """One post-LayerNorm Transformer encoder layer: ``([B, L, H], mask) -> [B, L, H]``."""

    # Compiled on its own (bertpretrain.runtime.compiling) when the job compiles.
    compile_region: ClassVar[bool] = True

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config, config.intermediate_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    """The stack of ``num_hidden_layers`` encoder layers: ``([B, L, H], mask) -> [B, L, H]``.

    With ``activation_checkpointing`` set, a training forward that records gradients keeps only
    each layer's input and recomputes the layer in the backward pass (less memory, about a third
    more compute). The recomputation replays the forward's RNG state, so dropout and the gradients
    are those of a plain forward.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.activation_checkpointing = False

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # Without gradients nothing is kept for a backward pass, so there is no memory to spare.
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for layer in self.layer:
            # Non-reentrant: PyTorch's recommended variant, which works with torch.compile and with
            # inputs that do not require gradients.
            x = checkpoint(layer, x, mask, use_reentrant=False) if recompute else layer(x, mask)
        return x


def sdpa_mask(attention_mask: torch.Tensor, packed: bool) -> torch.Tensor:
    """The boolean mask that :func:`torch.nn.functional.scaled_dot_product_attention` takes.

    Args:
        attention_mask: ``[B, L]`` any integer or bool dtype. Unpacked rows: 1 on tokens, 0 on
            padding. Packed rows: the sequence number (1..S) of each token, 0 on padding.
        packed: whether the rows are packed.

    Returns:
        Unpacked: ``[B, 1, 1, L]`` bool, True on the keys every query may attend (the tokens).
        Packed: ``[B, 1, L, L]`` bool, ``[b, 0, i, j]`` True iff tokens i and j carry the same
        number: block-diagonal over the row's sequences. On tokens it is
        :func:`bertpretrain.data.prepare.packing.attention_mask`; padding queries attend to the row's padding
        instead of nothing: SDPA has returned NaN for a query with no key (it depends on the kernel
        and the PyTorch version), and a NaN there would reach every token in the next layer (its
        value gets weight 0, and 0 * NaN is NaN). Padding outputs are never read: no masked
        position or ``[CLS]`` is padding.
    """
    if packed:
        return (attention_mask[:, :, None] == attention_mask[:, None, :])[:, None]
    # One row of keys broadcast over the queries: L times smaller than the [L, L] mask.
    return attention_mask.bool()[:, None, None, :]


def gather_positions(hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``hidden [B, L, H]`` at ``positions [B, N]`` int64 (indices into L): ``[B, N, H]``."""
    return torch.gather(hidden, 1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))


class BertPooler(nn.Module):
    """``tanh(dense(h_[CLS]))``, the input of the NSP classifier.

    ``(x [B, L, H], cls_positions [B, S] int64 or None) -> [B, H]`` at position 0 when
    ``cls_positions`` is None, else ``[B, S, H]`` at each of ``cls_positions`` (packed rows).
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor, cls_positions: torch.Tensor | None = None) -> torch.Tensor:
        cls = x[:, 0] if cls_positions is None else gather_positions(x, cls_positions)
        return torch.tanh(self.dense(cls))


class BertModel(nn.Module):
    """The encoder with its pooler (``add_pooling_layer``, as transformers' argument, or none).

    ``(input_ids, token_type_ids, attention_mask, position_ids=None, next_sentence_positions=None)
    -> (hidden [B, L, H], pooled)``, with the arguments of :meth:`BertForPreTraining.forward`;
    ``pooled`` is ``[B, H]``, or ``[B, S, H]`` for packed rows, or None without a pooler.

    Raises:
        ValueError: packed rows (``next_sentence_positions`` given) without ``position_ids``.
    """

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        next_sentence_positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        packed = next_sentence_positions is not None
        if packed and position_ids is None:
            # 0..L-1 would give every sequence after the first the positions of its place in the
            # row, not its own, and its outputs would differ from those it has alone.
            raise ValueError("packed rows (next_sentence_positions given) need position_ids")
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        hidden = self.encoder(x, sdpa_mask(attention_mask, packed))
        if self.pooler is None:
            return hidden, None
        return hidden, self.pooler(hidden, next_sentence_positions)


class BertPredictionHeadTransform(nn.Module):
    """Dense, GELU and LayerNorm before the vocabulary projection."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    """MLM head: ``[..., H] -> [..., V]`` logits; the decoder weight is the word embedding matrix."""

    # Compiled on its own (bertpretrain.runtime.compiling) when the job compiles.
    compile_region: ClassVar[bool] = True

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        # Both ties are Hugging Face's: its checkpoints hold decoder.weight and decoder.bias as
        # aliases of these two tensors.
        self.decoder.weight = word_embeddings.weight
        self.decoder.bias = self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(x))


class BertPreTrainingHeads(nn.Module):
    """The MLM head and the NSP classifier (``[..., H] -> [..., 2]``, class 1 = random next), or the
    MLM head alone (``next_sentence_prediction`` False: transformers' ``BertOnlyMLMHead``)."""

    def __init__(
        self, config: BertConfig, word_embeddings: nn.Embedding, next_sentence_prediction: bool = True
    ):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)
        self.seq_relationship = nn.Linear(config.hidden_size, 2) if next_sentence_prediction else None


class BertForPreTraining(nn.Module):
    """BERT with its two pretraining heads, parameter for parameter Hugging Face's model; with
    ``next_sentence_prediction`` False, the MLM head alone on an encoder without a pooler,
    parameter for parameter transformers' ``BertForMaskedLM``."""

    def __init__(self, config: BertConfig, next_sentence_prediction: bool = True):
        super().__init__()
        self.config = config
        self.next_sentence_prediction = next_sentence_prediction
        self.bert = BertModel(config, add_pooling_layer=next_sentence_prediction)
        self.cls = BertPreTrainingHeads(
            config, self.bert.embeddings.word_embeddings, next_sentence_prediction
        )
        self.apply(self._init_weights)

    def set_activation_checkpointing(self, enabled: bool) -> None:
        """Recompute each encoder layer in the backward pass of training forwards (see
        :class:`BertEncoder`); eval and ``no_grad`` forwards run as usual."""
        self.bert.encoder.activation_checkpointing = enabled

    def _init_weights(self, module: nn.Module) -> None:
        # Google's BERT and Hugging Face: truncation-free normal(0, 0.02) for every matrix, zero
        # biases, LayerNorm as identity, and a zero [PAD] embedding.
        std = self.config.initializer_range
        if module is self.cls.predictions.decoder:
            return  # both of its tensors are tied to others, initialised with those
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, BertLMPredictionHead):
            nn.init.zeros_(module.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        masked_lm_positions: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        next_sentence_positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """MLM and NSP logits, of unpacked rows or of packed rows (``next_sentence_positions``).

        Args:
            input_ids, token_type_ids: ``[B, L]`` int64.
            attention_mask: ``[B, L]`` integer or bool. Unpacked: 1 for tokens, 0 for padding.
                Packed: the sequence number 1..S of each token, 0 for padding; a token attends
                only to the tokens of its own sequence.
            masked_lm_positions: optional ``[B, P]`` int64 indices into ``L`` (``[B, W]``, W up to
                S*P, for packed rows); 0 on empty slots.
            position_ids: ``[B, L]`` int64, below ``max_position_embeddings``. Unpacked: optional,
                ``0 .. L-1`` when None. Packed: required, restarting at 0 at each sequence.
            next_sentence_positions: ``[B, S]`` int64, the row position of each sequence's
                ``[CLS]`` (any position, such as 0, on empty slots); given only for packed rows.

        Returns:
            ``mlm_logits``: ``[B, P, V]`` at ``masked_lm_positions`` if given, else ``[B, L, V]``;
            ``nsp_logits``: ``[B, 2]`` from position 0, or ``[B, S, 2]`` from each
            ``next_sentence_positions`` entry for packed rows; None without NSP. In the
            parameters' dtype, or autocast's.

        Raises:
            ValueError: ``next_sentence_positions`` given without ``position_ids``.
        """
        hidden, pooled = self.bert(
            input_ids, token_type_ids, attention_mask, position_ids, next_sentence_positions
        )
        if masked_lm_positions is not None:
            hidden = gather_positions(hidden, masked_lm_positions)
        mlm_logits = self.cls.predictions(hidden)
        if self.cls.seq_relationship is None or pooled is None:
            return mlm_logits, None
        return mlm_logits, self.cls.seq_relationship(pooled)


def pretraining_loss(
    mlm_logits: torch.Tensor,
    masked_lm_labels: torch.Tensor,
    nsp_logits: torch.Tensor | None,
    next_sentence_labels: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """BERT's pretraining loss: mean MLM cross-entropy plus mean NSP cross-entropy (Devlin et al.),
    or the MLM term alone for a model without NSP (``nsp_logits`` None: ``nsp_loss`` is a constant
    0, with no gradient).

    Each mean is over the batch's predictions, not per row, so that a packed row with more
    sequences weighs more, as the same sequences would unpacked.

    Args:
        mlm_logits: ``[B, P, V]`` (or ``[B, L, V]``) float.
        masked_lm_labels: ``[B, P]`` (or ``[B, L]``) int64 token ids, ``-100`` (``IGNORE_INDEX``)
            where nothing is predicted.
        nsp_logits: ``[B, 2]`` float, or ``[B, S, 2]`` for packed rows; None without NSP.
        next_sentence_labels: ``[B]`` int64, 1 = random next sentence; ``[B, S]`` for packed rows,
            ``-100`` on empty slots.

    Returns:
        ``(total, mlm_loss, nsp_loss)``, fp32 scalars in nats per prediction. A loss with no
        labels other than -100 is NaN (an empty mean).
    """
    vocab_size = mlm_logits.shape[-1]
    mlm_loss = F.cross_entropy(
        mlm_logits.reshape(-1, vocab_size).float(), masked_lm_labels.reshape(-1), ignore_index=IGNORE_INDEX
    )
    if nsp_logits is None:
        return mlm_loss, mlm_loss, torch.zeros((), device=mlm_loss.device)
    nsp_loss = F.cross_entropy(
        nsp_logits.reshape(-1, 2).float(), next_sentence_labels.reshape(-1), ignore_index=IGNORE_INDEX
    )
    return mlm_loss + nsp_loss, mlm_loss, nsp_loss
