"""The pure helpers of benchmarks/operator_load.py: the audit policy, how audit events are counted
as the operator's requests, the latency figures, and what it prints. (The benchmark itself starts a
control plane and takes minutes: it is run by hand, benchmarks/RESULTS.md.)"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from bertjob_testing.cluster.operator import NAMESPACE

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def operator_load() -> ModuleType:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("operator_load")


def _event(
    verb: str, resource: str, stage: str = "ResponseComplete", code: int = 200, **ref: str
) -> dict[str, Any]:
    return {
        "verb": verb,
        "stage": stage,
        "requestURI": f"/api/v1/{resource}?x=1",
        "objectRef": {"resource": resource, **ref},
        "responseStatus": {"code": code},
    }


def test_the_audit_policy_logs_the_operators_service_accounts_and_nothing_else(
    operator_load: ModuleType,
) -> None:
    first, last = operator_load.AUDIT_POLICY["rules"]
    assert first == {"level": "Metadata", "userGroups": [f"system:serviceaccounts:{NAMESPACE}"]}
    assert last == {"level": "None"}
    assert operator_load.AUDIT_POLICY["omitStages"] == ["RequestReceived"]


def test_each_request_counts_once_and_a_watch_when_it_starts(operator_load: ModuleType) -> None:
    events = [
        _event("create", "configmaps"),
        _event("patch", "bertpretrainjobs", subresource="status"),
        _event("create", "pytorchjobs", code=409),
        _event("watch", "pytorchjobs", stage="ResponseStarted"),
        _event("watch", "pytorchjobs"),  # the same watch ending: not counted again
        _event("create", "configmaps", stage="ResponseStarted"),  # only a watch counts when it starts
        _event("get", "version", stage="Panic"),
    ]
    events[-1]["objectRef"] = None
    calls = operator_load.audited_requests(events)
    assert calls == {
        "create configmaps": 1,
        "patch bertpretrainjobs/status": 1,
        "create pytorchjobs 409": 1,
        "watch pytorchjobs": 1,
    }
    version = _event("get", "version")
    version["objectRef"] = None
    version["requestURI"] = "/version?timeout=32s"
    assert operator_load.audited_requests([version]) == {"get /version": 1}


def test_audit_log_is_read_from_an_offset(operator_load: ModuleType, tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    log.write_text('{"verb": "get"}\n')
    offset = log.stat().st_size
    with log.open("a") as more:
        more.write('{"verb": "create"}\n\n{"verb": "patch"}\n')
    assert operator_load.read_audit(log, offset) == [{"verb": "create"}, {"verb": "patch"}]


def test_latency_figures(operator_load: ModuleType) -> None:
    created = {f"job-{index}": float(index) for index in range(100)}
    done = {name: at + 1 + (0.5 if name == "job-99" else 0) for name, at in created.items()}
    figures = operator_load.latency_figures(created, done, started=0.0)
    assert figures["p50_s"] == pytest.approx(1.0)
    assert figures["max_s"] == pytest.approx(1.5)
    assert figures["all_s"] == pytest.approx(100.5)


def test_a_printed_line_names_the_server_cpu_only_for_the_real_server(operator_load: ModuleType) -> None:
    run = dict.fromkeys(
        [
            "render_ms",
            "create_s",
            "create_ms",
            "all_s",
            "p50_s",
            "p95_s",
            "p95_returned_s",
            "max_s",
            "rss_mb",
            "operator_cpu_s",
            "client_cpu_s",
        ],
        1.0,
    )
    run["requests_per_job"] = 9.0
    emulator = operator_load.line("after", run, 200)
    assert "emulator and client" in emulator and "API server" not in emulator
    real = operator_load.line("after", {**run, "server_cpu_s": 2.0}, 200)
    assert "API server and etcd   2.0 s" in real and "9.0 operator requests/job" in real
