"""Status writes under optimistic concurrency (issue 29, item 4), on the real control plane: the
real API server answers 409 Conflict to a write that carries a stale ``metadata.resourceVersion``
(of the object or of its status subresource), and two of the operator's writers that read the
same status and write at the same moment both land.

The handlers' functions run in this process with the chart's ServiceAccount's credentials (the
chart's RBAC), the chart's operator stopped for the module so that they are the only writers: two
threads, held by a barrier at their first status patch so that each has read the status before
either writes. In a namespace the webhook does not serve (``unguarded``): it is down with the
operator (failurePolicy: Fail), and it would refuse the image change the race needs.

Why kwok: no pod needs to run: two of the operator's writers race on one job's status against the
real API server's resourceVersion check; the test writes the child's status.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from kubernetes.client import ApiClient, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from kubernetes.config import new_client_from_config

from bertjob import children, handlers
from bertjob_api.contract import GROUP, PLURAL, VERSION
from bertjob_testing.cluster.operator import RealCluster
from bertjob_testing.kube_emulator import WAIT_S
from tests.bertjob.e2e import PYTORCHJOBS, home, named_job
from tests.kubeflow_env import kubeflow_condition

pytestmark = pytest.mark.xdist_group("operator")


@pytest.fixture(scope="module")
def stopped(operator: RealCluster) -> Iterator[RealCluster]:
    """The chart's operator stopped for the module (the handlers here are the only writers), and
    started again after."""
    operator.stop()
    try:
        yield operator
    finally:
        operator.start()


@pytest.fixture
def api(stopped: RealCluster, unguarded: RealCluster) -> ApiClient:
    """A client with the credentials of the chart's ServiceAccount, as the operator's; the test's
    own calls are the admin's (``unguarded.api``), in its namespace."""
    return new_client_from_config(config_file=str(unguarded.operator_config))


def _jobs(api: ApiClient) -> CustomObjectsApi:
    return CustomObjectsApi(api)


def _job(cluster: RealCluster, name: str) -> dict[str, Any]:
    return cluster.job(name)


def _merge(cluster: RealCluster, name: str, body: dict[str, Any], status: bool = False) -> dict[str, Any]:
    jobs = _jobs(cluster.api)
    patch = jobs.patch_namespaced_custom_object_status if status else jobs.patch_namespaced_custom_object
    found = patch(
        GROUP, VERSION, home(cluster), PLURAL, name, body, _content_type="application/merge-patch+json"
    )
    assert isinstance(found, dict)
    return found


@pytest.mark.parametrize("status", [False, True], ids=["object", "status"])
def test_a_write_with_a_stale_resource_version_is_a_conflict(
    stopped: RealCluster, unguarded: RealCluster, status: bool
) -> None:
    """Of the object (a label: the server takes no status there, the status subresource being
    on) and of its status subresource."""
    cluster, name = unguarded, f"stale-{'status' if status else 'object'}"

    def write(value: str, version: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = (
            {"status": {"phase": value}} if status else {"metadata": {"labels": {"x": value}}}
        )
        if version is not None:
            body.setdefault("metadata", {})["resourceVersion"] = version
        return _merge(cluster, name, body, status)

    def written(obj: dict[str, Any]) -> str | None:
        return (
            (obj.get("status") or {}).get("phase") if status else obj["metadata"].get("labels", {}).get("x")
        )

    stale = cluster.create_job(named_job(name))["metadata"]["resourceVersion"]
    fresh = _merge(cluster, name, {"metadata": {"labels": {"a": "1"}}})["metadata"]["resourceVersion"]
    assert fresh != stale

    with pytest.raises(ApiException) as refused:
        write("Running", stale)

    assert refused.value.status == 409
    assert '"reason":"Conflict"' in str(refused.value.body).replace(" ", "")
    assert "the object has been modified" in str(refused.value.body)
    assert written(_job(cluster, name)) is None
    # With the stored resourceVersion the write lands; without one it lands unconditionally, as
    # kopf's own patches and the trainer's do.
    landed = write("Pending", fresh)
    assert written(landed) == "Pending" and landed["metadata"]["resourceVersion"] != fresh
    write("Running")
    assert written(_job(cluster, name)) == "Running"


class Held:
    """Wraps :func:`bertjob.children.call`: each thread's first status patch waits at a barrier of
    ``parties``, so that every writer has read the status before any writes; conflicts counted."""

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, timeout=WAIT_S)
        self.local = threading.local()
        self.conflicts = 0
        self.real = children.call

    def __call__(self, api: ApiClient, method: str, path: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if method == "PATCH" and path.endswith("/status") and not getattr(self.local, "held", False):
            self.local.held = True
            self.barrier.wait()
        try:
            return self.real(api, method, path, *args, **kwargs)
        except ApiException as error:
            self.conflicts += error.status == 409
            raise


def _run(*targets: Any) -> None:
    """Run each of ``targets`` in a thread; raise the first exception any raised."""
    errors: list[BaseException] = []

    def guarded(target: Any) -> None:
        try:
            target()
        except BaseException as error:  # reported to the test below
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(target,)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=WAIT_S)
    assert not any(thread.is_alive() for thread in threads), "a writer hung"
    if errors:
        raise errors[0]


def test_two_writers_racing_on_the_status_both_land(
    api: ApiClient, unguarded: RealCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The training job reports Running (mirror_child) while the user changes the image (update_job,
    refused): each read the status with the Created condition alone and writes conditions whole;
    the one that writes second finds its read stale (the real server's 409), reads again and keeps
    the other's condition."""
    cluster, name = unguarded, "raced"
    cluster.create_job(named_job(name))
    handlers.launch(api, _job(cluster, name))
    group, version, plural = PYTORCHJOBS.split("/")
    running = {"conditions": [kubeflow_condition("Created"), kubeflow_condition("Running")]}
    child = CustomObjectsApi(cluster.api).patch_namespaced_custom_object_status(
        group, version, home(cluster), plural, name, {"status": running},
        _content_type="application/merge-patch+json",
    )  # fmt: skip
    old = _job(cluster, name)["spec"]
    changed = _merge(cluster, name, {"spec": {"image": "other:1"}})
    memo = kopf.Memo(api=api)
    held = Held(2)
    monkeypatch.setattr(children, "call", held)

    _run(
        lambda: handlers.mirror_child(body=child, memo=memo, logger=logging.getLogger(name)),
        lambda: handlers.change(api, changed, old, changed["spec"]),
    )

    status = _job(cluster, name)["status"]
    by_type = {c["type"]: c["status"] for c in status["conditions"]}
    # The kstatus conditions follow from both writes: the job stalls on the refused change.
    assert by_type == {
        "Created": "True",
        "Running": "True",
        "SpecChangeRefused": "True",
        "Ready": "False",
        "Stalled": "True",
    }
    assert (status["phase"], status["observedGeneration"]) == ("Running", 2)
    assert held.conflicts >= 1, "the writers did not race"
