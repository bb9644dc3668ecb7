"""Launchers: how a BertPretrainJob becomes the distributed-training resource that runs it.

Each launcher (``spec.launcher``) names the child kind it creates, picks a kustomize overlay
under ``kustomize/overlays/`` for the job's topology, and supplies the job's own patch (RFC 6902
operations, built as data) that :func:`bertjob.render.render` applies on top of that overlay. It
also reads the child's status back, so that the operator can mirror it. One module per launcher;
``mpijob`` is refused by :mod:`bertjob.validation` until it has one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from bertjob.spec import JobSpec, SpecError

JsonPatch = list[dict[str, Any]]
ChildPhase = Literal["Running", "Succeeded", "Failed"]


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
class ChildState:
    """Where a child job stands, in the BertPretrainJob's terms."""

    phase: ChildPhase
    reason: str
    message: str


class Launcher(Protocol):
    """What :mod:`bertjob.render` and :mod:`bertjob.handlers` need from a launcher."""

    child: ChildKind

    def overlay(self, spec: JobSpec) -> str:
        """Name of the directory under ``kustomize/overlays/`` that fits the spec's topology."""
        ...

    def patch(self, spec: JobSpec, *, name: str, config_map: str, labels: Mapping[str, str]) -> JsonPatch:
        """RFC 6902 operations that turn the overlay's child into this job's child: its name,
        the ConfigMap holding the job file, pod labels, image, processes and replicas."""
        ...

    def state(self, child: Mapping[str, Any]) -> ChildState | None:
        """The child's phase from its status; None while nothing has happened yet."""
        ...


def json_pointer(*parts: str) -> str:
    """An RFC 6901 pointer to the field named by ``parts`` (``/`` in a label key becomes ``~1``)."""
    return "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in parts)


def kubeflow_state(status: Mapping[str, Any]) -> ChildState | None:
    """Read a Kubeflow training job's ``status.conditions`` (the JobCondition list shared by
    PyTorchJob and MPIJob): a true Succeeded or Failed condition wins over Running."""
    current = {
        condition.get("type"): condition
        for condition in status.get("conditions") or []
        if isinstance(condition, Mapping) and condition.get("status") == "True"
    }
    for phase in ("Succeeded", "Failed", "Running"):
        if phase in current:
            condition = current[phase]
            return ChildState(phase, str(condition.get("reason", "")), str(condition.get("message", "")))
    return None


def _registry() -> dict[str, Launcher]:
    # Imported here: the launcher modules import this module's types.
    from bertjob.launchers.pytorchjob import PyTorchJobLauncher

    return {"pytorchjob": PyTorchJobLauncher()}


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
