"""examples/gitops/argocd/health.lua, Argo CD's health check of a BertPretrainJob, run by Lua 5.1
(``lupa.lua51``: the Lua that Argo CD embeds, through gopher-lua) as Argo CD runs it: the live object
as the global ``obj``, the chunk's return value the health.

Here on statuses written out by hand, including those of an operator older than the kstatus
conditions; tests/cluster/test_kstatus_e2e.py runs it on the statuses the operator writes.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import yaml

from bertjob.render import kustomize_build
from bertjob_testing.jobs import EXAMPLES

lupa = pytest.importorskip("lupa.lua51", reason="lupa is in the dev extra")

ARGOCD = EXAMPLES / "gitops" / "argocd"
HEALTH_LUA = ARGOCD / "health.lua"
HEALTH_KEY = "resource.customizations.health.bertjob.dev_BertPretrainJob"
# Argo CD's health codes (gitops-engine pkg/health).
CODES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}


@functools.cache
def _script() -> str:
    return HEALTH_LUA.read_text(encoding="utf-8")


def _to_lua(runtime: Any, value: Any) -> Any:
    # As Argo CD hands the object over: maps become tables, lists 1-based sequences.
    if isinstance(value, dict):
        return runtime.table_from({key: _to_lua(runtime, item) for key, item in value.items()})
    if isinstance(value, list):
        return runtime.table_from([_to_lua(runtime, item) for item in value])
    return value


def argocd_health(obj: dict[str, Any]) -> tuple[str, str]:
    """``(status, message)`` that health.lua gives the BertPretrainJob ``obj`` (as the API server
    returns it), run in a fresh Lua 5.1 runtime.

    Raises:
        AssertionError: the check returned no table, or a status that is not an Argo CD health code.
    """
    runtime = lupa.LuaRuntime()
    runtime.globals().obj = _to_lua(runtime, obj)
    result = runtime.execute(_script())
    assert result is not None, "health.lua returned nothing"
    status, message = result["status"], result["message"]
    assert status in CODES, status
    return str(status), str(message or "")


def _job(status: dict[str, Any] | None, generation: int = 1) -> dict[str, Any]:
    job: dict[str, Any] = {
        "apiVersion": "bertjob.dev/v1alpha1",
        "kind": "BertPretrainJob",
        "metadata": {"name": "demo", "namespace": "bert", "generation": generation},
        "spec": {},
    }
    return job if status is None else {**job, "status": status}


def _cond(type_: str, status: str = "True", reason: str = "", message: str = "") -> dict[str, str]:
    return {
        "type": type_,
        "status": status,
        "reason": reason or type_,
        "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


@pytest.mark.parametrize(
    ("status", "generation", "health", "says"),
    [
        (None, 1, "Progressing", "Waiting for the bertjob operator"),
        # The kstatus conditions, as the operator writes them.
        ({"phase": "Pending", "observedGeneration": 1, "conditions": [
            _cond("Ready", "False", "Pending"), _cond("Reconciling", reason="Pending", message="waiting")]},
         1, "Progressing", "Pending: waiting"),
        ({"phase": "Running", "observedGeneration": 1, "conditions": [_cond("Ready", reason="Running")]},
         1, "Healthy", "Running"),
        ({"phase": "Succeeded", "observedGeneration": 1, "conditions": [_cond("Ready", reason="Succeeded")]},
         1, "Healthy", "Succeeded"),
        ({"phase": "Suspended", "observedGeneration": 2,
          "conditions": [_cond("Ready", "False", "Suspended")]},
         2, "Suspended", "suspend"),
        ({"phase": "Failed", "observedGeneration": 1, "conditions": [
            _cond("Ready", "False", "InvalidSpec", "spec.x: bad"), _cond("Stalled", reason="InvalidSpec",
                                                                         message="spec.x: bad")]},
         1, "Degraded", "InvalidSpec: spec.x: bad"),
        ({"phase": "Running", "observedGeneration": 2, "conditions": [
            _cond("Ready", "False", "SpecChangeRefused"), _cond("Stalled", reason="SpecChangeRefused")]},
         2, "Degraded", "SpecChangeRefused"),
        # A spec change the operator has not handled yet, whatever the conditions still say.
        ({"phase": "Running", "observedGeneration": 1, "conditions": [_cond("Ready", reason="Running")]},
         2, "Progressing", "generation 2"),
        # A status an operator older than the kstatus conditions wrote: the phase.
        ({"phase": "Running"}, 1, "Healthy", "Running"),
        ({"phase": "Preparing"}, 1, "Progressing", "Preparing"),
        ({"phase": "Suspended"}, 1, "Suspended", "suspend"),
        ({"phase": "Failed", "conditions": [_cond("Failed", reason="BackoffLimitExceeded")]},
         1, "Degraded", "BackoffLimitExceeded"),
        ({"phase": "Failed"}, 1, "Degraded", "Failed"),
        ({}, 1, "Unknown", "nil"),
        ({"phase": "Exploded"}, 1, "Unknown", "Exploded"),
    ],
)  # fmt: skip
def test_health(status: dict[str, Any] | None, generation: int, health: str, says: str) -> None:
    found, message = argocd_health(_job(status, generation))

    assert found == health
    assert says in message


def test_the_check_runs_on_lua_5_1() -> None:
    # gopher-lua implements Lua 5.1: no goto, no integer division, no utf8 library.
    assert lupa.LuaRuntime().eval("_VERSION") == "Lua 5.1"


def test_kustomize_puts_the_check_into_argocd_cm() -> None:
    built = [obj for obj in yaml.safe_load_all(kustomize_build(ARGOCD)) if obj]
    [config] = [obj for obj in built if obj["kind"] == "ConfigMap"]

    # Argo CD reads its settings from the ConfigMap of exactly this name, in its own namespace.
    assert (config["metadata"]["name"], config["metadata"]["namespace"]) == ("argocd-cm", "argocd")
    assert config["data"] == {HEALTH_KEY: _script()}
    assert config["metadata"]["labels"]["app.kubernetes.io/part-of"] == "argocd"
