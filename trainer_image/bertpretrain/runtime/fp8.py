"""``spec.precision: fp8``: the encoder's matrix products in FP8, through torchao's float8 training.

Each encoder layer's six ``nn.Linear`` (attention.self.query/key/value, attention.output.dense,
intermediate.dense, output.dense) becomes a ``torchao.float8.Float8Linear``: its input, weight and
output gradient are cast to FP8 (e4m3 in the forward pass, e5m2 for the gradients) with one scale
per tensor computed from its current absolute maximum ("tensorwise" dynamic scaling, torchao's
default recipe), and multiplied with ``torch._scaled_mm`` on the GPU's FP8 tensor cores, the
results in the input's dtype. Parameters, optimizer state and everything else stay as they are:
fp32 parameters, the rest of the model (embeddings, LayerNorm, attention's softmax, the pooler, the
heads and the tied MLM decoder) under bf16 autocast. The formats: Micikevicius et al. 2022, "FP8
Formats for Deep Learning" (arXiv:2209.05433); the recipe: torchao's ``torchao/float8/README.md``.

It pays only for wide layers: each product first reduces and casts its operands. Measured on one
H200 (torch 2.11, torchao 0.18; four encoder layers compiled, forward and backward, 32 x 512
tokens), fp8 ran at 0.82x bf16's speed at bert-base's width, 0.88x at bert-large's (0.94x at
128 x 512) and 1.33x at hidden size 4096.

torchao is imported inside the functions: a job in another precision does not need it.
"""

from __future__ import annotations

import torch
from torch import nn

# Where the encoder's layers are in the pretraining model and in the fine-tuning heads (both hold
# the encoder as ``bert``, Hugging Face's names).
ENCODER_LAYERS = "bert.encoder.layer."
# torch._scaled_mm, which Float8Linear multiplies with, needs both dimensions of the weight to be
# multiples of 16 (FP8 tensor-core tiles).
DIM_MULTIPLE = 16
# FP8 tensor cores: Ada (8.9) and Hopper (9.0) onwards.
MIN_CAPABILITY = (8, 9)


def _encoder_linears(model: nn.Module) -> dict[str, nn.Linear]:
    return {
        name: module
        for name, module in model.named_modules()
        if name.startswith(ENCODER_LAYERS) and type(module) is nn.Linear
    }


def convert_encoder_to_fp8(model: nn.Module, emulate: bool = False) -> list[str]:
    """Convert, in place, the encoder layers' ``nn.Linear`` of ``model`` to torchao float8
    training; returns their qualified names, in ``named_modules`` order.

    Exactly the plain ``nn.Linear`` modules whose qualified name begins with
    ``bert.encoder.layer.`` are converted (six per layer); nothing else is: not the tied MLM decoder
    (``cls.predictions.decoder``, whose ``[V, H]`` weight is the word-embedding matrix), the
    pooler, the MLM head's transform or the NSP classifier. Each becomes a
    ``torchao.float8.Float8Linear`` (a subclass of ``nn.Linear``) holding the same weight and bias
    Parameters, so parameter names, ``state_dict`` keys and ties are unchanged and checkpoints and
    Hugging Face exports load into either model. A converted layer takes ``[..., in_features]``
    fp32 or bf16 input and returns ``[..., out_features]`` in the input's dtype (CUDA autocast's
    dtype under CUDA autocast); inside it the input, the weight and the output gradient are cast to
    FP8 with one dynamic scale per tensor (torchao's "tensorwise" scaling; the FP8 formats of
    Micikevicius et al. 2022, "FP8 Formats for Deep Learning"). A layer already converted is left
    as it is (and not returned).

    ``emulate``: compute the FP8 products in higher precision (torchao's
    ``Float8LinearConfig(emulate=True)``), for tests on CPUs and GPUs without FP8 tensor cores.

    Raises:
        ValueError: an encoder Linear whose ``in_features`` or ``out_features`` is not a multiple
            of 16 (what ``torch._scaled_mm`` needs), naming the layer and its shape; raised
            before any layer is converted.
    """
    linears = _encoder_linears(model)
    for name, linear in linears.items():
        if linear.in_features % DIM_MULTIPLE or linear.out_features % DIM_MULTIPLE:
            raise ValueError(
                f"fp8: {name} is {linear.in_features} -> {linear.out_features} features; FP8 matrix "
                f"products need both to be multiples of {DIM_MULTIPLE} (choose hidden and "
                f"intermediate sizes that are, or precision bf16)"
            )
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    chosen = {id(linear) for linear in linears.values()}
    convert_to_float8_training(
        model,
        config=Float8LinearConfig(emulate=emulate),
        module_filter_fn=lambda module, _name: id(module) in chosen,
    )
    return list(linears)


def check_fp8_device(device: torch.device) -> None:
    """Refuse ``precision: fp8`` on a device without FP8 tensor cores.

    Raises:
        RuntimeError: ``device`` is not a CUDA device, or its compute capability is below 8.9
            (Ada, Hopper and newer have FP8 tensor cores; an A100 is 8.0); the message names
            ``spec.precision``.
    """
    if device.type != "cuda":
        raise RuntimeError(
            f"spec.precision: fp8 needs an NVIDIA GPU of compute capability "
            f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer (Ada, Hopper); this rank's device "
            f"is {device.type}; use bf16"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        raise RuntimeError(
            f"spec.precision: fp8 needs an NVIDIA GPU of compute capability "
            f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer (Ada, Hopper); "
            f"{torch.cuda.get_device_name(device)} is {capability[0]}.{capability[1]}; use bf16"
        )
