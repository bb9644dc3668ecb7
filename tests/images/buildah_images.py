"""Building the images with hack/build-images.sh and running them with buildah, as a pod would run
them: the image's own user and environment, the host's network, host directories where the pod's
volumes would be; and what a run wrote to the container's root filesystem."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bertjob_testing.jobs import REPO

BUILD = REPO / "hack" / "build-images.sh"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
OPERATOR_IMAGE = f"ghcr.io/bertjob/operator:{VERSION}"
XEON_IMAGE = f"ghcr.io/bertjob/trainer:{VERSION}-xeon"
# A cold Xeon build (Debian base, Python dependencies, PyPI's CUDA torch from
# $BERTJOB_CACHE/torch-index) took 5 minutes here, plus 2 to fill that index the first time
# (2.6 GB), and 6 to 11 more when no Horovod wheel is in $BERTJOB_CACHE/wheels to reuse; a warm one
# seconds (docs/images.md).
BUILD_TIMEOUT_S = 1500


@dataclass(frozen=True)
class Mount:
    """A host directory (or file) bind-mounted at ``target`` in the container."""

    source: Path
    target: str
    read_only: bool = False

    def option(self) -> str:
        """buildah's ``--volume`` value."""
        return f"{self.source}:{self.target}{':ro' if self.read_only else ''}"


@dataclass(frozen=True)
class Buildah:
    """buildah with the storage that hack/build-images.sh builds into."""

    flags: tuple[str, ...]

    def argv(self, *arguments: str) -> list[str]:
        """The command line of ``buildah <arguments>`` on this storage."""
        return ["buildah", *self.flags, *arguments]

    def __call__(self, *arguments: str, timeout_s: float = 120) -> str:
        """Run ``buildah <arguments>``; its standard output.

        Raises:
            RuntimeError: buildah failed (its standard error is in the message).
            subprocess.TimeoutExpired: it ran longer than ``timeout_s`` seconds.
        """
        result = subprocess.run(self.argv(*arguments), capture_output=True, text=True, timeout=timeout_s)
        if result.returncode != 0:
            raise RuntimeError(f"buildah {' '.join(arguments)} failed:\n{result.stderr}")
        return result.stdout

    def config(self, image: str) -> dict[str, Any]:
        """The image's OCI configuration (``Cmd``, ``User``, ``Env``, ``WorkingDir``)."""
        config: dict[str, Any] = json.loads(self("inspect", "--type", "image", image))["OCIv1"]["config"]
        return config

    @contextlib.contextmanager
    def container(self, image: str) -> Iterator[Container]:
        """A fresh container of ``image`` (its own root filesystem), removed afterwards."""
        name = self("from", "--quiet", image).strip()
        try:
            yield Container(self, name)
        finally:
            self("rm", name)


@dataclass(frozen=True)
class Container:
    """A buildah working container."""

    buildah: Buildah
    name: str

    def run_argv(
        self,
        command: Sequence[str],
        env: Mapping[str, str] = {},
        mounts: Sequence[Mount] = (),
        user: str | None = None,
        read_only_root: bool = False,
    ) -> list[str]:
        """The command line that runs ``command`` in this container as a pod would: the image's
        environment plus ``env``, the host's network, ``mounts``, and the image's user unless
        ``user`` (``uid:gid``) is given. buildah passes SIGTERM on to the command.

        ``read_only_root`` makes the root filesystem read-only for the command, as a pod's
        readOnlyRootFilesystem does (``mounts`` stay as they are), and runs it without any
        capability and with no_new_privs (a pod's ``capabilities: drop: [ALL]`` and
        ``allowPrivilegeEscalation: false``). buildah has no such option, and remounting its
        root from outside breaks buildah's own clean-up; so the command starts as root with
        CAP_SYS_ADMIN, remounts its own view of / read-only (its mount namespace is private)
        and gives up root with setpriv before anything of the image runs. ``user`` is required.
        """
        options = ["--isolation", "chroot"]
        for key, value in env.items():
            options += ["--env", f"{key}={value}"]
        for mount in mounts:
            options += ["--volume", mount.option()]
        if read_only_root:
            if user is None:
                raise ValueError("read_only_root needs the user (uid:gid) to run the command as")
            uid, _, gid = user.partition(":")
            drop = (
                "mount -o remount,bind,ro / && "
                f'HOME="$(getent passwd {uid} | cut -d: -f6)" '
                f"exec setpriv --reuid={uid} --regid={gid or uid} --clear-groups --no-new-privs "
                '--inh-caps=-all --bounding-set=-all -- "$@"'
            )
            options += ["--user", "0:0", "--cap-add", "CAP_SYS_ADMIN"]
            command = ["sh", "-c", drop, "sh", *command]
        elif user is not None:
            options += ["--user", user]
        return self.buildah.argv("run", *options, self.name, "--", *command)

    def rootfs(self) -> Path:
        """Where the container's root filesystem is mounted on the host (mounted on first use)."""
        return Path(self.buildah("mount", self.name).strip())


