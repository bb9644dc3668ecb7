"""Launchers: how a BertPretrainJob becomes the distributed-training resource that runs it.

Each launcher (``spec.launcher``) names the child kind it creates and its kustomize component
under ``kustomize/components/``, and supplies the job's own patch (RFC 6902 operations) that
:func:`bertjob.render.render` applies on top of the topology's overlay and the components. The
patch is rendered from the jinja2 templates in ``templates/`` (StrictUndefined; every value from the
job goes through ``tojson``), so no value can change its structure. A launcher also names the pod
template that runs the trainer (the data-preparation Job copies it). The child's status is read
by :mod:`bertjob.lifecycle`, the same for every launcher (Kubeflow's JobCondition list). One module
per launcher.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jinja2

from bertjob_api.defaults import DEFAULT_VOLUME
from bertjob_api.spec import Accelerator, JobSpec, SpecError, VolumeSpec

JsonPatch = list[dict[str, Any]]


@dataclass(frozen=True)
class ChildKind:
    """The API resource a launcher creates."""

    group: str
    version: str
    kind: str
    plural: str

    @property
    def api_version(self) -> str:
        """``group/version``, as written in a manifest."""
        return f"{self.group}/{self.version}"


@dataclass(frozen=True)
class PodNames:
    """Names a job's pods refer to, chosen by :mod:`bertjob.render`."""

    config_map: str
    service_account: str
    labels: Mapping[str, str]


class Launcher(Protocol):
    """What :mod:`bertjob.render` and :mod:`bertjob.handlers` need from a launcher."""

    child: ChildKind
    component: str
    """Directory under ``kustomize/components/`` that makes the base's job of this kind the output."""

    def patch(self, spec: JobSpec, *, name: str, pods: PodNames) -> JsonPatch:
        """RFC 6902 operations that turn the built child into this job's child: its name, the
        ConfigMap, labels, image, pod settings, volumes, processes, replicas and runPolicy."""
        ...

    def trainer_template(self, child: Mapping[str, Any]) -> dict[str, Any]:
        """The pod template (``template`` of a replica) of ``child`` whose container runs the trainer."""
        ...


# Extended resource each accelerator's device plugin advertises, one device per process.
DEVICE_RESOURCES: dict[Accelerator, str | None] = {
    "nvidia-gpu": "nvidia.com/gpu",
    "habana-hpu": "habana.ai/gaudi",
    "xeon-cpu": None,
}
TOPOLOGY_OVERLAYS = ("single-node", "multi-node")
_TEMPLATES = jinja2.Environment(
    # templates/ ships inside the package (pyproject: package-data).
    loader=jinja2.FileSystemLoader(Path(__file__).resolve().parents[1] / "templates"),
    undefined=jinja2.StrictUndefined,
    autoescape=False,
    keep_trailing_newline=True,
)


def overlay(spec: JobSpec) -> str:
    """Directory under ``kustomize/overlays/`` for the spec's topology: ``single-node`` for one
    node, else ``multi-node``; an elastic job is always ``multi-node``, whose PyTorchJob Workers
    (and the accelerator components' patches of them) an elastic PyTorchJob runs alone."""
    single = spec.topology.nodes == 1 and spec.elastic is None
    return TOPOLOGY_OVERLAYS[0] if single else TOPOLOGY_OVERLAYS[1]


def render_patch(template: str, **context: Any) -> JsonPatch:
    """The RFC 6902 operations that ``templates/<template>`` renders from ``context``, one JSON
    object per line.

    Raises:
        jinja2.UndefinedError: the template uses a name the context lacks (a bug, not user input).
    """
    text = _TEMPLATES.get_template(template).render(**context)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def job_patch(
    spec: JobSpec,
    name: str,
    fields: Mapping[str, Any],
    replicas: list[dict[str, Any]],
    removed: Sequence[str] = (),
) -> JsonPatch:
    """``templates/job.j2`` for a Kubeflow job: its name, Kueue label and runPolicy, the job-level
    ``fields`` (JSON pointer -> value), each replica (``path``, ``count``, ``trainer``, ``pod``
    from :func:`pod_context`, and ``container`` fields to add, a pointer relative to the
    container each) and, last, the ``removed`` fields (JSON pointers, e.g. a replica the overlay
    made that this job does not run)."""
    job = {
        "name": name,
        "queue_name": spec.queue_name,
        "run_policy": run_policy(spec),
        "fields": dict(fields),
        "replicas": replicas,
        "removed": list(removed),
    }
    return render_patch("job.j2", job=job)


