"""How a sharded optimizer sees its parameters: one flat partition per parameter group, holding
pieces of whole tensors (DeepSpeed ZeRO-1/2, :mod:`bertpretrain.runtime.parallel.deepspeed`).

An optimizer whose update is not element-wise (LAMB: a global gradient norm, per-tensor trust
ratios) takes a :class:`FlatShard` per group and an :data:`AllReduce` through a
``shard(shards, all_reduce)`` method, and computes whole-tensor norms from partial sums of squares
summed over the ranks (``bertpretrain.training.optimizer.Lamb.shard``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

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
