"""precision fp8 (bertpretrain.runtime.fp8): which layers torchao's float8 training takes over, that
parameters and checkpoints are unchanged, that the converted model trains (emulated on the CPU), and
the refusals of layers and devices FP8 cannot run on."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn
from torchao.float8.config import ScalingGranularity, ScalingType
from torchao.float8.float8_linear import Float8Linear

from bertpretrain.model.bert import BertForPreTraining, pretraining_loss
from bertpretrain.model.config import BertConfig
from bertpretrain.runtime.fp8 import check_fp8_device, convert_encoder_to_fp8

pytestmark = pytest.mark.usefixtures("one_thread")

ENCODER_LINEARS = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)
# The Linear layers that stay as they are, under bf16 autocast.
KEPT = (
    "cls.predictions.decoder",
    "cls.predictions.transform.dense",
    "cls.seq_relationship",
    "bert.pooler.dense",
)


def _model(config: BertConfig) -> BertForPreTraining:
    torch.manual_seed(0)
    return BertForPreTraining(config)


def test_exactly_the_encoder_linears_are_converted(tiny_config: BertConfig) -> None:
    # tiny_config's vocabulary (44) is no multiple of 16: the decoder, kept, is not checked.
    model = _model(tiny_config)
    converted = convert_encoder_to_fp8(model, emulate=True)
    expected = {f"bert.encoder.layer.{index}.{name}" for index in range(2) for name in ENCODER_LINEARS}
    assert len(converted) == 12
    assert set(converted) == expected
    modules = dict(model.named_modules())
    assert {name for name, module in modules.items() if isinstance(module, Float8Linear)} == expected
    for name in converted:
        config = modules[name].config
        assert config.emulate
        for cast in (config.cast_config_input, config.cast_config_weight, config.cast_config_grad_output):
            assert cast.scaling_type is ScalingType.DYNAMIC
            assert cast.scaling_granularity is ScalingGranularity.TENSORWISE
    for name in KEPT:
        assert type(modules[name]) is nn.Linear, name


def test_parameters_and_checkpoints_are_unchanged(tiny_config: BertConfig) -> None:
    model = _model(tiny_config)
    before = model.state_dict()
    parameters = dict(model.named_parameters())
    convert_encoder_to_fp8(model, emulate=True)
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[name], tensor) for name, tensor in before.items())
    assert all(parameter is parameters[name] for name, parameter in model.named_parameters())
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias
    # A plain model's checkpoint loads into a converted one, and the other way round.
    plain = _model(tiny_config)
    with torch.no_grad():
        for parameter in plain.parameters():
            parameter.add_(1.0)
    model.load_state_dict(plain.state_dict())
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in plain.state_dict().items())
    fresh = BertForPreTraining(tiny_config)
    fresh.load_state_dict(after)
    assert all(torch.equal(fresh.state_dict()[name], tensor) for name, tensor in after.items())


def _tensorwise_e4m3(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` through e4m3 with one scale, its absolute maximum mapped to e4m3's largest (448)."""
    largest = torch.finfo(torch.float8_e4m3fn).max
    scale = largest / tensor.abs().max().float()
    return (tensor.float() * scale).clamp(-largest, largest).to(torch.float8_e4m3fn).float() / scale


def test_a_converted_layer_multiplies_in_fp8(tiny_config: BertConfig) -> None:
    model = _model(tiny_config)
    plain = copy.deepcopy(model.bert.encoder.layer[0].intermediate.dense)
    convert_encoder_to_fp8(model, emulate=True)
    layer = model.bert.encoder.layer[0].intermediate.dense
    x = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = _tensorwise_e4m3(x) @ _tensorwise_e4m3(plain.weight).T + plain.bias
        output = layer(x)
        assert output.shape == (3, 5, 64)
        torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-6)
        assert not torch.allclose(output, plain(x), rtol=1e-5, atol=1e-6)  # FP8 loses precision


