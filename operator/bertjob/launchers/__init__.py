"""Launchers: how a BertPretrainJob becomes the distributed-training resource that runs it.

Each launcher (``spec.launcher``) names the child kind it creates and its kustomize component
under ``kustomize/components/``, and supplies the job's own patch, a strategic-merge patch that
:func:`bertjob.render.render` merges into the build of the topology's overlay and the components
(:func:`bertjob.render.merge`: replicas are found by their key, containers, volumes, volumeMounts
and env entries by their name, never by their position in the base's lists). The patch is rendered
from the jinja2 templates in ``templates/`` (StrictUndefined; every value from the job goes through
``tojson``), so no value can change its structure. A launcher also names the pod template that
runs the trainer (the data-preparation Job copies it), how its status reads as the job's conditions
(:mod:`bertjob.lifecycle`: Kubeflow's JobCondition list, or Trainer v2's TrainJob status) and which
run-policy changes reach it while it runs. One module per launcher, and
:mod:`bertjob.launchers.registry` to find one by ``spec.launcher`` or by the child's kind.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import jinja2

from bertjob import changes, lifecycle
from bertjob_api.contract import JOB_CONFIG_VOLUME
from bertjob_api.crd import Condition
from bertjob_api.spec import Accelerator, JobSpec, VolumeSpec

MergePatch = dict[str, Any]
# Kubernetes' strategic-merge directive: a mapping that carries {"$patch": "replace"} replaces the
# base's mapping instead of merging into it, and an entry of a list merged by name that carries
# {"$patch": "delete"} removes the base's entry of that name (bertjob.render.merge).
DIRECTIVE = "$patch"
REPLACE = "replace"
DELETE = "delete"


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
    """Names a job's pods refer to, chosen by :mod:`bertjob.render`; ``service_account`` None
    leaves the pods on their namespace's ``default`` account."""

    config_map: str
    service_account: str | None
    labels: Mapping[str, str]


