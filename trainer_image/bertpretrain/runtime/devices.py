"""The three accelerators: which torch device a rank uses, how its collectives run, and the few
places where a device needs a call of its own.

- nvidia-gpu: ``cuda:<local rank>``, NCCL, TensorFloat-32 as ``spec.tf32`` says.
- habana-hpu: ``hpu`` in lazy mode, HCCL, and ``mark_step()`` after the backward pass and after
  the optimizer step, as Habana's Model-References BERT does (Gaudi documentation, "Porting a
  Simple PyTorch Model to Gaudi"). ``habana_frameworks`` is imported only here, only for this
  accelerator. Not run on a Gaudi in this project's tests (none can be had); see docs/design.md.
- xeon-cpu: ``cpu``; oneCCL (``ccl``) when ``oneccl_bindings_for_pytorch`` is installed, else
  Gloo; each process gets the cores of one NUMA node (socket) when there is one process per
  node, as Intel's launch scripts bind them, and threads = its share of the pod's CPU limit.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bertjob_api.spec import Accelerator
from bertpretrain.common.cpus import cgroup_cpu_limit
from bertpretrain.runtime.world import World

NUMA_NODES = Path("/sys/devices/system/node")


def _no_op() -> None:
    return None


@dataclass(frozen=True)
class Device:
    """Where one rank computes.

    ``device``: the torch device; ``backend``: the ``torch.distributed`` backend for it;
    ``mark_step``: ends a lazy-mode graph (HPU), a no-op elsewhere; ``placement``: the CPU cores
    and threads chosen (xeon-cpu), for the log.
    """

    accelerator: Accelerator
    device: torch.device
    backend: str
    mark_step: Callable[[], None] = field(default=_no_op, compare=False)
    placement: str = ""


def open_device(accelerator: Accelerator, world: World, tf32: bool = True) -> Device:
    """Select and set up this rank's device for ``spec.accelerator``.

    Raises:
        RuntimeError: nvidia-gpu without CUDA or with fewer GPUs than local ranks; habana-hpu
            without ``habana_frameworks`` in the container.
    """
    if accelerator == "nvidia-gpu":
        return _nvidia_gpu(world, tf32)
    if accelerator == "habana-hpu":
        return _habana_hpu(world)
    return _xeon_cpu(world)


def _nvidia_gpu(world: World, tf32: bool) -> Device:
    if not torch.cuda.is_available():
        raise RuntimeError("accelerator nvidia-gpu, but torch.cuda is not available in this container")
    if world.local_rank >= torch.cuda.device_count():
        raise RuntimeError(
            f"local rank {world.local_rank}, but only {torch.cuda.device_count()} GPUs are visible"
        )
    torch.cuda.set_device(world.local_rank)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return Device("nvidia-gpu", torch.device("cuda", world.local_rank), "nccl")


def _habana_hpu(world: World) -> Device:
    try:
        core = importlib.import_module("habana_frameworks.torch.core")
        if world.distributed:
            # Registers the "hccl" backend with torch.distributed.
            importlib.import_module("habana_frameworks.torch.distributed.hccl")
    except ImportError as error:
        raise RuntimeError(
            f"accelerator habana-hpu, but habana_frameworks.torch is not installed in this container "
            f"({error}); use a Habana PyTorch base image"
        ) from None
    return Device("habana-hpu", torch.device("hpu"), "hccl", mark_step=core.mark_step)


def _xeon_cpu(world: World) -> Device:
    backend = "gloo"
    try:
        importlib.import_module("oneccl_bindings_for_pytorch")  # registers the "ccl" backend
        backend = "ccl"
    except ImportError:
        pass
    allowed = os.sched_getaffinity(0)
    cpus = numa_binding(allowed, numa_nodes(NUMA_NODES), world.local_rank, world.local_world_size)
    if cpus != allowed:
        os.sched_setaffinity(0, cpus)
    threads = cpu_threads(cpus, cgroup_cpu_limit(), world.local_world_size, os.environ)
    torch.set_num_threads(threads)
    placement = f"{threads} thread{'s' if threads > 1 else ''} on {len(cpus)} cores"
    if cpus != allowed:
        placement += f" of NUMA node {world.local_rank}"
    return Device("xeon-cpu", torch.device("cpu"), backend, placement=placement)


def parse_cpulist(text: str) -> set[int]:
    """CPUs of a Linux cpulist (``"0-3,8,10-11"``), as in ``/sys/devices/system/node/node0/cpulist``.

    Raises:
        ValueError: text that is not a cpulist.
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def numa_nodes(root: Path) -> list[set[int]]:
    """The CPUs of each NUMA node under ``root`` (``/sys/devices/system/node``), in node order;
    empty when the directory is absent."""
    nodes = sorted(root.glob("node[0-9]*"), key=lambda path: int(path.name.removeprefix("node")))
    return [parse_cpulist((node / "cpulist").read_text()) for node in nodes]


def numa_binding(
    allowed: set[int], nodes: list[set[int]], local_rank: int, local_world_size: int
) -> set[int]:
    """The cores this process should run on: with one process per NUMA node (``local_world_size``
    equal to the number of nodes, e.g. one per socket), those of node ``local_rank`` that the pod
    may use; otherwise ``allowed`` unchanged (one node, another layout, or mpirun already bound
    the process to fewer cores)."""
    if len(nodes) < 2 or local_world_size != len(nodes):
        return allowed
    mine = nodes[local_rank] & allowed
    return mine or allowed


def cpu_threads(
    cpus: set[int], limit: float | None, local_world_size: int, environ: Mapping[str, str]
) -> int:
    """Intra-op threads for one process: ``OMP_NUM_THREADS`` when the user set it; else the cores
    it may run on, capped by its share of the pod's CPU limit (``limit / local_world_size``,
    rounded down, at least 1).

    Raises:
        ValueError: ``OMP_NUM_THREADS`` is not an integer.
    """
    if "OMP_NUM_THREADS" in environ:
        try:
            return max(1, int(environ["OMP_NUM_THREADS"]))
        except ValueError:
            raise ValueError(f"OMP_NUM_THREADS={environ['OMP_NUM_THREADS']!r} is not an integer") from None
    threads = len(cpus)
    if limit is not None:
        threads = min(threads, math.floor(limit / local_world_size))
    return max(1, threads)
