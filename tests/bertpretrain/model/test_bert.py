"""The model against transformers' BertForPreTraining, and the pretraining loss."""

from __future__ import annotations

from contextlib import ExitStack
from typing import TypeVar
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers

from bertjob_api.defaults import MODEL_PRESETS
from bertpretrain.data.format import packed as packed_schema
from bertpretrain.data.format.shards import SHARD_DTYPES
from bertpretrain.data.prepare import packing
from bertpretrain.model import bert as model_module
from bertpretrain.model.bert import (
    IGNORE_INDEX,
    BertForPreTraining,
    pretraining_loss,
    sdpa_mask,
)
from bertpretrain.model.config import BertConfig
from bertpretrain.runtime.sharding import parameter_count

pytestmark = pytest.mark.usefixtures("one_thread")

ModelT = TypeVar("ModelT", bound=torch.nn.Module)

# The fixtures' vocabulary (conftest.VOCAB): [PAD] [UNK] [CLS] [SEP] [MASK], then words.
CLS, SEP, MASK, FIRST_WORD = 2, 3, 4, 5


def hf_model(config: BertConfig) -> transformers.BertForPreTraining:
    return transformers.BertForPreTraining(transformers.BertConfig(**config.to_hf_dict())).eval()


def with_large_weights(model: ModelT, seed: int) -> ModelT:
    """``model`` with weights of a trained model's size, not 0.02: differences such as GELU's tanh
    approximation, or one position embedding for another, would vanish in the near-zero
    activations of a fresh model."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model


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


@pytest.mark.parametrize(("preset", "expected"), [("bert-base", 110_106_428), ("bert-large", 336_226_108)])
def test_parameter_count_equals_transformers(preset: str, expected: int) -> None:
    config = BertConfig.from_dims(MODEL_PRESETS[preset], vocab_size=30522)
    # Shapes without storage: both models are built in a fraction of a second and no memory.
    with torch.device("meta"):
        ours = BertForPreTraining(config)
        theirs = transformers.BertForPreTraining(transformers.BertConfig(**config.to_hf_dict()))
    assert parameter_count(ours) == parameter_count(theirs) == expected


@pytest.mark.parametrize("direction", ["ours_into_hf", "hf_into_ours"])
def test_logits_and_loss_equal_transformers(tiny_config: BertConfig, direction: str) -> None:
    ours, theirs = BertForPreTraining(tiny_config).eval(), hf_model(tiny_config)
    if direction == "ours_into_hf":
        theirs.load_state_dict(with_large_weights(ours, seed=1).state_dict())
    else:
        ours.load_state_dict(with_large_weights(theirs, seed=1).state_dict())
    batch = padded_batch(tiny_config.vocab_size)
    # Rows of 24, 15 and 7 tokens; 0-padded positions with label -100, as the loader makes them.
    positions = torch.tensor([[1, 4, 20], [2, 3, 14], [6, 0, 0]])
    masked_lm_labels = torch.gather(batch["input_ids"], 1, positions)
    masked_lm_labels[2, 1:] = IGNORE_INDEX
    # transformers takes the same labels at their positions in the row, -100 elsewhere.
    labels = torch.full_like(batch["input_ids"], IGNORE_INDEX)
    for row, slot in (masked_lm_labels != IGNORE_INDEX).nonzero():
        labels[row, positions[row, slot]] = masked_lm_labels[row, slot]
    next_sentence_labels = torch.tensor([0, 1, 1])
    with torch.no_grad():
        mlm_logits, nsp_logits = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        gathered, _ = ours(**batch, masked_lm_positions=positions)
        loss = pretraining_loss(gathered, masked_lm_labels, nsp_logits, next_sentence_labels)[0]
        expected = theirs(**batch, labels=labels, next_sentence_label=next_sentence_labels)
    assert mlm_logits.shape == (3, 24, tiny_config.vocab_size)
    assert (mlm_logits - expected.prediction_logits).abs().max() <= 1e-5
    assert (nsp_logits - expected.seq_relationship_logits).abs().max() <= 1e-5
    assert abs(loss.item() - expected.loss.item()) <= 1e-5


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


def test_pretraining_loss_averages_the_real_slots_of_packed_rows() -> None:
    generator = torch.Generator().manual_seed(0)
    mlm_logits = torch.randn(2, 6, 11, generator=generator)
    labels = torch.full((2, 6), IGNORE_INDEX)
    labels[0, :4] = torch.tensor([3, 8, 1, 5])
    labels[1, 0] = 9
    nsp_logits = torch.randn(2, 3, 2, generator=generator)
    nsp_labels = torch.tensor([[1, 0, 1], [0, IGNORE_INDEX, IGNORE_INDEX]])
    total, mlm, nsp = pretraining_loss(mlm_logits, labels, nsp_logits, nsp_labels)
    log_probs = nsp_logits.log_softmax(-1)
    expected_nsp = -(log_probs[0, 0, 1] + log_probs[0, 1, 0] + log_probs[0, 2, 1] + log_probs[1, 0, 0]) / 4
    torch.testing.assert_close(nsp, expected_nsp)
    mlm_log_probs = mlm_logits.log_softmax(-1)
    expected_mlm = (
        -sum(mlm_log_probs[row, col, labels[row, col]] for row, col in labels.ne(IGNORE_INDEX).nonzero()) / 5
    )
    torch.testing.assert_close(mlm, expected_mlm)
    torch.testing.assert_close(total, mlm + nsp)


# Packed rows (Krell et al. 2021, arXiv:2107.02027) as bertpretrain.data.prepare.packing makes them: rows of
# PACK_LENGTH tokens holding up to PACK_SEQUENCES instances. SPFHP packs these lengths into the rows
# [30], [21, 11] and [14, 9, 7]: one row alone with two empty slots, one full.
PACK_LENGTH, PACK_SEQUENCES, PACK_PREDICTIONS = 32, 3, 4
INSTANCE_LENGTHS = (9, 21, 14, 7, 30, 11)


def instances(vocab_size: int) -> dict[str, np.ndarray]:
    """NVIDIA-schema instances of ``INSTANCE_LENGTHS`` (as ``shards.read_shard`` returns them):
    ``[CLS] A [SEP] B [SEP]`` of random words, 1-4 of them masked, random NSP labels."""
    rng = np.random.default_rng(0)
    count = len(INSTANCE_LENGTHS)
    shapes = {
        "masked_lm_positions": (count, PACK_PREDICTIONS),
        "masked_lm_ids": (count, PACK_PREDICTIONS),
        "next_sentence_labels": (count,),
    }
    arrays = {
        name: np.zeros(shapes.get(name, (count, PACK_LENGTH)), dtype) for name, dtype in SHARD_DTYPES.items()
    }
    for index, length in enumerate(INSTANCE_LENGTHS):
        split = length // 2
        tokens = rng.integers(FIRST_WORD, vocab_size, length)
        tokens[[0, split, length - 1]] = CLS, SEP, SEP
        words = np.setdiff1d(np.arange(length), [0, split, length - 1])
        masked = np.sort(rng.choice(words, min(PACK_PREDICTIONS, length // 5), replace=False))
        arrays["masked_lm_positions"][index, : len(masked)] = masked
        arrays["masked_lm_ids"][index, : len(masked)] = tokens[masked]
        tokens[masked] = MASK
        arrays["input_ids"][index, :length] = tokens
        arrays["input_mask"][index, :length] = 1
        arrays["segment_ids"][index, split + 1 : length] = 1
        arrays["next_sentence_labels"][index] = rng.integers(0, 2)
    return arrays


def packed_batch(arrays: dict[str, np.ndarray]) -> tuple[dict[str, torch.Tensor], list[np.ndarray]]:
    """Model inputs of ``arrays`` packed by ``packing.pack_instances`` (int64), and which instances
    each row holds, in slot order."""
    packed = packing.pack_instances(arrays, PACK_SEQUENCES, "spfhp", np.random.default_rng(0))
    lengths = arrays["input_mask"].sum(axis=1)
    plan = packing.plan_packs(lengths, PACK_LENGTH, PACK_SEQUENCES, "spfhp", np.random.default_rng(0))
    names = {
        "input_ids": "input_ids",
        "token_type_ids": "segment_ids",
        "attention_mask": "input_mask",
        "masked_lm_positions": "masked_lm_positions",
        "position_ids": "position_ids",
        "next_sentence_positions": "next_sentence_positions",
    }
    batch = {ours: torch.from_numpy(packed[theirs].astype(np.int64)) for ours, theirs in names.items()}
    return batch, plan


def outputs_alone(model: BertForPreTraining, arrays: dict[str, np.ndarray], index: int) -> list[torch.Tensor]:
    """``[mlm_logits [P_i, V], nsp_logits [2]]`` of instance ``index`` run as a batch of one,
    unpadded, with the default position ids."""
    length = int(arrays["input_mask"][index].sum())
    row = {
        name: torch.from_numpy(arrays[name][index, :length].astype(np.int64))[None]
        for name in ("input_ids", "segment_ids")
    }
    positions = arrays["masked_lm_positions"][index]
    positions = torch.from_numpy(positions[positions > 0].astype(np.int64))[None]
    with torch.no_grad():
        mlm, nsp = model(row["input_ids"], row["segment_ids"], torch.ones_like(row["input_ids"]), positions)
    return [mlm[0], nsp[0]]


def outputs_packed(
    model: BertForPreTraining,
    batch: dict[str, torch.Tensor],
    plan: list[np.ndarray],
    arrays: dict[str, np.ndarray],
) -> dict[int, list[torch.Tensor]]:
    """Instance index -> ``[mlm_logits [P_i, V], nsp_logits [2]]`` read from the packed rows' outputs."""
    with torch.no_grad():
        mlm, nsp = model(**batch)
    assert nsp.shape == (len(plan), PACK_SEQUENCES, 2)
    counts = (arrays["masked_lm_positions"] > 0).sum(axis=1)
    outputs = {}
    for row, members in enumerate(plan):
        # A row's predictions are its instances' own, one after the other in slot order.
        start = 0
        for slot, index in enumerate(members):
            outputs[int(index)] = [mlm[row, start : start + counts[index]], nsp[row, slot]]
            start += counts[index]
    return outputs


