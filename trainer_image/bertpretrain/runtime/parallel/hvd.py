"""Horovod data parallelism, as mpirun or horovodrun (an MPIJob's Launcher) starts it.

``hvd.DistributedOptimizer`` averages each gradient once per ``backward_passes_per_step``
backward passes (the gradient accumulation steps), asynchronously during the last one;
``synchronize()`` waits for it before the gradients are unscaled or clipped, and the step then
runs under ``skip_synchronize()`` (Horovod's documented pattern for AMP and gradient clipping).
Rank 0's parameters, and its optimizer state after a resume, are broadcast at the start of each
phase (Horovod's ``broadcast_parameters`` and ``broadcast_optimizer_state``).

Under elastic horovodrun (``HOROVOD_ELASTIC=1``) :meth:`HorovodParallel.run` is Horovod's
``hvd.elastic.run``: when a rank fails or hosts come and go, the survivors leave the job's
function, Horovod re-forms the world, and the function runs again with the new ranks and size,
resuming from the last checkpoint. The state kept between attempts is the checkpoints on shared
storage (``checkpoint.everySteps`` bounds the work redone), not Horovod's in-memory commits.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from importlib.metadata import version
from typing import Any, TypeVar

import torch
from torch import nn

from bertjob_api.spec import DistributedSpec
from bertpretrain.runtime.devices import Device
from bertpretrain.runtime.parallel import EngineSteps
from bertpretrain.runtime.world import World

T = TypeVar("T")


class HorovodParallel(EngineSteps):
    """:class:`bertpretrain.runtime.parallel.DataParallel` over Horovod (``horovod.torch``).

    ``spec.timeout_seconds`` bounds Horovod's Gloo rendezvous (``HOROVOD_GLOO_TIMEOUT_SECONDS``,
    unless already set). A rank that dies makes mpirun or horovodrun stop the others.

    Raises:
        RuntimeError: Horovod is not installed, or it sees another world than the launcher's
            variables describe.
        ValueError: bf16 gradient compression, which Horovod does not have.
    """

    def __init__(self, world: World, device: Device, spec: DistributedSpec):
        if spec.gradient_compression == "bf16":
            raise ValueError(
                "spec.distributed.gradientCompression bf16: Horovod compresses to fp16 only; use fp16 or none"
            )
        try:
            import horovod.torch as hvd
        except ImportError as error:
            raise RuntimeError(
                f"started by {world.launched_by}, which runs Horovod ranks, but horovod is not installed "
                f"({error}); build it with trainer_image/build_horovod.sh"
            ) from None
        os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(spec.timeout_seconds))
        hvd.init()
        self.elastic = os.environ.get("HOROVOD_ELASTIC") == "1"
        # Elastic ranks are assigned at each rendezvous; the launch-time variables are a first guess.
        if not self.elastic and (hvd.rank(), hvd.size()) != (world.rank, world.world_size):
            raise RuntimeError(
                f"Horovod sees rank {hvd.rank()} of {hvd.size()}, but {world.launched_by}'s variables "
                f"say rank {world.rank} of {world.world_size}"
            )
        self.hvd = hvd
        self.world = world
        self._read_world()
        self.device = device
        self.compression = (
            hvd.Compression.fp16 if spec.gradient_compression == "fp16" else hvd.Compression.none
        )
        controller = "MPI" if hvd.mpi_enabled() else "Gloo"
        compressed = ", fp16 gradient compression" if spec.gradient_compression == "fp16" else ""
        mode = ", elastic" if self.elastic else ""
        self.description = f"Horovod {version('horovod')} ({controller} controller{compressed}{mode})"

    def _read_world(self) -> None:
        self.world = World(
            self.world.launched_by,
            self.hvd.rank(),
            self.hvd.size(),
            self.hvd.local_rank(),
            self.hvd.local_size(),
        )

    def run(self, job: Callable[[], T]) -> T:
        if not self.elastic:
            return job()
        state = self.hvd.elastic.TorchState()
        state.register_reset_callbacks([self._read_world])

        @self.hvd.elastic.run
        def attempt(state: Any) -> T:
            if self.world.rank == 0:
                print(f"bertpretrain: elastic Horovod: {self.world.describe()}", flush=True)
            return job()

        return attempt(state)

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def wrap_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        model: nn.Module,
        accumulation_steps: int,
        config: Mapping[str, Any] | None = None,
    ) -> torch.optim.Optimizer:
        return self.hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            compression=self.compression,
            backward_passes_per_step=accumulation_steps,
            op=self.hvd.Average,
        )

    def accumulate(self, model: nn.Module, sync: bool) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # backward_passes_per_step delays the all-reduce.

    def gradients_ready(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.synchronize()  # type: ignore[attr-defined]

    def stepping(self, optimizer: torch.optim.Optimizer) -> contextlib.AbstractContextManager[Any]:
        return optimizer.skip_synchronize()  # type: ignore[attr-defined]

    def broadcast_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        # On a fresh optimizer broadcast_optimizer_state would first take a step with zero
        # gradients to create the state, and LAMB's weight decay would move the weights.
        if optimizer.state:
            self.hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return self.hvd.allreduce(values, op=self.hvd.Sum)

    # Named: Horovod matches collectives across ranks by name, and its default is the value's
    # type, which differs between rank 0's value and the others' None.
    def gather_object(self, value: object) -> list[object]:
        return list(self.hvd.allgather_object(value, name="bertpretrain.gather_object"))

    def broadcast_object(self, value: object) -> object:
        return self.hvd.broadcast_object(value, root_rank=0, name="bertpretrain.broadcast_object")

    def barrier(self) -> None:
        self.hvd.barrier()

    def close(self) -> None:
        self.hvd.shutdown()
