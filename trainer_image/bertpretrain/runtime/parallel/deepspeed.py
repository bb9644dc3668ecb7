"""DeepSpeed ZeRO data parallelism (``spec.distributed.deepspeed``), under torchrun (PyTorchJob) or
mpirun (MPIJob).

The process group is joined as for DDP (:class:`bertpretrain.runtime.parallel.ddp.TorchDistributed`,
``env://``), and ``deepspeed.initialize`` then finds it open. Under mpirun the rank and world come
from Open MPI's variables (:mod:`bertpretrain.runtime.world`), not from DeepSpeed's MPI discovery
(which needs mpi4py): they are copied to ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` for DeepSpeed, and
``MASTER_ADDR``/``MASTER_PORT`` must come from the launcher (the MPIJob's mpirun forwards them,
naming the first Worker).

``deepspeed.initialize(model, optimizer, config)`` takes the job's optimizer (LAMB or AdamW) as
ZeRO's client optimizer: ZeRO-1 and ZeRO-2 flatten each parameter group and hand each rank one flat
fp32 partition of it, with the optimizer state for that partition only (ZeRO-2 keeps only that
partition's gradients too). AdamW is element-wise, so it steps a partition as it would the whole;
LAMB is not (a global gradient norm and per-tensor trust ratios), so it is told where each tensor
lies in its partition (:meth:`bertpretrain.training.optimizer.Lamb.shard`) and sums the norms over
the ranks; DeepSpeed's own ``gradient_clipping`` is 0 for it (:func:`bertjob_api.deepspeed.job_keys`).

Each micro-batch runs DeepSpeed's ``backward`` (which divides the loss by the accumulation steps
and applies the fp16 loss scale) and its ``step`` (which only counts, except on the last
micro-batch of a step, where it clips, steps the optimizer and zeroes the gradients).

ZeRO-3 partitions the parameters too: each parameter's own tensor is empty between forwards, and
``param.ds_tensor`` holds this rank's ``ceil(ds_numel / world size)`` elements of it (padded at the
end). The module keeps the hooks ``deepspeed.initialize`` put on it, which gather each layer's
parameters from every rank around its forward and backward, so forward still runs through the
module. The fp32 master partitions are flat per sub-group (``fp32_partitioned_groups_flat``,
``zero_optimization.sub_group_size``), each the sub-group's ``ds_tensor`` slices in order; LAMB's
layout is read from them (:func:`stage3_flat_shards`), and LAMB needs one sub-group per parameter
group (it counts its steps per group). Whatever reads or writes whole parameters goes through
:mod:`bertpretrain.runtime.sharding` (``whole_parameters`` around a checkpoint's ``state_dict`` and
its loading, ``whole_copy`` for evaluation, ``parameter_count``).

Checkpoints stay one file written by rank 0: before it saves, every rank sends its partition's
optimizer state and fp32 master weights to rank 0 (:meth:`DeepSpeedParallel.gather_optimizer_state`),
and the file holds them rank by rank; on resume each rank takes its own back, which restores the
run bitwise. The model weights in the file are whole (ZeRO-1/2 keep every parameter on every
rank; under ZeRO-3 they are gathered for the save), so export and phase 2 read it as any other
checkpoint. A resume with another world size, or across stage 3 and stages 1/2, is refused
(:class:`ZeroOptimizer`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from importlib.metadata import version
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bertjob_api.deepspeed import FIELD, TRAINED_STAGES
from bertjob_api.spec import Accelerator, DistributedSpec
from bertpretrain.runtime.devices import Device
from bertpretrain.runtime.parallel.ddp import TorchDistributed
from bertpretrain.runtime.sharding import FlatShard
from bertpretrain.runtime.world import World

# DeepSpeed's accelerator for each of ours; without it DeepSpeed guesses from what is installed.
SHM_COMM_OP = "deepspeed_shm_comm"
DS_ACCELERATORS: dict[Accelerator, str] = {"xeon-cpu": "cpu", "nvidia-gpu": "cuda", "habana-hpu": "hpu"}


class DeepSpeedParallel(TorchDistributed):
    """:class:`bertpretrain.runtime.parallel.DataParallel` through DeepSpeed ZeRO stage
    ``spec.deepspeed.zeroStage`` (1, 2 or 3).

    Raises:
        RuntimeError: under mpirun without ``MASTER_ADDR`` and ``MASTER_PORT``; DeepSpeed not
            installed; a ZeRO stage this trainer does not run.
    """

    owns_step = True

    def __init__(self, world: World, device: Device, spec: DistributedSpec):
        assert spec.deepspeed is not None
        if spec.deepspeed.zero_stage not in TRAINED_STAGES:
            raise RuntimeError(
                f"spec.distributed.deepspeed.zeroStage {spec.deepspeed.zero_stage}: this trainer runs "
                f"ZeRO stages {' and '.join(map(str, TRAINED_STAGES))}"
            )
        _launcher_variables(world)
        os.environ.setdefault("DS_ACCELERATOR", DS_ACCELERATORS[device.accelerator])
        super().__init__(world, device, spec)
        self.zero_stage = spec.deepspeed.zero_stage
        try:
            ds_version = version("deepspeed")
        except Exception:
            raise RuntimeError(
                "spec.distributed.deepspeed is set but DeepSpeed is not installed in the trainer image "
                "(pip extra 'deepspeed')"
            ) from None
        self.description = f"DeepSpeed {ds_version} ZeRO stage {self.zero_stage} ({dist.get_backend()})"
        self.engine: Any = None

    def wrap_model(self, model: nn.Module) -> nn.Module:
        # DeepSpeed's engine is made with the optimizer (wrap_optimizer); it leaves the module
        # itself to run forward through (ZeRO-1/2's hooks sit on its parameters, ZeRO-3's on its
        # submodules, gathering their parameters).
        return model

    def wrap_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        model: nn.Module,
        accumulation_steps: int,
        config: Mapping[str, Any] | None = None,
    ) -> torch.optim.Optimizer:
        """``deepspeed.initialize`` with ``optimizer`` as ZeRO's client optimizer; returns a
        :class:`ZeroOptimizer` to step and to build the schedule on.

        Raises:
            ValueError: no ``config``, or one whose accumulation steps are not ``accumulation_steps``;
                LAMB under ZeRO-3 with several sub-groups in a parameter group
                (``zero_optimization.sub_group_size`` below a rank's share of a group).
        """
        if config is None:
            raise ValueError("DeepSpeed needs its config (bertjob_api.deepspeed.phase_config)")
        if config.get("gradient_accumulation_steps") != accumulation_steps:
            raise ValueError(
                f"DeepSpeed config has gradient_accumulation_steps "
                f"{config.get('gradient_accumulation_steps')}, the phase {accumulation_steps}"
            )
        import deepspeed
        import deepspeed.ops

        # DeepSpeed's shared-memory all-reduce for CPUs serves only inference_all_reduce, which
        # training never calls; left compatible, it is compiled at the first start (minutes, and a
        # C++ compiler the image does not have). Marking it incompatible keeps gloo's all-reduce.
        deepspeed.ops.__compatible_ops__[SHM_COMM_OP] = False
        self.engine, zero, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=dict(config), dist_init_required=False
        )
        shard = getattr(optimizer, "shard", None)
        if shard is not None:  # not element-wise (LAMB): it must see whole tensors' norms
            # ZeRO steps the groups one at a time, each group's gradients made just before; the
            # global norm over all of them is the one ZeRO computed first (over all ranks,
            # unscaled; zero_optimization.compute_grad_norm, which the job keeps on).
            if self.zero_stage == 3:
                if len(zero.fp16_groups) != len(optimizer.param_groups):
                    # LAMB counts its steps per parameter group; ZeRO-3 would step a group once
                    # per sub-group.
                    raise ValueError(
                        f"{FIELD}.zero_optimization.sub_group_size: LAMB under ZeRO-3 needs one "
                        f"sub-group per parameter group, but {len(zero.fp16_groups)} sub-groups "
                        f"were made for {len(optimizer.param_groups)} groups; raise it"
                    )
                shard(
                    stage3_flat_shards(zero, self.world.rank),
                    _all_reduce_sum,
                    lambda: zero._global_grad_norm,
                    partitions=list(zero.fp32_partitioned_groups_flat),
                )
            else:
                shard(flat_shards(zero, self.world.rank), _all_reduce_sum, lambda: zero._global_grad_norm)
        return ZeroOptimizer(self, zero, optimizer)

    def accumulate(self, model: nn.Module, sync: bool) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # DeepSpeed counts the micro-batches itself.

    def backward(self, loss: torch.Tensor, accumulation_steps: int, scaler: torch.amp.GradScaler) -> None:
        with self._collective("DeepSpeed's backward pass"):  # ZeRO reduces the gradients in it
            self.engine.backward(loss)  # divides by the accumulation steps, scales fp16
            if not self.engine.is_gradient_accumulation_boundary():
                self.engine.step()  # only counts the micro-batch; the last one's is the optimizer step

    def stepping(self, optimizer: torch.optim.Optimizer) -> contextlib.AbstractContextManager[Any]:
        # ZeRO's step all-gathers the updated parameters.
        return self._collective("DeepSpeed's optimizer step")

    def step_skipped(self) -> bool:
        return not self.engine.was_step_applied()

    def broadcast_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        # deepspeed.initialize broadcast rank 0's parameters; every rank loads its own part of a
        # resumed checkpoint's optimizer state from the same file.
        return None

    def gather_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        assert isinstance(optimizer, ZeroOptimizer)
        shard = optimizer.local_state()
        shards: list[object] | None = [None] * self.world.world_size if self.world.rank == 0 else None
        with self._collective("gather_object of the optimizer state"):
            dist.gather_object(shard, shards, dst=0, group=self._objects)
        optimizer.gathered = shards


def _launcher_variables(world: World) -> None:
    """Give DeepSpeed (and ``env://``) the world under mpirun in torchrun's variables."""
    if world.launched_by != "mpirun":
        return
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise RuntimeError(
            f"DeepSpeed under mpirun joins through torch.distributed and needs {' and '.join(missing)} "
            f"(rank 0's host and a free port), forwarded by mpirun (-x)"
        )
    os.environ.setdefault("RANK", str(world.rank))
    os.environ.setdefault("WORLD_SIZE", str(world.world_size))
    os.environ.setdefault("LOCAL_RANK", str(world.local_rank))
    os.environ.setdefault("LOCAL_WORLD_SIZE", str(world.local_world_size))


def _all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    values = values.clone()
    dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def flat_shards(zero: Any, rank: int) -> list[FlatShard]:
    """Where each parameter lies in this rank's flat fp32 partition of each group, read from
    DeepSpeed's ZeRO-1/2 optimizer (``deepspeed/runtime/zero/stage_1_and_2.py``): the group's
    parameters in ``round_robin_bit16_groups`` order, at ``round_robin_bit16_offsets`` in the
    flat buffer, which is cut into partitions of ``partition_size`` elements, rank ``r``'s
    starting at ``r * partition_size``; padding fills the end."""
    shards = []
    for group, (partition, offsets) in enumerate(
        zip(zero.single_partition_of_fp32_groups, zero.round_robin_bit16_offsets, strict=True)
    ):
        tensors = zero.round_robin_bit16_groups[group]
        size = int(zero.partition_size[group])
        assert partition.numel() == size, (partition.numel(), size)
        start = rank * size
        ids = torch.full((size,), len(tensors), dtype=torch.long)
        for index, (tensor, offset) in enumerate(zip(tensors, offsets, strict=True)):
            low, high = max(offset, start), min(offset + tensor.numel(), start + size)
            if low < high:
                ids[low - start : high - start] = index
        shards.append(FlatShard(ids.to(partition.device), len(tensors)))
    return shards


def stage3_flat_shards(zero: Any, rank: int) -> list[FlatShard]:
    """Where each parameter lies in this rank's flat fp32 partition of each ZeRO-3 sub-group,
    read from DeepSpeed's stage-3 optimizer (``deepspeed/runtime/zero/stage3.py``): sub-group
    ``g``'s partition (``fp32_partitioned_groups_flat[g]``) is the parameters of ``fp16_groups[g]``
    in order, each as its ``ds_tensor``: ``partition_numel()`` elements (``ceil(ds_numel / world
    size)``), rank ``r`` holding elements ``r * partition_numel()`` onwards of the flattened
    parameter, padding past ``ds_numel`` (``partition_parameters.py``)."""
    shards = []
    for params, partition in zip(zero.fp16_groups, zero.fp32_partitioned_groups_flat, strict=True):
        ids = torch.full((partition.numel(),), len(params), dtype=torch.long)
        offset = 0
        for index, param in enumerate(params):
            size = int(param.partition_numel())
            held = max(0, min(size, int(param.ds_numel) - rank * size))
            ids[offset : offset + held] = index
            offset += size
        assert offset == partition.numel(), (offset, partition.numel())
        shards.append(FlatShard(ids.to(partition.device), len(params)))
    return shards


class ZeroOptimizer(torch.optim.Optimizer):
    """The optimizer the engine steps under DeepSpeed: ``step`` is DeepSpeed's engine step (clip,
    client optimizer step on this rank's partition, all-gather of the updated parameters, zero
    the gradients); ``param_groups`` are the client optimizer's, so that the schedule sets its
    learning rate.

    ``state_dict`` (rank 0, after :meth:`DeepSpeedParallel.gather_optimizer_state`) holds every
    rank's partition state: ``{"zero": {"stage", "world_size", "ranks": [per rank: "optimizer" (the
    client's state dict), "fp32" (the fp32 master partitions, one per group), "loss_scale"]}}``,
    all tensors and plain values (``torch.load(weights_only=True)`` reads it).
    """

    def __init__(self, parallel: DeepSpeedParallel, zero: Any, client: torch.optim.Optimizer):
        # Not Optimizer.__init__: the parameters are the client's (the schedule only needs an
        # Optimizer with param_groups).
        self.parallel = parallel
        self.zero = zero
        self.client = client
        self.defaults = client.defaults
        self.gathered: list[object] | None = None

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.client.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.client.state

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """DeepSpeed's optimizer step (the last micro-batch's ``engine.step()``)."""
        self.parallel.engine.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None  # DeepSpeed zeroed them in its step.

    def local_state(self) -> dict[str, Any]:
        """This rank's part of the state, tensors on the CPU."""
        scaler = self.zero.loss_scaler
        loss_scale = {
            name: value for name, value in vars(scaler).items() if isinstance(value, bool | int | float)
        }
        with self._client_params():
            client = self.client.state_dict()
        fp32 = [p.detach() for p in self._fp32()]
        return _to_cpu({"optimizer": client, "fp32": fp32, "loss_scale": loss_scale})

    def _fp32(self) -> list[torch.Tensor]:
        """This rank's fp32 master partitions: one per group (ZeRO-1/2) or sub-group (ZeRO-3)."""
        if self.parallel.zero_stage == 3:
            return list(self.zero.fp32_partitioned_groups_flat)
        return list(self.zero.single_partition_of_fp32_groups)

    @contextlib.contextmanager
    def _client_params(self) -> Any:
        """ZeRO-3 empties the client's groups between steps (it hands them one sub-group at a time);
        its state is read and written with the groups holding their partitions, as DeepSpeed's own
        ``state_dict`` does."""
        if self.parallel.zero_stage != 3:
            yield
            return
        self.zero._set_fp32_optimizer_param_groups()
        try:
            yield
        finally:
            self.zero._clear_fp32_optimizer_param_groups()

    def state_dict(self) -> dict[str, Any]:
        """Every rank's state (rank 0 only, after the gather).

        Raises:
            RuntimeError: before :meth:`DeepSpeedParallel.gather_optimizer_state`, or on another rank.
        """
        if self.gathered is None:
            raise RuntimeError("ZeRO optimizer state: gather_optimizer_state first, and on rank 0")
        ranks, self.gathered = self.gathered, None
        return {"zero": {"stage": self.parallel.zero_stage, "world_size": len(ranks), "ranks": ranks}}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Take this rank's part of a :meth:`state_dict`. Stages 1 and 2 partition alike and load
        each other's; stage 3 loads only stage 3's.

        Raises:
            ValueError: a state not written under ZeRO, by another number of ranks, or at stage 3
                for stage 1 or 2 (or the other way round).
        """
        zero = state_dict.get("zero")
        if not isinstance(zero, Mapping):
            raise ValueError(
                "the checkpoint's optimizer state was written without DeepSpeed ZeRO; resume it with "
                "the engine that wrote it, or start the phase again"
            )
        world_size = self.parallel.world.world_size
        if zero["world_size"] != world_size:
            raise ValueError(
                f"the checkpoint's ZeRO optimizer state is sharded over {zero['world_size']} ranks, but "
                f"{world_size} train now; resume with {zero['world_size']} ranks"
            )
        if (zero["stage"] == 3) != (self.parallel.zero_stage == 3):
            raise ValueError(
                f"the checkpoint's ZeRO optimizer state was written at stage {zero['stage']}, which "
                f"partitions it otherwise than stage {self.parallel.zero_stage}; resume at stage "
                f"{zero['stage']}"
            )
        mine = zero["ranks"][self.parallel.world.rank]
        with self._client_params():
            self.client.load_state_dict(mine["optimizer"])
        for current, saved in zip(self._fp32(), mine["fp32"], strict=True):
            current.data.copy_(saved)
        if self.parallel.zero_stage == 3:
            # The 16-bit partitions the forward gathers are copies of the fp32 masters (the same
            # tensors in fp32); as after ZeRO-3's own step.
            for low, master in zip(self.zero.fp16_partitioned_groups_flat, self._fp32(), strict=True):
                if low is not master:
                    low.data.copy_(master.data)
        for name, value in mine["loss_scale"].items():
            setattr(self.zero.loss_scaler, name, value)
        # The model's bit16 weights came from the checkpoint's model state; the fp32 partitions
        # now hold the master copies, so the parameters equal what the run had when it saved.
        if hasattr(self.zero, "_link_all_hp_params"):
            self.zero._link_all_hp_params()


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(item) for item in value)
    return value
