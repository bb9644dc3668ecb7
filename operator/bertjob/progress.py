"""The trainers' progress reports, received by the operator and merged into their jobs' status.

A trainer's rank 0 POSTs ``{"progress": {...}}`` (or ``{"results": [...]}``) to
``https://<operator>/apis/bertjob.dev/v1alpha1/namespaces/<ns>/bertpretrainjobs/<name>/status``
with its pod's service-account token projected for the audience ``bertjob.dev``
(``trainer_image/bertpretrain/training/progress.py``). As Kubeflow Trainer's progress endpoint
(KEP-2779), so that no job's pods need any RBAC of their own. Each report, in this order:

1. its path names a job (else 404), it has a body of at most
   :data:`~bertjob_api.contract.PROGRESS_MAX_BYTES` (else 411 or 413) and a bearer token (401);
2. at most :attr:`Limits.reports_per_second` per token, with bursts of :attr:`Limits.burst`
   (else 429, before any request to the API server: a pod sending 1,000 a second costs this
   endpoint a hash and a lock each);
3. the token passes a TokenReview for the audience ``bertjob.dev`` (else 401), cached by the
   token's SHA-256 until the token expires;
4. the pod it was issued to is in the job's namespace, is the pod of that uid, and carries the
   job's ``bertjob.dev/job`` label (else 403: a token of another job's pod);
5. the body is a JSON object of those two fields that the CRD's status schema accepts, with
   finite numbers (else 400: junk, NaN, unknown fields);
6. it is merged into the job's status (202): at most one write per job per
   :attr:`Limits.write_interval_s`, the newest report of each field winning, so that many ranks
   or a fast job cannot flood the API server.

Every answer is counted in ``bertjob_progress_reports_total{code}``. Reporting is best effort:
a report the operator cannot take (restarting, or the API server failing: 503) is lost, and the
trainer's next one carries the newest values anyway.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import socket
import ssl
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
from kubernetes.client import (
    ApiClient,
    AuthenticationV1Api,
    CoreV1Api,
    CustomObjectsApi,
    V1TokenReview,
    V1TokenReviewSpec,
)
from kubernetes.client.exceptions import ApiException
from prometheus_client import Counter

from bertjob import certificates
from bertjob.render import ProgressEndpoint
from bertjob_api.contract import (
    GROUP,
    JOB_LABEL,
    PLURAL,
    PROGRESS_AUDIENCE,
    PROGRESS_FIELD,
    PROGRESS_MAX_BYTES,
    RESULTS_FIELD,
    VERSION,
    status_path,
)
from bertjob_api.crd import resource_schema

LOG = logging.getLogger(__name__)
REPORTS = Counter(
    "bertjob_progress_reports",
    "Progress reports received from trainers, by the HTTP status of the answer.",
    ["code"],
)
PATH = re.compile(
    rf"^/apis/{re.escape(GROUP)}/{VERSION}/namespaces/(?P<namespace>[a-z0-9-]{{1,63}})/{PLURAL}/"
    r"(?P<name>[a-z0-9.-]{1,253})/status$"
)
# The claims the API server puts in a TokenReview's user.extra for a token bound to a pod.
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
FIELDS = (PROGRESS_FIELD, RESULTS_FIELD)
HANDSHAKE_TIMEOUT_S = 10.0
# Entries a cache (reviews, rate buckets, last writes) holds before it drops the stale ones.
MAX_KEYS = 10_000
# The most of a refused body read (and dropped) so that its sender still reads the answer, bytes.
DRAIN_BYTES = 1024 * 1024


class RefusedError(Exception):
    """A report refused with HTTP status ``code`` and a one-line reason for the trainer's log."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code


@dataclass(frozen=True)
class Limits:
    """How much the endpoint takes: ``reports_per_second`` per token with bursts of ``burst``,
    one status write per job per ``write_interval_s`` seconds, TokenReview answers kept at most
    ``review_cache_s`` seconds (and never past the token's expiry)."""

    reports_per_second: float = 2.0
    burst: int = 10
    write_interval_s: float = 1.0
    review_cache_s: float = 600.0


@dataclass(frozen=True)
class Sender:
    """The pod a token was issued to, as the API server's TokenReview says: its namespace (the
    service account's), name and uid."""

    namespace: str
    pod: str
    uid: str


