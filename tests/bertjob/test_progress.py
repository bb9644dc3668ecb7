"""The operator's progress endpoint (bertjob.progress) in pieces: what it takes from a body, its
rate limit, its coalescing of status writes, its certificate, and HTTPS with the trainer's own
client in front of it. The checks that need the API server (TokenReview, the pod's job, the status
write) run against the real one in tests/cluster/test_progress.py."""

from __future__ import annotations

import datetime
import json
import ssl
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from bertjob import certificates, progress
from bertjob.progress import Limits, RateLimiter, Receiver, RefusedError, Sender, StatusWriter, parse
from bertjob_api.contract import PROGRESS_MAX_BYTES, status_path
from bertpretrain.training.progress import StatusReporter

PATH = status_path("team-a", "wiki")
PROGRESS = {"phase": 1, "step": 20, "totalSteps": 100, "loss": 7.25, "updateTime": "2026-12-05T22:00:00Z"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_report_of_progress_and_results_is_taken_as_status_fields() -> None:
    results = [{"task": "mrpc", "metric": "f1", "median": 0.8, "best": 0.9, "seeds": 3, "summary": "mrpc"}]
    body = json.dumps({"progress": PROGRESS, "results": results}).encode()

    assert parse(body) == {"progress": PROGRESS, "results": results}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{not json", "not JSON"),
        (b'{"progress": {"phase": 1, "step": 2, "loss": NaN}}', "NaN"),
        (b'{"progress": {"phase": 1, "step": 2, "loss": Infinity}}', "Infinity"),
        (b"[1, 2]", "a JSON object"),
        (b"{}", "a JSON object"),
        (b'{"phase": "Succeeded"}', "unknown status fields ['phase']"),
        (json.dumps({"progress": {**PROGRESS, "step": "ten"}}).encode(), "status.progress.step"),
        (b'{"progress": {"phase": 1, "step": 1, "conditions": []}}', "status.progress"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_a_bad_body_is_refused_naming_what_is_wrong(body: bytes, says: str) -> None:
    with pytest.raises(RefusedError) as refused:
        parse(body)

    assert refused.value.code == 400
    assert says in str(refused.value)


def test_one_token_gets_its_burst_then_its_rate() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=2.0, burst=10, clock=clock)

    taken = sum(limiter.allow("pod-a") for _ in range(1000))
    assert taken == 10
    assert limiter.allow("pod-b"), "another pod's bucket is its own"
    clock.now += 1.0
    assert [limiter.allow("pod-a") for _ in range(3)] == [True, True, False]


class Objects:
    """Records the status patches a StatusWriter makes."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, str, dict[str, Any]]] = []
        self.written = threading.Event()

    def patch_namespaced_custom_object_status(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: dict[str, Any]
    ) -> None:
        self.patches.append((namespace, name, body))
        self.written.set()


def test_reports_within_the_interval_are_merged_into_one_later_write() -> None:
    clock = Clock()
    writer = StatusWriter(api=None, interval_s=0.2, clock=clock)  # type: ignore[arg-type]
    objects = Objects()
    writer.objects = objects  # type: ignore[assignment]

    writer.submit("team-a", "wiki", {"progress": {**PROGRESS, "step": 1}})
    objects.written.clear()
    for step in (2, 3):
        writer.submit("team-a", "wiki", {"progress": {**PROGRESS, "step": step}})
    writer.submit("team-a", "wiki", {"results": []})
    assert len(objects.patches) == 1, "the first is written at once, the others wait"
    assert objects.written.wait(5)

    assert [(ns, name) for ns, name, _ in objects.patches] == [("team-a", "wiki")] * 2
    assert objects.patches[1][2] == {"status": {"progress": {**PROGRESS, "step": 3}, "results": []}}


def test_the_certificate_names_the_host_and_is_signed_by_the_ca() -> None:
    made = certificates.make(["bertjob-operator-progress.ops.svc", "127.0.0.1"])
    cert = x509.load_pem_x509_certificate(made.cert.encode())
    ca = x509.load_pem_x509_certificate(made.ca.encode())

    cert.verify_directly_issued_by(ca)
    assert certificates.covers(made, ["bertjob-operator-progress.ops.svc", "127.0.0.1"])
    assert not certificates.covers(made, ["bertjob-operator-progress.other.svc"])
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=certificates.VALIDITY_DAYS)
    assert not certificates.covers(made, ["127.0.0.1"], now=later), "an expiring one is made again"


class Reviewer:
    """Stands in for the TokenReview: token ``pod-of-wiki`` is a pod of team-a/wiki."""

    def sender(self, token: str, digest: str) -> Sender:
        if token not in ("pod-of-wiki", "pod-of-other"):
            raise RefusedError(401, "the token is not valid for the audience bertjob.dev")
        return Sender("team-a", token, "uid-" + token)

    def check(self, sender: Sender, namespace: str, name: str) -> None:
        if (sender.pod, namespace, name) != ("pod-of-wiki", "team-a", "wiki"):
            raise RefusedError(403, f"the pod {sender.pod} is not a pod of the job {name}")


@pytest.fixture
def endpoint(tmp_path: Path) -> Any:
    """The endpoint over HTTPS on 127.0.0.1, its writer recording, with the trainer's CA file."""
    made = certificates.make(["127.0.0.1"])
    (tmp_path / "tls.crt").write_text(made.cert)
    (tmp_path / "tls.key").write_text(made.key)
    (tmp_path / "ca.crt").write_text(made.ca)
    receiver = Receiver.__new__(Receiver)
    receiver.limits = Limits(write_interval_s=0)
    receiver.reviewer = Reviewer()  # type: ignore[assignment]
    receiver.limiter = RateLimiter(2.0, 10)
    receiver.writer = StatusWriter(None, 0)  # type: ignore[arg-type]
    receiver.writer.objects = Objects()  # type: ignore[assignment]
    server = progress.serve(receiver, "127.0.0.1", 0, tmp_path / "tls.crt", tmp_path / "tls.key")
    yield f"https://127.0.0.1:{server.server_address[1]}", tmp_path / "ca.crt", receiver.writer.objects
    server.shutdown()
    server.server_close()


def _post(url: str, ca: Path, body: bytes, token: str | None = "pod-of-wiki") -> tuple[int, str]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return answer.status, json.loads(answer.read())["message"]
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())["message"]


def test_the_trainers_own_client_reports_through_https(endpoint: Any, tmp_path: Path) -> None:
    url, ca, objects = endpoint
    token = tmp_path / "token"
    token.write_text("pod-of-wiki\n")
    reporter = StatusReporter(url + PATH, total_steps=100, token_file=token, ca_file=ca, min_interval_s=0)

    assert reporter.report(1, 20, {"loss": 7.25})
    [(namespace, name, body)] = objects.patches
    assert (namespace, name, body["status"]["progress"]["step"]) == ("team-a", "wiki", 20)


def _count(code: int) -> float:
    return progress.REPORTS.labels(code=str(code))._value.get()


@pytest.mark.parametrize(
    ("path", "token", "body", "code"),
    [
        (PATH, "pod-of-other", b'{"progress": {"phase": 1, "step": 1, "totalSteps": 9}}', 403),
        (PATH, "someone", b'{"progress": {"phase": 1, "step": 1, "totalSteps": 9}}', 401),
        (PATH, None, b'{"progress": {"phase": 1, "step": 1, "totalSteps": 9}}', 401),
        (PATH, "pod-of-wiki", b'{"progress": {"phase": 1, "step": 1, "loss": NaN}}', 400),
        (PATH, "pod-of-wiki", b"junk", 400),
        (PATH, "pod-of-wiki", b" " * (PROGRESS_MAX_BYTES + 1), 413),
        ("/apis/bertjob.dev/v1alpha1/namespaces/team-a/pods/x/status", "pod-of-wiki", b"{}", 404),
    ],
    ids=["another-jobs-pod", "not-a-pods-token", "no-token", "nan", "junk", "too-large", "not-a-job"],
)
def test_a_bad_report_is_refused_counted_and_never_written(
    endpoint: Any, path: str, token: str | None, body: bytes, code: int
) -> None:
    url, ca, objects = endpoint
    before = _count(code)

    answer, message = _post(url + path, ca, body, token)

    assert answer == code, message
    assert _count(code) == before + 1
    assert objects.patches == []


def test_a_flood_from_one_pod_is_answered_429_without_a_write_each(endpoint: Any) -> None:
    url, ca, objects = endpoint
    body = json.dumps({"progress": PROGRESS}).encode()

    codes = [_post(url + PATH, ca, body)[0] for _ in range(40)]

    assert codes.count(202) <= 12 and codes.count(429) >= 28, codes
    assert len(objects.patches) == codes.count(202)


class TokenReviews:
    """Answers TokenReviews as the API server would for a pod's bound token, until ``expired``."""

    def __init__(self) -> None:
        self.reviews = 0
        self.expired = False

    def create_token_review(self, review: Any) -> Any:
        from kubernetes.client import V1TokenReview, V1TokenReviewStatus, V1UserInfo

        self.reviews += 1
        user = V1UserInfo(
            username="system:serviceaccount:team-a:default",
            extra={progress.POD_NAME_EXTRA: ["wiki-master-0"], progress.POD_UID_EXTRA: ["uid-1"]},
        )
        audiences = review.spec.audiences
        return V1TokenReview(
            spec=review.spec,
            status=V1TokenReviewStatus(authenticated=not self.expired, audiences=audiences, user=user),
        )


def _jwt(expires: float) -> str:
    import base64

    claims = base64.urlsafe_b64encode(json.dumps({"exp": expires}).encode()).decode().rstrip("=")
    return f"header.{claims}.signature"


def test_a_review_is_kept_until_the_token_expires_then_asked_again() -> None:
    clock = Clock()
    reviewer = progress.Reviewer(None, Limits(review_cache_s=600), clock=clock)  # type: ignore[arg-type]
    reviews = TokenReviews()
    reviewer.auth = reviews  # type: ignore[assignment]
    token = _jwt(expires=clock.now + 60)

    assert reviewer.sender(token, "digest").pod == "wiki-master-0"
    clock.now += 30
    assert reviewer.sender(token, "digest").pod == "wiki-master-0"
    assert reviews.reviews == 1, "the answer is cached while the token is valid"

    clock.now += 31  # past the token's exp: asked again, and the API server refuses it now
    reviews.expired = True
    with pytest.raises(RefusedError) as refused:
        reviewer.sender(token, "digest")
    assert refused.value.code == 401 and reviews.reviews == 2
