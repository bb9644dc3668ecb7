"""``helm upgrade`` from the previous commit's chart and operator to this checkout's, with running
jobs, on the real API server: the webhook's certificate is kept (the Secret the chart made and the
configuration's caBundle unchanged, the old replica still answering through it mid-rollout), and
the new operator adopts the jobs the old one ran: no child made again, not even tried (the API
server's audit log holds every create request), no create handler run again, no error, and a
child's change after the upgrade still reaches its job's status.

Which previous: the newest commit whose ``charts/bertjob``, ``api/``, ``operator/`` or
``kustomize/`` (what the operator's image ships) differs from the working tree's: HEAD when the
working tree changed them, else the parent of the newest commit that changed them. Its folders are
taken from git and its operator is run from them (the old packages first on ``PYTHONPATH``, which
find the ``kustomize/`` tree beside them); the operator prints where it imported its packages
from, which is checked, for the old operator and the new. Without such a commit in the history (a
shallow clone, or none before), the upgrade is from this checkout to itself: the same checks, of a
chart and an operator that must keep their own certificate and jobs.

The previous chart is installed with the webhook on, as a platform team runs it; the upgrade
follows the chart's README ("Upgrading and uninstalling": ``helm upgrade`` updates the CRD too),
with the same values, then the old operator stops and this checkout's starts, as the Deployment's
rollout replaces the pod. Helm's server-side apply is forced over the test's own routing of the
webhook to the local operator (the only other manager of those fields), which is then done again.

Why kwok: no pod needs to run, so not even kwok: the API server alone (``api_only``) stores the
chart's objects, calls the operator's webhook and serves the children, whose status a stand-in for
Kubeflow's training operator writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import bertjob
import bertjob_api
from bertjob.admission import CERT_DIR_ENV, PORT_ENV
from bertjob_testing.cluster.catalog import REPO
from bertjob_testing.cluster.components.apiserver import AUDIT_LOG
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.operator import (
    CHART,
    NAMESPACE,
    OPERATOR,
    RELEASE,
    WEBHOOK_SECRET,
    WEBHOOK_SERVICE,
    RealCluster,
    helm,
    install,
    route_webhook_port,
)
from bertjob_testing.jobs import with_value
from tests.bertjob.e2e import named_job
from tests.cluster.test_crd_upgrade import old_job
from tests.cluster.test_operator import _phase, _report, forbidden

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# What the chart and the operator (as its image ships it: the Dockerfile's api/, operator/ and the
# kustomize/ tree it renders children with) are made of: the folders whose previous version runs.
PATHS = ("charts/bertjob", "api", "operator", "kustomize")
JOBS = 3
JOBS_NAMESPACE = "upgraded"
OPERATOR_USER = f"system:serviceaccount:{NAMESPACE}:{OPERATOR}"
# The line the operator prints first, naming the files its packages were imported from.
IMPORTED = "bertjob imported from"
PROBE = (
    "import sys, bertjob, bertjob_api, kopf.cli; "
    f"print({IMPORTED!r}, bertjob.__file__, bertjob_api.__file__, flush=True); "
    "sys.argv[0] = 'kopf'; kopf.cli.main()"
)
WEBHOOK_DENIED = 'admission webhook "bertpretrainjobs.bertjob.dev" denied the request'
# kopf's line for a creation the operator handled.
CREATED = "Handler 'create_job' succeeded"
# The webhook alone refuses it (schema and CEL take it): a checkpoint on no writable volume.
BAD_FIELD = "spec.checkpoint.path"


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)


def previous_commit() -> tuple[str, bool]:
    """The newest commit whose :data:`PATHS` differ from the working tree's, and whether it is
    this checkout itself (no such commit in the history: HEAD, its folders unchanged)."""
    if _git("status", "--porcelain", "--", *PATHS).stdout.strip():
        return _git("rev-parse", "HEAD").stdout.strip(), False
    last = _git("log", "-1", "--format=%H", "--", *PATHS).stdout.strip()
    parent = _git("rev-parse", "--verify", "--quiet", f"{last}^").stdout.strip() if last else ""
    if not parent:
        return _git("rev-parse", "HEAD").stdout.strip(), True
    return parent, False


def extract(commit: str, directory: Path) -> None:
    """Write :data:`PATHS` as ``commit`` has them into ``directory``.

    Raises:
        subprocess.CalledProcessError: git or tar failed.
    """
    directory.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, *PATHS], cwd=REPO, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive, check=True)


def _probed(pythonpath: list[Path]) -> Callable[[list[str], dict[str, str]], list[str]]:
    """A :attr:`RealCluster.launch` that runs kopf from this interpreter with ``pythonpath`` first
    on the module path, after printing where ``bertjob`` and ``bertjob_api`` came from."""
    inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    path = os.pathsep.join([*map(str, pythonpath), *inherited])

    def launch(command: list[str], _env: dict[str, str]) -> list[str]:
        return ["env", f"PYTHONPATH={path}", sys.executable, "-c", PROBE, *command[1:]]

    return launch


def _runs(cluster: RealCluster) -> list[str]:
    """The operator's log, one part per start, in order."""
    return re.split(r"^--- operator start \d+ ---$", cluster.log.read_text(), flags=re.MULTILINE)[1:]


