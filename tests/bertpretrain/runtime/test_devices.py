"""Device set-up: the CPU placement rules (NUMA binding, threads from the CPU limit), and clear
errors for accelerators this machine lacks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bertpretrain.runtime.devices import (
    cpu_threads,
    numa_binding,
    numa_nodes,
    open_device,
    parse_cpulist,
)
from bertpretrain.runtime.world import World

ALONE = World("single", 0, 1, 0, 1)


def test_parse_cpulist() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpulist("") == set()
    with pytest.raises(ValueError):
        parse_cpulist("0-a")


def test_numa_nodes_in_node_order(tmp_path: Path) -> None:
    for node, cpus in ((10, "20-21"), (2, "4-5"), (0, "0-1")):
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "cpulist").write_text(cpus + "\n")
    (tmp_path / "online").write_text("0,2,10")
    assert numa_nodes(tmp_path) == [{0, 1}, {4, 5}, {20, 21}]
    assert numa_nodes(tmp_path / "absent") == []


TWO_SOCKETS = [set(range(0, 8)), set(range(8, 16))]


@pytest.mark.parametrize(
    ("allowed", "local_rank", "local_world_size", "expected"),
    [
        (set(range(16)), 1, 2, set(range(8, 16))),  # one process per socket: its own socket
        (set(range(4, 12)), 0, 2, set(range(4, 8))),  # only the cores the pod may use
        (set(range(16)), 0, 4, set(range(16))),  # another layout: left to the user
        ({9, 10}, 0, 2, {9, 10}),  # mpirun bound this rank to cores of the other socket already
    ],
)
def test_numa_binding(allowed: set[int], local_rank: int, local_world_size: int, expected: set[int]) -> None:
    assert numa_binding(allowed, TWO_SOCKETS, local_rank, local_world_size) == expected


def test_single_node_is_not_bound() -> None:
    assert numa_binding({0, 1}, [{0, 1}], 0, 1) == {0, 1}


def test_cpu_threads() -> None:
    cores = set(range(16))
    assert cpu_threads(cores, None, 2, {}) == 16
    assert cpu_threads(cores, 10.0, 2, {}) == 5  # the pod's limit shared by two processes
    assert cpu_threads(cores, 1.0, 4, {}) == 1
    assert cpu_threads(cores, 10.0, 2, {"OMP_NUM_THREADS": "3"}) == 3  # the user's choice wins
    with pytest.raises(ValueError, match="OMP_NUM_THREADS='x' is not an integer"):
        cpu_threads(cores, None, 1, {"OMP_NUM_THREADS": "x"})


def test_xeon_cpu_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    try:
        device = open_device("xeon-cpu", ALONE)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert device.device == torch.device("cpu") and device.backend in ("gloo", "ccl")
    assert device.placement.startswith("1 thread on")
    device.mark_step()  # a no-op off the HPU


def test_habana_without_its_libraries() -> None:
    with pytest.raises(RuntimeError, match=r"habana-hpu, but habana_frameworks\.torch is not installed"):
        open_device("habana-hpu", ALONE)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_gpu_requested_without_cuda() -> None:
    with pytest.raises(RuntimeError, match=r"nvidia-gpu, but torch\.cuda is not available"):
        open_device("nvidia-gpu", ALONE)
