"""Data parallelism behind one small interface: the same training loop runs alone, under
torchrun with ``torch.distributed`` DDP (:mod:`.ddp`), or under mpirun/horovodrun with Horovod
(:mod:`.hvd`). :func:`join` picks the one the launcher calls for (:mod:`bertpretrain.runtime.world`) and
sets up this rank's device (:mod:`bertpretrain.runtime.devices`).

Per optimizer step the engine calls, in order: ``accumulate(model, sync)`` around each
micro-batch's forward and backward (gradients are averaged over ranks once, on the last one),
``gradients_ready(optimizer)`` before it reads the gradients (unscaling, clipping), then the step
inside ``stepping(optimizer)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

from bertjob_api.spec import Accelerator, DistributedSpec
from bertpretrain.runtime.devices import Device, open_device
from bertpretrain.runtime.world import World, detect_world

T = TypeVar("T")


class DataParallel(Protocol):
    """The collectives and wrappers one launcher's library provides."""

    world: World
    device: Device
    description: str
    """For the log: the library and its backend or controller."""

    def run(self, job: Callable[[], T]) -> T:
        """``job()``; under elastic Horovod, run again from the start (where it resumes from its
        checkpoints) after the world changed: a rank failed, or hosts came or went."""
        ...

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """The module to run forward and backward through (``model`` is already on the device)."""
        ...

    def wrap_optimizer(
        self, optimizer: torch.optim.Optimizer, model: nn.Module, accumulation_steps: int
    ) -> torch.optim.Optimizer:
        """The optimizer to step; build the schedule on it. ``accumulation_steps`` backward passes
        make one optimizer step."""
        ...

    def accumulate(self, model: nn.Module, sync: bool) -> contextlib.AbstractContextManager[Any]:
        """Around one micro-batch of the wrapped ``model``: ``sync`` on the last of a step."""
        ...

    def gradients_ready(self, optimizer: torch.optim.Optimizer) -> None:
        """Wait until the averaged gradients are in ``.grad``."""
        ...

    def stepping(self, optimizer: torch.optim.Optimizer) -> contextlib.AbstractContextManager[Any]:
        """Around ``optimizer.step()``."""
        ...

    def broadcast_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Give every rank rank 0's parameters, and its optimizer state when it has one."""
        ...

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``values`` over ranks (a collective: every rank calls it)."""
        ...

    def gather_object(self, value: object) -> list[object]:
        """``value`` of every rank, in rank order (a collective)."""
        ...

    def broadcast_object(self, value: object) -> object:
        """Rank 0's ``value`` on every rank (a collective); it may take long on rank 0 (data
        preparation), so it waits without the collective timeout."""
        ...

    def barrier(self) -> None:
        """Wait for every rank."""
        ...

    def close(self) -> None:
        """Leave the process group, if :func:`join` joined it."""
        ...


class Alone:
    """One process: no wrapper, no collective."""

    description = "one process"

    def __init__(self, world: World, device: Device):
        self.world = world
        self.device = device

    def run(self, job: Callable[[], T]) -> T:
        return job()

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def wrap_optimizer(
        self, optimizer: torch.optim.Optimizer, model: nn.Module, accumulation_steps: int
    ) -> torch.optim.Optimizer:
        return optimizer

    def accumulate(self, model: nn.Module, sync: bool) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def gradients_ready(self, optimizer: torch.optim.Optimizer) -> None:
        return None

    def stepping(self, optimizer: torch.optim.Optimizer) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def broadcast_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        return None

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def gather_object(self, value: object) -> list[object]:
        return [value]

    def broadcast_object(self, value: object) -> object:
        return value

    def barrier(self) -> None:
        return None

    def close(self) -> None:
        return None


def join(accelerator: Accelerator, tf32: bool = True, spec: DistributedSpec | None = None) -> DataParallel:
    """Set up this rank's device for ``spec.accelerator`` and join the job's process group in the
    way its launcher calls for: Horovod under mpirun or horovodrun, ``torch.distributed``
    otherwise, nothing for one process. ``spec``: ``spec.distributed`` (default: its defaults).

    Raises:
        RuntimeError: see :func:`bertpretrain.runtime.devices.open_device`; mpirun/horovodrun without
            Horovod installed; a rendezvous that failed within ``spec.timeout_seconds``.
        ValueError: bad launcher variables (:func:`bertpretrain.runtime.world.detect_world`), or bf16
            gradient compression under Horovod, which has no bf16 compressor.
    """
    spec = spec or DistributedSpec()
    world = detect_world()
    device = open_device(accelerator, world, tf32)
    if world.uses_horovod:
        from bertpretrain.runtime.parallel.hvd import HorovodParallel

        return HorovodParallel(world, device, spec)
    if world.distributed:
        from bertpretrain.runtime.parallel.ddp import TorchDistributed

        return TorchDistributed(world, device, spec)
    return Alone(world, device)