def pod_context(
    spec: JobSpec, pods: PodNames, *, container: str, labels: Mapping[str, str], trainer: bool
) -> dict[str, Any]:
    """What ``templates/pod.j2`` sets on one replica: ``spec.pod``'s settings, and for a pod that
    runs the trainer (``trainer``) its volumes, the ConfigMap and resources. ``container`` is the
    name the kustomize base gives the replica's container (the patch tests it)."""
    pod = spec.pod
    fields: dict[str, Any] = {
        "nodeSelector": dict(pod.node_selector) or None,
        "tolerations": list(pod.tolerations) or None,
        "affinity": pod.affinity,
        "priorityClassName": pod.priority_class_name,
        "schedulerName": pod.scheduler_name,
        "imagePullSecrets": [{"name": secret} for secret in pod.image_pull_secrets] or None,
        "securityContext": pod.security_context,
    }
    # A volume named like the base's emptyDir at /data replaces it; the others are added.
    data = next((volume for volume in spec.volumes if volume.name == DEFAULT_VOLUME.name), None)
    return {
        "container": container,
        "labels": dict(labels),
        "image": spec.image,
        "image_pull_policy": pod.image_pull_policy,
        "env": list(pod.env),
        "service_account": pods.service_account,
        "fields": {key: value for key, value in fields.items() if value is not None},
        "config_map": pods.config_map,
        "resources": resources(spec),
        "data_volume": _volume(data) if data else None,
        "volumes": [_volume(volume) for volume in spec.volumes if volume is not data],
    }


def resources(spec: JobSpec) -> dict[str, Any] | None:
    """The trainer container's ``resources``: ``spec.pod.resources`` plus the accelerator's
    device, one per process unless the limits name it. None when neither is set, which keeps
    the accelerator component's defaults (the Xeon component's CPU and memory requests)."""
    requests = dict(spec.pod.resources.requests)
    limits = dict(spec.pod.resources.limits)
    device = DEVICE_RESOURCES[spec.accelerator]
    if device is not None:
        limits.setdefault(device, spec.topology.processes_per_node)
    if not requests and not limits:
        return None
    return {name: value for name, value in (("requests", requests), ("limits", limits)) if value}


def run_policy(spec: JobSpec) -> dict[str, Any]:
    """Kubeflow's RunPolicy (shared by PyTorchJob and MPIJob) from ``spec.runPolicy``."""
    document = spec.run_policy.model_dump(mode="json", by_alias=True, exclude_none=True)
    policy = document.get("schedulingPolicy")
    if policy is not None and not policy:
        del document["schedulingPolicy"]
    return dict(document)


def _volume(volume: VolumeSpec) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": volume.name, "mountPath": volume.mount_path}
    if volume.read_only:
        mount["readOnly"] = True
    return {"volume": {"name": volume.name, **volume.source}, "mount": mount}


def json_pointer(*parts: str) -> str:
    """An RFC 6901 pointer to the field named by ``parts`` (``/`` in a label key becomes ``~1``)."""
    return "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in parts)


def _registry() -> dict[str, Launcher]:
    # Imported here: the launcher modules import this module's types.
    from bertjob.launchers.mpijob import MPIJobLauncher
    from bertjob.launchers.pytorchjob import PyTorchJobLauncher

    return {"pytorchjob": PyTorchJobLauncher(), "mpijob": MPIJobLauncher()}


LAUNCHERS: dict[str, Launcher] = _registry()


def get(name: str) -> Launcher:
    """The launcher for ``spec.launcher``.

    Raises:
        SpecError: no launcher of that name is implemented.
    """
    try:
        return LAUNCHERS[name]
    except KeyError:
        raise SpecError("<spec>", [("spec.launcher", f"{name} is not implemented")]) from None
