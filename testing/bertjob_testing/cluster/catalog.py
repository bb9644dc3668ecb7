"""The one table of what the test cluster is built from: each component's Go module, the name of
its version in ``hack/versions.env``, the executables built from it and the CRDs the tests install
from it.

``hack/build-cluster.sh`` reads the table through ``python3 catalog.py plan`` (this file needs only
the standard library, so the build needs no virtual environment); the cluster's processes
(:mod:`bertjob_testing.cluster.build`), the controllers' CRD install, the API emulator and
``tests/conftest.py`` read it as a module. Nothing else names a module, a version or a CRD path.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
VERSIONS_FILE = REPO / "hack" / "versions.env"


@dataclass(frozen=True)
class Component:
    """One directory of built executables, ``<name>-<version>/bin/`` under the tools directory.

    Attributes:
        name: the directory's prefix, and the component's name in messages.
        version_key: the name of its version in ``hack/versions.env`` (``ETCD_VERSION``).
        module: the Go module it is built from.
        binaries: (executable, Go package) pairs built into ``bin/``.
        kubernetes: built from ``k8s.io/kubernetes``, whose staging modules need ``replace``
            lines at ``<version_key's prefix>_STAGING_VERSION`` and whose ``/version`` is stamped.
        ldflags: extra ``-X`` flags; ``{version}`` is the version, ``{bare}`` the same without v.
        crds: paths inside the module of the CRD files the tests install from it.
    """

    name: str
    version_key: str
    module: str
    binaries: tuple[tuple[str, str], ...]
    kubernetes: bool = False
    ldflags: str = ""
    crds: tuple[str, ...] = ()

    @property
    def version(self) -> str:
        """The pinned version (``hack/versions.env``)."""
        return versions()[self.version_key]

    @property
    def staging_version(self) -> str:
        """The staging modules' version of a ``k8s.io/kubernetes`` component ('' for others)."""
        if not self.kubernetes:
            return ""
        return versions()[self.version_key.replace("_VERSION", "_STAGING_VERSION")]

    @property
    def directory(self) -> str:
        """The directory's name under the tools directory: ``<name>-<version>``."""
        return f"{self.name}-{self.version}"


def _kubernetes(*commands: str) -> tuple[tuple[str, str], ...]:
    return tuple((command, f"k8s.io/kubernetes/cmd/{command}") for command in commands)


