"""LAMB, as NVIDIA's BERT recipe runs it, and the optimizer factory.

LAMB is You et al. 2020, "Large Batch Optimization for Deep Learning: Training BERT in 76
minutes" (ICLR), in the form of NVIDIA apex's ``FusedLAMB`` that DeepLearningExamples' BERT
uses: the gradients of all parameters are first scaled down together so that their global L2
norm is at most ``max_grad_norm``; Adam moments with bias correction give the direction, the
decoupled weight decay is added to it, and each tensor's step is scaled by its trust ratio
``||p|| / ||update||``. As in ``FusedLAMB`` (``use_nvlamb=False``), tensors without weight decay
(biases, LayerNorm) take the plain Adam step; ``use_nvlamb=True`` gives them the trust ratio too.
``bias_correction=False`` uses the raw moments, as ``FusedLAMB(bias_correction=False)`` does;
when on, the bias correction is inside the update whose norm the trust ratio divides by.

Sharded (DeepSpeed ZeRO-1/2, :mod:`bertpretrain.runtime.parallel.deepspeed`), each rank's optimizer
holds one flat partition per group of the group's parameters laid end to end, which cuts tensors
anywhere. LAMB stays LAMB there (:meth:`Lamb.shard`): every norm it takes (the global gradient norm,
each tensor's ``||p||`` and ``||update||``) is computed from this rank's partial sums of squares,
tensor by tensor (:class:`FlatShard` says which element belongs to which tensor), summed over the
ranks in one all-reduce per group, so the clipping and trust ratios are those of whole tensors.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from bertjob_api.spec import OptimizerSpec
from bertpretrain.runtime.sharding import AllReduce, FlatShard

ParamGroups = list[dict[str, Any]]


def param_groups(model: nn.Module, weight_decay: float) -> ParamGroups:
    """Two groups: matrices and embeddings with ``weight_decay``, biases and LayerNorm without.

    As Google's BERT and NVIDIA's recipe exclude them; tied tensors appear once.
    """
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        excluded = name.endswith("bias") or "LayerNorm" in name
        (no_decay if excluded else decay).append(parameter)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


class Lamb(torch.optim.Optimizer):
    """LAMB with global gradient clipping, as apex's ``FusedLAMB``; multi-tensor ``_foreach`` ops,
    optionally compiled (``compiled``) into a few fused kernels.

    The step count is per group (``group["step"]``), as in ``FusedLAMB``. Parameters and
    gradients must be floating point of one dtype per group.

    Args:
        params: parameters, or groups of them with their own ``weight_decay`` (and other
            hyper-parameters), as :func:`param_groups` gives.
        lr: learning rate (the schedule multiplies it).
        betas: decay of the first and second moments, each in ``[0, 1)``.
        eps: added to the square root of the second moment, ``> 0``.
        weight_decay: decoupled weight decay, added to the update before the trust ratio.
        max_grad_norm: the global L2 norm of all gradients is clipped to this, ``> 0`` (the
            first group's value applies to all).
        use_nvlamb: apply the trust ratio to tensors without weight decay too.
        bias_correction: divide the moments by ``1 - beta ** step`` (Adam's bias correction).
        compiled: run each group's step under ``torch.compile`` (:func:`lamb_update` fused by
            TorchInductor, compiled at the first step), for whole tensors; a sharded group
            (:meth:`shard`) steps eagerly.

    Raises:
        ValueError: a hyper-parameter out of range.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | ParamGroups,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        max_grad_norm: float = 1.0,
        use_nvlamb: bool = False,
        bias_correction: bool = True,
        compiled: bool = False,
    ):
        if lr < 0:
            raise ValueError(f"learning rate must be >= 0, got {lr}")
        if not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        if eps <= 0 or max_grad_norm <= 0:
            raise ValueError(f"eps and max_grad_norm must be > 0, got {eps} and {max_grad_norm}")
        # Every setting lives in the groups, not in attributes: Horovod's DistributedOptimizer
        # rebuilds the optimizer from its param_groups alone.
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "max_grad_norm": max_grad_norm,
            "use_nvlamb": use_nvlamb,
            "bias_correction": bias_correction,
            "compiled": compiled,
        }
        super().__init__(params, defaults)
        # Sharded: each flat partition's layout, by the partition's identity (DeepSpeed steps one
        # group at a time, handing the optimizer a list of that group alone).
        self._shards: dict[int, FlatShard] | None = None
        self._all_reduce: AllReduce | None = None
        self._global_grad_norm: Callable[[], torch.Tensor] | None = None

    def shard(
        self,
        shards: list[FlatShard],
        all_reduce: AllReduce,
        global_grad_norm: Callable[[], torch.Tensor | float] | None = None,
        partitions: list[torch.Tensor] | None = None,
    ) -> None:
        """Say that each group now holds one flat partition of its tensors, laid out as
        ``shards[group]`` says, the other partitions on the other ranks; the norms are then summed
        over the ranks with ``all_reduce`` (every rank must step together).

        ``global_grad_norm``: the L2 norm of all gradients of all ranks, where the caller steps
        the groups one at a time and only the stepped group's gradients exist (DeepSpeed ZeRO
        computes it before its first group, over every rank's partitions); without it, the norm
        is computed from the gradients present, which must then be every group's.

        ``partitions``: the flat partitions, one per group, where the groups do not hold them now
        (DeepSpeed ZeRO-3 empties the groups and puts each partition in its group only while it
        steps it); default: each group's one tensor.

        Raises:
            ValueError: not one shard per group, or a group that is not one flat tensor of the
                shard's length.
        """
        if len(shards) != len(self.param_groups):
            raise ValueError(f"{len(shards)} shard layouts for {len(self.param_groups)} parameter groups")
        groups = [group["params"] for group in self.param_groups]
        if partitions is not None:
            groups = [[partition] for partition in partitions]
        for index, (params, layout) in enumerate(zip(groups, shards, strict=True)):
            if len(params) != 1 or params[0].dim() != 1 or params[0].numel() != layout.tensor_ids.numel():
                shapes = [tuple(p.shape) for p in params]
                raise ValueError(
                    f"parameter group {index}: expected one flat partition of "
                    f"{layout.tensor_ids.numel()} elements, got tensors of shapes {shapes}"
                )
        self._shards = {id(params[0]): layout for params, layout in zip(groups, shards, strict=True)}
        self._all_reduce = all_reduce
        if global_grad_norm is not None:
            self._global_grad_norm = lambda: torch.as_tensor(global_grad_norm(), dtype=torch.float32)

    def _layout(self, group: dict[str, Any]) -> FlatShard | None:
        return None if self._shards is None else self._shards[id(group["params"][0])]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One update of every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        groups = [group for group in self.param_groups if any(p.grad is not None for p in group["params"])]
        if not groups:
            return loss
        # Clip by dividing (not multiplying by a clamped factor) to round exactly as FusedLAMB.
        clip_divisor = torch.clamp(self._global_norm(groups) / self.param_groups[0]["max_grad_norm"], min=1.0)
        for group in groups:
            self._update_group(group, clip_divisor, self._layout(group))
        return loss

    def _global_norm(self, groups: list[dict[str, Any]]) -> torch.Tensor:
        grads = [p.grad for group in groups for p in group["params"] if p.grad is not None]
        if self._shards is None:
            return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        if self._global_grad_norm is not None:
            return self._global_grad_norm().to(grads[0].device)
        assert self._all_reduce is not None
        squares = [
            layout.sums_of_squares(group["params"][0].grad).sum()
            for group in groups
            if (layout := self._layout(group)) is not None
        ]
        return self._all_reduce(torch.stack(squares).sum()).sqrt()

    def _norms(
        self, layout: FlatShard | None, params: Sequence[torch.Tensor], updates: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each whole tensor's ``||p||`` and ``||update||``, ``[tensors]`` each."""
        if layout is None:
            return torch.stack(torch._foreach_norm(list(params))), torch.stack(
                torch._foreach_norm(list(updates))
            )
        assert self._all_reduce is not None
        squares = torch.stack([layout.sums_of_squares(params[0]), layout.sums_of_squares(updates[0])])
        param_norms, update_norms = self._all_reduce(squares).sqrt().unbind()
        return param_norms, update_norms

    @torch.no_grad()
    def warm_up(self) -> None:
        """Compile each compiled group's step now, on zero gradients and moments at learning rate 0,
        so that the first real step does not; the parameters, the state and the step counts are
        left as they were. Does nothing for eager or sharded groups.

        Raises:
            Exception: what ``torch.compile`` raises when it cannot compile the step.
        """
        if self._shards is not None:
            return
        for group in self.param_groups:
            if not group.get("compiled") or not group["params"]:
                continue
            params = list(group["params"])
            device = params[0].device
            _compiled_lamb_update()(
                params,
                [torch.zeros_like(p) for p in params],
                [torch.zeros_like(p) for p in params],
                [torch.zeros_like(p) for p in params],
                torch.ones((), device=device),
                torch.tensor([0.0, 1.0, 1.0], device=device),
                _constants(group),
            )

    def uncompile(self) -> None:
        """Step eagerly from now on (after compiling failed)."""
        for group in self.param_groups:
            group["compiled"] = False

    def _update_group(
        self, group: dict[str, Any], clip_divisor: torch.Tensor, layout: FlatShard | None
    ) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        for p in params:
            if not self.state[p]:
                self.state[p]["exp_avg"] = torch.zeros_like(p)
                self.state[p]["exp_avg_sq"] = torch.zeros_like(p)
        group["step"] = group.get("step", 0) + 1
        constants = _constants(group)
        # The step's scalars as one small tensor, so that a compiled step sees a new learning rate
        # and step count as data, not as constants to recompile for; bias corrections in double.
        step = group["step"]
        values = [group["lr"], 1.0, 1.0]
        if group["bias_correction"]:
            values[1:] = [1 - constants.beta1**step, 1 - constants.beta2**step]
        scalars = torch.tensor(values, dtype=torch.float32).to(params[0].device, non_blocking=True)
        grads = [p.grad for p in params]
        exp_avgs = [self.state[p]["exp_avg"] for p in params]
        exp_avg_sqs = [self.state[p]["exp_avg_sq"] for p in params]
        if layout is None:
            update = _compiled_lamb_update() if group.get("compiled") else lamb_update
            update(params, grads, exp_avgs, exp_avg_sqs, clip_divisor, scalars, constants)
            return
        # Sharded: the trust ratios need every rank's partial sums of squares in between.
        updates = lamb_directions(grads, exp_avgs, exp_avg_sqs, clip_divisor, scalars[1:], params, constants)
        ratios = None
        if constants.trust:
            param_norms, update_norms = self._norms(layout, params, updates)
            ratios = [layout.spread(trust_ratios(param_norms, update_norms)).to(updates[0].dtype)]
        apply_updates(params, updates, scalars[0], ratios)


def _constants(group: dict[str, Any]) -> LambConstants:
    beta1, beta2 = group["betas"]
    trust = group["weight_decay"] != 0 or group["use_nvlamb"]
    return LambConstants(beta1, beta2, group["eps"], group["weight_decay"], trust)


class LambConstants(NamedTuple):
    """A parameter group's LAMB settings that stay the same from step to step."""

    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    trust: bool  # scale each tensor's step by its trust ratio (weight decay or use_nvlamb)


def lamb_directions(
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    clip_divisor: torch.Tensor,
    bias_corrections: torch.Tensor,
    params: list[torch.Tensor],
    constants: LambConstants,
) -> list[torch.Tensor]:
    """Update the moments in place and return each tensor's LAMB direction before the trust ratio:
    ``m_hat / (sqrt(v_hat) + eps) + weight_decay * p``, the hats being the moments divided by
    ``bias_corrections`` ``[2]`` (``1 - beta1 ** step``, ``1 - beta2 ** step``; ones without bias
    correction). Each list holds one tensor per parameter, of the parameter's shape and dtype;
    ``clip_divisor`` is a 0-d tensor, at least 1, that the gradients are divided by."""
    clipped = torch._foreach_div(grads, clip_divisor)
    torch._foreach_lerp_(exp_avgs, clipped, 1 - constants.beta1)
    torch._foreach_mul_(exp_avg_sqs, constants.beta2)
    torch._foreach_addcmul_(exp_avg_sqs, clipped, clipped, value=1 - constants.beta2)
    denominators = torch._foreach_div(exp_avg_sqs, bias_corrections[1])
    torch._foreach_sqrt_(denominators)
    torch._foreach_add_(denominators, constants.eps)
    updates = torch._foreach_div(exp_avgs, bias_corrections[0])
    torch._foreach_div_(updates, denominators)
    if constants.weight_decay != 0:
        torch._foreach_add_(updates, params, alpha=constants.weight_decay)
    return list(updates)


def trust_ratios(param_norms: torch.Tensor, update_norms: torch.Tensor) -> torch.Tensor:
    """``||p|| / ||update||`` per tensor, ``[tensors]``, 1 where either norm is 0 (You et al.)."""
    return torch.where(
        (param_norms > 0) & (update_norms > 0), param_norms / update_norms, torch.ones_like(param_norms)
    )


def apply_updates(
    params: list[torch.Tensor],
    updates: list[torch.Tensor],
    lr: torch.Tensor,
    ratios: list[torch.Tensor] | None,
) -> None:
    """``p -= lr * ratio * update`` for each tensor; ``lr`` a 0-d tensor, ``ratios`` one 0-d
    tensor per tensor (or one tensor of the update's shape, sharded), None for ratio 1."""
    if ratios is not None:
        torch._foreach_mul_(updates, ratios)
    torch._foreach_mul_(updates, lr)
    torch._foreach_sub_(params, updates)


def lamb_update(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    clip_divisor: torch.Tensor,
    scalars: torch.Tensor,
    constants: LambConstants,
) -> None:
    """One LAMB step of one group of whole tensors, in place: :func:`lamb_directions`, the trust
    ratios from each tensor's ``||p||`` and ``||update||``, :func:`apply_updates`. ``scalars`` is
    ``[3]`` float32: the learning rate and the two bias corrections. About 15 passes over the
    group's tensors in eager mode (each ``_foreach`` op one multi-tensor kernel); compiled
    (:func:`_compiled_lamb_update`), TorchInductor fuses them into a few."""
    updates = lamb_directions(grads, exp_avgs, exp_avg_sqs, clip_divisor, scalars[1:], params, constants)
    ratios = None
    if constants.trust:
        norms = trust_ratios(
            torch.stack(torch._foreach_norm(params)), torch.stack(torch._foreach_norm(updates))
        )
        ratios = list(norms.unbind())
    apply_updates(params, updates, scalars[0], ratios)


@functools.cache
def _compiled_lamb_update() -> Callable[..., None]:
    """:func:`lamb_update` under ``torch.compile``: one graph per parameter group (its tensors'
    shapes and constants), compiled at its first step; the step's learning rate and count are data."""
    return torch.compile(lamb_update, fullgraph=True, dynamic=False)


def build_optimizer(
    model: nn.Module, spec: OptimizerSpec, lr: float, compiled: bool = False
) -> torch.optim.Optimizer:
    """LAMB (clipping inside) or ``torch.optim.AdamW`` over :func:`param_groups` of ``model``.

    ``lr`` is the peak learning rate; the schedule multiplies it. For AdamW, clip the gradients
    to ``spec.max_grad_norm`` before each step (the engine does). ``compiled``: LAMB's step under
    ``torch.compile`` (AdamW takes torch's own foreach step).
    """
    groups = param_groups(model, spec.weight_decay)
    betas = (spec.beta1, spec.beta2)
    if spec.name == "lamb":
        return Lamb(
            groups, lr=lr, betas=betas, eps=spec.eps, max_grad_norm=spec.max_grad_norm, compiled=compiled
        )
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=spec.eps)
