"""Device, precision and data parallelism behind a few calls, so that the training loop does not
see them (in the manner of gpauloski/llm-pytorch's ``engine``).

The process group comes from torchrun's environment (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``). With more than one process the model is wrapped in
:class:`~torch.nn.parallel.DistributedDataParallel`, and gradients are all-reduced only on the
last micro-batch of each gradient accumulation (``no_sync`` on the others).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bertjob.spec import Accelerator, Precision
from bertpretrain.metrics import prediction_counts
from bertpretrain.model import pretraining_loss

Batch = dict[str, torch.Tensor]

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_NATIVE_INSTRUCTIONS = {"bf16": "AVX512-BF16 or AMX-BF16", "fp16": "AVX512-FP16 or AMX-FP16"}
_ENV_DEFAULTS = (("WORLD_SIZE", "1"), ("RANK", "0"), ("LOCAL_RANK", "0"))
# Batch entries of packed rows, passed to the model by name.
_PACKED_INPUTS = ("position_ids", "next_sentence_positions")
STEP_STATS = ("loss", "mlm_loss", "nsp_loss", "mlm_correct", "mlm_total", "nsp_correct", "nsp_total")


@dataclass(frozen=True)
class DistributedEnv:
    """This process's place in the job, as torchrun describes it."""

    world_size: int
    rank: int
    local_rank: int

    @classmethod
    def from_environ(cls) -> DistributedEnv:
        """Read ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK``; a lone process when they are unset.

        Raises:
            ValueError: a variable that is not an integer, or a rank outside the world size.
        """
        try:
            env = cls(*(int(os.environ.get(name, default)) for name, default in _ENV_DEFAULTS))
        except ValueError:
            values = {name: os.environ.get(name) for name, _ in _ENV_DEFAULTS}
            raise ValueError(f"torchrun environment is not integers: {values}") from None
        if not 0 <= env.rank < env.world_size:
            raise ValueError(f"RANK {env.rank} is outside WORLD_SIZE {env.world_size}")
        return env


def select_device(accelerator: Accelerator, local_rank: int) -> torch.device:
    """The device for ``spec.accelerator``: ``cpu`` for xeon-cpu, ``cuda:<local rank>`` for nvidia-gpu.

    Raises:
        RuntimeError: nvidia-gpu without a usable CUDA, or habana-hpu (not supported yet).
    """
    if accelerator == "xeon-cpu":
        return torch.device("cpu")
    if accelerator == "nvidia-gpu":
        if not torch.cuda.is_available():
            raise RuntimeError("accelerator nvidia-gpu, but torch.cuda is not available in this container")
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(
                f"LOCAL_RANK {local_rank}, but only {torch.cuda.device_count()} GPUs are visible"
            )
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    raise RuntimeError(f"accelerator {accelerator} is not supported yet by the trainer")


def _cpu_has_native(precision: Precision) -> bool:
    # oneDNN's own check for the instructions its bf16/fp16 kernels need.
    supported = getattr(torch.ops.mkldnn, f"_is_mkldnn_{precision}_supported", None)
    return bool(supported()) if supported is not None else True


def init_process_group(device: torch.device) -> None:
    """Join torchrun's process group: NCCL for CUDA devices, gloo for the CPU."""
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")