def _imported_from(log: str) -> tuple[Path, Path]:
    [line] = [line for line in log.splitlines() if line.startswith(IMPORTED)]
    operator_file, api_file = line.removeprefix(IMPORTED).split()
    return Path(operator_file), Path(api_file)


def _certificate(plane: ControlPlane) -> dict[str, str]:
    """The webhook Secret's keys and each caBundle of the chart's webhook configuration, by name,
    as the start of their SHA-256 (short enough for a failure's diff); '' for an empty one."""
    secret = plane.kubectl.get("secret", WEBHOOK_SECRET, "-n", NAMESPACE)
    configuration = plane.kubectl.get("validatingwebhookconfiguration", OPERATOR)
    found = {f"Secret {key}": value for key, value in secret["data"].items()}
    for hook in configuration["webhooks"]:
        found[f"caBundle of {hook['name']}"] = hook["clientConfig"].get("caBundle", "")
    return {name: value and hashlib.sha256(value.encode()).hexdigest()[:16] for name, value in found.items()}


def _audit(plane: ControlPlane) -> list[dict[str, Any]]:
    """Every event of the API server's audit log, whatever the answer."""
    return [json.loads(line) for line in (plane.workdir / AUDIT_LOG).read_text().splitlines()]


def _made_again(cluster: RealCluster, since: int) -> list[str]:
    """What the operator's latest run did as if the old jobs were new: each create request in the
    jobs' namespace since audit event ``since`` (Events and the bad jobs aside), answered or
    refused (an object that exists is refused: the attempt is what counts), and each creation it
    logged."""
    assert cluster.plane is not None
    tried = [
        f"{e['user']['username']} create {e['objectRef'].get('resource')}/{e['objectRef'].get('name')}: "
        f"{(e.get('responseStatus') or {}).get('code')}"
        for e in _audit(cluster.plane)[since:]
        if e["verb"] == "create"
        and (e.get("objectRef") or {}).get("namespace") == JOBS_NAMESPACE
        and e["objectRef"].get("resource") != "events"
        and not e["objectRef"].get("name", "").startswith("bad-")
    ]
    return tried + [line for line in _runs(cluster)[-1].splitlines() if CREATED in line]


def _uids(plane: ControlPlane, name: str) -> dict[str, str]:
    """The uid of ``name``'s children (its PyTorchJob and ConfigMap)."""
    return {
        "pytorchjob": plane.kubectl.get("pytorchjob", name, "-n", JOBS_NAMESPACE)["metadata"]["uid"],
        "configmap": plane.kubectl.get("configmap", f"{name}-job", "-n", JOBS_NAMESPACE)["metadata"]["uid"],
    }


