"""LAMB against a per-tensor reference written from apex's FusedLAMB kernels, against
torch-optimizer's independent ``Lamb``, and the factory."""

from __future__ import annotations

import copy
import math
import threading
from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch_optimizer
from torch import nn
from torch._dynamo.utils import counters

from bertjob_api.spec import OptimizerSpec
from bertpretrain.model.bert import BertForPreTraining
from bertpretrain.model.config import BertConfig
from bertpretrain.runtime.sharding import FlatShard
from bertpretrain.training.optimizer import Lamb, build_optimizer, param_groups

pytestmark = pytest.mark.usefixtures("one_thread")


class ReferenceLamb:
    """LAMB one tensor at a time in plain torch, as ``multi_tensor_lamb`` computes it."""

    def __init__(
        self,
        groups: list[dict],
        lr: float,
        betas: tuple[float, float],
        eps: float,
        max_grad_norm: float,
        use_nvlamb: bool = False,
        bias_correction: bool = True,
    ):
        self.groups = groups
        self.lr, self.betas, self.eps = lr, betas, eps
        self.max_grad_norm, self.use_nvlamb = max_grad_norm, use_nvlamb
        self.bias_correction = bias_correction
        self.moments = {
            id(p): (torch.zeros_like(p), torch.zeros_like(p)) for g in groups for p in g["params"]
        }
        self.step_count = 0

    @torch.no_grad()
    def step(self) -> None:
        self.step_count += 1
        beta1, beta2 = self.betas
        squares = sum(float((p.grad.double() ** 2).sum()) for g in self.groups for p in g["params"])
        global_norm = math.sqrt(squares)
        divisor = global_norm / self.max_grad_norm if global_norm > self.max_grad_norm else 1.0
        for group in self.groups:
            decay = group["weight_decay"]
            for p in group["params"]:
                m, v = self.moments[id(p)]
                grad = p.grad / divisor
                m.mul_(beta1).add_((1 - beta1) * grad)
                v.mul_(beta2).add_((1 - beta2) * grad * grad)
                m_hat, v_hat = m, v
                if self.bias_correction:
                    m_hat = m / (1 - beta1**self.step_count)
                    v_hat = v / (1 - beta2**self.step_count)
                update = m_hat / (v_hat.sqrt() + self.eps) + decay * p
                ratio = 1.0
                if decay != 0 or self.use_nvlamb:
                    p_norm, u_norm = p.norm().item(), update.norm().item()
                    ratio = p_norm / u_norm if p_norm > 0 and u_norm > 0 else 1.0
                p.sub_(self.lr * ratio * update)


def make_params(seed: int) -> list[nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [
        nn.Parameter(torch.randn(6, 5, generator=generator)),
        nn.Parameter(torch.zeros(4, 3)),  # norm 0: trust ratio 1
        nn.Parameter(torch.randn(7, generator=generator)),
        nn.Parameter(torch.ones(5)),
    ]


def groups_of(params: list[nn.Parameter]) -> list[dict]:
    return [{"params": params[:2], "weight_decay": 0.01}, {"params": params[2:], "weight_decay": 0.0}]


def step_alongside(
    ours: Lamb,
    ours_params: list[nn.Parameter],
    reference: ReferenceLamb,
    ref_params: list[nn.Parameter],
    grad_scale: float,
) -> None:
    """6 steps of both on the same random gradients, the parameters within 1e-6 after each."""
    generator = torch.Generator().manual_seed(1)
    for step in range(6):
        for p, q in zip(ours_params, ref_params, strict=True):
            grad = torch.randn(p.shape, generator=generator) * grad_scale
            p.grad, q.grad = grad.clone(), grad.clone()
        ours.step()
        reference.step()
        for p, q in zip(ours_params, ref_params, strict=True):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=0, msg=lambda m, step=step: f"step {step}: {m}")


