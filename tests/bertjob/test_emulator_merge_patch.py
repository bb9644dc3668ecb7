"""The emulator's own JSON merge patch (RFC 7386), which the operator's status writes rely on when
the end-to-end tests run on it.

The emulator: a real API server's CRD status schema refuses the status this starts from (a
string ``pendingEvents``, an object ``conditions``: tests/cluster/test_malformed_status.py), so
only the emulator can hold it; the real server's own merge is the one tests/cluster exercises.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration, CustomObjectsApi

from bertjob_api.contract import GROUP, PLURAL, VERSION
from bertjob_testing.kube_emulator import cluster_crds, emulator
from tests.bertjob.e2e import named_job

NAMESPACE = "default"


@pytest.fixture(scope="module")
def api() -> Iterator[ApiClient]:
    """A client of an emulator that serves our CRD."""
    with emulator(cluster_crds([])) as (url, _):
        configuration = Configuration()
        configuration.host = url
        yield ApiClient(configuration)


def _status(api: ApiClient, name: str, status: dict[str, Any]) -> dict[str, Any]:
    found = CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, NAMESPACE, PLURAL, name, {"status": status},
        _content_type="application/merge-patch+json",
    )  # fmt: skip
    assert isinstance(found, dict)
    return found


def test_a_merge_patch_replaces_what_is_not_an_object(api: ApiClient) -> None:
    """RFC 7386, as an API server merges: an object patched over a string (or a list over an
    object) replaces it, where kmock's own merge refuses."""
    name = "replaced"
    CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, named_job(name))
    _status(api, name, {"pendingEvents": "x", "conditions": {"a": 1}, "phase": "Pending"})

    patch = {"pendingEvents": {"e": {"type": "Normal"}}, "conditions": [], "phase": None}
    status = _status(api, name, patch)["status"]

    assert status == {"pendingEvents": {"e": {"type": "Normal"}}, "conditions": []}
