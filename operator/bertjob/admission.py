"""The validating admission webhook for BertPretrainJobs: a bad job, or a change the operator
cannot apply, is refused at ``kubectl apply`` instead of failing after it is stored.

The webhook runs the checks that ``bertjob validate`` runs (:func:`problems`: the document parsed
by :func:`bertjob_api.spec.parse_job`, then :func:`bertjob.render.rendered`: every check of
:func:`bertjob_api.validation.cluster_job`, and each object it renders small enough to store) and,
on an UPDATE that changes the spec, the rule by which the operator applies a change after the fact
(:func:`bertjob.changes.refused_fields`). A refusal lists every problem with its field path. An
update that leaves the spec as it was (metadata: labels, annotations, finalizers; or the status)
always passes, even for a job whose stored spec is invalid, so that such a job can be deleted.
A job it allows may get warnings (:func:`warned`: those of :func:`bertjob_api.validation.warnings`,
which ``bertjob validate`` prints too), which ``kubectl apply`` shows as ``Warning: ...``.

It is off unless configured: :func:`configure` (called by the operator's startup handler) turns it
on when ``$BERTJOB_WEBHOOK_CERT_DIR`` names a directory with the serving certificate
(``tls.crt``, ``tls.key``: a ``kubernetes.io/tls`` Secret as the chart's or cert-manager's,
mounted), served by kopf's own :class:`kopf.WebhookServer` on ``$BERTJOB_WEBHOOK_PORT`` (default
9443) of ``$BERTJOB_WEBHOOK_ADDRESS`` (default all interfaces). kopf re-reads the files when they
change (cert-manager's renewals). The chart's ValidatingWebhookConfiguration calls it at
``/`` + :data:`WEBHOOK_ID`, for CREATE and UPDATE of the main resource only (never ``/status``).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kopf
import yaml
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from bertjob import changes, launchers, lifecycle
from bertjob.children import read
from bertjob.launchers import registry
from bertjob.render import rendered
from bertjob_api.contract import GROUP, JOB_FILE, PLURAL, VERSION
from bertjob_api.jobfile import without_status
from bertjob_api.spec import JobSpec, SpecError, parse_job, to_document
from bertjob_api.validation import cluster_job
from bertjob_api.validation import warnings as spec_warnings

CERT_DIR_ENV = "BERTJOB_WEBHOOK_CERT_DIR"
PORT_ENV = "BERTJOB_WEBHOOK_PORT"
ADDRESS_ENV = "BERTJOB_WEBHOOK_ADDRESS"
PORT = 9443
CERT_FILE, KEY_FILE = "tls.crt", "tls.key"
# The handler's id, which is also the URL path the API server calls: kopf runs only the handler
# whose id the path names, and none (allowing the request) for a path naming none.
WEBHOOK_ID = "validate-bertpretrainjob"
# HTTP status of a refusal, as the API server answers for an invalid object.
REFUSED_CODE = 422


def launcher_of(document: Mapping[str, Any]) -> launchers.Launcher:
    """The launcher of a job document: its ``spec.launcher``, or the spec's default where a
    document written without defaults lacks it.

    Raises:
        SpecError: no launcher of that name.
    """
    default = JobSpec.model_fields["launcher"].default
    return registry.get(str(document["spec"].get("launcher", default)))


def problems(obj: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every problem of a BertPretrainJob object (as the API server holds it: its status is left
    out) that ``bertjob validate`` would report for it as a file, as (field path, message); []
    for a valid job."""
    try:
        checked(obj)
    except SpecError as error:
        return list(error.problems)
    return []


def checked(obj: Mapping[str, Any], objects: bool = True) -> dict[str, Any]:
    """A BertPretrainJob object (its status left out) as the operator runs it: validated as
    ``bertjob validate`` validates a file (:func:`bertjob.render.rendered`), with defaults, as a
    document. ``objects=False`` leaves out rendering it and the size of its objects: for a job
    that is only compared with.

    Raises:
        SpecError: listing every problem found.
        RenderError: kustomize failed.
    """
    document = without_status(dict(obj))
    meta = document.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    source = f"{meta.get('namespace')}/{meta.get('name')}"
    job = parse_job(document, source)
    return to_document(rendered(job, source).job if objects else cluster_job(job, source))


def review(
    operation: str,
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any],
    accepted: Mapping[str, Any] | None = None,
) -> list[tuple[str, str]]:
    """Why admission refuses ``operation`` (CREATE or UPDATE) of ``new``, as (field path, message)
    pairs; [] to allow it.

    An UPDATE whose spec equals ``old``'s passes. Any other request is refused when ``new`` is
    invalid (:func:`problems`); a valid UPDATE is refused for each field that the operator would
    not apply to the job as ``old``'s status describes it (:func:`bertjob.changes.refused_fields`),
    compared, after defaults, with ``accepted`` (the document the job's children were rendered
    from, its ConfigMap's) or, without it, with ``old``.
    """
    if operation == "UPDATE" and old is not None and old.get("spec") == new.get("spec"):
        return []
    try:
        candidate = checked(new)
    except SpecError as error:
        return list(error.problems)
    if operation != "UPDATE" or old is None:
        return []
    for basis in (accepted, old):
        try:
            # Only compared with: rendered when it was accepted, not again here.
            before = checked(basis, objects=False) if basis is not None else None
        except SpecError:
            before = None
        if before is not None:
            break
    else:
        # Neither passes today's checks: what the operator would refuse is what the user changed.
        before, candidate = dict(old), dict(new)
    safe_fields = launcher_of(before).safe_fields
    status = lifecycle.of(old)
    refused = changes.refused_fields(status, before.get("spec"), candidate.get("spec"), safe_fields)
    allowed = ", ".join(safe_fields)
    return [
        (
            field,
            f"cannot change once the job has children (phase {status.phase}): only {allowed} "
            "change a running job; delete the job and create it again to change the rest",
        )
        for field in refused
    ]