@pytest.mark.parametrize("grad_scale", [0.01, 100.0], ids=["unclipped", "clipped"])
@pytest.mark.parametrize("use_nvlamb", [False, True])
@pytest.mark.parametrize("bias_correction", [True, False], ids=["debiased", "raw"])
def test_lamb_matches_reference(grad_scale: float, use_nvlamb: bool, bias_correction: bool) -> None:
    ours_params, ref_params = make_params(0), make_params(0)
    hyper: dict[str, Any] = {
        "lr": 0.01,
        "betas": (0.9, 0.999),
        "eps": 1e-6,
        "max_grad_norm": 1.0,
        "use_nvlamb": use_nvlamb,
        "bias_correction": bias_correction,
    }
    ours = Lamb(groups_of(ours_params), **hyper)
    reference = ReferenceLamb(groups_of(ref_params), **hyper)
    step_alongside(ours, ours_params, reference, ref_params, grad_scale)
    assert ours.param_groups[0]["step"] == 6
    # The zero tensor moved (ratio 1), and parameters did move at all.
    assert ours_params[1].abs().sum() > 0
    assert not torch.equal(ours_params[0], make_params(0)[0])


@pytest.mark.parametrize("grad_scale", [0.01, 100.0], ids=["unclipped", "clipped"])
def test_compiled_lamb_matches_reference_and_compiles_once(grad_scale: float) -> None:
    """LAMB's step under ``torch.compile`` (TorchInductor on the CPU) against the reference: its
    warm-up compiles both groups' steps and changes nothing; the steps after it compile nothing."""
    torch._dynamo.reset()
    ours_params, ref_params = make_params(0), make_params(0)
    hyper: dict[str, Any] = {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-6, "max_grad_norm": 1.0}
    ours = Lamb(groups_of(ours_params), compiled=True, **hyper)
    reference = ReferenceLamb(groups_of(ref_params), **hyper)
    ours.warm_up()
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 2  # one per group
    assert not ours.state and "step" not in ours.param_groups[0]
    assert all(torch.equal(p, q) for p, q in zip(ours_params, make_params(0), strict=True))
    step_alongside(ours, ours_params, reference, ref_params, grad_scale)
    assert counters["stats"]["unique_graphs"] == graphs, "a step compiled again"
    assert not torch.equal(ours_params[0], make_params(0)[0])


def test_lamb_matches_torch_optimizer_over_many_steps() -> None:
    """200 steps against ``torch_optimizer.Lamb`` (torch-optimizer 0.3), written independently.

    That implementation has no gradient clipping, so its gradients are clipped here first as
    FusedLAMB clips (all divided by ``max(global_norm / max_grad_norm, 1)``). It applies the
    trust ratio to every tensor, which is ours with ``use_nvlamb=True``, and clamps the weight norm
    at ``clamp_value``, set out of reach. Its ``debias=True`` scales the step by the bias
    correction after the trust ratio, where FusedLAMB corrects the moments inside it, so the two
    agree only without bias correction: ``bias_correction=False`` here, ``debias=False`` there.
    The bias-corrected default is checked against :class:`ReferenceLamb` above.
    """
    max_grad_norm, lr, betas, eps = 1.0, 0.01, (0.9, 0.999), 1e-6
    generator = torch.Generator().manual_seed(3)
    shapes = [(8, 6), (6,), (4, 3), (6,), (5,)]
    initial = [torch.randn(shape, generator=generator) for shape in shapes]
    initial[3].zero_()  # a zero tensor: trust ratio 1 in both
    ours_params = [nn.Parameter(t.clone()) for t in initial]
    their_params = [nn.Parameter(t.clone()) for t in initial]

    def groups(params: list[nn.Parameter]) -> list[dict]:
        return [{"params": params[:3], "weight_decay": 0.01}, {"params": params[3:], "weight_decay": 0.0}]

    ours = Lamb(
        groups(ours_params),
        lr=lr,
        betas=betas,
        eps=eps,
        max_grad_norm=max_grad_norm,
        use_nvlamb=True,
        bias_correction=False,
    )
    theirs = torch_optimizer.Lamb(
        groups(their_params), lr=lr, betas=betas, eps=eps, clamp_value=1e30, debias=False
    )
    clipped = 0
    for step in range(1, 201):
        # Scales from 0.01 to 1 put the global norm (about 9 x scale) on both sides of 1, about half
        # the steps each.
        scale = 10 ** (torch.rand((), generator=generator).item() * 2 - 2)
        grads = [torch.randn(shape, generator=generator) * scale for shape in shapes]
        global_norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
        divisor = max(global_norm / max_grad_norm, 1.0)
        clipped += divisor > 1.0
        for p, q, grad in zip(ours_params, their_params, grads, strict=True):
            p.grad, q.grad = grad.clone(), grad / divisor
        ours.step()
        theirs.step()
        for p, q in zip(ours_params, their_params, strict=True):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=0, msg=lambda m, step=step: f"step {step}: {m}")
    assert 50 < clipped < 150
    # The parameters travelled far beyond the tolerance.
    assert all((p - t).abs().max() > 0.05 for p, t in zip(ours_params, initial, strict=True))


