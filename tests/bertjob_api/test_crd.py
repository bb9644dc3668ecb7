"""The generated CRD: committed, structural, and agreeing with the pydantic spec."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from bertjob_api.crd import (
    ChildRef,
    Condition,
    JobStatus,
    chart_template,
    crd,
    crd_yaml,
    escape_template,
    structural,
)
from bertjob_api.spec import SpecError, parse_job
from bertjob_testing.jobs import DELETE, REPO, example, valid_job, with_value
from tests.k8s_schema import assert_valid, errors

CHART_TEMPLATE = REPO / "charts" / "bertjob" / "templates" / "crd.yaml"
MANIFEST = REPO / "manifests" / "crd.yaml"


def test_the_chart_template_is_the_generated_one() -> None:
    assert CHART_TEMPLATE.read_text() == chart_template(), (
        "charts/bertjob/templates/crd.yaml is stale: regenerate it with `make generate`"
    )


def test_the_manifest_is_the_generated_crd() -> None:
    # manifests/crd.yaml is Helm's rendering of the chart template (tests/charts/test_generate.py
    # holds it to that); here, without helm, that it still carries the spec's CRD unchanged.
    [manifest] = [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]
    generated = crd()
    assert {key: manifest[key] for key in ("apiVersion", "kind", "spec")} == {
        key: generated[key] for key in ("apiVersion", "kind", "spec")
    }
    assert manifest["metadata"]["name"] == generated["metadata"]["name"]
    assert manifest["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


@pytest.mark.parametrize(("arguments", "printed"), [([], crd_yaml), (["--chart-template"], chart_template)])
def test_python_dash_m_prints_it(arguments: list[str], printed: Any) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bertjob_api.crd", *arguments], capture_output=True, text=True, check=True
    )
    assert result.stdout == printed()


def test_python_dash_m_refuses_other_arguments() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bertjob_api.crd", "--chart"], capture_output=True, text=True
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert "usage" in result.stderr


def test_the_chart_template_is_the_crd_inside_the_charts_switches() -> None:
    lines = chart_template().splitlines()
    assert lines[0].startswith("{{- /*") and lines[0].endswith("*/ -}}")
    assert (lines[1], lines[-1]) == ("{{- if .Values.crds.install }}", "{{- end }}")
    # What is left once the chart's own lines are taken out is the CRD, as YAML.
    chart_lines = {
        '    {{- include "bertjob.labels" . | nindent 4 }}',
        "  {{- if .Values.crds.keep }}",
        "  annotations:",
        "    helm.sh/resource-policy: keep",
        "  {{- end }}",
        "  labels:",
    }
    body = yaml.safe_load("\n".join(line for line in lines[2:-1] if line not in chart_lines))
    assert body == crd()


def test_template_syntax_in_the_crd_is_escaped() -> None:
    assert escape_template("a {{ .Values.x }} b {{{") == 'a {{ "{{" }} .Values.x }} b {{ "{{" }}{'
    definition = crd()
    definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = "{{ .Release.Name }}"
    template = chart_template(definition)
    assert "{{ .Release.Name" not in template
    assert '{{ "{{" }} .Release.Name }}' in template


def _nodes(schema: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if "items" in schema:
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), Mapping):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


def test_the_schema_is_structural(bertjob_schema: dict[str, Any]) -> None:
    for path, node in _nodes(bertjob_schema):
        # The API server's two exceptions to "every node has a type".
        untyped = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        assert "type" in node or untyped, f"{path or '<root>'} has no type"
        assert not {"$ref", "$defs", "anyOf", "title", "const"} & set(node), path
        # A map's value schema is structural; `true`/`false` are not schemas the API server takes.
        assert isinstance(node.get("additionalProperties", {}), Mapping), path
        if "properties" in node:
            assert "additionalProperties" not in node, path
        # OpenAPI 3.0 spells exclusive bounds as booleans beside minimum/maximum.
        assert node.get("exclusiveMinimum", True) is True and node.get("exclusiveMaximum", True) is True, path
        if "required" in node:
            assert set(node["required"]) <= set(node["properties"]), path
        if "default" in node:
            assert not errors(node["default"], node), f"{path}: default does not fit"


def test_conversion_of_json_schema_2020_keywords() -> None:
    converted = structural(
        {
            "anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "null"}],
            "default": None,
            "title": "Rate",
            "description": "``x`` per s.",
        },
        {},
    )
    assert converted == {"type": "number", "description": "x per s.", "minimum": 0, "exclusiveMinimum": True}
    assert structural({"const": "v1", "type": "string"}, {}) == {"type": "string", "enum": ["v1"]}
    with pytest.raises(ValueError, match="union"):
        structural({"anyOf": [{"type": "string"}, {"type": "integer"}]}, {})
    with pytest.raises(ValueError, match="oneOf"):
        structural({"oneOf": [{"type": "string"}]}, {})


@pytest.mark.parametrize(
    "document",
    [valid_job(), example("bert-tiny-local.yaml"), example("bert-base-8xa100.yaml")],
    ids=["valid_job", "bert-tiny-local", "bert-base-8xa100"],
)
def test_the_schema_accepts_valid_jobs(document: dict[str, Any], bertjob_schema: dict[str, Any]) -> None:
    assert_valid(document, bertjob_schema)


@pytest.mark.parametrize(
    ("field", "value", "path", "says"),
    [
        ("spec.topology.nodes", "2", "spec.topology.nodes", "not of type 'integer'"),
        ("spec.accelerator", "tpu", "spec.accelerator", "is not one of"),
        ("spec.phases.0.learningRate", 0, "spec.phases[0].learningRate", "less than or equal to the minimum"),
        ("spec.image", DELETE, "spec", "'image' is a required property"),
        ("spec.checkpoint.path", DELETE, "spec.checkpoint", "'path' is a required property"),
        ("spec.phases.0.batchSize", 64, "spec.phases[0].batchSize", "unknown field"),
        ("spec.data.lowercased", True, "spec.data.lowercased", "unknown field"),
    ],
)
def test_the_schema_refuses_what_the_spec_refuses(
    field: str, value: Any, path: str, says: str, bertjob_schema: dict[str, Any]
) -> None:
    document = with_value(valid_job(), field, value)

    found = errors(document, bertjob_schema)

    assert any(problem.startswith(f"{path}: ") and says in problem for problem in found), found
    with pytest.raises(SpecError) as refused:
        parse_job(document)
    assert [where for where, _ in refused.value.problems] == [field.replace(".0.", "[0].")]


def test_the_status_schema_accepts_what_the_operator_writes(bertjob_schema: dict[str, Any]) -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    status = JobStatus(
        phase="Pending",
        conditions=[
            Condition(type="Created", status="True", reason="ChildrenCreated", last_transition_time=now)
        ],
        children=[ChildRef(api_version="kubeflow.org/v1", kind="PyTorchJob", name="demo")],
        config_map="demo-job",
        start_time=now,
    ).model_dump(mode="json", by_alias=True, exclude_none=True)
    schema = bertjob_schema["properties"]["status"]

    assert_valid(status, schema)
    assert status["startTime"] == "2026-01-02T03:04:05Z"
    assert errors({**status, "phase": "Done"}, schema) == [
        "phase: 'Done' is not one of ['Pending', 'Preparing', 'Running', 'Succeeded', 'Failed', 'Suspended']"
    ]


def test_the_printer_columns_have_names_that_say_which_phase() -> None:
    [version] = crd()["spec"]["versions"]
    columns = {column["name"].lower(): column["jsonPath"] for column in version["additionalPrinterColumns"]}
    assert len(columns) == len(version["additionalPrinterColumns"])  # kubectl upper-cases them
    # The job's phase (status.phase) and the training's (status.progress.phase) are both phases:
    # neither column is called just Phase.
    assert "phase" not in columns
    assert columns["status"] == ".status.phase"
    assert columns["training-phase"] == ".status.progress.phase"


def test_the_printer_columns_point_at_declared_fields(bertjob_schema: dict[str, Any]) -> None:
    [version] = crd()["spec"]["versions"]
    assert [column["name"] for column in version["additionalPrinterColumns"]] == [
        "Status",
        "Launcher",
        "Nodes",
        "Training-Phase",
        "Step",
        "Loss",
        "Seq/s",
        "Result",
        "Age",
    ]
    for column in version["additionalPrinterColumns"]:
        parts = column["jsonPath"].lstrip(".").split(".")
        if parts[0] == "metadata":
            continue
        node = bertjob_schema
        for part in parts:
            name, _, index = part.partition("[")  # results[0]: an item of the list results
            node = node["properties"][name]
            if index:
                assert node["type"] == "array", column
                node = node["items"]
        assert node["type"] == column["type"], column
    assert version["subresources"] == {"status": {}}