def _batch(vocab_size: int) -> dict[str, torch.Tensor]:
    """Four unpadded rows of 16 tokens, two segments, four masked positions each."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, vocab_size, (4, 16), generator=generator)
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 8:] = 1
    positions = torch.tensor([1, 4, 9, 13]).repeat(4, 1)
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": torch.ones_like(input_ids),
        "masked_lm_positions": positions,
        "masked_lm_labels": torch.randint(5, vocab_size, (4, 4), generator=generator),
        "next_sentence_labels": torch.tensor([0, 1, 1, 0]),
    }


def test_converted_model_trains_under_bf16_autocast(tiny_config: BertConfig) -> None:
    model = _model(tiny_config)
    convert_encoder_to_fp8(model, emulate=True)
    batch = _batch(tiny_config.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(8):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mlm_logits, nsp_logits = model(
                batch["input_ids"],
                batch["token_type_ids"],
                batch["attention_mask"],
                batch["masked_lm_positions"],
            )
            loss, _, _ = pretraining_loss(
                mlm_logits, batch["masked_lm_labels"], nsp_logits, batch["next_sentence_labels"]
            )
        assert mlm_logits.shape == (4, 4, tiny_config.vocab_size)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    encoder_weight = model.bert.encoder.layer[0].attention.self.query.weight
    assert encoder_weight.dtype == torch.float32 and encoder_weight.grad is not None
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] - 0.2, losses


@pytest.mark.parametrize(
    ("widths", "layer", "shape"),
    [
        ({"hidden_size": 40}, "bert.encoder.layer.0.attention.self.query", "40 -> 40"),
        ({"intermediate_size": 72}, "bert.encoder.layer.0.intermediate.dense", "32 -> 72"),
    ],
)
def test_widths_that_are_no_multiple_of_16_are_refused(
    tiny_config: BertConfig, widths: dict[str, int], layer: str, shape: str
) -> None:
    model = _model(dataclasses.replace(tiny_config, **widths))
    with pytest.raises(ValueError, match=f"{layer} is {shape} features.*multiples of 16"):
        convert_encoder_to_fp8(model, emulate=True)
    assert not any(isinstance(module, Float8Linear) for module in model.modules())


def test_converting_again_converts_nothing(tiny_config: BertConfig) -> None:
    model = _model(tiny_config)
    convert_encoder_to_fp8(model, emulate=True)
    converted = {name: module for name, module in model.named_modules() if isinstance(module, Float8Linear)}
    assert convert_encoder_to_fp8(model, emulate=True) == []
    assert {name: module for name, module in model.named_modules() if isinstance(module, Float8Linear)} == (
        converted
    )


def _gpu(monkeypatch: pytest.MonkeyPatch, name: str, capability: tuple[int, int]) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


@pytest.mark.parametrize(
    ("name", "capability"),
    [("NVIDIA L4", (8, 9)), ("NVIDIA H100 80GB HBM3", (9, 0)), ("NVIDIA B200", (10, 0))],
)
def test_fp8_runs_on_ada_and_newer(
    monkeypatch: pytest.MonkeyPatch, name: str, capability: tuple[int, int]
) -> None:
    _gpu(monkeypatch, name, capability)
    check_fp8_device(torch.device("cuda", 0))


@pytest.mark.parametrize(
    ("name", "capability"),
    [("NVIDIA A100-SXM4-80GB", (8, 0)), ("NVIDIA A10G", (8, 6)), ("Tesla V100-SXM2-32GB", (7, 0))],
)
def test_fp8_is_refused_on_older_gpus(
    monkeypatch: pytest.MonkeyPatch, name: str, capability: tuple[int, int]
) -> None:
    _gpu(monkeypatch, name, capability)
    with pytest.raises(RuntimeError) as caught:
        check_fp8_device(torch.device("cuda", 0))
    message = str(caught.value)
    assert message.startswith("spec.precision: fp8 needs an NVIDIA GPU of compute capability 8.9 or newer")
    assert f"{name} is {capability[0]}.{capability[1]}" in message


@pytest.mark.parametrize("device", ["cpu", "hpu"])
def test_fp8_is_refused_off_cuda(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    _gpu(monkeypatch, "NVIDIA H100 80GB HBM3", (9, 0))  # a GPU in the machine is not this rank's device
    with pytest.raises(RuntimeError, match=rf"spec\.precision: fp8 needs an NVIDIA GPU.*device is {device}"):
        check_fp8_device(torch.device(device))
