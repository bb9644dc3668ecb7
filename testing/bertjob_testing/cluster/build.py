"""The test cluster's executables and upstream files: where ``hack/build-cluster.sh`` builds each
component of the catalog (:mod:`bertjob_testing.cluster.catalog`), building what is missing, and
the CRDs the catalog lists, from the components' Go modules at the pinned versions.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

from bertjob_testing.cluster.catalog import REPO, component, crd_owner

BUILD_SCRIPT = REPO / "hack" / "build-cluster.sh"
TOOLS_DIR_ENV = "BERTJOB_TOOLS_DIR"


class BuildError(RuntimeError):
    """A component could not be built or found; the message names it, its version and the log."""


def tools_dir() -> Path:
    """Where the binaries are kept: ``$BERTJOB_TOOLS_DIR``, default ``~/.cache/bertjob/tools``
    (outside the checkout, so that a fresh clone on the same machine builds nothing)."""
    return Path(os.environ.get(TOOLS_DIR_ENV) or Path.home() / ".cache" / "bertjob" / "tools")


def executable(name: str, binary: str) -> Path:
    """The path of executable ``binary`` of catalog component ``name``, built by :func:`build`
    when missing (many minutes the first time on a machine, nothing after).

    Raises:
        KeyError: no such component, or it builds no such executable.
        BuildError: as :func:`build`.
    """
    built = component(name)
    if binary not in dict(built.binaries):
        raise KeyError(f"component {name} builds no {binary!r} (it builds {', '.join(dict(built.binaries))})")
    directory = tools_dir() / built.directory
    path = directory / "bin" / binary
    if not ((directory / ".complete").is_file() and path.is_file()):
        build()
    return path


def build() -> None:
    """Run ``hack/build-cluster.sh``: build every component that is missing (one build at a time
    per machine; a second caller waits for the first).

    Raises:
        BuildError: the script failed; its message names the component, the version and the last
            lines of the build's log.
    """
    environment = {**os.environ, TOOLS_DIR_ENV: str(tools_dir())}
    result = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, env=environment)
    if result.returncode != 0:
        raise BuildError(f"hack/build-cluster.sh failed (exit {result.returncode}):\n{result.stderr[-4000:]}")


@functools.cache
def module_dir(module: str, version: str) -> Path:
    """The unpacked zip of Go module ``module`` at ``version``, downloaded through the Go module
    proxy into Go's module cache (``go mod download``) where it is not there yet.

    Raises:
        BuildError: ``go`` is missing, or the proxy refused the module (its error quoted).
    """
    try:
        result = subprocess.run(
            ["go", "mod", "download", "-json", f"{module}@{version}"],
            capture_output=True,
            text=True,
            env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"},
            cwd=tools_dir().parent if tools_dir().parent.is_dir() else None,
        )
    except FileNotFoundError as error:
        raise BuildError(f"go is not installed: {error}") from error
    try:
        answer = json.loads(result.stdout)
    except json.JSONDecodeError:
        answer = {"Error": result.stderr.strip() or "no answer"}
    if result.returncode != 0 or "Error" in answer:
        raise BuildError(f"go mod download {module}@{version}: {answer.get('Error', result.stderr)}")
    return Path(answer["Dir"])


def source(name: str) -> Path:
    """The Go module of catalog component ``name`` at its pinned version, unpacked.

    Raises:
        BuildError: as :func:`module_dir`.
    """
    built = component(name)
    return module_dir(built.module, built.version)


def crds(name: str) -> list[Path]:
    """The CRD files the catalog lists for component ``name``, from its module.

    Raises:
        BuildError: the module could not be downloaded, or lacks one of them.
    """
    found = [source(name) / path for path in component(name).crds]
    for path in found:
        if not path.is_file():
            raise BuildError(f"{component(name).module}@{component(name).version} has no {path.name}")
    return found


def upstream_crd(filename: str) -> Path:
    """The CRD file called ``filename`` from the module of the component that lists it.

    Raises:
        KeyError: no component lists it.
        BuildError: the module could not be downloaded, or lacks the file.
    """
    owner, inside = crd_owner(filename)
    path = source(owner.name) / inside
    if not path.is_file():
        raise BuildError(f"{owner.module}@{owner.version} has no {inside}")
    return path
