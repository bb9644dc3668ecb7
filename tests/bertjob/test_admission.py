"""The admission webhook's pure parts: the same checks as ``bertjob validate`` for every job of
the admission table, its message, and how the operator turns it on (or leaves it off)."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from kubernetes.client import ApiClient, Configuration

from bertjob import admission, changes
from bertjob.cli import LOCAL_CONFIG, main
from bertjob.lifecycle import condition, now
from bertjob_api.crd import JobStatus
from bertjob_api.jobfile import load_job
from bertjob_api.spec import SpecError
from bertjob_api.validation import KUEUE_TRAINJOB_UNTESTED, cluster_job
from bertjob_testing.admission_cases import JOB_CASES
from bertjob_testing.cluster.process import free_port
from bertjob_testing.jobs import valid_job, with_value


@pytest.mark.parametrize("case", JOB_CASES, ids=[case["id"] for case in JOB_CASES])
def test_admission_finds_what_bertjob_validate_finds(
    tmp_path: Path, case: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(case["document"]))
    try:
        cluster_job(load_job(path), str(path))
        expected: list[tuple[str, str]] = []
    except SpecError as error:
        expected = error.problems
    assert admission.problems(case["document"]) == expected
    # A job marked local-config (bertjob.cli.LOCAL_CONFIG, the local demo) never goes to a cluster:
    # `bertjob validate` checks it as `bertjob run` takes it, while the webhook refuses it.
    local = case["document"]["metadata"].get("annotations", {}).get(LOCAL_CONFIG) == "true"
    assert main(["validate", str(path)]) == (0 if case["allowed"] or local else 2)
    found = [path for path, _ in admission.problems(case["document"])]
    assert all(field in found for field in case["fields"]) and bool(found) != case["allowed"]


def test_the_status_is_not_checked() -> None:
    document = {**JOB_CASES[0]["document"], "status": {"phase": "Nonsense", "extra": 1}}
    assert admission.problems(document) == []


def test_the_message_names_every_problem() -> None:
    found = [("spec.a", "bad"), ("spec.b[0].c", "worse")]
    assert admission.message(found) == "invalid BertPretrainJob, 2 problems: spec.a: bad; spec.b[0].c: worse"
    assert admission.message(found[:1]) == "invalid BertPretrainJob, 1 problem: spec.a: bad"


def _certificate_dir(tmp_path: Path) -> Path:
    # configure() checks that the files exist; the server reads them only when kopf starts it.
    (tmp_path / "tls.crt").write_text("certificate")
    (tmp_path / "tls.key").write_text("key")
    return tmp_path


def test_the_webhook_is_off_unless_configured() -> None:
    settings, registry = kopf.OperatorSettings(), kopf.OperatorRegistry()
    assert admission.configure(settings, {}, registry) is False
    assert settings.admission.server is None and not registry._webhooks.get_all_handlers()


def test_the_webhook_serves_the_certificate_files_on_the_port(tmp_path: Path) -> None:
    settings, registry = kopf.OperatorSettings(), kopf.OperatorRegistry()
    environ = {admission.CERT_DIR_ENV: str(_certificate_dir(tmp_path)), admission.PORT_ENV: "8443"}
    assert admission.configure(settings, environ, registry) is True
    # A startup handler retried registers the handler once.
    assert admission.configure(settings, environ, registry) is True
    server = settings.admission.server
    assert isinstance(server, kopf.WebhookServer)
    assert (server.port, server.addr) == (8443, None)
    assert (server.certfile, server.pkeyfile) == (str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    [handler] = registry._webhooks.get_all_handlers()
    assert handler.id == admission.WEBHOOK_ID and handler.fn is admission.validate_job
    assert set(handler.operations or ()) == {"CREATE", "UPDATE"} and handler.subresource is None


def test_the_operator_reaches_into_no_private_part_of_kopf() -> None:
    # kopf is not pinned (kopf>=1.45): its private names (kopf._core..., registry._webhooks) may
    # change in any release. The tests above still look inside a registry: a change there fails a
    # test, not the operator.
    private = re.compile(r"\bkopf\._|\bregistry\._[a-z]")
    for path in sorted((Path(admission.__file__).parent).rglob("*.py")):
        found = [line for line in path.read_text().splitlines() if private.search(line) and "#" not in line]
        assert not found, f"{path}: {found}"


def test_a_missing_certificate_is_named(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("certificate")
    with pytest.raises(FileNotFoundError, match=r"BERTJOB_WEBHOOK_CERT_DIR: no .*tls\.key"):
        admission.configure(
            kopf.OperatorSettings(), {admission.CERT_DIR_ENV: str(tmp_path)}, kopf.OperatorRegistry()
        )


@pytest.mark.parametrize("port", ["http", "0", "70000", "-1"])
def test_a_bad_port_is_named(tmp_path: Path, port: str) -> None:
    environ = {admission.CERT_DIR_ENV: str(_certificate_dir(tmp_path)), admission.PORT_ENV: port}
    with pytest.raises(ValueError, match="BERTJOB_WEBHOOK_PORT"):
        admission.configure(kopf.OperatorSettings(), environ, kopf.OperatorRegistry())


def _status(phase: str | None, reason: str | None = None, status: str = "True") -> JobStatus:
    conditions = [] if reason is None else [condition("Failed", reason, "", now(), status == "True")]
    return JobStatus(phase=phase, conditions=conditions)


@pytest.mark.parametrize(
    ("status", "renders"),
    [
        (_status("Failed", "InvalidSpec"), True),
        (_status("Failed", "RenderFailed"), True),
        (_status("Failed", "JobFailed"), False),
        (_status("Failed", "ChildRejected"), False),
        (_status("Running", "InvalidSpec", "False"), False),
        (_status("Running"), False),
        (_status(None), False),
    ],
)
def test_only_a_job_failed_for_its_spec_is_rendered_again(status: JobStatus, renders: bool) -> None:
    assert changes.renders_again(status) is renders
    image_changed = changes.refused_fields(status, {"image": "a"}, {"image": "b"})
    # Rendered again, or not handled yet: any change goes; with children, the image is refused.
    assert image_changed == ([] if renders or status.phase is None else ["spec.image"])


@pytest.mark.parametrize("safe_fields", [changes.SAFE_FIELDS, ("spec.runPolicy.suspend",)])
def test_a_job_with_children_takes_its_launchers_safe_fields_only(safe_fields: tuple[str, ...]) -> None:
    before = {"image": "a", "runPolicy": {}}
    after = {"image": "a", "runPolicy": {"suspend": True, "backoffLimit": 3}}
    refused = changes.refused_fields(_status("Running"), before, after, safe_fields)
    assert refused == [f for f in ["spec.runPolicy.backoffLimit"] if f not in safe_fields]


def _validate(document: dict[str, Any], operation: str = "CREATE", old: Any = None) -> list[str]:
    """Run the handler as kopf does; the warnings it returns to kubectl (kopf's ``warnings`` list)."""
    warnings: list[str] = []
    admission.validate_job(
        body=kopf.Body(document),
        memo=kopf.Memo(),
        logger=logging.getLogger("test"),
        warnings=warnings,
        old=old,
        operation=operation,
    )
    return warnings


def test_the_handler_refuses_with_422_naming_the_fields() -> None:
    [case] = [case for case in JOB_CASES if case["id"] == "three-problems-all-named"]
    with pytest.raises(kopf.AdmissionError) as refused:
        _validate(case["document"])
    assert refused.value.code == admission.REFUSED_CODE
    assert all(f"{field}: " in str(refused.value) for field in case["fields"])
    _validate(JOB_CASES[0]["document"])


def test_a_check_that_fails_refuses_the_request_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any) -> list[tuple[str, str]]:
        raise RuntimeError("boom")

    monkeypatch.setattr(admission, "review", broken)
    with pytest.raises(kopf.AdmissionError, match="could not check this request: boom") as refused:
        _validate(JOB_CASES[0]["document"])
    assert refused.value.code == 500


