"""Device, precision and data parallelism behind a few calls, so that the training loop does not
see them (in the manner of gpauloski/llm-pytorch's ``engine``).

The device and the data parallelism (alone, DDP under torchrun, Horovod under mpirun or
horovodrun, DeepSpeed ZeRO under either) come from
:func:`bertpretrain.runtime.parallel.joining.join`; gradients are averaged over ranks once per
optimizer step, on the last micro-batch of each gradient accumulation.
Under DeepSpeed, precision, loss scaling and gradient clipping are DeepSpeed's (its config's
``fp16``/``bf16`` sections and ``gradient_clipping``), not the engine's autocast and gradient scaler.

What is minimised, and what is counted besides, is the training loop's: it passes the engine a
:data:`Statistics` function, so that the runtime depends on neither the model's loss nor the
training metrics.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
from torch import nn

from bertjob_api.spec import Precision
from bertpretrain.common.batch import Batch, TaskBatch, tensors
from bertpretrain.runtime import compiling
from bertpretrain.runtime.parallel import DataParallel

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_NATIVE_INSTRUCTIONS = {"bf16": "AVX512-BF16 or AMX-BF16", "fp16": "AVX512-FP16 or AMX-FP16"}
# The model's outputs for a batch: the masked-LM logits and the next-sentence logits.
Outputs = tuple[torch.Tensor, torch.Tensor]
# A micro-batch's statistics from the batch (a Batch, or a TaskBatch when fine-tuning) and the
# model's outputs: a 1-D tensor whose element 0 is the loss to minimise (a mean over the
# micro-batch, differentiable), the rest whatever the caller counts. The engine weights element 0
# for accumulation and back-propagates it.
Statistics = Callable[[Any, Any], torch.Tensor]
# How a model is called on a batch (on the device): the pretraining model's call by default; a
# fine-tuning head's takes only the three encoder inputs.
Forward = Callable[[Callable[..., Any], Any], Any]


def pretraining_forward(model: Callable[..., Outputs], batch: Batch) -> Outputs:
    """The pretraining model on ``batch`` (as :func:`bertpretrain.data.load.loader.to_batch` makes it):
    its MLM logits at the masked positions and its NSP logits."""
    # Packed rows only carry position_ids and next_sentence_positions; None is the model's default.
    return model(
        batch["input_ids"],
        batch["token_type_ids"],
        batch["attention_mask"],
        batch["masked_lm_positions"],
        position_ids=batch.get("position_ids"),
        next_sentence_positions=batch.get("next_sentence_positions"),
    )


def _cpu_has_native(precision: Precision) -> bool:
    # oneDNN's own check for the instructions its bf16/fp16 kernels need.
    supported = getattr(torch.ops.mkldnn, f"_is_mkldnn_{precision}_supported", None)
    return bool(supported()) if supported is not None else True


def _rng_states(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_states(device: torch.device, states: tuple[torch.Tensor, torch.Tensor | None]) -> None:
    torch.set_rng_state(states[0])
    if states[1] is not None:
        torch.cuda.set_rng_state(states[1], device)


class Engine:
    """Runs forward/backward and optimizer steps on one rank's device, in one precision.

    ``parallel``: this rank's device and data parallelism, from
    :func:`bertpretrain.runtime.parallel.joining.join`.
    ``precision``: ``bf16`` or ``fp16`` autocast over fp32 parameters (fp16 with a gradient
    scaler), or ``fp32``. ``statistics``: what each micro-batch yields, its element 0 the loss
    (see :data:`Statistics`); ``forward``: how the model is called on a batch (see :data:`Forward`).
    Call :meth:`prepare` with the model, :meth:`wrap_optimizer` on its optimizer before building the
    schedule, then :meth:`attach` both.
    """

    def __init__(
        self,
        parallel: DataParallel,
        precision: Precision,
        statistics: Statistics,
        forward: Forward = pretraining_forward,
    ):
        self.parallel = parallel
        self.statistics = statistics
        self.forward = forward
        self.world = parallel.world
        self.hardware = parallel.device
        self.device = parallel.device.device
        # DeepSpeed casts the model itself (fp16/bf16 parameters, fp32 master copies in ZeRO).
        self.autocast_dtype = None if parallel.owns_step else _AUTOCAST_DTYPES.get(precision)
        if self.device.type == "cpu" and precision != "fp32" and not _cpu_has_native(precision):
            warnings.warn(
                f"{precision} autocast on a CPU without {_NATIVE_INSTRUCTIONS[precision]} is emulated "
                f"and many times slower than fp32; consider precision fp32",
                stacklevel=2,
            )
        self.scaler = torch.amp.GradScaler(
            self.device.type, enabled=precision == "fp16" and not parallel.owns_step
        )
        self._micro_batches = 0

    @property
    def rank(self) -> int:
        """This process's rank, 0 to world size - 1."""
        return self.world.rank

    @property
    def world_size(self) -> int:
        """Number of training processes in the job."""
        return self.world.world_size

    @property
    def distributed(self) -> bool:
        """Whether more than one process trains."""
        return self.world.distributed

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the one that prints and writes checkpoints."""
        return self.world.rank == 0

    def prepare(self, model: nn.Module, compile: bool = False, required: bool = True) -> nn.Module:
        """Move ``model`` to the device and wrap it for data parallelism (DDP under torchrun);
        returns the model. With ``compile``, its regions are compiled in place
        (:func:`bertpretrain.runtime.compiling.compile_regions`), to be compiled by :meth:`warm_up`.
        ``required``: a compile failure stops the job (``spec.compile: true``) rather than falling
        back to eager (unset).

        Keep using the returned (unwrapped) module for checkpoints and optimizers.
        """
        self.module = model.to(self.device)
        self.compile_required = required
        if compile:
            compiling.compile_regions(self.module, compiling.backend_for(self.device))
        self.wrapped = self.parallel.wrap_model(self.module)
        return self.module

    @property
    def compiled(self) -> bool:
        """Whether the model runs compiled (after :meth:`prepare`; false again after a fallback)."""
        return compiling.is_compiled(self.module)

    def warm_up(self, batch: Batch | TaskBatch) -> float | None:
        """Compile the model's training forward and backward and the optimizer's step on ``batch``
        (the first micro-batch, as :meth:`forward_backward` takes it) before the first step, so
        that no timed step compiles. Nothing of the training changes: the gradients are computed
        by ``torch.autograd.grad`` and dropped (no ``.grad``, no DDP or Horovod hook, no
        collective), the optimizer compiles at learning rate 0 on zeros, and the RNG states are
        restored. Under DeepSpeed, which runs its own forward, the model compiles at its first step.

        Returns:
            Seconds spent, or None when nothing is compiled (eager, or compiling failed with
            ``required`` false: then a warning, and the model and optimizer run eagerly).

        Raises:
            bertpretrain.runtime.compiling.CompileError: compiling failed with ``required``.
        """
        if not self.compiled or self.parallel.owns_step:
            return None
        started = time.perf_counter()
        states = _rng_states(self.device)
        try:
            stats = self._statistics(self.module, self._on_device(batch))
            trainable = [p for p in self.module.parameters() if p.requires_grad]
            torch.autograd.grad(stats[0], trainable, allow_unused=True)
            if isinstance(self.optimizer, compiling.CompiledStep):
                self.optimizer.warm_up()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        except Exception as error:
            reason = compiling.failure(error)
            if self.compile_required:
                raise compiling.CompileError(
                    f"{compiling.FIELD}: true, but torch.compile failed on the first micro-batch: {reason}"
                ) from error
            warnings.warn(
                f"{compiling.FIELD} unset: torch.compile failed ({reason}); training eagerly",
                stacklevel=2,
            )
            compiling.uncompile(self.module)
            if isinstance(self.optimizer, compiling.CompiledStep):
                self.optimizer.uncompile()
            return None
        finally:
            _set_rng_states(self.device, states)
        return time.perf_counter() - started

    def wrap_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        accumulation_steps: int,
        config: Mapping[str, Any] | None = None,
    ) -> torch.optim.Optimizer:
        """The optimizer to build the schedule on and to :meth:`attach` (Horovod's
        ``DistributedOptimizer`` under mpirun/horovodrun, DeepSpeed's ZeRO optimizer behind
        :class:`bertpretrain.runtime.parallel.deepspeed.ZeroOptimizer` with DeepSpeed, ``optimizer`` itself
        otherwise). ``config``: DeepSpeed's config for the phase, used under DeepSpeed only."""
        return self.parallel.wrap_optimizer(optimizer, self.module, accumulation_steps, config)

    def attach(
        self,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        clip_grad_norm: float | None,
    ) -> None:
        """Set the optimizer and schedule; ``clip_grad_norm`` clips the global gradient norm before
        each step (None when the optimizer clips, as LAMB does; ignored under DeepSpeed, which clips
        to its config's ``gradient_clipping``)."""
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.clip_grad_norm = None if self.parallel.owns_step else clip_grad_norm

    def gather_optimizer_state(self) -> None:
        """Collect the optimizer state on rank 0 for a checkpoint, where ranks hold parts of it
        (DeepSpeed ZeRO); a collective, before rank 0 calls ``optimizer.state_dict()``."""
        self.parallel.gather_optimizer_state(self.optimizer)

    def broadcast_state(self) -> None:
        """Give every rank rank 0's parameters and optimizer state (at the start, and after a
        resume); a collective."""
        self.parallel.broadcast_state(self.module, self.optimizer)

    def _autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, self.autocast_dtype, enabled=self.autocast_dtype is not None)

    def _on_device(self, batch: Batch | TaskBatch) -> Batch | TaskBatch:
        moved = {name: tensor.to(self.device, non_blocking=True) for name, tensor in tensors(batch).items()}
        return cast(Batch | TaskBatch, moved)

    def _outputs(self, model: Callable[..., Any], batch: Batch | TaskBatch) -> Any:
        """:attr:`forward` of ``model`` on ``batch`` (on the device) under autocast."""
        with self._autocast():
            return self.forward(model, batch)

    def _statistics(self, model: Callable[..., Any], batch: Batch | TaskBatch) -> torch.Tensor:
        """The model's forward pass on ``batch`` under autocast, then :attr:`statistics` of its
        outputs outside autocast (the statistics function computes in the outputs' dtypes)."""
        return self.statistics(batch, self._outputs(model, batch))

    def forward_backward(self, batch: Batch | TaskBatch, accumulation_steps: int) -> torch.Tensor:
        """Forward and backward on one micro-batch, its loss weighted ``1 / accumulation_steps``.

        ``batch`` as :func:`bertpretrain.data.load.loader.to_batch` makes it. Returns this micro-batch's
        statistics on this rank, as :attr:`statistics` gives them (element 0 the unweighted loss),
        detached.
        """
        self._micro_batches += 1
        sync = self._micro_batches % accumulation_steps == 0
        batch = self._on_device(batch)
        with self.parallel.accumulate(self.wrapped, sync):
            stats = self._statistics(self.wrapped, batch)
            self.parallel.backward(stats[0], accumulation_steps, self.scaler)
        self.hardware.mark_step()
        return stats.detach()

    @torch.no_grad()
    def evaluate(self, batch: Batch | TaskBatch, model: nn.Module | None = None) -> torch.Tensor:
        """Statistics of one held-out batch as :meth:`forward_backward` gives them, without
        gradients, on the unwrapped model or on ``model`` (a copy of it with whole parameters,
        :func:`bertpretrain.runtime.sharding.whole_copy`): no collective. Call with the model in
        eval mode."""
        return self._statistics(self.module if model is None else model, self._on_device(batch))

    @torch.no_grad()
    def predict(self, batch: Batch | TaskBatch) -> Any:
        """The outputs of :attr:`forward` on ``batch`` (moved to the device) under autocast, without
        gradients, on the unwrapped model: no collective of its own (under ZeRO-3 the forward
        gathers each layer's parameters from every rank). Call in eval mode."""
        return self._outputs(self.module, self._on_device(batch))

    def optimizer_step(self) -> tuple[float, bool]:
        """Unscale and clip the gradients, step the optimizer and the schedule, zero the gradients.

        With fp16 a step whose gradients overflowed is skipped by the scaler, which then halves
        the loss scale.

        Returns:
            The learning rate of this step (of the first parameter group), and whether the
            gradient scaler skipped the update.
        """
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.parallel.gradients_ready(self.optimizer)
        self.scaler.unscale_(self.optimizer)
        if self.clip_grad_norm is not None:
            nn.utils.clip_grad_norm_(self.module.parameters(), self.clip_grad_norm)
        scale = self.scaler.get_scale()
        with self.parallel.stepping(self.optimizer):
            self.scaler.step(self.optimizer)
        self.hardware.mark_step()
        self.scaler.update()
        self.scheduler.step()
        # torch's default sets the gradients to None; Horovod's optimizer takes no argument.
        self.optimizer.zero_grad()
        # Each step counts its own micro-batches: a batch ramp changes their number step by step.
        self._micro_batches = 0
        return lr, (
            self.scaler.is_enabled() and self.scaler.get_scale() < scale
        ) or self.parallel.step_skipped()

    def sum_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``values`` over all ranks (a collective: every rank calls it)."""
        return self.parallel.sum(values)

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (a collective: every rank calls it)."""
        if not self.distributed:
            return flag
        return bool(self.sum_over_ranks(torch.tensor([float(flag)], device=self.device)).item() > 0)

    def gather(self, value: object) -> list[object]:
        """``value`` of every rank, in rank order (a collective: every rank calls it)."""
        return self.parallel.gather_object(value)

    def barrier(self) -> None:
        """Wait for every rank (no-op for one process)."""
        self.parallel.barrier()
