"""The operator's Prometheus metrics and its readiness endpoint.

- ``bertjob_jobs{phase}`` (gauge): BertPretrainJobs this operator sees, by ``status.phase``
  (``None`` before the first status).
- ``bertjob_reconcile_errors_total{handler,error}`` (counter): handler runs that raised;
  ``error`` is ``permanent`` (a bad spec, not retried), ``temporary`` (retried) or ``unexpected``.
- ``bertjob_reconcile_duration_seconds{handler}`` (histogram): wall time of each handler run.
- The ``process_*`` and ``python_*`` metrics of prometheus_client's default registry.

:func:`serve` answers ``/metrics`` and ``/readyz`` on one port (``$BERTJOB_METRICS_PORT``).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any, TypeVar, get_args
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import kopf
from prometheus_client import REGISTRY, Counter, Histogram, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bertjob_api.crd import Phase

PORT_ENV = "BERTJOB_METRICS_PORT"
UNSET_PHASE = "None"

ERRORS = Counter(
    "bertjob_reconcile_errors",
    "Handler runs that raised, by handler and kind of error.",
    ["handler", "error"],
)
DURATION = Histogram(
    "bertjob_reconcile_duration_seconds", "Wall time of each handler run, in seconds.", ["handler"]
)

F = TypeVar("F", bound=Callable[..., Any])


class JobPhases(Collector):
    """``bertjob_jobs{phase}``: the phase of every job seen, kept as events arrive (thread-safe)."""

    def __init__(self) -> None:
        self._phases: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def seen(self, namespace: str, name: str, phase: Phase | None) -> None:
        """Record a job's current phase."""
        with self._lock:
            self._phases[(namespace, name)] = phase or UNSET_PHASE

    def gone(self, namespace: str, name: str) -> None:
        """Forget a deleted job."""
        with self._lock:
            self._phases.pop((namespace, name), None)

    def count(self) -> int:
        """Number of jobs seen and not deleted."""
        with self._lock:
            return len(self._phases)

    def collect(self) -> Iterable[Metric]:
        """One gauge sample per phase, zeros included, so that a phase emptied reads 0."""
        with self._lock:
            phases = list(self._phases.values())
        family = GaugeMetricFamily("bertjob_jobs", "BertPretrainJobs by status.phase.", labels=["phase"])
        for phase in (*get_args(Phase), UNSET_PHASE):
            family.add_metric([phase], phases.count(phase))
        yield family


JOBS = JobPhases()
REGISTRY.register(JOBS)


def observed(handler: str) -> Callable[[F], F]:
    """Decorate a kopf handler so that its duration and errors are measured under ``handler``;
    what it raises passes through unchanged."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            except kopf.PermanentError:
                ERRORS.labels(handler, "permanent").inc()
                raise
            except kopf.TemporaryError:
                ERRORS.labels(handler, "temporary").inc()
                raise
            except Exception:
                ERRORS.labels(handler, "unexpected").inc()
                raise
            finally:
                DURATION.labels(handler).observe(time.perf_counter() - started)

        return wrapper  # type: ignore[return-value]

    return decorate


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        # Scrapes and probes every few seconds would drown the operator's own log.
        pass


def app(ready: threading.Event) -> Callable[..., Iterator[bytes]]:
    """WSGI app: ``/readyz`` answers 200 once ``ready`` is set (503 before), anything else the
    metrics in Prometheus' text format."""
    metrics = make_wsgi_app(REGISTRY)

    def route(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
        if environ.get("PATH_INFO") == "/readyz":
            status = "200 OK" if ready.is_set() else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain")])
            return iter([status.encode()])
        return iter(metrics(environ, start_response))

    return route


def serve(port: int, ready: threading.Event, address: str = "0.0.0.0") -> WSGIServer:
    """Serve :func:`app` on ``address:port`` from a daemon thread; stop it with ``shutdown()``.

    Raises:
        OSError: the port is taken.
    """
    server = make_server(address, port, app(ready), _Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
