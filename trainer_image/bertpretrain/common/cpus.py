"""How many CPUs this process may use: its affinity, capped by the container's cgroup CPU limit.

In a pod with ``resources.limits.cpu: 4`` on a 64-core node, the affinity still lists 64 cores;
the CFS quota is what says 4. It is read from cgroup v2 (``cpu.max``: ``"400000 100000"``, or
``"max 100000"`` when unlimited) and, where that file is missing, from cgroup v1
(``cpu/cpu.cfs_quota_us`` over ``cpu/cpu.cfs_period_us``, the quota ``-1`` when unlimited).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def cgroup_cpu_limit(root: Path = CGROUP) -> float | None:
    """The container's CPU limit in cores (``2.5`` for ``250000 100000``) from the cgroup file
    system mounted at ``root``: cgroup v2 ``cpu.max`` first, else cgroup v1
    ``cpu/cpu.cfs_quota_us`` over ``cpu/cpu.cfs_period_us``.

    Returns None when there is no limit (``max``, a v1 quota of ``-1``) or no readable, well-formed
    file (not in a container, another layout); never raises.
    """
    try:
        quota, period = (root / "cpu.max").read_text().split()
        return None if quota == "max" else _cores(int(quota), int(period))
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return _cores(quota_us, period_us)


def _cores(quota: int, period: int) -> float | None:
    # A quota of -1 (v1) means unlimited; a period of 0 is not something a kernel writes, but
    # would otherwise divide by zero.
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def available_cpus(root: Path = CGROUP) -> int:
    """CPUs this process may use: the number in its affinity mask, capped by the cgroup CPU limit
    under ``root`` rounded up (a limit of 2.5 cores allows 3 busy processes), at least 1."""
    cpus = len(os.sched_getaffinity(0))
    limit = cgroup_cpu_limit(root)
    if limit is None:
        return cpus
    return max(1, min(cpus, math.ceil(limit)))