class Launcher(Protocol):
    """What :mod:`bertjob.render` and :mod:`bertjob.handlers` need from a launcher."""

    child: ChildKind
    component: str
    """Directory under ``kustomize/components/`` that makes the base's job of this kind the output."""

    def patch(self, spec: JobSpec, *, name: str, namespace: str, pods: PodNames) -> MergePatch:
        """The strategic-merge patch that turns the built child into this job's child: its name,
        namespace and labels, the ConfigMap, image, pod settings, volumes, processes, replicas and
        runPolicy."""
        ...

    def trainer_template(self, child: Mapping[str, Any]) -> dict[str, Any]:
        """The pod template (``template`` of a replica) of ``child`` whose container runs the trainer."""
        ...

    def finish(self, spec: JobSpec, child: dict[str, Any]) -> dict[str, Any]:
        """``child`` (the build with :meth:`patch` merged in) completed with what is made from the
        merged object itself; returns a new object or ``child`` unchanged."""
        ...

    safe_fields: tuple[str, ...]
    """The fields of ``spec.runPolicy`` (dotted paths) applied to a running child; other changes
    are refused (:mod:`bertjob.changes`)."""

    def policy_patch(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """The merge patch that writes ``fields`` (fields of ``spec.runPolicy`` among
        :attr:`safe_fields`, by name, as :func:`bertjob.changes.to_write` gives them; None removes
        one) into the child; {} for none."""
        ...

    def suspended(self, child_spec: object) -> bool:
        """Whether the child's ``spec`` (as read back) holds it suspended."""
        ...

    def conditions(self, child_status: Mapping[str, Any], at: datetime) -> list[Condition]:
        """The child's ``status`` as the job's own conditions (:mod:`bertjob.lifecycle`); a time the
        child does not give reads as ``at``."""
        ...

    def has_conditions(self, child_status: Mapping[str, Any]) -> bool:
        """Whether :meth:`conditions` finds anything in ``child_status``, without building them (a
        filter run on kopf's event loop for every event of every training job)."""
        ...


class KubeflowJob:
    """What the training operator's PyTorchJob and mpi-operator's MPIJob share: Kubeflow's
    ``runPolicy`` and JobCondition list."""

    safe_fields = changes.SAFE_FIELDS

    def finish(self, spec: JobSpec, child: dict[str, Any]) -> dict[str, Any]:
        """``child`` as it is: the patch makes all of a Kubeflow job."""
        return child

    def policy_patch(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """:func:`bertjob.changes.training_patch`: ``fields`` into the child's ``runPolicy``."""
        return changes.training_patch(fields)

    def suspended(self, child_spec: object) -> bool:
        """Whether the child's ``runPolicy.suspend`` is true."""
        return changes.suspended(child_spec)

    def conditions(self, child_status: Mapping[str, Any], at: datetime) -> list[Condition]:
        """:func:`bertjob.lifecycle.child_conditions`."""
        return lifecycle.child_conditions(child_status, at)

    def has_conditions(self, child_status: Mapping[str, Any]) -> bool:
        """:func:`bertjob.lifecycle.has_child_conditions`."""
        return lifecycle.has_child_conditions(child_status)


# Extended resource each accelerator's device plugin advertises, one device per process.
DEVICE_RESOURCES: dict[Accelerator, str | None] = {
    "nvidia-gpu": "nvidia.com/gpu",
    "habana-hpu": "habana.ai/gaudi",
    "xeon-cpu": None,
}
TOPOLOGY_OVERLAYS = ("single-node", "multi-node")


def whole(value: Any) -> Any:
    """``value`` marked to replace what the base holds in its place rather than merge into it: a
    mapping gains ``{"$patch": "replace"}`` (unless it carries a directive of its own, such as the
    operator's ``delete`` of an env entry); anything else (a list without a merge key, a scalar)
    replaces it anyway. The template filter ``whole``; values from the job never carry the
    directive themselves (each is checked against its Kubernetes schema, unknown fields refused)."""
    return {DIRECTIVE: REPLACE, **value} if isinstance(value, Mapping) else value


_TEMPLATES = jinja2.Environment(
    # templates/ ships inside the package (pyproject: package-data).
    loader=jinja2.FileSystemLoader(Path(__file__).resolve().parents[1] / "templates"),
    undefined=jinja2.StrictUndefined,
    autoescape=False,
    keep_trailing_newline=True,
    # The package's templates do not change while it runs: no stat of the file per render.
    auto_reload=False,
)
_TEMPLATES.filters["whole"] = whole


def overlay(spec: JobSpec) -> str:
    """Directory under ``kustomize/overlays/`` for the spec's topology: ``single-node`` for one
    node, else ``multi-node``; an elastic job is always ``multi-node``, whose PyTorchJob Workers
    (and the accelerator components' patches of them) an elastic PyTorchJob runs alone."""
    single = spec.topology.nodes == 1 and spec.elastic is None
    return TOPOLOGY_OVERLAYS[0] if single else TOPOLOGY_OVERLAYS[1]


def render_patch(template: str, **context: Any) -> MergePatch:
    """The strategic-merge patch that ``templates/<template>`` renders from ``context`` (one JSON
    document).

    Raises:
        jinja2.UndefinedError: the template uses a name the context lacks (a bug, not user input).
    """
    patch = json.loads(_TEMPLATES.get_template(template).render(**context))
    assert isinstance(patch, dict), template
    return patch


def job_patch(
    spec: JobSpec,
    *,
    name: str,
    namespace: str,
    pods: PodNames,
    replica_specs: str,
    fields: Mapping[str, Any],
    replicas: list[dict[str, Any]],
    removed: Sequence[str] = (),
) -> MergePatch:
    """``templates/job.j2`` for a Kubeflow job: its name, namespace, labels (``pods.labels`` and
    the Kueue queue) and runPolicy, the fields of ``spec`` (``fields``, each replacing the base's),
    and in ``spec.<replica_specs>`` each replica by its key (``name``, ``count``, ``trainer``,
    ``pod`` from :func:`pod_context`, and ``container`` fields that replace the base's) and
    ``removed``, the replicas the overlay made that this job does not run."""
    labels = dict(pods.labels)
    if spec.queue_name is not None:
        labels["kueue.x-k8s.io/queue-name"] = spec.queue_name
    job = {
        "name": name,
        "namespace": namespace,
        "labels": labels,
        "run_policy": run_policy(spec),
        "fields": dict(fields),
        "replica_specs": replica_specs,
        "replicas": [*replicas, *({"name": gone, "removed": True} for gone in removed)],
    }
    return render_patch("job.j2", job=job)


def pod_context(
    spec: JobSpec, pods: PodNames, *, container: str, labels: Mapping[str, str], trainer: bool
) -> dict[str, Any]:
    """What ``templates/pod.j2`` sets on one replica: ``spec.pod``'s settings, and for a pod that
    runs the trainer (``trainer``) its volumes, the ConfigMap and resources. ``container`` is the
    name the kustomize base gives the replica's container, which the patch finds it by. The pod's
    labels are ``spec.pod.labels`` with ``labels`` (the operator's) over them, and its annotations
    ``spec.pod.annotations``; the spec refuses a label key of the operator's or of the controllers'
    (:func:`bertjob_api.spec.cluster.reserved_pod_label`), and ``labels`` win should one get by."""
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
    return {
        "container": container,
        "labels": {**pod.labels, **labels},
        "annotations": dict(pod.annotations),
        "image": spec.image,
        "image_pull_policy": pod.image_pull_policy,
        "env": list(pod.env),
        "service_account": pods.service_account,
        "fields": {key: value for key, value in fields.items() if value is not None},
        "config_volume": JOB_CONFIG_VOLUME,
        "config_map": pods.config_map,
        "resources": resources(spec),
        # By name: one named like a base volume (`data`, the emptyDir at /data) replaces it in
        # place, the others are added after the base's.
        "volumes": [_volume(volume) for volume in spec.volumes],
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
