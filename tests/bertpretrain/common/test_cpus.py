"""bertpretrain.common.cpus: the cgroup CPU limit (v2 and v1) read from fake cgroup files, and the
CPU count that the data stage's workers and the CPU device's threads are sized from."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bertpretrain.common.cpus import available_cpus, cgroup_cpu_limit

AFFINITY = 16

# name: (files under the cgroup root, the limit in cores, available_cpus with 16 CPUs in the affinity)
CASES: dict[str, tuple[dict[str, str], float | None, int]] = {
    "no cgroup": ({}, None, 16),
    "v2 max": ({"cpu.max": "max 100000\n"}, None, 16),
    "v2 quota": ({"cpu.max": "400000 100000\n"}, 4.0, 4),
    "v2 fractional quota rounds up": ({"cpu.max": "250000 100000\n"}, 2.5, 3),
    "v2 quota under one core": ({"cpu.max": "50000 100000\n"}, 0.5, 1),
    "v2 quota over the affinity": ({"cpu.max": "6400000 100000\n"}, 64.0, 16),
    "v2 empty file": ({"cpu.max": ""}, None, 16),
    "v1 quota/period": ({"cpu/cpu.cfs_quota_us": "800000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 8.0, 8),
    "v1 -1": ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None, 16),
    "v1 without period": ({"cpu/cpu.cfs_quota_us": "800000\n"}, None, 16),
    "v1 zero period": ({"cpu/cpu.cfs_quota_us": "800000\n", "cpu/cpu.cfs_period_us": "0\n"}, None, 16),
    "v2 wins over v1": (
        {"cpu.max": "200000 100000\n", "cpu/cpu.cfs_quota_us": "800000", "cpu/cpu.cfs_period_us": "100000"},
        2.0,
        2,
    ),
    "malformed v2 falls back to v1": (
        {"cpu.max": "lots\n", "cpu/cpu.cfs_quota_us": "300000", "cpu/cpu.cfs_period_us": "100000"},
        3.0,
        3,
    ),
}


def cgroup(root: Path, files: dict[str, str]) -> Path:
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content)
    return root


@pytest.mark.parametrize(("files", "limit", "cpus"), CASES.values(), ids=CASES.keys())
def test_cgroup_cpu_limit_and_available_cpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str], limit: float | None, cpus: int
) -> None:
    root = cgroup(tmp_path, files)
    assert cgroup_cpu_limit(root) == limit
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(AFFINITY)))
    assert available_cpus(root) == cpus


def test_available_cpus_is_the_affinity_without_a_limit(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    assert available_cpus(tmp_path / "missing") == affinity
    assert available_cpus(cgroup(tmp_path, {"cpu.max": "100000 100000\n"})) == 1
