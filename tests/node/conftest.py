"""Fixtures of the real-node tier: a control plane of its own with a real node (containerd, runc
and the kubelet on this machine, :mod:`bertjob_testing.cluster.node`) beside kwok's fake nodes, and
a namespace per test. A plane of its own: the node's pods are real processes of this machine, and
the shared plane's tests expect every pod to be kwok's."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bertjob_testing.cluster.controllers import Controllers
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.node import TOLERATION, RealNode
from bertjob_testing.cluster.operator import NAMESPACE, OPERATOR, RELEASE, helm, install_chart
from tests.cluster.conftest import _namespace_name, _own_namespace
from tests.images.buildah_images import Buildah, Built

NEEDS_ROOT = "a real node (containerd, runc, cgroups, a bridge) needs root"
ROLLOUT_S = 180
# buildah's export of the Xeon trainer image (6.3 GB: PyPI's torch carries CUDA's libraries) took
# 47 s here, containerd's import about as long.
IMPORT_TIMEOUT_S = 900


@pytest.fixture(scope="package")
def real_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    """A control plane with kwok's nodes and one real node, Ready; stopped after the package."""
    if os.geteuid() != 0:
        pytest.skip(NEEDS_ROOT)
    workdir = tmp_path_factory.mktemp("node-plane")
    # The API server calls a webhook's Service through its endpoints (the pod's address, routed to
    # the node), not its ClusterIP, which only kube-proxy's rules inside the node's namespace lead.
    plane = ControlPlane(
        workdir / "plane", extra_args={"kube-apiserver": ["--enable-aggregator-routing=true"]}
    )
    plane.workdir.mkdir()
    try:
        plane.start()
        node = RealNode(plane, workdir / "node")
        node.start()
        yield node
    finally:
        plane.stop()


@pytest.fixture
def namespace(real_node: RealNode, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the test's own on the real node's plane."""
    with _own_namespace(real_node.plane, _namespace_name(request)) as name:
        yield name


@pytest.fixture(scope="package")
def controllers_on_node(real_node: RealNode) -> Controllers:
    """training-operator, mpi-operator, JobSet, Trainer v2 and Kueue on the real node's plane
    (processes of this machine, as in the controllers tier; the pods they make run on the node)."""
    started = Controllers(real_node.plane, real_node.workdir.parent / "controllers", real_node.host_address)
    started.start()
    return started


def import_built(node: RealNode, buildah: Buildah, image: Built, workdir: Path) -> None:
    """Export ``image`` from buildah's storage as a Docker archive and import it into the node's
    containerd (no registry); the archive is deleted after."""
    archive = workdir / "image.tar"
    buildah("push", image.name, f"docker-archive:{archive}:{image.name}", timeout_s=IMPORT_TIMEOUT_S)
    try:
        node.import_image(archive)
    finally:
        archive.unlink()


def rollout(node: RealNode) -> None:
    """Wait until the chart's Deployment has its replicas ready (the webhook is served)."""
    node.plane.kubectl(
        "rollout",
        "status",
        f"deployment/{OPERATOR}",
        "-n",
        NAMESPACE,
        f"--timeout={ROLLOUT_S}s",
        timeout_s=ROLLOUT_S + 10,
    )


@pytest.fixture(scope="package")
def chart_on_node(
    real_node: RealNode,
    buildah: Buildah,
    operator_image: Built,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RealNode]:
    """The operator image imported into the node and the chart installed (webhook on) with its
    pod placed there; uninstalled after."""
    plane = real_node.plane
    import_built(real_node, buildah, operator_image, tmp_path_factory.mktemp("operator-image"))
    registry, _, rest = operator_image.name.partition("/")
    repository, _, tag = rest.partition(":")
    install_chart(
        plane,
        f"--set=image.registry={registry}",
        f"--set=image.repository={repository}",
        f"--set=image.tag={tag}",
        f"--set-json=tolerations={json.dumps([TOLERATION])}",
        f"--set-json=nodeSelector={json.dumps({'kubernetes.io/hostname': real_node.name})}",
    )
    try:
        rollout(real_node)
        yield real_node
    finally:
        helm(plane, "uninstall", RELEASE, f"--namespace={NAMESPACE}", "--wait", check=False)


@pytest.fixture(scope="package")
def trainer_on_node(
    real_node: RealNode, buildah: Buildah, xeon_image: Built, tmp_path_factory: pytest.TempPathFactory
) -> Built:
    """The Xeon trainer image in the node's containerd."""
    import_built(real_node, buildah, xeon_image, tmp_path_factory.mktemp("trainer-image"))
    return xeon_image
