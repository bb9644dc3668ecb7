"""Validate an object against a CRD's openAPIV3Schema as the API server would.

OpenAPI 3.0 validation (openapi-schema-validator's OAS30Validator, formats checked) plus what
strict field validation adds (``kubectl apply`` since 1.27): a field that the schema does not
declare is an error, unless the schema says ``x-kubernetes-preserve-unknown-fields``. The
object's own ``metadata`` is ObjectMeta, which the API server checks itself, so it is skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from openapi_schema_validator import OAS30Validator


def crd_schema(crd: Mapping[str, Any], version: str | None = None) -> dict[str, Any]:
    """The openAPIV3Schema of ``version`` (default: the storage version) of a CRD."""
    for served in crd["spec"]["versions"]:
        if served["name"] == version or (version is None and served.get("storage")):
            return dict(served["schema"]["openAPIV3Schema"])
    raise KeyError(f"{crd['metadata']['name']} has no version {version}")


def load_crd_schema(path: Path, version: str | None = None) -> dict[str, Any]:
    """:func:`crd_schema` of the CRD in a YAML file."""
    return crd_schema(yaml.safe_load(path.read_text()), version)


def errors(obj: Any, schema: Mapping[str, Any]) -> list[str]:
    """Every problem with ``obj``, each as ``path: message`` (path like ``spec.phases[0].steps``)."""
    validator = OAS30Validator(schema, format_checker=OAS30Validator.FORMAT_CHECKER)
    found = [f"{_path(error.absolute_path)}: {error.message}" for error in validator.iter_errors(obj)]
    found += _unknown_fields(obj, schema, [], root=True)
    return found


def assert_valid(obj: Any, schema: Mapping[str, Any]) -> None:
    """Fail with every problem listed unless ``obj`` fits ``schema``."""
    problems = errors(obj, schema)
    assert not problems, "\n".join(problems)


def _unknown_fields(obj: Any, schema: Mapping[str, Any], path: list[Any], root: bool = False) -> list[str]:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found: list[str] = []
    if isinstance(obj, Mapping):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        embedded = (
            {"apiVersion", "kind", "metadata"} if schema.get("x-kubernetes-embedded-resource") else set()
        )
        for key, value in obj.items():
            if root and key == "metadata":
                continue
            if properties is not None and key in properties:
                found += _unknown_fields(value, properties[key], [*path, key])
            elif isinstance(additional, Mapping):
                found += _unknown_fields(value, additional, [*path, key])
            elif key not in embedded:
                found.append(f"{_path([*path, key])}: unknown field")
    elif isinstance(obj, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(obj):
            found += _unknown_fields(item, schema["items"], [*path, index])
    return found


def _path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<root>"
