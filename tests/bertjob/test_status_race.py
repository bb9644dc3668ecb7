"""Status writes under optimistic concurrency (issue 29, item 4): the emulator answers 409 Conflict
to a write that carries a stale ``metadata.resourceVersion``, as an API server does, and two of the
operator's writers that read the same status and write at the same moment both land.

The handlers' functions run in this process against the emulator alone (no ``kopf run``): two
threads, held by a barrier at their first status patch so that each has read the status before
either writes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from kubernetes.client import ApiClient, Configuration, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from bertjob import children, handlers
from bertjob_api.contract import GROUP, PLURAL, VERSION
from bertjob_testing.kube_emulator import WAIT_S, cluster_crds, emulator
from tests.bertjob.e2e import PYTORCHJOBS, named_job
from tests.kubeflow_env import kubeflow_condition

NAMESPACE = "default"


@pytest.fixture(scope="module")
def api() -> Iterator[ApiClient]:
    """A client of an emulator that serves our CRD and the PyTorchJob CRD."""
    with emulator(cluster_crds(["pytorchjob"])) as (url, _):
        configuration = Configuration()
        configuration.host = url
        yield ApiClient(configuration)


def _jobs(api: ApiClient) -> CustomObjectsApi:
    return CustomObjectsApi(api)


def _job(api: ApiClient, name: str) -> dict[str, Any]:
    found = _jobs(api).get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
    assert isinstance(found, dict)
    return found


def _merge(api: ApiClient, name: str, body: dict[str, Any], status: bool = False) -> dict[str, Any]:
    patch = (
        _jobs(api).patch_namespaced_custom_object_status
        if status
        else _jobs(api).patch_namespaced_custom_object
    )
    found = patch(GROUP, VERSION, NAMESPACE, PLURAL, name, body, _content_type="application/merge-patch+json")
    assert isinstance(found, dict)
    return found


@pytest.mark.parametrize("status", [False, True], ids=["object", "status"])
def test_a_write_with_a_stale_resource_version_is_a_conflict(api: ApiClient, status: bool) -> None:
    name = f"stale-{'status' if status else 'object'}"
    created = _jobs(api).create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, named_job(name))
    stale = created["metadata"]["resourceVersion"]
    fresh = _merge(api, name, {"metadata": {"labels": {"a": "1"}}})["metadata"]["resourceVersion"]
    assert fresh != stale

    with pytest.raises(ApiException) as refused:
        _merge(api, name, {"metadata": {"resourceVersion": stale}, "status": {"phase": "Running"}}, status)

    assert refused.value.status == 409
    assert '"reason":"Conflict"' in str(refused.value.body).replace(" ", "")
    assert "the object has been modified" in str(refused.value.body)
    assert "phase" not in (_job(api, name).get("status") or {})
    # With the stored resourceVersion the write lands; without one it lands unconditionally, as
    # kopf's own patches and the trainer's do.
    written = _merge(
        api, name, {"metadata": {"resourceVersion": fresh}, "status": {"phase": "Pending"}}, status
    )
    assert written["status"]["phase"] == "Pending" and written["metadata"]["resourceVersion"] != fresh
    _merge(api, name, {"status": {"phase": "Running"}}, status)
    assert _job(api, name)["status"]["phase"] == "Running"


def test_a_merge_patch_replaces_what_is_not_an_object(api: ApiClient) -> None:
    """RFC 7386, as an API server merges: an object patched over a string (or a list over an
    object) replaces it, where kmock's own merge refuses."""
    name = "replaced"
    _jobs(api).create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, named_job(name))
    _merge(api, name, {"status": {"pendingEvents": "x", "conditions": {"a": 1}, "phase": "Pending"}}, True)

    patch = {"pendingEvents": {"e": {"type": "Normal"}}, "conditions": [], "phase": None}
    status = _merge(api, name, {"status": patch}, True)["status"]

    assert status == {"pendingEvents": {"e": {"type": "Normal"}}, "conditions": []}


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


def test_two_writers_racing_on_the_status_both_land(api: ApiClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """The training job reports Running (mirror_child) while the user changes the image (update_job,
    refused): each read the status with the Created condition alone and writes conditions whole;
    the one that writes second finds its read stale, reads again and keeps the other's condition."""
    name = "raced"
    _jobs(api).create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, named_job(name))
    handlers.launch(api, _job(api, name))
    group, version, plural = PYTORCHJOBS.split("/")
    running = {"conditions": [kubeflow_condition("Created"), kubeflow_condition("Running")]}
    child = CustomObjectsApi(api).patch_namespaced_custom_object_status(
        group, version, NAMESPACE, plural, name, {"status": running},
        _content_type="application/merge-patch+json",
    )  # fmt: skip
    old = _job(api, name)["spec"]
    changed = _merge(api, name, {"spec": {"image": "other:1"}})
    memo = kopf.Memo(api=api)
    held = Held(2)
    monkeypatch.setattr(children, "call", held)

    _run(
        lambda: handlers.mirror_child(body=child, memo=memo),
        lambda: handlers.change(api, changed, old, changed["spec"]),
    )

    status = _job(api, name)["status"]
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
