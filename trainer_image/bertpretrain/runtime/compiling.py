"""``torch.compile`` of the model by regions, and what a failed compile means for the job.

Regional compilation (PyTorch's recipe "Reducing torch.compile cold start compilation time with
regional compilation"): instead of the whole model, each module whose class sets
``compile_region = True`` (the model marks them: :mod:`bertpretrain.model.bert`) is compiled in
place (``nn.Module.compile``). The encoder's layers share one code object and one
graph, so BERT-large's 24 layers compile once, not 24 times (TorchDynamo treats their parameters
as inputs); the embeddings and the MLM head (dense, GELU, LayerNorm, the tied decoder) are the
other two graphs. TorchInductor fuses what eager mode runs as separate kernels: bias and GELU,
dropout, the residual add and LayerNorm. The loss, the pooler and DDP's hooks stay eager, so DDP
buckets its gradients as it does without compiling (no graph split at the buckets).

Each new input shape, training/evaluation mode or gradient mode compiles a region once more; after
the first new shape TorchDynamo makes the changed dimension dynamic, so an evaluation's smaller
last batch, or phase 2's longer sequences in the same process, compile once and are then reused.
:func:`reset` drops every compiled graph, at the start of a phase, so that each phase's shapes are
compiled for that phase alone.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import nn

# The spec field a compile failure names.
FIELD = "spec.compile"


class CompileError(ValueError):
    """``spec.compile: true`` and compiling failed (no C compiler, an operation TorchInductor
    cannot compile...): the job stops before training, with the reason. A ValueError, as the
    trainer's other errors that a restart would not mend: ``python -m bertpretrain`` prints it and
    exits with 1."""


@runtime_checkable
class CompiledStep(Protocol):
    """An optimizer whose step may run compiled (:class:`bertpretrain.training.optimizer.Lamb`)."""

    def warm_up(self) -> None:
        """Compile the step now, changing no parameter or state."""

    def uncompile(self) -> None:
        """Step eagerly from now on."""


def backend_for(device: torch.device) -> str:
    """The ``torch.compile`` backend for ``device``: Habana's ``hpu_backend`` on a Gaudi (its
    eager mode, ``PT_HPU_LAZY_MODE=0``), TorchInductor elsewhere."""
    return "hpu_backend" if device.type == "hpu" else "inductor"


def compile_regions(model: nn.Module, backend: str = "inductor") -> list[str]:
    """Compile each module of ``model`` whose class sets ``compile_region`` in place, with
    ``backend``; nothing is compiled until a region first runs. Returns the compiled modules' names
    (``bert.encoder.layer.0`` ...), in ``named_modules`` order."""
    names = []
    for name, module in model.named_modules():
        if getattr(module, "compile_region", False):
            module.compile(backend=backend)
            names.append(name)
    return names


def uncompile(model: nn.Module) -> None:
    """Undo :func:`compile_regions`: every module of ``model`` runs eagerly again."""
    for module in model.modules():
        module._compiled_call_impl = None


def is_compiled(model: nn.Module) -> bool:
    """Whether any module of ``model`` runs compiled."""
    return any(module._compiled_call_impl is not None for module in model.modules())


def reset() -> None:
    """Forget every graph compiled so far in this process (TorchDynamo's caches): the next call of
    each region compiles for the shapes it then sees."""
    torch._dynamo.reset()


def failure(error: BaseException) -> str:
    """One line saying why compiling failed: the type and first message line of the innermost
    cause (TorchDynamo wraps a backend's error in ``BackendCompilerFailed``)."""
    while (inner := getattr(error, "inner_exception", None) or error.__cause__) is not None:
        error = inner
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else 'no message'}"