class Reviewer:
    """Authenticates tokens by TokenReview for :data:`PROGRESS_AUDIENCE`; answers are cached by
    the token's SHA-256 for ``limits.review_cache_s`` seconds, or until the token's ``exp``.
    A pod's membership of a job is checked against the pod as stored (``get`` on pods), cached
    by the pod's uid: a pod's labels are the operator's and a uid never names another pod."""

    def __init__(self, api: ApiClient, limits: Limits, clock: Callable[[], float] = time.time):
        self.auth = AuthenticationV1Api(api)
        self.core = CoreV1Api(api)
        self.limits = limits
        self.clock = clock
        self._lock = threading.Lock()
        self._senders: dict[str, tuple[Sender, float]] = {}
        self._jobs: dict[str, str | None] = {}

    def sender(self, token: str, digest: str) -> Sender:
        """The pod ``token`` (whose SHA-256 is ``digest``) was issued to.

        Raises:
            RefusedError: 401, the API server does not take it for our audience or it is no pod's.
            ApiException: the TokenReview itself failed.
        """
        now = self.clock()
        with self._lock:
            cached = self._senders.get(digest)
        if cached is not None and cached[1] > now:
            return cached[0]
        review = self.auth.create_token_review(
            V1TokenReview(spec=V1TokenReviewSpec(token=token, audiences=[PROGRESS_AUDIENCE]))
        )
        status = review.status
        if status is None or not status.authenticated or PROGRESS_AUDIENCE not in (status.audiences or []):
            raise RefusedError(401, f"the token is not valid for the audience {PROGRESS_AUDIENCE}")
        extra = (status.user.extra if status.user else None) or {}
        username = (status.user.username if status.user else None) or ""
        if not username.startswith(SERVICE_ACCOUNT_PREFIX) or not extra.get(POD_NAME_EXTRA):
            raise RefusedError(401, "the token is not bound to a pod (mount the projected token)")
        namespace = username.removeprefix(SERVICE_ACCOUNT_PREFIX).split(":")[0]
        sender = Sender(namespace, extra[POD_NAME_EXTRA][0], (extra.get(POD_UID_EXTRA) or [""])[0])
        until = min(now + self.limits.review_cache_s, _expiry(token) or now + self.limits.review_cache_s)
        with self._lock:
            if len(self._senders) > MAX_KEYS:  # tokens rotate hourly: drop the expired
                self._senders = {key: value for key, value in self._senders.items() if value[1] > now}
            self._senders[digest] = (sender, until)
        return sender

    def check(self, sender: Sender, namespace: str, name: str) -> None:
        """That ``sender``'s pod belongs to the job ``namespace/name``.

        Raises:
            RefusedError: 403, it is another namespace's or another job's pod, or gone.
        """
        if sender.namespace != namespace:
            raise RefusedError(403, f"a pod of namespace {sender.namespace} reports for {namespace}/{name}")
        with self._lock:
            known = sender.uid in self._jobs
            job = self._jobs.get(sender.uid)
        if not known:
            try:
                pod = self.core.read_namespaced_pod(sender.pod, namespace)
            except ApiException as error:
                if error.status != 404:
                    raise
                raise RefusedError(403, f"the pod {namespace}/{sender.pod} is gone") from None
            job = None
            meta = pod.metadata
            if meta is not None and meta.uid == sender.uid:
                job = (meta.labels or {}).get(JOB_LABEL)
            with self._lock:
                if len(self._jobs) > MAX_KEYS:  # pods come and go: read again what is still asked
                    self._jobs.clear()
                self._jobs[sender.uid] = job
        if job != name:
            raise RefusedError(403, f"the pod {namespace}/{sender.pod} is not a pod of the job {name}")


class RateLimiter:
    """A token bucket per key: ``rate`` per second, up to ``burst`` at once (thread-safe)."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}

    def allow(self, key: str) -> bool:
        """Take one from ``key``'s bucket; False when it is empty."""
        now = self.clock()
        with self._lock:
            if len(self._buckets) > MAX_KEYS:  # tokens rotate hourly: forget the full, idle buckets
                idle = self.burst / self.rate
                self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < idle}
            level, then = self._buckets.get(key, (float(self.burst), now))
            level = min(float(self.burst), level + (now - then) * self.rate)
            if level < 1:
                self._buckets[key] = (level, now)
                return False
            self._buckets[key] = (level - 1, now)
            return True


class StatusWriter:
    """Merges reports into jobs' status, one JSON merge patch per job at most every
    ``interval_s`` seconds: a report within the interval waits, merged with any later one, and is
    written when the interval ends (from a timer thread)."""

    def __init__(self, api: ApiClient, interval_s: float, clock: Callable[[], float] = time.monotonic):
        self.objects = CustomObjectsApi(api)
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], float] = {}
        self._pending: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes = 0

    def submit(self, namespace: str, name: str, fields: Mapping[str, Any]) -> None:
        """Write ``fields`` of the job's status now, or with the job's next write.

        Raises:
            ApiException: the write now failed (a later one's failure is only counted).
        """
        key = (namespace, name)
        with self._lock:
            pending = key in self._pending
            self._pending[key] = {**self._pending.get(key, {}), **fields}
            if pending:
                return
            wait = self._last.get(key, -float("inf")) + self.interval_s - self.clock()
            if wait > 0:
                timer = threading.Timer(wait, self._flush_later, (key,))
                timer.daemon = True
                timer.start()
                return
        self._flush(key)

    def _flush_later(self, key: tuple[str, str]) -> None:
        try:
            self._flush(key)
        except ApiException as error:
            REPORTS.labels(code=str(error.status or 503)).inc()

    def _flush(self, key: tuple[str, str]) -> None:
        with self._lock:
            fields = self._pending.pop(key)
            now = self._last[key] = self.clock()
            if len(self._last) > MAX_KEYS:  # jobs come and go: forget those past their interval
                self._last = {k: t for k, t in self._last.items() if now - t < self.interval_s}
        namespace, name = key
        self.objects.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": fields}
        )
        self.writes += 1


