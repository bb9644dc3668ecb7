"""BertPretrainJob -> Kubernetes manifests: the job file as a ConfigMap, and the launcher's child.

The child starts from plain kustomize YAML (``kustomize/base`` and an overlay per topology) that
works by hand too. :func:`render` writes a throw-away kustomization that references the overlay
the launcher picks and adds the job's own patch, runs ``kustomize build`` (or ``kubectl
kustomize``) on it and parses the result. Every value from the job reaches a manifest as data, a
JSON string inside the kustomization or a YAML scalar written by PyYAML, never pasted into YAML
text, so a field that holds YAML or template syntax comes out verbatim.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bertjob import launchers
from bertjob.defaults import with_defaults
from bertjob.launchers import Launcher
from bertjob.spec import BertPretrainJob, to_document
from bertjob.validation import check

KUSTOMIZE_DIR_ENV = "BERTJOB_KUSTOMIZE_DIR"
JOB_FILE = "job.yaml"
NAME_LABEL = "app.kubernetes.io/name"
JOB_LABEL = "bertjob.dev/job"
KUSTOMIZE_TIMEOUT_S = 60


class RenderError(RuntimeError):
    """kustomize is missing, or it refused the kustomization (its stderr is in the message)."""


def kustomize_dir() -> Path:
    """The ``kustomize/`` tree: ``$BERTJOB_KUSTOMIZE_DIR``, else the repository's ``kustomize/``
    next to ``operator/`` (the operator image sets the variable)."""
    configured = os.environ.get(KUSTOMIZE_DIR_ENV)
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[2] / "kustomize"


def config_map_name(job_name: str) -> str:
    """Name of the ConfigMap that holds a job's ``job.yaml``."""
    return f"{job_name}-config"


def job_labels(job_name: str) -> dict[str, str]:
    """Labels on every object rendered for a job (and on the child's pods)."""
    return {NAME_LABEL: "bertjob", JOB_LABEL: job_name}


def render(job: BertPretrainJob) -> list[dict[str, Any]]:
    """The manifests for ``job``: its ConfigMap, then the launcher's child (e.g. a PyTorchJob).

    Applies :func:`bertjob.defaults.with_defaults` and :func:`bertjob.validation.check` first;
    the ConfigMap's ``job.yaml`` is the whole job document after defaults.

    Raises:
        SpecError: the spec is inconsistent, or names a launcher that does not exist.
        RenderError: no kustomize/kubectl on PATH, or kustomize failed.
    """
    name, namespace = job.metadata.name, job.metadata.namespace
    spec = check(with_defaults(job.spec), f"{namespace}/{name}", cluster=True)
    job = job.model_copy(update={"spec": spec})
    launcher = launchers.get(spec.launcher)
    labels = job_labels(name)
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": config_map_name(name), "namespace": namespace, "labels": labels},
        "data": {JOB_FILE: yaml.safe_dump(to_document(job), sort_keys=False)},
    }
    return [config_map, _build_child(job, launcher, labels)]


def _build_child(job: BertPretrainJob, launcher: Launcher, labels: dict[str, str]) -> dict[str, Any]:
    overlay = kustomize_dir() / "overlays" / launcher.overlay(job.spec)
    if not (overlay / "kustomization.yaml").is_file():
        raise RenderError(f"no kustomization in {overlay} (set {KUSTOMIZE_DIR_ENV})")
    ops = launcher.patch(
        job.spec, name=job.metadata.name, config_map=config_map_name(job.metadata.name), labels=labels
    )
    child = launcher.child
    with tempfile.TemporaryDirectory(prefix="bertjob-") as workdir:
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            # kustomize accepts a directory outside the kustomization's root, given relatively.
            "resources": [os.path.relpath(overlay.resolve(), Path(workdir).resolve())],
            "namespace": job.metadata.namespace,
            "labels": [{"pairs": labels}],
            "patches": [
                {
                    "target": {"group": child.group, "version": child.version, "kind": child.kind},
                    "patch": json.dumps(ops),
                }
            ],
        }
        # JSON is YAML: the file is written by json.dumps, so no value can change its structure.
        (Path(workdir) / "kustomization.yaml").write_text(json.dumps(kustomization, indent=2))
        output = kustomize_build(Path(workdir))
    objects = [obj for obj in yaml.safe_load_all(output) if obj is not None]
    if [(obj.get("apiVersion"), obj.get("kind")) for obj in objects] != [(child.api_version, child.kind)]:
        raise RenderError(f"{overlay} should build exactly one {child.kind}")
    return dict(objects[0])


def kustomize_build(directory: Path) -> str:
    """The YAML that ``kustomize build directory`` prints, from a ``kustomize`` binary on PATH,
    else from ``kubectl kustomize``.

    Raises:
        RenderError: neither is on PATH, kustomize failed, or it took over 60 s.
    """
    if binary := shutil.which("kustomize"):
        command = [binary, "build", str(directory)]
    elif kubectl := shutil.which("kubectl"):
        command = [kubectl, "kustomize", str(directory)]
    else:
        raise RenderError("neither kustomize nor kubectl is on PATH")
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=KUSTOMIZE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise RenderError(f"{' '.join(command)} took more than {KUSTOMIZE_TIMEOUT_S} s") from None
    if result.returncode != 0:
        raise RenderError(f"{' '.join(command)} failed: {result.stderr.strip()}")
    return result.stdout