class Engine:
    """Runs forward/backward and optimizer steps on one device, in one precision, on one rank.

    ``precision``: ``bf16`` or ``fp16`` autocast over fp32 parameters (fp16 with a gradient
    scaler), or ``fp32``; ``tf32`` lets fp32 matrix products and convolutions on NVIDIA GPUs use
    TensorFloat-32, as NVIDIA's recipe does. Call :meth:`prepare` with the model, then
    :meth:`attach` with its optimizer and schedule.

    Raises:
        RuntimeError: see :func:`select_device`.
    """

    def __init__(self, accelerator: Accelerator, precision: Precision, tf32: bool = True):
        self.env = DistributedEnv.from_environ()
        self.device = select_device(accelerator, self.env.local_rank)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
        self._owns_process_group = self.distributed and not dist.is_initialized()
        if self._owns_process_group:
            init_process_group(self.device)
        self.autocast_dtype = _AUTOCAST_DTYPES.get(precision)
        if self.device.type == "cpu" and precision != "fp32" and not _cpu_has_native(precision):
            warnings.warn(
                f"{precision} autocast on a CPU without {_NATIVE_INSTRUCTIONS[precision]} is emulated "
                f"and many times slower than fp32; consider precision fp32",
                stacklevel=2,
            )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=precision == "fp16")
        self._micro_batches = 0

    @property
    def rank(self) -> int:
        """This process's rank, 0 to world size - 1."""
        return self.env.rank

    @property
    def world_size(self) -> int:
        """Number of training processes in the job."""
        return self.env.world_size

    @property
    def distributed(self) -> bool:
        """Whether more than one process trains."""
        return self.env.world_size > 1

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the one that prints and writes checkpoints."""
        return self.env.rank == 0

    def prepare(self, model: nn.Module, compile: bool = False) -> nn.Module:
        """Move ``model`` to the device, wrap it in DDP when distributed and, with ``compile``, in
        :func:`torch.compile`; returns the model.

        Keep using the returned (unwrapped) module for checkpoints and optimizers.
        """
        self.module = model.to(self.device)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(model, device_ids=device_ids) if self.distributed else None
        forward: nn.Module = self.module if self.ddp is None else self.ddp
        # DDP first, then compile: TorchDynamo splits the graph at DDP's buckets (torch docs).
        self.forward_module: Callable[..., tuple[torch.Tensor, torch.Tensor]] = (
            torch.compile(forward) if compile else forward
        )
        return self.module

    def attach(
        self,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        clip_grad_norm: float | None,
    ) -> None:
        """Set the optimizer and schedule; ``clip_grad_norm`` clips the global gradient norm before
        each step (None when the optimizer clips, as LAMB does)."""
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.clip_grad_norm = clip_grad_norm

    def _autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, self.autocast_dtype, enabled=self.autocast_dtype is not None)

    def _forward(
        self, model: Callable[..., tuple[torch.Tensor, torch.Tensor]], batch: Batch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with self._autocast():
            return model(
                batch["input_ids"],
                batch["token_type_ids"],
                batch["attention_mask"],
                batch["masked_lm_positions"],
                **{name: batch[name] for name in _PACKED_INPUTS if name in batch},
            )

    def _stats(self, batch: Batch, logits: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """``[7]`` fp32: the three losses of ``pretraining_loss`` and ``prediction_counts``."""
        mlm_logits, nsp_logits = logits
        targets = (batch["masked_lm_labels"], batch["next_sentence_labels"])
        losses = pretraining_loss(mlm_logits, targets[0], nsp_logits, targets[1])
        counts = prediction_counts(mlm_logits.detach(), targets[0], nsp_logits.detach(), targets[1])
        return torch.cat([torch.stack(losses), counts])

    def forward_backward(self, batch: Batch, accumulation_steps: int) -> torch.Tensor:
        """Forward and backward on one micro-batch, its loss weighted ``1 / accumulation_steps``.

        ``batch`` as :func:`bertpretrain.loader.to_batch` makes it. Returns this micro-batch's
        statistics on this rank, fp32 ``[7]`` named by ``STEP_STATS``: the unweighted total,
        MLM and NSP losses (nats) and the counts of :func:`bertpretrain.metrics.prediction_counts`.
        """
        self._micro_batches += 1
        sync = self._micro_batches % accumulation_steps == 0
        batch = {name: tensor.to(self.device, non_blocking=True) for name, tensor in batch.items()}
        no_sync = self.ddp.no_sync() if self.ddp is not None and not sync else contextlib.nullcontext()
        with no_sync:
            stats = self._stats(batch, self._forward(self.forward_module, batch))
            self.scaler.scale(stats[0] / accumulation_steps).backward()
        return stats.detach()

    @torch.no_grad()
    def evaluate(self, batch: Batch) -> torch.Tensor:
        """Statistics of one held-out batch as :meth:`forward_backward` gives them, without
        gradients, on the unwrapped model (no collective). Call with the model in eval mode."""
        batch = {name: tensor.to(self.device, non_blocking=True) for name, tensor in batch.items()}
        return self._stats(batch, self._forward(self.module, batch))

    def optimizer_step(self) -> tuple[float, bool]:
        """Unscale and clip the gradients, step the optimizer and the schedule, zero the gradients.

        With fp16 a step whose gradients overflowed is skipped by the scaler, which then halves
        the loss scale.

        Returns:
            The learning rate of this step (of the first parameter group), and whether the
            gradient scaler skipped the update.
        """
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.scaler.unscale_(self.optimizer)
        if self.clip_grad_norm is not None:
            nn.utils.clip_grad_norm_(self.module.parameters(), self.clip_grad_norm)
        scale = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return lr, self.scaler.is_enabled() and self.scaler.get_scale() < scale

    def sum_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``values`` over all ranks (a collective: every rank calls it)."""
        if self.distributed:
            values = values.clone()
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (a collective: every rank calls it)."""
        if not self.distributed:
            return flag
        return bool(self.sum_over_ranks(torch.tensor([float(flag)], device=self.device)).item() > 0)

    def gather(self, value: object) -> list[object]:
        """``value`` of every rank, in rank order (a collective: every rank calls it)."""
        if not self.distributed:
            return [value]
        values: list[object] = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values

    def mean_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        """The element-wise mean of ``values`` over all ranks (a collective: every rank calls it)."""
        return self.sum_over_ranks(values) / self.world_size

    def barrier(self) -> None:
        """Wait for every rank (no-op for one process)."""
        if self.distributed:
            dist.barrier()

    def close(self) -> None:
        """Leave the process group, if this engine created it."""
        if self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