def parse(body: bytes) -> dict[str, Any]:
    """A report's body as status fields: a JSON object of ``progress`` and/or ``results`` that
    the CRD's status schema accepts, with finite numbers.

    Raises:
        RefusedError: 400, naming what is wrong.
    """
    try:
        fields = json.loads(body, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as error:
        raise RefusedError(400, f"the body is not JSON: {error}") from None
    if not isinstance(fields, dict) or not fields:
        raise RefusedError(400, f"the body must be a JSON object of {' and/or '.join(FIELDS)}")
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        carries = " and/or ".join(FIELDS)
        raise RefusedError(400, f"unknown status fields {unknown}: a report carries {carries}")
    try:
        jsonschema.validate(fields, _STATUS_SCHEMA)
    except jsonschema.ValidationError as error:
        where = ".".join(str(part) for part in error.absolute_path) or "status"
        raise RefusedError(400, f"status.{where}: {error.message}") from None
    return dict(fields)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a status can hold")


def _expiry(token: str) -> float | None:
    """The ``exp`` claim (seconds since the epoch) of a JWT the API server has just accepted."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(_b64url(payload))
        return float(claims["exp"])
    except (IndexError, ValueError, KeyError, TypeError):
        return None


def _b64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


_STATUS_SCHEMA = {
    "type": "object",
    "properties": {field: resource_schema()["properties"]["status"]["properties"][field] for field in FIELDS},
}


class Receiver:
    """What the endpoint does with one request: every check of the module's docstring, then the
    write. Kept apart from HTTP so that a test can drive it directly."""

    def __init__(self, api: ApiClient, limits: Limits = Limits()):
        self.limits = limits
        self.reviewer = Reviewer(api, limits)
        self.limiter = RateLimiter(limits.reports_per_second, limits.burst)
        self.writer = StatusWriter(api, limits.write_interval_s)

    def receive(self, path: str, authorization: str | None, body: Callable[[], bytes]) -> tuple[int, str]:
        """Answer one POST of ``path``: (HTTP status, message). ``body`` reads the request's body,
        called only once the sender is known to belong to the job."""
        try:
            match = PATH.match(path)
            if match is None:
                raise RefusedError(404, f"no job's status at {path}: POST to {status_path('<ns>', '<name>')}")
            namespace, name = match["namespace"], match["name"]
            scheme, _, token = (authorization or "").partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise RefusedError(401, "no bearer token: send the pod's projected bertjob.dev token")
            token = token.strip()
            digest = hashlib.sha256(token.encode()).hexdigest()
            if not self.limiter.allow(digest):
                raise RefusedError(429, f"over {self.limits.reports_per_second:g} reports/s from one pod")
            sender = self.reviewer.sender(token, digest)
            self.reviewer.check(sender, namespace, name)
            self.writer.submit(namespace, name, parse(body()))
        except RefusedError as refused:
            return self._answer(refused.code, str(refused))
        except ApiException as error:
            if error.status == 404:
                return self._answer(404, f"no BertPretrainJob {path}")
            # The operator's own failure (its RBAC, the API server): said in its log, not only to
            # the trainer's.
            LOG.warning(
                "a progress report for %s was lost: the API server answered %s %s: %s",
                path,
                error.status,
                error.reason,
                error.body,
            )
            return self._answer(503, f"the API server answered {error.status} {error.reason}")
        return self._answer(202, "accepted")

    def _answer(self, code: int, message: str) -> tuple[int, str]:
        REPORTS.labels(code=str(code)).inc()
        return code, message


class _Handler(BaseHTTPRequestHandler):
    server: ProgressServer
    # One report per connection: a trainer reports every few seconds at most, and a connection
    # that ends with each answer never holds a body the handler left unread.
    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:
        length_text = self.headers.get("Content-Length") or ""
        length = int(length_text) if length_text.isdigit() else -1
        read = False

        def body() -> bytes:
            nonlocal read
            read = True
            return self.rfile.read(length)

        if length < 0:
            code, message = 411, "a report needs a Content-Length"
            REPORTS.labels(code=str(code)).inc()
        elif length > PROGRESS_MAX_BYTES:
            code, message = 413, f"a report is at most {PROGRESS_MAX_BYTES} bytes, this one {length}"
            REPORTS.labels(code=str(code)).inc()
        else:
            code, message = self.server.receiver.receive(self.path, self.headers.get("Authorization"), body)
        # A client that is still sending its body when the socket closes reads no answer (a reset):
        # a refused body is read and dropped, up to DRAIN_BYTES.
        if not read and 0 < length <= DRAIN_BYTES:
            self.rfile.read(length)
        payload = json.dumps({"code": code, "message": message}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per report would flood the operator's log; the counter has them


class ProgressServer(ThreadingHTTPServer):
    """The HTTPS endpoint: :class:`Receiver` behind TLS on ``address:port``."""

    daemon_threads = True

    def __init__(self, receiver: Receiver, address: str, port: int, cert_file: Path, key_file: Path):
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.load_cert_chain(str(cert_file), str(key_file))
        super().__init__((address, port), _Handler)
        self.receiver = receiver

    def finish_request(self, request: Any, client_address: Any) -> None:
        """TLS in the request's own thread: a client slow to shake hands holds up no other."""
        assert isinstance(request, socket.socket)
        request.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            wrapped = self.context.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError):
            return
        super().finish_request(wrapped, client_address)


