"""What the test cluster is built from: the versions pinned in ``hack/versions.env``, the
directories ``hack/build-cluster.sh`` builds them into, and the Kubeflow CRDs taken from the
controllers' own Go modules at those versions.

Both the build script and this module read the one file; nothing else names a version.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
VERSIONS_FILE = REPO / "hack" / "versions.env"
BUILD_SCRIPT = REPO / "hack" / "build-cluster.sh"
TOOLS_DIR_ENV = "BERTJOB_TOOLS_DIR"


class BuildError(RuntimeError):
    """A component could not be built or found; the message names it, its version and the log."""


@functools.cache
def versions() -> dict[str, str]:
    """The ``NAME=VALUE`` lines of ``hack/versions.env`` (comments and blank lines skipped).

    Raises:
        ValueError: a line that is neither, naming the file and the line number.
    """
    found: dict[str, str] = {}
    for number, line in enumerate(VERSIONS_FILE.read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, equals, value = line.partition("=")
        if not equals or not name.isidentifier() or not value:
            raise ValueError(f"{VERSIONS_FILE}:{number}: not NAME=VALUE: {line!r}")
        found[name] = value
    return found


def tools_dir() -> Path:
    """Where the binaries are kept: ``$BERTJOB_TOOLS_DIR``, default ``~/.cache/bertjob/tools``
    (outside the checkout, so that a fresh clone on the same machine builds nothing)."""
    return Path(os.environ.get(TOOLS_DIR_ENV) or Path.home() / ".cache" / "bertjob" / "tools")


@dataclass(frozen=True)
class Binaries:
    """Paths of the built executables."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kwok: Path
    kubernetes_version: str
    # The API server of the oldest Kubernetes the chart claims (KUBERNETES_FLOOR_VERSION).
    kube_apiserver_floor: Path
    floor_version: str


@functools.cache
def binaries() -> Binaries:
    """The control plane's executables, built by :func:`build` where one is missing (many
    minutes the first time on a machine, nothing after).

    Raises:
        BuildError: the script failed; its message names the component, the version and the last
            lines of the build's log.
    """
    pinned = versions()
    root = tools_dir()
    components = (
        ("ETCD", "etcd"),
        ("KUBERNETES", "kubernetes"),
        ("KWOK", "kwok"),
        ("KUBERNETES_FLOOR", "kube-apiserver"),
    )
    if not all(
        (root / f"{name}-{pinned[f'{key}_VERSION']}" / ".complete").is_file() for key, name in components
    ):
        build()
    kubernetes = root / f"kubernetes-{pinned['KUBERNETES_VERSION']}" / "bin"
    return Binaries(
        etcd=root / f"etcd-{pinned['ETCD_VERSION']}" / "bin" / "etcd",
        kube_apiserver=kubernetes / "kube-apiserver",
        kube_controller_manager=kubernetes / "kube-controller-manager",
        kube_scheduler=kubernetes / "kube-scheduler",
        kubectl=kubernetes / "kubectl",
        kwok=root / f"kwok-{pinned['KWOK_VERSION']}" / "bin" / "kwok",
        kubernetes_version=pinned["KUBERNETES_VERSION"],
        kube_apiserver_floor=root
        / f"kube-apiserver-{pinned['KUBERNETES_FLOOR_VERSION']}"
        / "bin"
        / "kube-apiserver",
        floor_version=pinned["KUBERNETES_FLOOR_VERSION"],
    )


@dataclass(frozen=True)
class ControllerBinaries:
    """Paths of the Kubeflow and Kueue controllers' executables."""

    training_operator: Path
    mpi_operator: Path
    trainer: Path
    jobset: Path
    kueue: Path


# Each controller: its name in versions.env, its component directory, its executable.
CONTROLLERS = {
    "training_operator": ("TRAINING_OPERATOR", "training-operator", "training-operator"),
    "mpi_operator": ("MPI_OPERATOR", "mpi-operator", "mpi-operator"),
    "trainer": ("TRAINER", "trainer", "trainer-controller-manager"),
    "jobset": ("JOBSET", "jobset", "jobset"),
    "kueue": ("KUEUE", "kueue", "kueue"),
}


@functools.cache
def controller_binaries() -> ControllerBinaries:
    """The controllers' executables, built by :func:`build` where one is missing (each from its
    own tools module; minutes each the first time on a machine, nothing after).

    Raises:
        BuildError: as :func:`build`.
    """
    pinned = versions()
    root = tools_dir()
    paths = {
        field: root / f"{component}-{pinned[f'{key}_VERSION']}" / "bin" / binary
        for field, (key, component, binary) in CONTROLLERS.items()
    }
    if not all(path.parent.with_name(".complete").is_file() for path in paths.values()):
        build()
    return ControllerBinaries(**paths)


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


# Each upstream CRD file the tests install: (module, its version's name in versions.env, path in
# the module). The same manifests Kubeflow's own install applies.
UPSTREAM_CRDS = {
    "kubeflow.org_pytorchjobs.yaml": (
        "github.com/kubeflow/training-operator",
        "TRAINING_OPERATOR_VERSION",
        "manifests/base/crds/kubeflow.org_pytorchjobs.yaml",
    ),
    "kubeflow.org_mpijobs.yaml": (
        "github.com/kubeflow/mpi-operator",
        "MPI_OPERATOR_VERSION",
        "manifests/base/kubeflow.org_mpijobs.yaml",
    ),
    "trainer.kubeflow.org_trainjobs.yaml": (
        "github.com/kubeflow/trainer/v2",
        "TRAINER_VERSION",
        "manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml",
    ),
    "trainer.kubeflow.org_clustertrainingruntimes.yaml": (
        "github.com/kubeflow/trainer/v2",
        "TRAINER_VERSION",
        "manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml",
    ),
    "trainer.kubeflow.org_trainingruntimes.yaml": (
        "github.com/kubeflow/trainer/v2",
        "TRAINER_VERSION",
        "manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml",
    ),
}


def upstream_crd(filename: str) -> Path:
    """The path of one of :data:`UPSTREAM_CRDS` in its controller's module at the pinned version.

    Raises:
        KeyError: not one of them.
        BuildError: the module could not be downloaded, or lacks the file.
    """
    module, version_name, inside = UPSTREAM_CRDS[filename]
    path = module_dir(module, versions()[version_name]) / inside
    if not path.is_file():
        raise BuildError(f"{module}@{versions()[version_name]} has no {inside}")
    return path
