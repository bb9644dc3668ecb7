"""The BertPretrainJob CustomResourceDefinition, generated from the pydantic models.

``spec`` is :class:`bertjob_api.spec.JobSpec`'s JSON Schema turned into the structural OpenAPI v3
subset the API server accepts: ``$ref`` inlined, titles dropped, ``Optional[X]`` as plain ``X``
(not required), ``Literal`` as ``enum``, JSON Schema 2020's numeric ``exclusiveMinimum: x`` as
OpenAPI 3.0's ``minimum: x, exclusiveMinimum: true``. ``status`` is :class:`JobStatus`, which
the operator writes. The CEL rules (``x-kubernetes-validations``) that the API server checks
across fields come with the models' JSON Schema, each on the object it reads
(:mod:`bertjob_api.spec.cel` says which checks they restate and what keeps them within the API
server's cost budget); :func:`structural` copies them, as every ``x-kubernetes-*`` keyword.
``manifests/crd.yaml`` is this module's output (``python -m bertjob_api.crd``), and a test checks
that it is up to date, so that the CRD cannot drift from the spec.
The Helm chart's ``templates/crd.yaml`` is the same CRD wrapped in the chart's switches
(:func:`chart_template`, ``python -m bertjob_api.crd --chart-template``); ``hack/generate-manifests.sh``
writes it, and ``manifests/crd.yaml`` is what Helm renders from it.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from bertjob_api.contract import GROUP, KIND, PLURAL, VERSION
from bertjob_api.spec import JobSpec

Phase = Literal["Pending", "Preparing", "Running", "Succeeded", "Failed", "Suspended"]
ConditionType = Literal[
    "Created",
    "Preparing",
    "Prepared",
    "Running",
    "Restarting",
    "Suspended",
    "Succeeded",
    "Failed",
    "SpecChangeRefused",
    "Ready",
    "Reconciling",
    "Stalled",
]


class _Status(BaseModel):
    # Not strict: status comes back from the API server as JSON, timestamps as strings.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class Condition(_Status):
    """One observation of the job, in the shape Kubernetes conditions share."""

    type: ConditionType = Field(
        description="Created (children created), Preparing/Prepared (the data Job), Running, "
        "Restarting, Suspended, Succeeded or Failed (mirrored from the child, or a bad spec), "
        "SpecChangeRefused (a change that cannot be applied to a running job); Ready, Reconciling "
        "and Stalled (kstatus, derived from the others: docs/operator.md, Status for GitOps tools)."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason, e.g. InvalidSpec.")
    message: str = Field("", description="For people; names the field at fault for a bad spec.")
    last_transition_time: datetime = Field(description="When the condition last changed.")


class ChildRef(_Status):
    """A resource the job was rendered into."""

    api_version: str = Field(description="e.g. kubeflow.org/v1.")
    kind: str = Field(description="e.g. PyTorchJob.")
    name: str = Field(description="Name, in the job's namespace.")


class Progress(_Status):
    """Training progress, reported by the trainer's rank 0 at each logging step: the phase and
    step, and the log values of :data:`bertjob_api.contract.PROGRESS_FIELDS` under their names."""

    phase: int = Field(ge=1, description="Training phase (1 or 2).")
    step: int = Field(ge=0, description="Optimizer steps done in this phase.")
    total_steps: int = Field(ge=1, description="Optimizer steps in this phase.")
    loss: float | None = Field(None, description="Training loss (masked LM + NSP) at the last logging step.")
    mlm_accuracy: float | None = Field(None, description="Masked-LM accuracy at the last logging step.")
    sequences_per_second: float | None = Field(None, description="Training throughput, all ranks together.")
    budget_left_seconds: float | None = Field(
        None, description="With spec.budget: the phase's time left at its calibrated speed, in seconds."
    )
    update_time: datetime = Field(description="When the trainer reported this.")


class TaskResult(_Status):
    """One fine-tuning task's outcome (spec.finetune), reported by the trainer's rank 0 when the
    task ends; the figures are also in finetune.json with each seed's."""

    task: str = Field(description="The task's name.")
    metric: str = Field(description="The headline metric: the first of the task's metrics.")
    median: float = Field(description="Its median over the seeds (fractions; SQuAD's in percent).")
    best: float = Field(description="Its best over the seeds.")
    seeds: int = Field(ge=1, description="Runs with different seeds.")
    metrics: dict[str, float] = Field(
        default_factory=dict, description="The median of every metric of the task."
    )
    baseline: float | None = Field(
        None, description="The headline metric's median fine-tuned from random weights (spec baseline)."
    )
    summary: str = Field(description="One line for kubectl get, e.g. 'mrpc accuracy 0.842 (3 seeds)'.")


