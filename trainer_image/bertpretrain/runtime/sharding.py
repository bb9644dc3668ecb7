"""How a sharded optimizer sees its parameters: one flat partition per parameter group (or
sub-group), holding pieces of whole tensors (DeepSpeed ZeRO, :mod:`bertpretrain.runtime.parallel.deepspeed`);
and how the rest of the trainer reads a model whose parameters are themselves partitioned over
the ranks (ZeRO-3: :func:`whole_parameters`, :func:`whole_copy`, :func:`parameter_count`).

An optimizer whose update is not element-wise (LAMB: a global gradient norm, per-tensor trust
ratios) takes a :class:`FlatShard` per group and an :data:`AllReduce` through a
``shard(shards, all_reduce)`` method, and computes whole-tensor norms from partial sums of squares
summed over the ranks (``bertpretrain.training.optimizer.Lamb.shard``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

AllReduce = Callable[[torch.Tensor], torch.Tensor]
"""The element-wise sum of a tensor over the ranks that share the optimizer (a collective)."""


@dataclass(frozen=True)
class FlatShard:
    """Which whole tensor each element of one flat partition belongs to.

    ``tensor_ids``: int64, shape ``[partition numel]``, on the partition's device; element ``j``
    of the partition is part of tensor ``tensor_ids[j]`` (0 to ``tensors - 1``, the same numbering
    on every rank), or ``tensors`` where it is padding. ``tensors``: how many tensors the group's
    flat buffer holds over all ranks.
    """

    tensor_ids: torch.Tensor
    tensors: int

    def sums_of_squares(self, values: torch.Tensor) -> torch.Tensor:
        """fp32 ``[tensors]``: for each whole tensor, the sum of squares of its elements in
        ``values`` (this partition's, shape ``[partition numel]``); padding left out."""
        sums = torch.zeros(self.tensors + 1, dtype=torch.float32, device=values.device)
        sums.index_add_(0, self.tensor_ids, values.float().square())
        return sums[: self.tensors]

    def spread(self, per_tensor: torch.Tensor) -> torch.Tensor:
        """``per_tensor`` (``[tensors]``) laid over the partition: ``[partition numel]``, padding 1."""
        return torch.cat([per_tensor, per_tensor.new_ones(1)])[self.tensor_ids]


def _partitioned(model: nn.Module) -> list[nn.Parameter]:
    # DeepSpeed ZeRO-3 marks each parameter it partitions with its ds_* attributes.
    return [p for p in model.parameters() if hasattr(p, "ds_id")]


def whole_parameters(
    model: nn.Module, modifier_rank: int | None = None
) -> contextlib.AbstractContextManager[Any]:
    """Around code that reads ``model``'s whole parameters (``state_dict()`` for a checkpoint) or,
    with ``modifier_rank``, writes them there (``load_state_dict``): under ZeRO-3, where each rank
    holds a slice of each parameter, DeepSpeed's ``deepspeed.zero.GatheredParameters`` (a
    collective: every rank enters it; what ``modifier_rank`` wrote reaches every rank's slice on
    exit); nothing for a model whose parameters are whole."""
    params = _partitioned(model)
    if not params:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank)


@contextlib.contextmanager
def whole_copy(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` itself, or under ZeRO-3 a copy of it with whole parameters and no DeepSpeed hooks
    (made by every rank together: a collective), to run forward on one rank alone (evaluation,
    whose batch count differs between ranks; a ZeRO-3 forward gathers each layer's parameters
    from all ranks). The copy is built on the meta device, so it draws no random numbers, and
    takes the gathered tensors; the model needs a ``config`` attribute its class is built from.
    Tied parameters are untied in the copy (equal values; it is not trained)."""
    if not _partitioned(model):
        yield model
        return
    with whole_parameters(model):
        state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    with torch.device("meta"):
        copy = type(model)(model.config)
    copy.load_state_dict(state, assign=True)
    copy.train(model.training)
    yield copy


def parameter_count(model: nn.Module) -> int:
    """Number of parameter elements of the whole model, tied tensors counted once (under ZeRO-3 a
    parameter's own tensor is empty between forwards; its whole size is ``ds_numel``)."""
    return sum(int(getattr(p, "ds_numel", p.numel())) for p in model.parameters())