def _queued(launcher: str) -> dict[str, Any]:
    return with_value(with_value(valid_job(), "spec.launcher", launcher), "spec.queueName", "team-a")


def test_a_queued_trainjob_is_allowed_with_a_warning_naming_the_field() -> None:
    # Kueue v0.17 to v0.19 queue Trainer v2.2's TrainJob, not the v2.3 one it renders: a warning
    # for kubectl apply (bertjob_api.validation.warnings), not a refusal.
    assert _validate(_queued("trainjob")) == [f"spec.queueName: {KUEUE_TRAINJOB_UNTESTED}"]
    changed = with_value(_queued("trainjob"), "spec.queueName", "team-b")
    assert _validate(changed, "UPDATE", _queued("trainjob")) == [f"spec.queueName: {KUEUE_TRAINJOB_UNTESTED}"]


def test_other_requests_get_no_warning() -> None:
    assert _validate(_queued("pytorchjob")) == []
    assert _validate(with_value(valid_job(), "spec.launcher", "trainjob")) == []
    # An update that leaves the spec as it was is not checked, nor warned of again.
    labelled = with_value(_queued("trainjob"), "metadata.labels", {"team": "a"})
    assert _validate(labelled, "UPDATE", old=_queued("trainjob")) == []
    # A refusal carries its problems, no warning beside them.
    refused = with_value(_queued("trainjob"), "spec.topology.processesPerNode", 3)
    warnings: list[str] = []
    with pytest.raises(kopf.AdmissionError):
        admission.validate_job(
            body=kopf.Body(refused),
            memo=kopf.Memo(),
            logger=logging.getLogger("test"),
            warnings=warnings,
            operation="CREATE",
        )
    assert warnings == []


def test_an_api_server_out_of_reach_leaves_the_change_judged_against_the_old_object() -> None:
    # While the operator's API server restarts, the webhook (served by the operator) is still
    # called by the cluster's other API servers: reading the accepted spec fails to connect, and
    # the change is judged as the docstring promises instead of refused with the connection error.
    configuration = Configuration(host=f"https://127.0.0.1:{free_port()}")
    configuration.retries = 0
    job = {"metadata": {"name": "a", "namespace": "team"}, "status": {"configMap": "a-job"}}
    assert admission.accepted_document(ApiClient(configuration), job) is None