class PendingEvent(_Status):
    """An Event about the job, recorded with the change it reports, until the operator posts it."""

    type: Literal["Normal", "Warning"] = Field(description="Normal or Warning.")
    reason: str = Field(description="CamelCase reason: the new phase, or why the job failed.")
    message: str = Field("", description="For people.")
    time: datetime = Field(description="When the change it reports was written.")


class JobStatus(_Status):
    """``status`` of a BertPretrainJob, written by the operator (``progress`` by the trainer)."""

    phase: Phase | None = Field(
        None, description="Pending, Preparing, Running, Succeeded, Failed or Suspended."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Latest condition of each type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    children: list[ChildRef] = Field(
        default_factory=list, description="The data-preparation Job, if any, and the training job."
    )
    config_map: str | None = Field(None, description="The ConfigMap holding job.yaml.")
    observed_generation: int | None = Field(None, description="The spec generation the status describes.")
    start_time: datetime | None = Field(None, description="When the children were created.")
    completion_time: datetime | None = Field(None, description="When the job succeeded or failed.")
    progress: Progress | None = Field(None, description="Live training progress from the trainer.")
    results: list[TaskResult] = Field(
        default_factory=list, description="Fine-tuning results from the trainer, one per task, in spec order."
    )
    pending_events: dict[str, PendingEvent] = Field(
        default_factory=dict,
        description="Events not yet posted, by the name they are posted under (so never twice).",
    )


# Keywords that mean the same in JSON Schema 2020 and the API server's OpenAPI v3 subset.
_SAME = {
    "type",
    "description",
    "required",
    "enum",
    "default",
    "format",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "maxProperties",
}


_FIRST = {"type": 0, "description": 1}


def structural(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    """Convert a pydantic JSON Schema node into a structural OpenAPI v3 schema.

    ``defs`` is the document's ``$defs``. A field's own description wins over its class's.

    Raises:
        ValueError: a keyword or union the API server's schema cannot express.
    """
    node = dict(schema)
    if "$ref" in node:
        target = defs[node.pop("$ref").removeprefix("#/$defs/")]
        return structural({**target, **node}, defs)
    if "anyOf" in node:
        variants = [variant for variant in node.pop("anyOf") if variant != {"type": "null"}]
        if len(variants) != 1:
            raise ValueError(f"cannot express the union {variants} in a structural schema")
        if node.get("default", ...) is None:
            del node["default"]
        return structural({**variants[0], **node}, defs)

    result: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" or (key == "additionalProperties" and value is False):
            # Unknown fields are pruned, or refused under strict field validation, anyway.
            continue
        if key in _SAME:
            result[key] = value.replace("``", "") if key == "description" else value
        elif key == "const":
            result["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            result["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            result[key] = True
        elif key == "properties":
            result[key] = {name: structural(sub, defs) for name, sub in value.items()}
        elif key in ("items", "additionalProperties"):
            result[key] = structural(value, defs)
        elif key.startswith("x-kubernetes-"):
            result[key] = value
        else:
            raise ValueError(f"cannot express the JSON Schema keyword {key!r} in a structural schema")
    # type and description first, the rest alphabetically: the order `kubectl explain` readers expect.
    return dict(sorted(result.items(), key=lambda item: (_FIRST.get(item[0], len(_FIRST)), item[0])))


def _model_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True, mode="validation")
    return structural(schema, schema.pop("$defs", {}))


def resource_schema() -> dict[str, Any]:
    """The ``openAPIV3Schema`` of a BertPretrainJob."""
    return {
        "type": "object",
        "description": "BERT pretraining as one resource: the operator renders it into a ConfigMap "
        "with the job file and a Kubeflow training job, and reports progress in status.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "bertjob.dev/v1alpha1."},
            "kind": {"type": "string", "description": "BertPretrainJob."},
            # ObjectMeta is validated by the API server itself.
            "metadata": {"type": "object"},
            "spec": _model_schema(JobSpec),
            "status": _model_schema(JobStatus),
        },
    }


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition (apiextensions.k8s.io/v1) as a dict."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["bpj"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": resource_schema()},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Status", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Launcher", "type": "string", "jsonPath": ".spec.launcher"},
                        {"name": "Nodes", "type": "integer", "jsonPath": ".spec.topology.nodes"},
                        # Not "Phase": Status is the job's status.phase; this is the training's.
                        {"name": "Training-Phase", "type": "integer", "jsonPath": ".status.progress.phase"},
                        {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
                        {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss"},
                        {
                            "name": "Seq/s",
                            "type": "number",
                            "jsonPath": ".status.progress.sequencesPerSecond",
                        },
                        {"name": "Result", "type": "string", "jsonPath": ".status.results[0].summary"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }


HEADER = "# Generated from api/bertjob_api/spec/ by `python -m bertjob_api.crd`; do not edit.\n"


def crd_yaml() -> str:
    """The CRD as the YAML text committed in ``manifests/crd.yaml``."""
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=100)


CHART_HEADER = (
    "{{- /* Generated from api/bertjob_api/spec/ by `python -m bertjob_api.crd --chart-template`"
    " (make generate); do not edit. */ -}}\n"
)


def escape_template(text: str) -> str:
    """``text`` as a Go template that renders back to ``text``: every ``{{`` becomes an action
    printing ``{{``, so that a description quoting template syntax stays text in the chart."""
    return text.replace("{{", '{{ "{{" }}')


def _block(obj: Mapping[str, Any]) -> str:
    return escape_template(yaml.safe_dump(dict(obj), sort_keys=False, width=100))


def chart_template(definition: Mapping[str, Any] | None = None) -> str:
    """The chart's ``templates/crd.yaml``: the CRD (default: :func:`crd`) rendered only when
    ``crds.install`` is true, labelled like the chart's other objects, and annotated
    ``helm.sh/resource-policy: keep`` when ``crds.keep`` is true, so that ``helm uninstall`` does not
    delete every BertPretrainJob with it.

    The CRD sits in ``templates/`` rather than Helm's ``crds/``, which Helm installs once and never
    upgrades, so that ``helm upgrade`` brings the schema up to date with the operator.
    """
    definition = crd() if definition is None else definition
    head = {key: definition[key] for key in ("apiVersion", "kind")}
    metadata = textwrap.indent(_block({"name": definition["metadata"]["name"]}), "  ")
    body = {key: value for key, value in definition.items() if key not in (*head, "metadata")}
    return (
        CHART_HEADER
        + "{{- if .Values.crds.install }}\n"
        + _block(head)
        + "metadata:\n"
        + metadata
        + "  labels:\n"
        + '    {{- include "bertjob.labels" . | nindent 4 }}\n'
        + "  {{- if .Values.crds.keep }}\n"
        + "  annotations:\n"
        + "    helm.sh/resource-policy: keep\n"
        + "  {{- end }}\n"
        + _block(body)
        + "{{- end }}\n"
    )


def main(argv: list[str]) -> int:
    """``python -m bertjob_api.crd``: print the CRD; with ``--chart-template``, the chart's template."""
    if argv not in ([], ["--chart-template"]):
        print("usage: python -m bertjob_api.crd [--chart-template]", file=sys.stderr)
        return 2
    print(chart_template() if argv else crd_yaml(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
