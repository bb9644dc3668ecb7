"""Helpers for the tests that use the chart: where it is, finding helm, and reading what it renders."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from bertjob_testing.jobs import REPO

CHART = REPO / "charts" / "bertjob"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
BAD_VALUES = REPO / "tests" / "charts" / "values"
RELEASE = "bertjob"
NAMESPACE = "bertjob-system"
KUBERNETES_VERSION = "1.33"

Objects = dict[tuple[str, str | None, str], dict[str, Any]]


def helm_binary() -> str | None:
    """helm beside this interpreter (make installs it into .venv/bin), else on PATH."""
    beside = Path(sys.executable).with_name("helm")
    return str(beside) if beside.is_file() else shutil.which("helm")


def helm_or_skip() -> str:
    """:func:`helm_binary`; skips the calling test with how to install helm when there is none."""
    binary = helm_binary()
    if binary is None:
        pytest.skip("helm is not installed: `make .venv/bin/helm` (hack/install-helm.sh) provides it")
    return binary


def by_key(objects: list[dict[str, Any]]) -> Objects:
    """Objects by (kind, namespace, name); fails on two with the same key."""
    found: Objects = {}
    for obj in objects:
        key = (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
        assert key not in found, f"{key} rendered twice"
        found[key] = obj
    return found


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of ``kind`` (and ``name``) among ``objects``."""
    [found] = [obj for obj in objects if obj["kind"] == kind and name in (None, obj["metadata"]["name"])]
    return found


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator's container in the rendered Deployment."""
    [container] = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return dict(container)


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every scalar (and empty map or list) of ``value``, by a dotted path with [i] for items."""
    if isinstance(value, Mapping) and value:
        for key, sub in value.items():
            yield from leaves(sub, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list) and value:
        for index, sub in enumerate(value):
            yield from leaves(sub, f"{path}[{index}]")
    else:
        yield path, value


def chart_metadata() -> dict[str, Any]:
    """Chart.yaml."""
    loaded: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return loaded


def default_values() -> dict[str, Any]:
    """values.yaml."""
    loaded: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return loaded


def values_schema() -> dict[str, Any]:
    """values.schema.json."""
    loaded: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return loaded


def resolve(node: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """A schema node with its ``$ref`` and ``allOf`` parts merged in (enough for this chart's schema)."""
    merged = {key: value for key, value in node.items() if key not in ("$ref", "allOf")}
    parts = [*node.get("allOf", [])]
    if "$ref" in node:
        parts.append(node)
    for part in parts:
        if "$ref" in part:
            target: Any = schema
            for name in part["$ref"].removeprefix("#/").split("/"):
                target = target[name]
            part = {**target, **{k: v for k, v in part.items() if k != "$ref"}}
        for key, value in resolve(part, schema).items():
            merged.setdefault(key, value)
    return merged


def settings(
    values: Mapping[str, Any],
    schema: Mapping[str, Any],
    node: Mapping[str, Any] | None = None,
    path: str = "",
) -> Iterator[tuple[str, Any, dict[str, Any]]]:
    """Every setting of ``values``: (dotted key, value, its schema node). A map is a group of
    settings when its schema lists the keys it requires (image, crds, metrics.serviceMonitor, ...);
    any other value, free-form maps such as resources or podLabels included, is one setting."""
    node = schema if node is None else node
    for key, value in values.items():
        sub = resolve(node["properties"][key], schema)
        dotted = f"{path}.{key}" if path else key
        if isinstance(value, Mapping) and "properties" in sub and "required" in sub:
            yield from settings(value, schema, sub, dotted)
        else:
            yield dotted, value, sub


def schema_type(node: Mapping[str, Any]) -> str:
    """A schema node's type as the README spells it: "string", "integer or string"."""
    types = node["type"]
    return " or ".join(types) if isinstance(types, list) else str(types)


def merged(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` over ``base`` as Helm merges values: maps key by key, anything else replaced."""
    result = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result