def test_lamb_trust_ratio_bounds_the_step() -> None:
    # With weight decay the per-tensor step is lr x ||p|| whatever the gradient's size.
    (p,) = [nn.Parameter(torch.full((10,), 2.0))]
    optimizer = Lamb([{"params": [p], "weight_decay": 0.01}], lr=0.1)
    before = p.detach().clone()
    p.grad = torch.full((10,), 1e6)
    optimizer.step()
    assert torch.linalg.vector_norm(p - before).item() == pytest.approx(0.1 * before.norm().item(), rel=1e-5)


def test_tensors_without_decay_take_the_adam_step() -> None:
    # FusedLAMB's default (use_nvlamb=False): no trust ratio where weight decay is 0, so the
    # first step is Adam's, lr x g / (|g| + eps), whatever the parameter's norm.
    bias = nn.Parameter(torch.full((5,), 3.0))
    optimizer = Lamb([{"params": [bias], "weight_decay": 0.0}], lr=0.1)
    grad = torch.tensor([0.1, -0.2, 0.3, -0.05, 0.01])
    bias.grad = grad.clone()
    optimizer.step()
    torch.testing.assert_close(bias.detach(), 3.0 - 0.1 * grad / (grad.abs() + 1e-6))


def test_lamb_state_dict_resumes_exactly() -> None:
    params = make_params(0)
    optimizer = Lamb(groups_of(params), lr=0.01)
    generator = torch.Generator().manual_seed(2)
    grads = [[torch.randn(p.shape, generator=generator) for p in params] for _ in range(4)]

    def apply(optimizer: Lamb, params: list[nn.Parameter], steps: list[list[torch.Tensor]]) -> None:
        for step in steps:
            for p, grad in zip(params, step, strict=True):
                p.grad = grad.clone()
            optimizer.step()

    apply(optimizer, params, grads[:2])
    saved_params, saved_state = copy.deepcopy(params), copy.deepcopy(optimizer.state_dict())
    apply(optimizer, params, grads[2:])
    resumed = Lamb(groups_of(saved_params), lr=0.01)
    resumed.load_state_dict(saved_state)
    apply(resumed, saved_params, grads[2:])
    for p, q in zip(params, saved_params, strict=True):
        torch.testing.assert_close(p, q, atol=0, rtol=0)