Snapshot = dict[str, tuple[int, int, int, int]]


def build_cache() -> Path:
    """Where the builds keep what they reuse: ``hack/build-images.sh --cache-dir`` ($BERTJOB_CACHE,
    by default ~/.cache/bertjob/build; make passes the same variable to Horovod's and helm's
    installs)."""
    answer = subprocess.run(
        [str(BUILD), "--cache-dir"], capture_output=True, text=True, check=True, timeout=60
    )
    return Path(answer.stdout.strip())


def snapshot(root: Path) -> Snapshot:
    """Every path under ``root`` (as an absolute path inside it) with its mode, owner, and for
    anything but a directory its size and modification time (ns); a directory's own mtime changes
    whenever an entry is added, which the entry itself shows."""
    found: Snapshot = {}
    for directory, directories, files in os.walk(root):
        for name in directories + files:
            path = os.path.join(directory, name)
            stat = os.lstat(path)
            inside = "/" + os.path.relpath(path, root)
            if name in directories:
                found[inside] = (stat.st_mode, stat.st_uid, 0, 0)
            else:
                found[inside] = (stat.st_mode, stat.st_uid, stat.st_size, stat.st_mtime_ns)
    return found


def written_outside(before: Snapshot, after: Snapshot, mounts: Sequence[Mount]) -> list[str]:
    """The paths added, removed or changed between two snapshots of a container's root filesystem,
    less the mount points of ``mounts`` and the directories buildah makes to hold them."""
    holders = set()
    for mount in mounts:
        path = Path(mount.target)
        holders |= {str(path), *(str(parent) for parent in path.parents)}
    return sorted(
        path
        for path in before.keys() | after.keys()
        if before.get(path) != after.get(path) and path not in holders
    )


@dataclass(frozen=True)
class Built:
    """An image built this session."""

    name: str


def build(target: str, buildah: Buildah, logs: Path) -> Built:
    """Build ``target`` (operator or xeon) with ``hack/build-images.sh --local``, its output in
    ``logs/build-<target>.log``; at most BUILD_TIMEOUT_S seconds.

    Raises:
        pytest.fail.Exception: the build failed (the log's tail is in the message).
        subprocess.TimeoutExpired: it ran out of time.
    """
    log = logs / f"build-{target}.log"
    with log.open("w") as output:
        result = subprocess.run(
            [str(BUILD), "--builder", "buildah", "--local", target],
            stdout=output,
            stderr=subprocess.STDOUT,
            timeout=BUILD_TIMEOUT_S,
            cwd=REPO,
        )
    if result.returncode != 0:
        pytest.fail(f"hack/build-images.sh --local {target} failed:\n" + log.read_text()[-6000:])
    name = OPERATOR_IMAGE if target == "operator" else XEON_IMAGE
    buildah.config(name)  # it is there
    return Built(name)


def volume_dir(path: Path) -> Path:
    """``path`` made as a directory anyone may write, as a pod's emptyDir volume is."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    return path
