"""BertPretrainJob -> Kubernetes manifests: the job file (with where to report progress), the
optional data-preparation Job and the launcher's child.

The child comes from plain kustomize YAML that works by hand too: ``kustomize/base`` (the trainer pod
and both launchers' jobs), an overlay per topology, a launcher component and an accelerator
component. Each combination of them is built once per process (``kustomize build``, or ``kubectl
kustomize``: :func:`build`, cached) and every job's child is that build with the job's own patch
merged in, in-process (:func:`merge`). The patch is a strategic-merge patch that the launcher
renders from jinja2 templates where every value goes through ``tojson``; it finds replicas by their
key and containers, volumes, volumeMounts and env entries by their name, so reordering the base's
lists cannot make it patch the wrong entry. The other objects are built here as data. No value from
the job is pasted into YAML text, so a field that holds YAML or template syntax comes out verbatim.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from bertjob import launchers
from bertjob.launchers import DELETE, DIRECTIVE, REPLACE, Launcher, PodNames, registry
from bertjob_api.contract import (
    JOB_FILE,
    JOB_LABEL,
    JOB_PATH,
    PERMANENT_EXIT_CODES,
    PREPARE_COMMAND,
    PREPARE_CONTAINER,
    PROGRESS_CA_KEY,
    PROGRESS_URL_KEY,
    TRAINER_MODULE,
    status_path,
)
from bertjob_api.jobfile import dump
from bertjob_api.spec import BertPretrainJob, JobSpec, SpecError, to_document
from bertjob_api.validation import cluster_job, object_size_problems

KUSTOMIZE_DIR_ENV = "BERTJOB_KUSTOMIZE_DIR"
NAME_LABEL = "app.kubernetes.io/name"
COMPONENT_LABEL = "app.kubernetes.io/component"
KUSTOMIZE_TIMEOUT_S = 60
# Exit codes of `python -m bertpretrain prepare` that a retry would not mend (bad input, bad spec).
PREPARE_FATAL_EXIT_CODES = list(PERMANENT_EXIT_CODES)
# The strategic merge's lists merged by a key (as Kubernetes' patchMergeKey, except volumeMounts,
# which Kubernetes merges by mountPath and we by name, as the base's volumes); every other list is
# replaced. A pod's containers are named in full: see merge().
MERGE_KEYS = {
    "containers": "name",
    "volumes": "name",
    "volumeMounts": "name",
    "env": "name",
    # A TrainJob's (Trainer v2 declares both lists as maps by these keys).
    "runtimePatches": "manager",
    "replicatedJobs": "name",
}
COMPLETE_LISTS = frozenset({"containers"})

Component = Literal["config", "prepare", "train"]


class RenderError(RuntimeError):
    """kustomize is missing, it refused the kustomization (its stderr is in the message), or its
    build does not take the job's patch."""


class MergeError(ValueError):
    """A strategic-merge patch that does not fit the object: it names a container the object
    lacks, leaves one out, or carries a directive :func:`merge` does not know."""


def kustomize_dir() -> Path:
    """The ``kustomize/`` tree: ``$BERTJOB_KUSTOMIZE_DIR`` (the operator image sets it), else the
    copy inside the installed package (``bertjob/kustomize``, which the wheel carries: setup.py),
    else the repository's ``kustomize/`` next to ``operator/`` (an editable install)."""
    configured = os.environ.get(KUSTOMIZE_DIR_ENV)
    if configured:
        return Path(configured)
    return _INSTALLED_KUSTOMIZE


# Resolved and looked up once: resolving a path reads each of its directories (it took as long as
# the rest of building a job's child), and every job's child asks for the tree.
_PACKAGE = Path(__file__).resolve().parent
_INSTALLED_KUSTOMIZE = (
    _PACKAGE / "kustomize" if (_PACKAGE / "kustomize").is_dir() else _PACKAGE.parents[1] / "kustomize"
)


def config_map_name(job_name: str) -> str:
    """Name of the ConfigMap that holds a job's ``job.yaml``: ``<job>-job``. Not ``<job>-config``,
    the name mpi-operator gives the hostfile ConfigMap of the MPIJob ``<job>`` (it refuses to start
    an MPIJob whose ConfigMap of that name it does not control)."""
    return f"{job_name}-job"