def test_param_groups_exclude_bias_and_layernorm() -> None:
    config = BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    model = BertForPreTraining(config)
    decay, no_decay = param_groups(model, 0.01)
    names = {id(p): name for name, p in model.named_parameters()}
    decay_names = {names[id(p)] for p in decay["params"]}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert "bert.embeddings.word_embeddings.weight" in decay_names
    assert "bert.encoder.layer.0.attention.self.query.weight" in decay_names
    assert "cls.predictions.bias" in no_decay_names
    assert "bert.embeddings.LayerNorm.weight" in no_decay_names
    assert all(name.endswith("bias") or "LayerNorm" in name for name in no_decay_names)
    assert not any(name.endswith("bias") or "LayerNorm" in name for name in decay_names)
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_build_optimizer() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    lamb = build_optimizer(model, OptimizerSpec(), lr=1e-3)
    assert isinstance(lamb, Lamb)
    assert lamb.param_groups[0]["max_grad_norm"] == 1.0 and lamb.param_groups[0]["eps"] == 1e-6
    adamw = build_optimizer(model, OptimizerSpec(name="adamw", weight_decay=0.1, beta2=0.98), lr=2e-4)
    assert isinstance(adamw, torch.optim.AdamW)
    assert adamw.param_groups[0]["betas"] == (0.9, 0.98)
    assert [group["weight_decay"] for group in adamw.param_groups] == [0.1, 0.0]
    assert adamw.param_groups[0]["lr"] == 2e-4


def test_lamb_rebuilt_from_its_groups_steps_the_same() -> None:
    # Horovod's DistributedOptimizer makes a new optimizer of the same class from param_groups alone.
    torch.manual_seed(0)
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    second.load_state_dict(first.state_dict())
    configured = Lamb(first.parameters(), lr=0.1, max_grad_norm=0.01, use_nvlamb=True, bias_correction=False)
    rebuilt = Lamb(
        Lamb(
            second.parameters(), lr=0.1, max_grad_norm=0.01, use_nvlamb=True, bias_correction=False
        ).param_groups
    )
    for model, optimizer in ((first, configured), (second, rebuilt)):
        model(torch.ones(2, 4)).square().sum().backward()
        optimizer.step()
    torch.testing.assert_close(first.weight, second.weight, rtol=0, atol=0)


def test_lamb_rejects_bad_hyperparameters() -> None:
    with pytest.raises(ValueError, match="betas"):
        Lamb([nn.Parameter(torch.ones(1))], betas=(0.9, 1.0))


# The tensors of groups_of's two groups.
GROUP_INDICES = [[0, 1], [2, 3]]


def _flat_partitions(
    group: Sequence[torch.Tensor], ranks: int, padding: int
) -> tuple[list[torch.Tensor], list[FlatShard]]:
    """The group's tensors end to end, ``padding`` zeros after, cut into ``ranks`` equal
    partitions as ZeRO-1/2 cuts them: each partition and its layout, rank by rank."""
    flat = torch.cat([p.detach().reshape(-1) for p in group] + [torch.zeros(padding)])
    ids = torch.cat(
        [torch.full((p.numel(),), i) for i, p in enumerate(group)] + [torch.full((padding,), len(group))]
    )
    size = flat.numel() // ranks
    assert size * ranks == flat.numel()
    return (
        [flat[r * size : (r + 1) * size].clone() for r in range(ranks)],
        [FlatShard(ids[r * size : (r + 1) * size], len(group)) for r in range(ranks)],
    )


class ThreadAllReduce:
    """An all-reduce (sum) among ``ranks`` threads, as torch.distributed's over ranks."""

    def __init__(self, ranks: int):
        self.barrier = threading.Barrier(ranks)
        self.values: dict[int, torch.Tensor] = {}
        self.lock = threading.Lock()

    def __call__(self, rank: int, value: torch.Tensor) -> torch.Tensor:
        with self.lock:
            self.values[rank] = value.clone()
        self.barrier.wait()
        total = sum(self.values[r] for r in sorted(self.values))
        self.barrier.wait()
        assert isinstance(total, torch.Tensor)
        return total


