"""A malformed status from the API server (issue 29, item 5): the emulator, like an API server
whose CRD schema is not enforced, keeps a status that is not an object, or has fields of the wrong
shape. The operator reads such fields as absent (:func:`bertjob.lifecycle.read`), says so once, and
writes a well-formed status; it does not fail on every event, and the job is reconciled.

The emulator: a real API server with our CRD cannot store either status. Tried on one
(tests/cluster/test_malformed_status.py), it refuses both with 422 by the CRD's status schema
('status: Invalid value: "string": in body must be of type object'; 'status.conditions ... must
be of type array', 'status.pendingEvents ... must be of type object', 'status.phase ... must be of
type string'), as it refuses every status :func:`bertjob.lifecycle.read` calls junk that the
schema types (an unknown phase, a condition without its required fields, a startTime that is not
a date-time). So the junk status repaired here, after the child reported Running or not, is not
reachable through a real server that serves this CRD: only through one that does not enforce
the schema, or for a status stored under an earlier, looser CRD and read back after an upgrade.

On the session's emulator cluster; waits are bounded.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes.client import CustomObjectsApi

from bertjob_api.contract import GROUP, PLURAL, VERSION
from bertjob_testing.kube_emulator import Cluster
from tests.bertjob.e2e import named_job

WRONG_SHAPE = "status fields of the wrong shape"
# Lines of a handler failing (kopf logs its traceback) or of the repair, for the one job.
FAILING = ("Traceback", "AttributeError", "TypeError", WRONG_SHAPE)
QUIET_S = 3.0


def _set_status(cluster: Cluster, name: str, status: Any) -> None:
    """Replace the job's status with ``status`` (a JSON patch: kmock merge-patches no string over
    an object), as a client could where the API server does not enforce the CRD's schema."""
    CustomObjectsApi(cluster.api).patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", PLURAL, name, [{"op": "replace", "path": "/status", "value": status}],
        _content_type="application/json-patch+json",
    )  # fmt: skip


def _noise(cluster: Cluster, offset: int) -> list[str]:
    """The operator's log lines since ``offset`` that show a handler failing or a repair."""
    text = cluster.log.read_bytes()[offset:].decode(errors="replace")
    return [line for line in text.splitlines() if any(word in line for word in FAILING)]


def _well_formed(cluster: Cluster, name: str) -> dict[str, Any] | None:
    status = cluster.job(name).get("status")
    if not isinstance(status, dict):
        return None
    good = isinstance(status.get("phase"), str) and isinstance(status.get("conditions"), list)
    return status if good and all(isinstance(c, dict) for c in status["conditions"]) else None


# (job name, the junk status, the fields the operator's repair names).
JUNK_STATUSES = [
    ("junk-status-string", "garbage", "status"),
    ("junk-status-fields", {"phase": 12, "conditions": "x", "pendingEvents": "x"},
     "conditions, pendingEvents, phase"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "junk", "fields"), JUNK_STATUSES)
def test_a_malformed_status_is_repaired_once_not_retried(
    cluster: Cluster, name: str, junk: Any, fields: str
) -> None:
    cluster.create_job(named_job(name))
    cluster.status_when(name, "Pending")
    # The Pending event posted and removed from the status: no write of the operator's is under way.
    cluster.wait_for("the Pending event", lambda: not cluster.job(name)["status"].get("pendingEvents"))
    cluster.reasons_when(name, lambda reasons: "Pending" in reasons)
    offset = cluster.log.stat().st_size

    _set_status(cluster, name, junk)

    status = cluster.wait_for(f"{name}'s status to be whole", lambda: _well_formed(cluster, name), 15)
    assert status["phase"] == "Pending"
    assert [c["type"] for c in status["conditions"]] == ["Created", "Ready", "Reconciling"]
    assert [child["name"] for child in status["children"]] == [name]
    noise = _noise(cluster, offset)
    time.sleep(QUIET_S)
    assert _noise(cluster, offset) == noise, "the operator kept failing on the job"
    repairs = [line for line in noise if WRONG_SHAPE in line and name in line]
    assert len(repairs) == 1, noise
    assert repairs[0].endswith(fields), repairs[0]
    assert [line for line in noise if name in line and WRONG_SHAPE not in line] == []
    assert _well_formed(cluster, name) == status