@dataclass(frozen=True)
class ProgressEndpoint:
    """Where the trainers of the jobs this operator renders report progress (bertjob.progress):
    ``url``, the endpoint's ``https://host:port`` as pods reach it, and ``ca``, the PEM of the CA
    that signed its certificate."""

    url: str
    ca: str

    def job_url(self, namespace: str, name: str) -> str:
        """The URL one job's trainer POSTs its reports to."""
        return self.url.rstrip("/") + status_path(namespace, name)


def job_labels(job_name: str, component: Component | None = None) -> dict[str, str]:
    """Labels on every object rendered for a job (and on its pods); ``component`` says which
    part of the job the object is (:func:`component`)."""
    labels = {NAME_LABEL: "bertjob", JOB_LABEL: job_name}
    if component is not None:
        labels[COMPONENT_LABEL] = component
    return labels


def component(obj: Mapping[str, Any]) -> str:
    """Which part of a job a rendered object is, from its ``app.kubernetes.io/component`` label:
    ``config`` (the ConfigMap), ``prepare`` (the data-preparation Job) or ``train`` (the
    launcher's child); ``""`` for an object without it."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return str(labels.get(COMPONENT_LABEL, ""))


def render(job: BertPretrainJob, progress: ProgressEndpoint | None = None) -> list[dict[str, Any]]:
    """The manifests for ``job``, in the order they are to be created:

    1. the ConfigMap ``<name>-job`` holding ``job.yaml`` (the whole job document after defaults)
       and, with ``progress``, the job's report URL and the endpoint's CA (``progress-url``,
       ``progress-ca.crt``: bertjob_api.contract), which the trainer reads beside ``job.yaml``;
    2. with ``spec.prepare.enabled``, the batch/v1 Job ``<name>-prepare`` (``python -m bertpretrain
       prepare``) in the trainer's pod, with ``spec.prepare.resources``;
    3. the launcher's child ``<name>`` (a PyTorchJob, an MPIJob or a TrainJob).

    No RBAC: the pods run as ``spec.pod.serviceAccountName`` (else the namespace's ``default``)
    and report progress to the operator with a projected token, which needs none.

    Each carries :func:`job_labels` with its :func:`component`. The objects of :func:`rendered`,
    which checks the job first and each object's size after.

    Raises:
        SpecError: the spec is inconsistent, names a launcher that does not exist, or makes an
            object larger than the API server stores.
        RenderError: no kustomize/kubectl on PATH, kustomize failed, or its build does not take
            the job's patch.
    """
    return rendered(job, progress=progress).objects


@dataclass(frozen=True)
class Rendered:
    """A job as the operator runs it (defaults applied, every check passed) and its manifests."""

    job: BertPretrainJob
    objects: list[dict[str, Any]]


def rendered(
    job: BertPretrainJob, source: str | None = None, progress: ProgressEndpoint | None = None
) -> Rendered:
    """``job`` checked as the operator checks it before creating anything, and its manifests
    (:func:`render`): :func:`bertjob_api.validation.cluster_job` (defaults and every check of the
    spec), then the objects are built and each is refused when its JSON exceeds what the API server
    can store (:func:`bertjob_api.validation.object_size_problems`, naming the field that makes it
    large). The one check of ``bertjob validate``, the admission webhook and the operator's
    handlers, so that a job none of them refuses is one the API server takes. ``source`` names the
    job in a :class:`SpecError` (default ``namespace/name``); ``progress`` as :func:`render`.

    Raises:
        SpecError, RenderError: as :func:`render`.
    """
    name, namespace = job.metadata.name, job.metadata.namespace
    source = source or f"{namespace}/{name}"
    job = cluster_job(job, source)
    spec = job.spec
    launcher = registry.get(spec.launcher)
    pods = PodNames(config_map_name(name), spec.pod.service_account_name, job_labels(name, "train"))
    document = to_document(job)
    # The trainer reads it as kubectl would: strings go-yaml reads otherwise are quoted.
    data = {JOB_FILE: dump(document)}
    if progress is not None:
        data |= {PROGRESS_URL_KEY: progress.job_url(namespace, name), PROGRESS_CA_KEY: progress.ca}
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(name, namespace, config_map_name(name), "config"),
        "data": data,
    }
    objects: list[dict[str, Any]] = [config_map]
    child = _build_child(job, launcher, pods)
    if spec.prepare.enabled:
        objects.append(_prepare_job(name, namespace, spec, launcher.trainer_template(child)))
    objects.append(child)
    problems = object_size_problems(document, objects)
    if problems:
        raise SpecError(source, problems)
    return Rendered(job, objects)


def _meta(job_name: str, namespace: str, name: str, part: Component) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": job_labels(job_name, part)}


def _prepare_job(name: str, namespace: str, spec: JobSpec, trainer: Mapping[str, Any]) -> dict[str, Any]:
    """The data stage as a batch/v1 Job in a copy of the trainer's pod (same image, volumes, env,
    security and scheduling, and ``spec.pod.annotations``), with ``spec.prepare.resources``
    instead of the trainer's devices and the labels of the ``prepare`` component over
    ``spec.pod.labels``."""
    template = copy.deepcopy(dict(trainer))
    # Not the trainer's labels, which name the train component (and a launcher's own keys): the
    # user's, whose keys the spec keeps apart from the operator's, then the operator's.
    template.setdefault("metadata", {})["labels"] = {**spec.pod.labels, **job_labels(name, "prepare")}
    pod = template["spec"]
    [container] = pod["containers"]
    for field in ("args", "ports", "resources"):
        container.pop(field, None)
    container.update(
        name=PREPARE_CONTAINER,
        command=["python", "-m", TRAINER_MODULE, PREPARE_COMMAND, "--config", JOB_PATH],
    )
    prepare = spec.prepare.resources
    limits = {"requests": dict(prepare.requests), "limits": dict(prepare.limits)}
    if any(limits.values()):
        container["resources"] = {key: value for key, value in limits.items() if value}
    # Never restarted in place: the Job's backoffLimit retries, except for the exit codes of a bad
    # spec or corpus, which fail it at once; a preempted pod does not count as a failure.
    pod["restartPolicy"] = "Never"
    job_spec: dict[str, Any] = {
        "suspend": spec.run_policy.suspend,
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {
                        "containerName": PREPARE_CONTAINER,
                        "operator": "In",
                        "values": PREPARE_FATAL_EXIT_CODES,
                    },
                },
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            ]
        },
        "template": template,
    }
    if spec.run_policy.backoff_limit is not None:
        job_spec["backoffLimit"] = spec.run_policy.backoff_limit
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(name, namespace, f"{name}-prepare", "prepare"),
        "spec": job_spec,
    }


def _build_child(job: BertPretrainJob, launcher: Launcher, pods: PodNames) -> dict[str, Any]:
    root = kustomize_dir()
    parts = (launchers.overlay(job.spec), launcher.component, job.spec.accelerator)
    built = build(root, *parts)
    child = launcher.child
    if (built.get("apiVersion"), built.get("kind")) != (child.api_version, child.kind):
        raise RenderError(f"{root} should build exactly one {child.kind}")
    name, namespace = job.metadata.name, job.metadata.namespace
    patch = launcher.patch(job.spec, name=name, namespace=namespace, pods=pods)
    try:
        return launcher.finish(job.spec, dict(merge(built, patch)))
    except MergeError as error:
        raise RenderError(
            f"the kustomize build of {root} {parts} does not take the job's patch: {error}"
        ) from None


def build(root: Path, overlay: str, launcher_component: str, accelerator: str) -> dict[str, Any]:
    """The one object that kustomize builds from ``overlays/<overlay>`` with the components
    ``<launcher_component>`` and ``<accelerator>`` of the kustomize tree ``root``: a fresh copy of
    the build cached for this process (:func:`cached_build`), which the caller may change.

    Raises:
        RenderError: a directory has no kustomization, kustomize is missing or failed, or it
            built other than one object.
    """
    with _BUILDING:
        text = cached_build(_resolved(root), overlay, launcher_component, accelerator)
    return dict(json.loads(text))


# One build at a time: the operator's worker threads that render their first jobs at once would
# otherwise each run kustomize for the same combination (functools.cache does not wait for a call
# under way); once built, holding it is one cache lookup.
_BUILDING = threading.Lock()


@functools.lru_cache(maxsize=64)
def _resolved(root: Path) -> Path:
    """``root.resolve()``, once per process and path (a tree moved under the path is read by the
    next process, as :func:`cached_build` reads a changed tree)."""
    return root.resolve()


@functools.cache
def cached_build(root: Path, overlay: str, launcher_component: str, accelerator: str) -> str:
    """:func:`build`'s object as JSON text, built once per process and combination (a failure is
    not cached, and is tried again by the next call). The cache reads no file twice: a changed
    kustomize tree is read by the next process, or after ``cached_build.cache_clear()``."""
    parts = [
        root / "overlays" / overlay,
        *(root / "components" / name for name in (launcher_component, accelerator)),
    ]
    for part in parts:
        if not (part / "kustomization.yaml").is_file():
            raise RenderError(f"no kustomization in {part} (set {KUSTOMIZE_DIR_ENV})")
    with tempfile.TemporaryDirectory(prefix="bertjob-") as workdir:
        # kustomize accepts directories outside the kustomization's root, given relatively.
        relative = [os.path.relpath(part, Path(workdir).resolve()) for part in parts]
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": relative[:1],
            "components": relative[1:],
        }
        (Path(workdir) / "kustomization.yaml").write_text(json.dumps(kustomization, indent=2))
        output = kustomize_build(Path(workdir))
    objects = [obj for obj in yaml.safe_load_all(output) if obj is not None]
    if len(objects) != 1:
        raise RenderError(
            f"{root} should build exactly one object from {overlay}, {launcher_component}, {accelerator}"
        )
    return json.dumps(objects[0])


def merge(original: Any, patch: Any, field: str = "") -> Any:
    """``original`` with the strategic-merge ``patch`` applied, as Kubernetes' strategic merge
    does for the keys our patches use; neither argument is changed (a new object shares parts of
    both).

    - A mapping merges key by key into the original's (a missing one counts as empty); a key
      whose value is null is removed. A mapping with ``{"$patch": "replace"}`` replaces the
      original's as it is, without the directive, and nothing inside it is read as a directive.
    - A list under a key of :data:`MERGE_KEYS` merges entry by entry by that key (``name``): an
      entry the original has is merged in its place, another is added at the end, in the patch's
      order; entries the patch leaves out stay as they are, and an entry ``{"name": ...,
      "$patch": "delete"}`` removes the original's of that name (if any). Under ``containers``
      the patch must name each of the original's containers and no other (a base that renamed its
      container, which kustomize's replacements then add beside it, would otherwise run without its
      command).
    - Any other list, and any scalar, replaces the original's.

    Raises:
        MergeError: a container list that does not match, a merge-key list entry without its key,
            or an unknown ``$patch`` directive.
    """
    if isinstance(patch, Mapping):
        if DIRECTIVE in patch:
            if patch[DIRECTIVE] != REPLACE:
                raise MergeError(
                    f"unknown directive {DIRECTIVE}: {patch[DIRECTIVE]!r} under {field or 'the root'}"
                )
            return {key: value for key, value in patch.items() if key != DIRECTIVE}
        result = dict(original) if isinstance(original, Mapping) else {}
        for key, value in patch.items():
            if value is None:
                result.pop(key, None)
            else:
                result[key] = merge(result.get(key), value, key)
        return result
    if isinstance(patch, list) and field in MERGE_KEYS:
        return _merge_list(original if isinstance(original, list) else [], patch, field)
    return patch


def _merge_list(original: list[Any], patch: list[Any], field: str) -> list[Any]:
    key = MERGE_KEYS[field]
    result = list(original)
    where = {entry.get(key): index for index, entry in enumerate(result) if isinstance(entry, Mapping)}
    for entry in patch:
        if not isinstance(entry, Mapping) or key not in entry:
            raise MergeError(f"an entry of {field} without its {key}: {entry!r}")
        index = where.get(entry[key])
        if entry.get(DIRECTIVE) == DELETE and field not in COMPLETE_LISTS:
            if index is not None:
                del result[index]
                where = {name: at - (at > index) for name, at in where.items() if at != index}
            continue
        if index is not None:
            result[index] = merge(result[index], entry, field)
        elif field in COMPLETE_LISTS:
            raise MergeError(f"{field} has no {key} {entry[key]!r} (it has {sorted(where, key=str)})")
        else:
            where[entry[key]] = len(result)
            result.append(merge(None, entry, field))
    if field in COMPLETE_LISTS and len(patch) != len(result):
        named = {entry[key] for entry in patch}
        raise MergeError(f"{field} has {sorted(set(where) - named, key=str)} besides {sorted(named)}")
    return result


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
