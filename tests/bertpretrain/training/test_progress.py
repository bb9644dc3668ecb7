"""StatusReporter: the trainer's progress POSTed to the operator's progress endpoint, against a
real HTTP server on 127.0.0.1 that records each request (tests/bertjob/test_progress.py serves it
with the operator's own receiver)."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from bertpretrain.training.logs import TrainingLog
from bertpretrain.training.progress import StatusReporter

JOB_STATUS = "/apis/bertjob.dev/v1alpha1/namespaces/team-a/bertpretrainjobs/wiki/status"


class Recorder(ThreadingHTTPServer):
    """Answers every POST with ``answer`` and keeps (path, headers, body) of each."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        self.answer = 200

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{JOB_STATUS}"


class _Handler(BaseHTTPRequestHandler):
    server: Recorder

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, dict(self.headers), body))
        self.send_response(self.server.answer)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Recorder]:
    recorder = Recorder()
    thread = threading.Thread(target=recorder.serve_forever, daemon=True)
    thread.start()
    yield recorder
    recorder.shutdown()
    recorder.server_close()


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("first-token\n")
    return path


VALUES = {"loss": 7.25, "mlm_accuracy": 0.125, "sequences_per_second": 1234.5, "learning_rate": 1e-3}


def test_a_report_sends_only_the_progress(server: Recorder, token: Path) -> None:
    reporter = StatusReporter(server.url, total_steps=100, token_file=token)

    assert reporter.report(1, 20, {**VALUES, "nsp_accuracy": math.nan})

    [(path, headers, body)] = server.requests
    assert path == JOB_STATUS
    assert headers["Content-Type"] == "application/json"
    assert headers["Authorization"] == "Bearer first-token"
    assert list(body) == ["progress"]
    progress = body["progress"]
    assert progress.pop("updateTime").endswith("Z")
    assert progress == {
        "phase": 1,
        "step": 20,
        "totalSteps": 100,
        "loss": 7.25,
        "mlmAccuracy": 0.125,
        "sequencesPerSecond": 1234.5,
    }


def test_a_diverged_loss_is_left_out(server: Recorder) -> None:
    StatusReporter(server.url, total_steps=100).report(2, 5, {**VALUES, "loss": math.nan})

    [(_, headers, body)] = server.requests
    assert "loss" not in body["progress"]
    assert "Authorization" not in headers


def test_reports_are_rate_limited_but_the_last_step_always_goes(server: Recorder, token: Path) -> None:
    reporter = StatusReporter(server.url, total_steps=30, token_file=token, min_interval_s=3600)

    sent = [reporter.report(1, step, VALUES) for step in (10, 20, 30)]

    assert sent == [True, False, True]
    assert [body["progress"]["step"] for _, _, body in server.requests] == [10, 30]


def test_a_rotated_token_is_read_again(server: Recorder, token: Path) -> None:
    reporter = StatusReporter(server.url, total_steps=100, token_file=token, min_interval_s=0)
    reporter.report(1, 1, VALUES)
    token.write_text("second-token")
    reporter.report(1, 2, VALUES)

    assert [headers["Authorization"] for _, headers, _ in server.requests] == [
        "Bearer first-token",
        "Bearer second-token",
    ]


def test_a_refused_report_warns_once_and_training_goes_on(
    server: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    server.answer = 403
    reporter = StatusReporter(server.url, total_steps=100, min_interval_s=0)

    assert [reporter.report(1, step, VALUES) for step in (1, 2, 3)] == [False, False, False]
    server.answer = 200
    assert reporter.report(1, 4, VALUES)

    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert "cannot report progress" in err[0] and "403" in err[0]
    assert "again" in err[1]


def test_an_unreachable_api_server_does_not_stop_training(capsys: pytest.CaptureFixture[str]) -> None:
    with Recorder() as closed:
        url = closed.url
    reporter = StatusReporter(url, total_steps=10, timeout_s=2)

    assert not reporter.report(1, 10, VALUES)
    assert "cannot report progress" in capsys.readouterr().err


def test_the_training_log_reports_training_values_only(server: Recorder, tmp_path: Path) -> None:
    log = TrainingLog(
        tmp_path / "logs", tensorboard=False, status=StatusReporter(server.url, 100, None, None, 0)
    )
    log.log(1, 10, "train", VALUES)
    log.log(1, 10, "eval", {"mlm_accuracy": 0.5})
    log.close()

    assert [body["progress"]["mlmAccuracy"] for _, _, body in server.requests] == [0.125]


def test_in_a_pod_the_url_ca_and_token_come_from_the_mounted_files(tmp_path: Path) -> None:
    config, tokens = tmp_path / "etc-bertjob", tmp_path / "token-dir"
    config.mkdir()
    tokens.mkdir()
    (config / "progress-url").write_text("https://bertjob-progress.ops.svc:8443" + JOB_STATUS + "\n")
    # No CA file: the system's trust store (an operator behind a certificate from a public CA).
    reporter = StatusReporter.from_environment(7, config, tokens)

    assert reporter is not None
    assert (reporter.url, reporter.total_steps, reporter.token_file, reporter.context) == (
        "https://bertjob-progress.ops.svc:8443" + JOB_STATUS,
        7,
        tokens / "token",
        None,
    )


def test_without_the_operators_url_nothing_is_reported(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("{}")

    assert StatusReporter.from_environment(7, tmp_path, tmp_path) is None
