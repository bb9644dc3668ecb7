"""Undo what the test cluster's real node made on this machine, whatever state it was left in:

    python -m bertjob_testing.cluster.nodecleanup --workdir DIR --cgroup-root /NAME \
        --netns NAME --link NAME --network NAME [--discard DIR ...]

In order: every process in the node's cgroups (the pods' containers) and every process whose command
line names the node's directory (containerd's shims, which leave containerd's session) is killed;
every mount under the directory is detached (the containers' overlays, the pods' volumes and
network namespaces), the deepest first; the cgroups are removed, the deepest first; the node's
network namespace (with its bridge, its end of the link and kube-proxy's rules; this machine's end
and route go with it) and libcni's cached results for the node's network are deleted; last, the
``--discard`` directories (containerd's root: the images' content and unpacked snapshots, 13 GB
with the trainer's image, which pytest's kept temporary directories would otherwise hold three
times over). Run by the cluster's stop and by its reaper (:mod:`bertjob_testing.cluster.process`'s
registry), after containerd and the kubelet themselves were stopped. Standard library and
:mod:`bertjob_testing.cluster.process` only; exit 1 naming what could not be undone.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bertjob_testing.cluster.process import running

CGROUPS = Path("/sys/fs/cgroup")
# libcni's cache of each attachment's result (containerd does not move it).
CNI_CACHE = Path("/var/lib/cni/results")
MNT_DETACH = 2
_umount2 = ctypes.CDLL(None, use_errno=True).umount2


def hierarchies() -> list[Path]:
    """The mounted cgroup hierarchies under ``/sys/fs/cgroup`` (v1's per controller, and the v2
    one a hybrid machine mounts at ``unified``)."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, kind, *_ = line.split()
        if kind in ("cgroup", "cgroup2") and point.startswith(str(CGROUPS)):
            found.append(Path(point))
    return found


def cgroup_processes(root: str) -> set[int]:
    """Every process in ``root``'s subtree of any hierarchy."""
    pids: set[int] = set()
    for hierarchy in hierarchies():
        top = hierarchy / root.lstrip("/")
        for procs in top.rglob("cgroup.procs") if top.is_dir() else ():
            try:
                pids.update(int(pid) for pid in procs.read_text().split())
            except OSError:
                continue
    return pids


def naming(directory: Path) -> set[int]:
    """Every process (but this one) whose command line names ``directory``."""
    needle = str(directory).encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def mounts_under(directory: Path) -> list[str]:
    """The mount points under ``directory``, the deepest first."""
    prefix = str(directory).rstrip("/") + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix) or point == str(directory):
            points.append(point)
    return sorted(set(points), key=lambda point: point.count("/"), reverse=True)


def remove_cgroups(root: str) -> list[str]:
    """Remove ``root``'s subtree in every hierarchy, the deepest first; those that stayed."""
    stayed = []
    for hierarchy in hierarchies():
        top = hierarchy / root.lstrip("/")
        if not top.is_dir():
            continue
        for directory in sorted(
            (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
        ):
            try:
                directory.rmdir()
            except OSError:
                stayed.append(str(directory))
        try:
            top.rmdir()
        except OSError:
            stayed.append(str(top))
    return stayed


def main(argv: Sequence[str]) -> int:
    """Undo the node as the module docstring says; 0, or 1 naming what stayed."""
    parser = argparse.ArgumentParser(prog="python -m bertjob_testing.cluster.nodecleanup")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--cgroup-root", required=True)
    parser.add_argument("--netns", required=True)
    parser.add_argument("--link", required=True)
    parser.add_argument("--network", required=True)
    parser.add_argument("--discard", type=Path, action="append", default=[])
    args = parser.parse_args(argv)
    problems = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = {pid for pid in cgroup_processes(args.cgroup_root) | naming(args.workdir) if running(pid)}
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    else:
        problems.append(f"processes still running: {sorted(left)}")
    for point in mounts_under(args.workdir):
        if _umount2(point.encode(), MNT_DETACH) != 0:
            problems.append(f"umount {point}: {os.strerror(ctypes.get_errno())}")
    stayed = remove_cgroups(args.cgroup_root)
    if stayed:
        problems.append(f"cgroups left: {stayed}")
    # This machine's end of the node's link, deleted here with its peer and its route: a deleted
    # namespace's interfaces go later, from the kernel's own work queue.
    if Path(f"/sys/class/net/{args.link}").exists():
        deleted = subprocess.run(["ip", "link", "delete", args.link], capture_output=True, text=True)
        if deleted.returncode != 0:
            problems.append(f"ip link delete {args.link}: {deleted.stderr.strip()}")
    if Path(f"/run/netns/{args.netns}").exists():
        deleted = subprocess.run(["ip", "netns", "delete", args.netns], capture_output=True, text=True)
        if deleted.returncode != 0:
            problems.append(f"ip netns delete {args.netns}: {deleted.stderr.strip()}")
    for cached in CNI_CACHE.glob(f"{args.network}-*") if CNI_CACHE.is_dir() else ():
        cached.unlink(missing_ok=True)
    for directory in args.discard:
        if mounts_under(directory):
            problems.append(f"{directory} kept: mounts are left under it")
            continue
        shutil.rmtree(directory, ignore_errors=True)
        if directory.exists():
            problems.append(f"{directory} could not be deleted")
    if problems:
        print("nodecleanup: " + "; ".join(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