def _apply(plane: ControlPlane, document: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return plane.kubectl("apply", "-n", JOBS_NAMESPACE, "-f", "-", input=json.dumps(document), check=False)


def _refused_by_the_webhook(plane: ControlPlane, name: str, when: str) -> None:
    bad = with_value(named_job(name), BAD_FIELD, "/ckpt")
    result = _apply(plane, bad)
    assert result.returncode != 0, f"a bad job was let through {when}"
    assert WEBHOOK_DENIED in result.stderr and BAD_FIELD in result.stderr, f"{when}: {result.stderr}"


def _route_webhook(cluster: RealCluster) -> None:
    """What install() does to reach the local operator, done again: ``helm upgrade`` puts the
    chart's Service and webhook port back."""
    assert cluster.plane is not None
    cluster.plane.kubectl.route_service_to_localhost(NAMESPACE, WEBHOOK_SERVICE)
    route_webhook_port(cluster.plane, int(cluster.env[PORT_ENV]))


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd and an API server of this test's own (no controllers, no nodes)."""
    plane = ControlPlane(tmp_path_factory.mktemp("helm-upgrade"))
    try:
        plane.start(api_only=True)
        yield plane
    finally:
        plane.stop()


def test_helm_upgrade_from_the_previous_commit_keeps_the_certificate_and_adopts_running_jobs(
    plane: ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit, itself = previous_commit()
    print(f"\nupgrading from {commit[:12]}{' (this checkout itself)' if itself else ''}")
    previous = tmp_path / "previous"
    extract(commit, previous)
    old_code = [previous / "api", previous / "operator"]
    workdir = tmp_path / "operator"
    workdir.mkdir()
    with monkeypatch.context() as patched:
        patched.setenv("PYTHONPATH", os.pathsep.join(map(str, old_code)))
        cluster = install(plane, workdir, chart=previous / "charts" / "bertjob")
    try:
        # Started again to print what it imported (install() gives no launch hook).
        cluster.stop()
        cluster.launch = _probed(old_code)
        cluster.start()
        imported = _imported_from(_runs(cluster)[-1])
        assert imported == (
            previous / "operator" / "bertjob" / "__init__.py",
            previous / "api" / "bertjob_api" / "__init__.py",
        ), f"the old operator ran this checkout's code: {imported}"

        plane.kubectl("create", "namespace", JOBS_NAMESPACE)
        names = [f"job-{index}" for index in range(JOBS)]
        for name in names:
            document = named_job(name)
            if plane.kubectl(
                "create", "--dry-run=server", "-n", JOBS_NAMESPACE, "-f", "-",
                input=json.dumps(document), check=False,
            ).returncode:  # fmt: skip
                document = old_job(commit, name)  # the old CRD refuses today's job: the old one's
            result = _apply(plane, document)
            assert result.returncode == 0, result.stderr
        for name in names:
            _phase(cluster, JOBS_NAMESPACE, name, "Pending")
            _report(plane, JOBS_NAMESPACE, name, "Created", "Running")
            _phase(cluster, JOBS_NAMESPACE, name, "Running")
        children = {name: _uids(plane, name) for name in names}
        # What the new operator must not log again: the old one's creation of each job.
        old_run = _runs(cluster)[-1]
        assert all(f"[{JOBS_NAMESPACE}/{name}] {CREATED}" in old_run for name in names), old_run
        certificate = _certificate(plane)
        assert len(certificate) == 4 and all(certificate.values()), certificate
        upgraded_at = len(_audit(plane))

        # Helm applies server-side: the fields the test's routing patched (the Service's type, the
        # webhook's port) have a second manager here, which a cluster without the routing lacks.
        helm(
            plane, "upgrade", RELEASE, str(CHART), f"--namespace={NAMESPACE}", "--set=webhook.enabled=true",
            "--force-conflicts",
        )  # fmt: skip
        assert _certificate(plane) == certificate, "helm upgrade made the webhook a new certificate"
        # Mid-rollout: the old replica, with the certificate it mounted, still answers.
        _route_webhook(cluster)
        _refused_by_the_webhook(plane, "bad-mid-rollout", "mid-rollout")

        cluster.stop()
        # The new pod mounts the Secret as the upgrade left it.
        assert plane.kubectl.mount_secret(NAMESPACE, WEBHOOK_SECRET, Path(cluster.env[CERT_DIR_ENV]))
        cluster.launch = _probed([])
        cluster.start()
        new_run = _runs(cluster)[-1]
        # This checkout's code, as this test run imports it.
        assert _imported_from(new_run) == (Path(bertjob.__file__), Path(bertjob_api.__file__))
        _refused_by_the_webhook(plane, "bad-after", "after the upgrade")

        # A change after the upgrade reaches each job through the new operator.
        for name in names:
            _report(plane, JOBS_NAMESPACE, name, "Created", "Running", "Succeeded")
        try:
            for name in names:
                _phase(cluster, JOBS_NAMESPACE, name, "Succeeded")
        except AssertionError as error:
            again = _made_again(cluster, upgraded_at) or "nothing made again"
            raise AssertionError(f"{error}; {again}") from None
        new_run = _runs(cluster)[-1]

        for name in names:
            assert _uids(plane, name) == children[name], f"{name}'s children were made again"
            changes = plane.audited_changes("pytorchjobs", JOBS_NAMESPACE, name)
            creators = [event["user"]["username"] for event in changes if event["verb"] == "create"]
            assert creators == [OPERATOR_USER], f"{name}'s PyTorchJob created by {creators}"
        assert not _made_again(cluster, upgraded_at), _made_again(cluster, upgraded_at)
        # kopf logs the webhook's refusals of the bad jobs as errors; nothing else may be one.
        errors = [
            line
            for line in new_run.splitlines()
            if ("ERROR" in line and f"[{JOBS_NAMESPACE}/bad-" not in line) or "Traceback" in line
        ]
        assert not errors, "\n".join(errors)
        assert not forbidden(cluster), "\n".join(forbidden(cluster))
        print(f"{JOBS} jobs adopted, the webhook certificate kept, from {commit[:12]}")
    finally:
        cluster.stop()
