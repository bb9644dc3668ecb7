"""Fixtures of the real-node tier: a control plane of its own with a real node (containerd, runc
and the kubelet on this machine, :mod:`bertjob_testing.cluster.node`) beside kwok's fake nodes, and
a namespace per test. A plane of its own: the node's pods are real processes of this machine, and
the shared plane's tests expect every pod to be kwok's."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.node import RealNode
from tests.cluster.conftest import _namespace_name, _own_namespace

NEEDS_ROOT = "a real node (containerd, runc, cgroups, a bridge) needs root"


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
