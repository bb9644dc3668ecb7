"""``torch.distributed`` data parallelism, as torchrun (a PyTorchJob's pods) starts it.

The model is wrapped in :class:`~torch.nn.parallel.DistributedDataParallel`, which broadcasts
rank 0's parameters when it is built and averages the gradients in buckets during the backward
pass; ``no_sync`` skips that on all but the last micro-batch of a step. With
``spec.distributed.gradientCompression`` the buckets travel as fp16 or bf16 (torch's
``fp16_compress_hook``/``bf16_compress_hook``) and are averaged back in fp32.

Every collective, DDP's backward pass and the joining itself run inside
:func:`bertpretrain.runtime.parallel.peers.collective`: another rank that is gone (its connection
closed, or the collective timed out waiting for it) raises
:class:`bertpretrain.common.peers.PeerLostError` (exit 201, retryable) rather than this rank's
failure (exit 1).
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from bertjob_api.spec import DistributedSpec
from bertpretrain.runtime.devices import Device
from bertpretrain.runtime.parallel import EngineSteps
from bertpretrain.runtime.parallel.peers import collective
from bertpretrain.runtime.world import World

T = TypeVar("T")
_COMPRESSION_HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}
# Rank 0 may prepare the data for hours while the others wait in broadcast_object.
_PREPARATION_TIMEOUT = datetime.timedelta(days=7)


class TorchDistributed(EngineSteps):
    """:class:`bertpretrain.runtime.parallel.DataParallel` over ``torch.distributed``.

    Joins the process group from torchrun's ``MASTER_ADDR``/``MASTER_PORT`` (``env://``) on the
    device's backend, unless one is already initialised (then it is left open on :meth:`close`).
    A collective that waits longer than ``spec.timeout_seconds`` for a rank fails; the object
    collectives wait up to 7 days (rank 0 may prepare the data meanwhile, and fine-tuning's ranks
    may run unequal shares of seeds before they gather).

    Raises:
        PeerLostError: (here and from every collective) another rank is gone or never came.
    """

    def __init__(self, world: World, device: Device, spec: DistributedSpec):
        self.world = world
        self.device = device
        self.compression = spec.gradient_compression
        self._owns_group = not dist.is_initialized()
        with self._collective("joining the process group"):
            if self._owns_group:
                dist.init_process_group(
                    backend=device.backend,
                    timeout=datetime.timedelta(seconds=spec.timeout_seconds),
                    world_size=world.world_size,
                    rank=world.rank,
                )
            # Object collectives pickle through CPU tensors: a Gloo group, with its own timeout.
            self._objects = dist.new_group(backend="gloo", timeout=_PREPARATION_TIMEOUT)
        backend = dist.get_backend()
        compression = "" if self.compression == "none" else f", {self.compression} gradient compression"
        self.description = f"torch.distributed DDP ({backend}{compression})"

    def _collective(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Around a collective called ``name`` in the log: a lost peer raises PeerLostError."""
        return collective(name, self.world.rank)

    def run(self, job: Callable[[], T]) -> T:
        return job()  # torchrun restarts failed ranks itself, as new processes.

    def wrap_model(self, model: nn.Module) -> nn.Module:
        device_ids = [self.device.device.index] if self.device.device.type == "cuda" else None
        with self._collective("DDP's broadcast of the parameters"):
            wrapped = DistributedDataParallel(model, device_ids=device_ids)
        hook = _COMPRESSION_HOOKS.get(self.compression)
        if hook is not None:
            wrapped.register_comm_hook(None, hook)
        return wrapped

    def wrap_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        model: nn.Module,
        accumulation_steps: int,
        config: Mapping[str, Any] | None = None,
    ) -> torch.optim.Optimizer:
        return optimizer

    def accumulate(self, model: nn.Module, sync: bool) -> contextlib.AbstractContextManager[Any]:
        assert isinstance(model, DistributedDataParallel)
        return contextlib.nullcontext() if sync else model.no_sync()

    def backward(self, loss: torch.Tensor, accumulation_steps: int, scaler: torch.amp.GradScaler) -> None:
        # On a step's last micro-batch the backward pass all-reduces the gradients' buckets.
        with self._collective("the backward pass (all_reduce of the gradients)"):
            super().backward(loss, accumulation_steps, scaler)

    def gradients_ready(self, optimizer: torch.optim.Optimizer) -> None:
        return None  # DDP's backward pass returns with the gradients averaged.

    def stepping(self, optimizer: torch.optim.Optimizer) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def broadcast_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        # DDP broadcast the parameters when it wrapped the model; every rank loads the optimizer
        # state of a resumed checkpoint from the same file.
        return None

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        values = values.clone()
        with self._collective("all_reduce"):
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values

    def gather_object(self, value: object) -> list[object]:
        values: list[object] = [None] * self.world.world_size
        with self._collective("all_gather_object"):
            dist.all_gather_object(values, value, group=self._objects)
        return values

    def broadcast_object(self, value: object) -> object:
        box = [value]
        with self._collective("broadcast_object_list"):
            dist.broadcast_object_list(box, src=0, group=self._objects)
        return box[0]

    def barrier(self) -> None:
        with self._collective("barrier"):
            dist.barrier()

    def close(self) -> None:
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