def serve(receiver: Receiver, address: str, port: int, cert_file: Path, key_file: Path) -> ProgressServer:
    """Serve ``receiver`` over HTTPS from a daemon thread; stop it with ``shutdown()``.

    Raises:
        OSError: the port is taken.
        ssl.SSLError: the certificate or key files are not a matching PEM pair.
    """
    server = ProgressServer(receiver, address, port, cert_file, key_file)
    threading.Thread(target=server.serve_forever, name="progress", daemon=True).start()
    return server


URL_ENV = "BERTJOB_PROGRESS_URL"
SECRET_ENV = "BERTJOB_PROGRESS_SECRET"
PORT_ENV = "BERTJOB_PROGRESS_PORT"
ADDRESS_ENV = "BERTJOB_PROGRESS_ADDRESS"
PORT = 8443


@dataclass
class Serving:
    """A running endpoint: what jobs are rendered with, and the server to stop."""

    endpoint: ProgressEndpoint
    server: ProgressServer


def configure(api: ApiClient, environ: Mapping[str, str], limits: Limits = Limits()) -> Serving | None:
    """Serve the endpoint if ``$BERTJOB_PROGRESS_URL`` is set: the ``https://host:port`` that
    trainers reach (the chart's Service). Its certificate is the one kept in the Secret
    ``$BERTJOB_PROGRESS_SECRET`` (``namespace/name``: :func:`bertjob.certificates.kept`, made for
    the URL's host), served on ``$BERTJOB_PROGRESS_PORT`` (default 8443) of
    ``$BERTJOB_PROGRESS_ADDRESS`` (default every interface). None when the URL is unset: jobs are
    then rendered without a report URL, and their trainers report nothing.

    Raises:
        ValueError: the URL is not ``https://host[:port]``, the Secret is not ``namespace/name``,
            or the port is not a port number.
        kubernetes.client.exceptions.ApiException: the Secret could not be read or written.
        OSError: the port is taken.
    """
    url = environ.get(URL_ENV)
    if not url:
        return None
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "https" or not parsed.hostname or parsed.path not in ("", "/"):
        raise ValueError(f"${URL_ENV}: {url!r} is not https://host[:port] (the Service trainers reach)")
    namespace, _, name = environ.get(SECRET_ENV, "").partition("/")
    if not (namespace and name):
        raise ValueError(f"${SECRET_ENV}: {environ.get(SECRET_ENV)!r} is not namespace/name of a Secret")
    port_text = environ.get(PORT_ENV, str(PORT))
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"${PORT_ENV}: {port_text!r} is not a port number (1-65535)")
    certificate = certificates.kept(api, namespace, name, [parsed.hostname])
    address = environ.get(ADDRESS_ENV) or "0.0.0.0"
    # ssl reads the pair from files only; they are gone once the server's context holds them.
    with tempfile.TemporaryDirectory(prefix="bertjob-progress-") as directory:
        cert_file = Path(directory) / certificates.CERT_KEY
        key_file = Path(directory) / certificates.PRIVATE_KEY
        cert_file.write_text(certificate.cert)
        key_file.touch(mode=0o600)
        key_file.write_text(certificate.key)
        server = serve(Receiver(api, limits), address, int(port_text), cert_file, key_file)
    return Serving(ProgressEndpoint(url.rstrip("/"), certificate.ca), server)
