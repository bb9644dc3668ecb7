"""The operator's Prometheus metrics and its readiness endpoint.

- ``bertjob_jobs{phase}`` (gauge): BertPretrainJobs this operator sees, by ``status.phase``
  (``None`` before the first status).
- ``bertjob_reconcile_errors_total{handler,error}`` (counter): handler runs that raised;
  ``error`` is ``permanent`` (a bad spec, not retried), ``temporary`` (retried) or ``unexpected``.
- ``bertjob_reconcile_duration_seconds{handler}`` (histogram): wall time of each handler run.
- The ``process_*`` and ``python_*`` metrics of prometheus_client's default registry.

:func:`serve` answers ``/metrics`` and ``/readyz`` on one port (``$BERTJOB_METRICS_PORT``).

``bertjob_jobs`` follows the watch events of the jobs, and a job leaves it on its DELETED event. A
watch that resumes after its resourceVersion was compacted (410 Gone) lists again instead, and a job
deleted meanwhile sends no DELETED event: :func:`start_resync` lists the jobs of every namespace
counted, every :data:`JOBS_RESYNC_S` seconds, and forgets those the list no longer has.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any, TypeVar, cast, get_args
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import kopf
import urllib3
from kubernetes.client import ApiClient, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from prometheus_client import REGISTRY, Counter, Histogram, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bertjob_api.contract import GROUP, PLURAL, VERSION
from bertjob_api.crd import Phase

PORT_ENV = "BERTJOB_METRICS_PORT"
UNSET_PHASE = "None"
# Seconds between two lists of the jobs counted (:func:`start_resync`): after a watch gap the count
# may be stale for up to a minute, at the cost of one list per namespace with jobs per minute.
JOBS_RESYNC_S = 60.0
# Seconds between those lists, where an installation (or a test) wants another pace.
JOBS_RESYNC_ENV = "BERTJOB_JOBS_RESYNC_SECONDS"
# Seconds one list may take before the resync gives up on it until the next period.
LIST_TIMEOUT_S = 30.0

log = logging.getLogger("bertjob.monitoring")

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
    """``bertjob_jobs{phase}``: the phase of every job seen, kept as events arrive (thread-safe),
    with the ``time.monotonic()`` second it was last seen, for :meth:`prune`."""

    def __init__(self) -> None:
        # (namespace, name) -> (phase, monotonic seconds when last seen)
        self._jobs: dict[tuple[str, str], tuple[str, float]] = {}
        self._lock = threading.Lock()

    def seen(self, namespace: str, name: str, phase: Phase | None) -> None:
        """Record a job's current phase, seen now."""
        with self._lock:
            self._jobs[(namespace, name)] = (phase or UNSET_PHASE, time.monotonic())

    def gone(self, namespace: str, name: str) -> None:
        """Forget a deleted job."""
        with self._lock:
            self._jobs.pop((namespace, name), None)

    def count(self) -> int:
        """Number of jobs seen and not deleted."""
        with self._lock:
            return len(self._jobs)

    def namespaces(self) -> set[str]:
        """The namespaces that have jobs counted."""
        with self._lock:
            return {namespace for namespace, _ in self._jobs}

    def prune(self, namespace: str, listed: Collection[str], started: float) -> list[str]:
        """Forget the jobs of ``namespace`` that a list of it did not return (``listed``: the names
        it did) and that were not seen since ``started``, the ``time.monotonic()`` second the list
        was sent: a job seen after that may have been created after the list was answered. Jobs of
        other namespaces stay. The names forgotten, sorted."""
        with self._lock:
            stale = sorted(
                name
                for (where, name), (_, at) in self._jobs.items()
                if where == namespace and name not in listed and at < started
            )
            for name in stale:
                del self._jobs[(namespace, name)]
        return stale

    def collect(self) -> Iterable[Metric]:
        """One gauge sample per phase, zeros included, so that a phase emptied reads 0."""
        with self._lock:
            phases = [phase for phase, _ in self._jobs.values()]
        family = GaugeMetricFamily("bertjob_jobs", "BertPretrainJobs by status.phase.", labels=["phase"])
        for phase in (*get_args(Phase), UNSET_PHASE):
            family.add_metric([phase], phases.count(phase))
        yield family


JOBS = JobPhases()
REGISTRY.register(JOBS)


def resync(api: ApiClient, period_s: float, jobs: JobPhases = JOBS) -> None:
    """List the BertPretrainJobs of each namespace that has jobs in ``jobs`` and forget those gone
    (:meth:`JobPhases.prune`). A list that fails (an HTTP error, the server unreachable, or no
    answer within :data:`LIST_TIMEOUT_S` seconds) is logged in one line and leaves that namespace
    as it is until the next resync, ``period_s`` seconds later."""
    objects = CustomObjectsApi(api)
    for namespace in sorted(jobs.namespaces()):
        started = time.monotonic()
        try:
            found = objects.list_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, _request_timeout=LIST_TIMEOUT_S
            )
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
            log.warning(
                "cannot list the %s of %s to recount bertjob_jobs (%s); trying again in %.0f s",
                PLURAL,
                namespace,
                _why(error),
                period_s,
            )
            continue
        listed = {item["metadata"]["name"] for item in cast(dict[str, Any], found).get("items") or []}
        if forgotten := jobs.prune(namespace, listed, started):
            log.info(
                "bertjob_jobs: forgot the jobs of %s deleted unseen: %s", namespace, ", ".join(forgotten)
            )


def _why(error: Exception) -> str:
    """What a failed request met, in one line: the HTTP status, or the connection's error."""
    if isinstance(error, ApiException):
        return f"HTTP {error.status} {error.reason}"
    # urllib3's MaxRetryError wraps the last attempt's error, which says it plainer.
    return str(getattr(error, "reason", None) or error)


def start_resync(api: ApiClient, period_s: float = JOBS_RESYNC_S) -> threading.Event:
    """Run :func:`resync` every ``period_s`` seconds in a daemon thread; set the returned event to
    stop it."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(period_s):
            resync(api, period_s)

    threading.Thread(target=run, name="jobs-resync", daemon=True).start()
    return stop


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