def warned(operation: str, old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[str]:
    """The admission warnings of ``operation`` (CREATE or UPDATE) of ``new``, a job :func:`review`
    allows: each of :func:`bertjob_api.validation.warnings`, as ``field path: message`` (the
    refusal's spelling); [] for an UPDATE that leaves the spec as it was (nothing was checked),
    or a job whose spec does not parse."""
    if operation == "UPDATE" and old is not None and old.get("spec") == new.get("spec"):
        return []
    document = without_status(dict(new))
    meta = document.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    try:
        spec = parse_job(document, f"{meta.get('namespace')}/{meta.get('name')}").spec
    except SpecError:
        return []
    return [f"{path}: {text}" for path, text in spec_warnings(spec)]


def message(found: list[tuple[str, str]]) -> str:
    """The AdmissionReview message of a refusal: every problem, each with its field path."""
    count = f"{len(found)} problems" if len(found) > 1 else "1 problem"
    return f"invalid BertPretrainJob, {count}: " + "; ".join(f"{path}: {problem}" for path, problem in found)


def accepted_document(api: ApiClient, obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The job document the children of ``obj`` were rendered from (its ConfigMap's job.yaml, as
    the operator's update handler reads it); None when the job has none yet, or it cannot be
    read (gone, not YAML, the API server failed or could not be reached, as while it restarts:
    admission then compares with the old object)."""
    name = lifecycle.of(obj).config_map
    namespace = (obj.get("metadata") or {}).get("namespace")
    if name is None or namespace is None:
        return None
    try:
        meta = {"name": name, "namespace": namespace}
        found = read(api, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta})
        document = yaml.safe_load(((found or {}).get("data") or {}).get(JOB_FILE) or "null")
    except (ApiException, HTTPError, yaml.YAMLError):
        return None
    return document if isinstance(document, dict) and isinstance(document.get("spec"), dict) else None


def validate_job(
    body: kopf.Body, memo: Any, logger: Any, warnings: list[str] | None = None, **kwargs: Any
) -> None:
    """kopf's validating handler for BertPretrainJobs (:func:`review`), registered by
    :func:`configure`. A request it allows gets :func:`warned`'s warnings appended to
    ``warnings``, the list kopf gives each validating handler and returns in the
    AdmissionReview's ``response.warnings`` (which ``kubectl apply`` prints).

    Raises:
        kopf.AdmissionError: the request is refused; its message names every field at fault
            (:func:`message`), with HTTP code 422.
    """
    new, old, operation = dict(body), kwargs.get("old"), kwargs.get("operation")
    before = dict(old) if isinstance(old, Mapping) else None
    accepted = None
    if operation == "UPDATE" and before is not None and before.get("spec") != new.get("spec"):
        api = memo.get("api")
        accepted = accepted_document(api, before) if api is not None else None
    try:
        found = review(str(operation), before, new, accepted)
        if not found and warnings is not None:
            warnings.extend(warned(str(operation), before, new))
    except Exception as error:
        # A request we cannot judge is refused, and the operator serves the next one.
        logger.exception("admission review failed")
        problem = f"the bertjob webhook could not check this request: {error}"
        raise kopf.AdmissionError(problem, code=500) from error
    if found:
        raise kopf.AdmissionError(message(found), code=REFUSED_CODE)


def configure(
    settings: kopf.OperatorSettings,
    environ: Mapping[str, str] = os.environ,
    registry: kopf.OperatorRegistry | None = None,
) -> bool:
    """Serve the webhook if ``$BERTJOB_WEBHOOK_CERT_DIR`` is set: register :func:`validate_job`
    and give kopf a :class:`kopf.WebhookServer` with the certificate files found there. Returns
    whether it is on. Called by the operator's startup handler, before kopf starts serving;
    ``registry`` is kopf's default one unless given.

    Raises:
        FileNotFoundError: the directory lacks ``tls.crt`` or ``tls.key``.
        ValueError: ``$BERTJOB_WEBHOOK_PORT`` is not a port number.
    """
    cert_dir = environ.get(CERT_DIR_ENV)
    if not cert_dir:
        return False
    files = [Path(cert_dir) / name for name in (CERT_FILE, KEY_FILE)]
    missing = [str(path) for path in files if not path.is_file()]
    if missing:
        found = " or ".join(missing)
        raise FileNotFoundError(f"${CERT_DIR_ENV}: no {found}; mount the webhook's TLS Secret there")
    port_text = environ.get(PORT_ENV, str(PORT))
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"${PORT_ENV}: {port_text!r} is not a port number (1-65535)")
    settings.admission.server = kopf.WebhookServer(
        addr=environ.get(ADDRESS_ENV) or None,
        port=int(port_text),
        certfile=str(files[0]),
        pkeyfile=str(files[1]),
    )
    # A startup handler retried after this point must not register the handler twice.
    registry = registry or kopf.get_default_registry()
    if registry not in _REGISTERED:
        kopf.on.validate(
            GROUP, VERSION, PLURAL, id=WEBHOOK_ID, operations=["CREATE", "UPDATE"], registry=registry
        )(validate_job)
        _REGISTERED.add(registry)
    return True


# The registries :func:`configure` gave :func:`validate_job`: kopf has no public way to ask a
# registry which webhooks it holds, and its private one (``registry._webhooks``) may change.
_REGISTERED: weakref.WeakSet[kopf.OperatorRegistry] = weakref.WeakSet()
