"""Fixtures of the tests on the real control plane: the chart installed and the operator running
under its ServiceAccount (one for this folder's run), and a namespace per test.

``cluster`` is the operator's :class:`RealCluster` with its calls in the test's own namespace (the
moved end-to-end tests call it as they called the emulator's ``cluster`` of tests/conftest.py,
which this one hides here); ``unguarded`` is the same in a namespace the chart's webhook does not
serve, as on a cluster where the webhook is off (the chart's default), so that what only the
webhook refuses reaches the operator. Every test that uses the operator is in the xdist group
``operator``: one operator for the one cluster (two watching every namespace would both handle
each job), so pytest-xdist's ``--dist loadgroup`` runs them all in one worker.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.operator import (
    UNSERVED_LABEL,
    UNSERVED_VALUE,
    RealCluster,
    install,
    skip_webhook_in_labelled_namespaces,
    uninstall,
)

OPERATOR_GROUP = "operator"


@pytest.fixture(scope="package")
def operator(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """``helm install`` of charts/bertjob (webhook on) into the real API server and the operator
    running as a local process with the chart's ServiceAccount's token; uninstalled after."""
    cluster = install(control_plane, tmp_path_factory.mktemp("operator"))
    try:
        skip_webhook_in_labelled_namespaces(control_plane)
        yield cluster
    finally:
        uninstall(cluster)


def _namespace_name(request: pytest.FixtureRequest, suffix: str = "") -> str:
    """A namespace name of the test's own: its name, cut short, and a digest of its node id (two
    parameters of one test differ after the cut)."""
    digest = hashlib.sha256((request.node.nodeid + suffix).encode()).hexdigest()[:8]
    name = request.node.name.replace("_", "-").replace("[", "-").replace("]", "").replace(".", "-").lower()
    return f"{name[:50].strip('-')}-{digest}"


@contextlib.contextmanager
def _own_namespace(plane: ControlPlane, name: str, labels: dict[str, str] | None = None) -> Iterator[str]:
    """Namespace ``name`` (with ``labels``) while in the block, then deleted without waiting."""
    document = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
    plane.kubectl("create", "-f", "-", input=json.dumps(document))
    try:
        yield name
    finally:
        plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the test's own, deleted after it (the namespace controller empties it)."""
    with _own_namespace(control_plane, _namespace_name(request)) as name:
        yield name


@contextlib.contextmanager
def _in_namespace(operator: RealCluster, namespace: str) -> Iterator[RealCluster]:
    """``operator`` with its calls in ``namespace``; running again after if it ran before, and a
    test that stopped or killed it failed before starting it."""
    operator.default_namespace = namespace
    was_running = running(operator)
    try:
        yield operator
    finally:
        operator.default_namespace = "default"
        if was_running and not running(operator):
            operator.start()


def running(operator: RealCluster) -> bool:
    """Whether the operator's process runs."""
    return operator.operator is not None and operator.operator.poll() is None


@pytest.fixture
def cluster(operator: RealCluster, namespace: str) -> Iterator[RealCluster]:
    """The operator's cluster, its calls (create_job, job, report ...) in the test's namespace."""
    with _in_namespace(operator, namespace) as cluster:
        yield cluster


@pytest.fixture
def unguarded(
    operator: RealCluster, control_plane: ControlPlane, request: pytest.FixtureRequest
) -> Iterator[RealCluster]:
    """The operator's cluster, its calls in a namespace of the test's own that the webhook does
    not serve (:data:`UNSERVED_LABEL`): the API server stores a job, or a change, that only the
    webhook would refuse, and the operator refuses it after the fact (its status and Events)."""
    labels = {UNSERVED_LABEL: UNSERVED_VALUE}
    with (
        _own_namespace(control_plane, _namespace_name(request, "-unguarded"), labels) as name,
        _in_namespace(operator, name) as cluster,
    ):
        yield cluster


HERE = Path(__file__).parent
# Marks a test that reads what the whole tier did (tests/cluster/test_rbac_audit.py): it runs after
# every other test of this folder.
TIER_AUDIT_MARK = "tier_audit"
# The tests of this folder that -k, -m or --deselect left out in this run.
_DESELECTED: list[str] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here that runs the operator joins the xdist group ``operator``; the tests marked
    :data:`TIER_AUDIT_MARK` move after the last test of this folder (in the same xdist group, which
    one worker runs in this order)."""
    for item in items:
        if item.path.is_relative_to(HERE) and "operator" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(OPERATOR_GROUP))
    audits = [item for item in items if item.get_closest_marker(TIER_AUDIT_MARK)]
    if not audits:
        return
    for item in audits:
        item.add_marker(pytest.mark.xdist_group(OPERATOR_GROUP))
        items.remove(item)
    last = max((index for index, item in enumerate(items) if item.path.is_relative_to(HERE)), default=-1)
    items[last + 1 : last + 1] = audits


def pytest_deselected(items: list[pytest.Item]) -> None:
    """Remember which tests of this folder were deselected (:func:`incomplete_tier`)."""
    _DESELECTED.extend(item.nodeid for item in items if item.path.is_relative_to(HERE))


def incomplete_tier(session: pytest.Session) -> str:
    """Why this run is not the whole cluster tier ('' when it is): a test module of this folder not
    collected, or tests of it deselected."""
    collected = {item.path.name for item in session.items if item.path.is_relative_to(HERE)}
    missing = sorted(path.name for path in HERE.glob("test_*.py") if path.name not in collected)
    if missing:
        return f"not collected: {', '.join(missing)}"
    if _DESELECTED:
        return f"{len(_DESELECTED)} tests deselected, such as {_DESELECTED[0]}"
    return ""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """A failed test that ran the operator reports the operator's log."""
    report = yield
    funcargs = getattr(item, "funcargs", {})
    cluster = funcargs.get("operator") or funcargs.get("cluster") or funcargs.get("unguarded")
    if report.failed and isinstance(cluster, RealCluster) and cluster.log.exists():
        report.sections.append(("operator log", cluster.log_tail()))
    return report