@pytest.mark.parametrize("grad_scale", [0.01, 100.0], ids=["unclipped", "clipped"])
@pytest.mark.parametrize("use_nvlamb", [False, True])
@pytest.mark.parametrize("group_by_group", [False, True], ids=["together", "group-by-group"])
def test_sharded_lamb_equals_whole_lamb(grad_scale: float, use_nvlamb: bool, group_by_group: bool) -> None:
    """3 ranks, each holding one flat partition per group (tensors cut mid-way, padding at the
    end), step to the same parameters as LAMB on whole tensors: the global clipping norm and the
    per-tensor trust ratios are over whole tensors. ``group_by_group``: as DeepSpeed ZeRO steps,
    one group at a time (the optimizer's ``param_groups`` that group alone, the others without
    gradients), given the global gradient norm it computed first."""
    ranks, steps = 3, 3
    hyper: dict[str, Any] = {"lr": 0.05, "max_grad_norm": 1.0, "use_nvlamb": use_nvlamb}
    whole = make_params(0)
    reference = Lamb(groups_of(whole), **hyper)
    generator = torch.Generator().manual_seed(5)
    grads = [[torch.randn(p.shape, generator=generator) * grad_scale for p in whole] for _ in range(steps)]
    for step in grads:
        for p, grad in zip(whole, step, strict=True):
            p.grad = grad.clone()
        reference.step()

    start = make_params(0)
    groups = [[start[i] for i in indices] for indices in GROUP_INDICES]
    paddings = [(-sum(p.numel() for p in g)) % ranks + ranks for g in groups]  # a partition or more
    laid_out = [_flat_partitions(g, ranks, pad) for g, pad in zip(groups, paddings, strict=True)]
    all_reduce = ThreadAllReduce(ranks)
    partitions: list[list[torch.Tensor]] = [[] for _ in range(ranks)]
    errors: list[BaseException] = []

    def rank_steps(rank: int) -> None:
        try:
            params = [nn.Parameter(laid_out[g][0][rank]) for g in range(2)]
            optimizer = Lamb(
                [{"params": [params[0]], "weight_decay": 0.01}, {"params": [params[1]], "weight_decay": 0.0}],
                **hyper,
            )
            norm = torch.zeros(())
            optimizer.shard(
                [laid_out[g][1][rank] for g in range(2)],
                lambda t: all_reduce(rank, t),
                (lambda: norm) if group_by_group else None,
            )
            for step in grads:
                grads_flat = [
                    _flat_partitions([step[i] for i in indices], ranks, paddings[g])[0][rank]
                    for g, indices in enumerate(GROUP_INDICES)
                ]
                if not group_by_group:
                    for param, grad in zip(params, grads_flat, strict=True):
                        param.grad = grad
                    optimizer.step()
                    continue
                norm = torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in step]))
                groups = optimizer.param_groups
                for g, group in enumerate(groups):
                    params[g].grad = grads_flat[g]
                    optimizer.param_groups = [group]
                    optimizer.step()
                    params[g].grad = None
                optimizer.param_groups = groups
            partitions[rank] = [p.detach() for p in params]
        except BaseException as error:
            errors.append(error)
            all_reduce.barrier.abort()

    threads = [threading.Thread(target=rank_steps, args=(r,)) for r in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for g, group in enumerate(groups):
        flat = torch.cat([partitions[r][g] for r in range(ranks)])
        expected, _ = _flat_partitions([whole[i] for i in GROUP_INDICES[g]], 1, paddings[g])
        torch.testing.assert_close(flat, expected[0], atol=1e-6, rtol=1e-5)
        assert not torch.equal(flat, _flat_partitions(group, 1, paddings[g])[0][0])  # it moved


def test_shard_refuses_a_group_that_is_not_one_flat_partition() -> None:
    params = make_params(0)
    optimizer = Lamb(groups_of(params))
    layout = FlatShard(torch.zeros(10, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="parameter group 0: expected one flat partition of 10 elements"):
        optimizer.shard([layout, layout], lambda t: t)
    with pytest.raises(ValueError, match="1 shard layouts for 2 parameter groups"):
        optimizer.shard([layout], lambda t: t)