def assert_outputs_close(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    for got, want in zip(actual, expected, strict=True):
        assert got.shape == want.shape
        assert (got - want).abs().max() <= 1e-5


@pytest.fixture
def large_model(tiny_config: BertConfig) -> BertForPreTraining:
    return with_large_weights(BertForPreTraining(tiny_config).eval(), seed=2)


def test_packed_sequences_equal_sequences_alone(large_model: BertForPreTraining, vocab_size: int) -> None:
    arrays = instances(vocab_size)
    batch, plan = packed_batch(arrays)
    assert sorted(len(members) for members in plan) == [1, 2, 3]
    packed = outputs_packed(large_model, batch, plan, arrays)
    for index in range(len(INSTANCE_LENGTHS)):
        assert_outputs_close(packed[index], outputs_alone(large_model, arrays, index))


def test_packed_sequences_do_not_see_each_other(large_model: BertForPreTraining, vocab_size: int) -> None:
    arrays = instances(vocab_size)
    batch, plan = packed_batch(arrays)
    row = next(row for row, members in enumerate(plan) if len(members) == PACK_SEQUENCES)
    changed = {**batch, "input_ids": batch["input_ids"].clone()}
    # New words for the row's first sequence (its special tokens and [MASK]s kept) and its padding.
    first = batch["attention_mask"][row] == 1
    words = first & (batch["input_ids"][row] >= FIRST_WORD)
    changed["input_ids"][row, words] = FIRST_WORD + (batch["input_ids"][row, words] - FIRST_WORD + 1) % (
        vocab_size - FIRST_WORD
    )
    changed["input_ids"][row, batch["attention_mask"][row] == 0] = FIRST_WORD
    before = outputs_packed(large_model, batch, plan, arrays)
    after = outputs_packed(large_model, changed, plan, arrays)
    first_index, *others = (int(index) for index in plan[row])
    assert (after[first_index][1] - before[first_index][1]).abs().max() > 1e-3
    for index in others:
        assert_outputs_close(after[index], before[index])


def test_packed_position_ids_restart_at_each_sequence(
    large_model: BertForPreTraining, vocab_size: int
) -> None:
    arrays = instances(vocab_size)
    batch, plan = packed_batch(arrays)
    for row, members in enumerate(plan):
        starts = batch["next_sentence_positions"][row, : len(members)]
        assert torch.all(batch["position_ids"][row, starts] == 0)
    # Positions counted from the row's start, not each sequence's: the sequences after the first of
    # their row no longer equal themselves alone, the first ones still do.
    counting = {**batch, "position_ids": torch.arange(PACK_LENGTH).expand(len(plan), -1)}
    outputs = outputs_packed(large_model, counting, plan, arrays)
    for members in plan:
        first, *others = (int(index) for index in members)
        assert_outputs_close(outputs[first], outputs_alone(large_model, arrays, first))
        for index in others:
            assert (outputs[index][1] - outputs_alone(large_model, arrays, index)[1]).abs().max() > 1e-3


def test_packed_rows_need_position_ids(tiny_config: BertConfig, vocab_size: int) -> None:
    batch, _ = packed_batch(instances(vocab_size))
    del batch["position_ids"]
    with pytest.raises(ValueError, match="position_ids"):
        BertForPreTraining(tiny_config)(**batch)


def test_packed_mask_is_block_diagonal_with_padding_on_itself(vocab_size: int) -> None:
    batch, _ = packed_batch(instances(vocab_size))
    input_mask = batch["attention_mask"]
    mask = sdpa_mask(input_mask, packed=True)
    assert mask.shape == (len(input_mask), 1, PACK_LENGTH, PACK_LENGTH)
    tokens = (input_mask != 0)[:, :, None].expand(-1, -1, PACK_LENGTH)
    reference = torch.from_numpy(packed_schema.attention_mask(input_mask.numpy()))
    assert torch.equal(mask[:, 0][tokens], reference[tokens])
    # Every query, padding included, has a key: SDPA may return NaN for one that has none.
    assert torch.all(mask.any(dim=-1))
    unpacked = sdpa_mask(input_mask.clamp(max=1), packed=False)
    assert unpacked.shape == (len(input_mask), 1, 1, PACK_LENGTH)


def train_step(
    model: BertForPreTraining, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """One forward, and a backward where the loss has a graph, with dropout seeded the same each
    time: the pretraining loss, the gradients, and how many times the encoder's layers ran."""
    model.zero_grad()
    torch.manual_seed(4)
    # Spies on forward rather than forward hooks, which the checkpoint's recomputation does not run.
    with ExitStack() as stack:
        spies = [
            stack.enter_context(mock.patch.object(layer, "forward", wraps=layer.forward))
            for layer in model.bert.encoder.layer
        ]
        mlm_logits, nsp_logits = model(
            batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["masked_lm_positions"]
        )
        losses = pretraining_loss(
            mlm_logits, batch["masked_lm_labels"], nsp_logits, batch["next_sentence_labels"]
        )
        if losses[0].requires_grad:
            losses[0].backward()
    calls = sum(spy.call_count for spy in spies)
    gradients = {
        name: parameter.grad for name, parameter in model.named_parameters() if parameter.grad is not None
    }
    return losses[0].detach(), gradients, calls


def test_activation_checkpointing_keeps_loss_and_gradients(tiny_config: BertConfig) -> None:
    # Dropout on: the recomputation must draw the same masks as the forward did.
    assert tiny_config.hidden_dropout_prob > 0 and tiny_config.attention_probs_dropout_prob > 0
    batch = padded_batch(tiny_config.vocab_size)
    batch["masked_lm_positions"] = torch.tensor([[1, 4, 20], [2, 3, 14], [6, 0, 0]])
    batch["masked_lm_labels"] = torch.gather(batch["input_ids"], 1, batch["masked_lm_positions"])
    batch["masked_lm_labels"][2, 1:] = IGNORE_INDEX
    batch["next_sentence_labels"] = torch.tensor([0, 1, 1])
    model = BertForPreTraining(tiny_config).train()
    layers = tiny_config.num_hidden_layers
    loss, gradients, calls = train_step(model, batch)
    assert calls == layers
    assert train_step(model.eval(), batch)[0] != loss  # dropout was on
    model.train()

    model.set_activation_checkpointing(True)
    checkpointed_loss, checkpointed_gradients, calls = train_step(model, batch)
    assert calls == 2 * layers  # each layer ran again in the backward pass
    assert checkpointed_loss == loss
    assert checkpointed_gradients.keys() == gradients.keys() and len(gradients) > 0
    for name, gradient in gradients.items():
        torch.testing.assert_close(checkpointed_gradients[name], gradient, rtol=0, atol=0, msg=name)

    # Forwards with nothing to keep for a backward pass are not checkpointed.
    with mock.patch.object(model_module, "checkpoint", wraps=model_module.checkpoint) as spy:
        with torch.no_grad():
            train_step(model, batch)
        train_step(model.eval(), batch)
        spy.assert_not_called()
        model.train().set_activation_checkpointing(False)
        assert train_step(model, batch)[2] == layers
        spy.assert_not_called()
