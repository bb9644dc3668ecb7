"""Data parallelism behind one small interface: the same training loop runs alone, under
torchrun with ``torch.distributed`` DDP (:mod:`.ddp`), under mpirun/horovodrun with Horovod
(:mod:`.hvd`), or, with ``spec.distributed.deepspeed``, under torchrun or mpirun with DeepSpeed ZeRO
(:mod:`.deepspeed`). :func:`bertpretrain.runtime.parallel.joining.join` picks the one the job and
its launcher call for (:mod:`bertpretrain.runtime.world`) and sets up this rank's device
(:mod:`bertpretrain.runtime.devices`).

Per optimizer step the engine calls, in order: ``accumulate(model, sync)`` around each
micro-batch's forward and ``backward`` (gradients are averaged over ranks once, on the last one),
``gradients_ready(optimizer)`` before it reads the gradients (unscaling, clipping), then the step
inside ``stepping(optimizer)``, and ``step_skipped()``. DDP, Horovod and one process leave precision,
clipping and the loss scale to the engine (:class:`EngineSteps`); DeepSpeed does them itself
(``owns_step``), in its ``backward`` and in the step of the optimizer its ``wrap_optimizer`` returns.
Before rank 0 writes a checkpoint, every rank calls ``gather_optimizer_state`` (ZeRO's optimizer
state is sharded over the ranks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

from bertpretrain.runtime.devices import Device
from bertpretrain.runtime.world import World

T = TypeVar("T")


class DataParallel(Protocol):
    """The collectives and wrappers one launcher's library provides."""

    world: World
    device: Device
    description: str
    """For the log: the library and its backend or controller."""
    owns_step: bool
    """Whether the library does mixed precision, loss scaling and gradient clipping itself (the
    engine then runs fp32 code without autocast, scaler or clipping of its own)."""

    def run(self, job: Callable[[], T]) -> T:
        """``job()``; under elastic Horovod, run again from the start (where it resumes from its
        checkpoints) after the world changed: a rank failed, or hosts came or went."""
        ...

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """The module to run forward and backward through (``model`` is already on the device)."""
        ...

    def wrap_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        model: nn.Module,
        accumulation_steps: int,
        config: Mapping[str, Any] | None = None,
    ) -> torch.optim.Optimizer:
        """The optimizer to step; build the schedule on it. ``accumulation_steps`` backward passes
        make one optimizer step. ``config``: the library's own configuration for this phase
        (DeepSpeed's, :func:`bertjob_api.deepspeed.phase_config`), where it takes one."""
        ...

    def accumulate(self, model: nn.Module, sync: bool) -> contextlib.AbstractContextManager[Any]:
        """Around one micro-batch of the wrapped ``model``: ``sync`` on the last of a step."""
        ...

    def backward(self, loss: torch.Tensor, accumulation_steps: int, scaler: torch.amp.GradScaler) -> None:
        """Back-propagate one micro-batch's ``loss`` (a scalar, the micro-batch's mean), weighted
        ``1 / accumulation_steps`` and scaled by ``scaler`` (or by the library's own loss scale)."""
        ...

    def step_skipped(self) -> bool:
        """Whether the library skipped the optimizer step just taken (an fp16 overflow in its own
        loss scaling); False where the engine's gradient scaler decides."""
        ...

    def gather_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        """Collect on rank 0 what ``optimizer.state_dict()`` must hold there for a checkpoint, where
        the ranks hold parts of it (a collective: every rank calls it before rank 0 saves)."""
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


class EngineSteps:
    """The engine's own precision and step: torch autocast, ``GradScaler`` and clipping (DDP,
    Horovod, one process); the optimizer state is whole on every rank."""

    owns_step = False

    def backward(self, loss: torch.Tensor, accumulation_steps: int, scaler: torch.amp.GradScaler) -> None:
        scaler.scale(loss / accumulation_steps).backward()

    def step_skipped(self) -> bool:
        return False

    def gather_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        return None


class Alone(EngineSteps):
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
        self,
        optimizer: torch.optim.Optimizer,
        model: nn.Module,
        accumulation_steps: int,
        config: Mapping[str, Any] | None = None,
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