COMPONENTS = (
    Component(
        "etcd",
        "ETCD_VERSION",
        "go.etcd.io/etcd/server/v3",
        (("etcd", "go.etcd.io/etcd/server/v3"),),
        ldflags="-X go.etcd.io/etcd/api/v3/version.GitSHA=module",
    ),
    Component(
        "kubernetes",
        "KUBERNETES_VERSION",
        "k8s.io/kubernetes",
        _kubernetes(
            "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet", "kube-proxy"
        ),
        kubernetes=True,
    ),
    Component(
        "kwok",
        "KWOK_VERSION",
        "sigs.k8s.io/kwok",
        (("kwok", "sigs.k8s.io/kwok/cmd/kwok"),),
        ldflags="-X sigs.k8s.io/kwok/pkg/consts.Version={bare}",
        # Its Logs and ClusterLogs kinds: a Logs object named as a pod makes `kubectl logs` serve
        # a file.
        crds=(
            "kustomize/crd/bases/kwok.x-k8s.io_logs.yaml",
            "kustomize/crd/bases/kwok.x-k8s.io_clusterlogs.yaml",
        ),
    ),
    # The oldest Kubernetes the chart claims: its API server alone, to install the CRD and the chart on.
    Component(
        "kube-apiserver",
        "KUBERNETES_FLOOR_VERSION",
        "k8s.io/kubernetes",
        _kubernetes("kube-apiserver"),
        kubernetes=True,
    ),
    # The real node: containerd (with its runc shim and ctr), the CNI plugins its pods' network is
    # made with, and CoreDNS as the cluster's DNS (kubelet and kube-proxy are the Kubernetes build's).
    Component(
        "containerd",
        "CONTAINERD_VERSION",
        "github.com/containerd/containerd/v2",
        tuple(
            (command, f"github.com/containerd/containerd/v2/cmd/{command}")
            for command in ("containerd", "containerd-shim-runc-v2", "ctr")
        ),
        ldflags="-X github.com/containerd/containerd/v2/version.Version={version}",
    ),
    Component(
        "cni-plugins",
        "CNI_PLUGINS_VERSION",
        "github.com/containernetworking/plugins",
        tuple(
            (plugin.rpartition("/")[2], f"github.com/containernetworking/plugins/plugins/{plugin}")
            for plugin in ("main/bridge", "main/loopback", "ipam/host-local", "meta/portmap")
        ),
    ),
    Component(
        "coredns",
        "COREDNS_VERSION",
        "github.com/coredns/coredns",
        (("coredns", "github.com/coredns/coredns"),),
    ),
    # The controllers, each from its own tools module: their go.mod files pin different k8s.io/*
    # and controller-runtime versions, and one module would force one set on all of them.
    Component(
        "training-operator",
        "TRAINING_OPERATOR_VERSION",
        "github.com/kubeflow/training-operator",
        (("training-operator", "github.com/kubeflow/training-operator/cmd/training-operator.v1"),),
        crds=("manifests/base/crds/kubeflow.org_pytorchjobs.yaml",),
    ),
    Component(
        "mpi-operator",
        "MPI_OPERATOR_VERSION",
        "github.com/kubeflow/mpi-operator",
        (("mpi-operator", "github.com/kubeflow/mpi-operator/cmd/mpi-operator"),),
        crds=("manifests/base/kubeflow.org_mpijobs.yaml",),
    ),
    Component(
        "trainer",
        "TRAINER_VERSION",
        "github.com/kubeflow/trainer/v2",
        (("trainer-controller-manager", "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"),),
        crds=tuple(
            f"manifests/base/crds/trainer.kubeflow.org_{kind}.yaml"
            for kind in ("trainjobs", "clustertrainingruntimes", "trainingruntimes")
        ),
    ),
    Component(
        "jobset",
        "JOBSET_VERSION",
        "sigs.k8s.io/jobset",
        (("jobset", "sigs.k8s.io/jobset"),),
        crds=("config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",),
    ),
    # Kueue's CRDs carry conversion webhooks, so the controllers tier renders them with Kueue's own
    # kustomize component (config/components/crd) and points them at the running Kueue.
    Component("kueue", "KUEUE_VERSION", "sigs.k8s.io/kueue", (("kueue", "sigs.k8s.io/kueue/cmd/kueue"),)),
)
BY_NAME = {component.name: component for component in COMPONENTS}


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


def component(name: str) -> Component:
    """The component called ``name``.

    Raises:
        KeyError: no such component, naming the known ones.
    """
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no component {name!r} in the catalog (known: {', '.join(BY_NAME)})") from None


def crd_owner(filename: str) -> tuple[Component, str]:
    """The component whose module holds the CRD file called ``filename``, and its path there.

    Raises:
        KeyError: no component lists it.
    """
    for candidate in COMPONENTS:
        for path in candidate.crds:
            if Path(path).name == filename:
                return candidate, path
    raise KeyError(f"no component of the catalog lists a CRD file {filename!r}")


def plan() -> str:
    """What ``hack/build-cluster.sh`` builds, one line per component, its fields separated by ``|``
    (a shell's ``read`` would merge two tabs around an empty field): name, version,
    module, staging version ('' unless built from ``k8s.io/kubernetes``), ldflags, and the
    ``executable=package`` pairs separated by spaces."""
    lines = []
    for each in COMPONENTS:
        ldflags = each.ldflags.format(version=each.version, bare=each.version.removeprefix("v"))
        binaries = " ".join(f"{executable}={package}" for executable, package in each.binaries)
        lines.append(
            "|".join((each.name, each.version, each.module, each.staging_version, ldflags, binaries))
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["plan"]:
        sys.exit(f"usage: {sys.argv[0]} plan")
    sys.stdout.write(plan())
