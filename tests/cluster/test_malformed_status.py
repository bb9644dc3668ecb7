"""Whether a real API server can hold the malformed statuses that the operator repairs on the
emulator (tests/bertjob/test_malformed_status_e2e.py): it cannot. Our CRD's status schema types
every field, and the server refuses each junk status with 422, naming the fields, and keeps the
status the operator wrote. Neither a JSON patch nor a merge patch of the status subresource gets
it through, and a status written with the object itself is dropped (the status subresource is on).

Why kwok: no pod needs to run: the API server alone refuses each junk write of the job's status
subresource.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client import CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from bertjob_api.contract import GROUP, PLURAL, VERSION
from bertjob_testing.cluster.operator import RealCluster
from tests.bertjob.e2e import home, named_job
from tests.bertjob.test_malformed_status_e2e import JUNK_STATUSES

pytestmark = pytest.mark.xdist_group("operator")

# What the server names, for each junk status of JUNK_STATUSES (by job name).
REFUSALS = {
    "junk-status-string": ['status: Invalid value: "string"', "in body must be of type object"],
    "junk-status-fields": [
        'status.conditions: Invalid value: "string": conditions in body must be of type array',
        'status.pendingEvents: Invalid value: "string": pendingEvents in body must be of type object',
        'status.phase: Invalid value: "integer": phase in body must be of type string',
    ],
}
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"


def _patch_status(cluster: RealCluster, name: str, body: Any, content_type: str) -> None:
    CustomObjectsApi(cluster.api).patch_namespaced_custom_object_status(
        GROUP, VERSION, home(cluster), PLURAL, name, body, _content_type=content_type
    )


def test_the_real_server_refuses_every_junk_status(cluster: RealCluster) -> None:
    name = "junk"
    cluster.create_job(named_job(name))
    cluster.status_when(name, "Pending")
    cluster.wait_for("the Pending event posted", lambda: not cluster.job(name)["status"].get("pendingEvents"))
    written = cluster.job(name)["status"]

    for case, junk, _ in JUNK_STATUSES:
        bodies = [([{"op": "replace", "path": "/status", "value": junk}], JSON_PATCH)]
        if isinstance(junk, dict):
            bodies.append(({"status": junk}, MERGE_PATCH))
        for body, content_type in bodies:
            with pytest.raises(ApiException) as refused:
                _patch_status(cluster, name, body, content_type)
            message = str(json.loads(str(refused.value.body))["message"])
            assert refused.value.status == 422, message
            for named in REFUSALS[case]:
                assert named in message, f"{case} ({content_type}): {message}"
        # A status written with the object is dropped: the status subresource is on.
        cluster.patch_job(name, {"status": {"phase": "Bogus"}})

    assert cluster.job(name)["status"] == written
