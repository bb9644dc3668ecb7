"""Checks of the Kubernetes objects a job passes through to its pods as written.

``spec.pod.affinity``, ``tolerations``, ``env``, ``securityContext`` and each volume's ``source``
are stored as the user wrote them and copied into the children, so the API server (or a Kubeflow
operator's CRD schema) would be the first to look at them, after the job was accepted. Here each is
checked against the Kubernetes OpenAPI schema of its type, as the Kubeflow CRDs embed it: strict
(an unknown field is an error), without nulls, with 32/64-bit integers, and a resource quantity an
integer or a quantity string. The definitions are a subset of Kubernetes' own schema, kept in
``kubernetes-types.json`` beside this module and written by :func:`generate` from the
``kubernetes-validate`` package (a development dependency), so the operator carries 30 kB of
schema rather than that package's 100 MB; a test checks that the file is up to date.

    python -m bertjob_api.passthrough     # rewrite kubernetes-types.json
"""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker, validators
from jsonschema.exceptions import ValidationError

from bertjob_api import kubenames
from bertjob_api.files import write_text

SCHEMA_FILE = Path(__file__).with_name("kubernetes-types.json")
KUBERNETES_VERSION = "1.33"
TYPES = {
    "Affinity": "io.k8s.api.core.v1.Affinity",
    "Toleration": "io.k8s.api.core.v1.Toleration",
    "EnvVar": "io.k8s.api.core.v1.EnvVar",
    "PodSecurityContext": "io.k8s.api.core.v1.PodSecurityContext",
    "Volume": "io.k8s.api.core.v1.Volume",
    "ObjectMeta": "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
}
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
# Deeper than any of these types goes; a deeper value is refused before the schema walks it.
MAX_DEPTH = 32
_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}

Path_ = tuple[str | int, ...]


def _format_checker() -> FormatChecker:
    checker = FormatChecker([])
    for name, limit in (("int32", kubenames.INT32_MAX), ("int64", kubenames.INT64_MAX)):
        checker.checks(name)(
            functools.partial(
                lambda value, top: not isinstance(value, int) or -top - 1 <= value <= top, top=limit
            )
        )
    checker.checks("quantity")(lambda value: kubenames.parse_quantity(value)[1] is None)
    return checker


# JSON Schema counts 1.0 as an integer; the API server's Go types do not take it.
_Validator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool)
    ),
)


@functools.cache
def _validator(kind: str) -> Any:
    definitions = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))["$defs"]
    schema = {"$ref": f"#/$defs/{TYPES[kind]}", "$defs": definitions}
    return _Validator(schema, format_checker=_format_checker())


def problems(value: Any, kind: str, where: str) -> list[tuple[str, str]]:
    """What the API server would refuse in ``value``, an object of the Kubernetes type ``kind``
    (a key of :data:`TYPES`) found at the field path ``where``, as ``(field path, message)``
    pairs: values JSON cannot carry (NaN, infinity, non-string keys, other Python types, strings
    :func:`bertjob_api.kubenames.string_problem` refuses, integers beyond 2^53, which kustomize rounds,
    nesting deeper than :data:`MAX_DEPTH`), then the schema's findings. Empty when the API server
    takes it."""
    found = [(kubenames.field_path(where, path), message) for path, message in _plain_json_problems(value)]
    if found:
        return found
    errors = sorted(
        _validator(kind).iter_errors(value), key=lambda error: list(map(str, error.absolute_path))
    )
    return [
        (kubenames.field_path(where, path), message) for error in errors for path, message in _describe(error)
    ]


def _plain_json_problems(value: Any) -> Iterator[tuple[Path_, str]]:
    """Iteratively, so that a value nested a million deep is refused rather than overflowing the stack."""
    stack: list[tuple[Path_, Any]] = [((), value)]
    while stack:
        path, item = stack.pop()
        if len(path) > MAX_DEPTH:
            yield path, f"nested deeper than {MAX_DEPTH} levels"
        elif isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    yield path, f"the key {kubenames.shown(key)} is not a string"
                elif (problem := kubenames.string_problem(key)) is not None:
                    yield path, f"the key {kubenames.shown(key)} {problem}"
                else:
                    stack.append(((*path, key), child))
        elif isinstance(item, list):
            stack.extend(((*path, index), child) for index, child in enumerate(item))
        elif isinstance(item, float) and not math.isfinite(item):
            yield path, f"{item} is not a number JSON can carry"
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) > kubenames.JSON_SAFE_INTEGER:
            yield (
                path,
                f"{kubenames.shown(item)} is beyond 2^53, which kustomize rounds (it reads floats)",
            )
        elif isinstance(item, str):
            problem = kubenames.string_problem(item)
            if problem is not None:
                yield path, problem
        elif type(item) not in _JSON_TYPES:
            yield path, f"a {type(item).__name__} is not a string, number, boolean, list or object"


def _describe(error: ValidationError) -> Iterator[tuple[Path_, str]]:
    path = tuple(error.absolute_path)
    instance, rule, expected = error.instance, error.validator, error.validator_value
    if rule == "additionalProperties":
        known = error.schema.get("properties", {})
        for key in instance:
            if key not in known:
                yield (*path, key), "unknown field"
    elif rule == "required":
        for key in expected:
            if key not in instance:
                yield (*path, key), "required field is missing"
    elif rule == "type":
        wanted = " or ".join(expected) if isinstance(expected, list) else expected
        yield (
            path,
            f"must be of type {wanted}, not {_JSON_TYPES.get(type(instance), type(instance).__name__)}",
        )
    elif rule == "format" and expected == "quantity":
        yield path, str(kubenames.parse_quantity(instance)[1])
    elif rule == "format":
        yield path, f"{kubenames.shown(instance)} does not fit a {expected.removeprefix('int')}-bit integer"
    elif rule == "enum":
        yield path, "must be one of " + ", ".join(map(repr, expected))
    else:
        yield path, error.message if len(error.message) <= 200 else error.message[:197] + "..."


def generate(version: str = KUBERNETES_VERSION) -> dict[str, Any]:
    """The definitions :data:`TYPES` need, from ``kubernetes-validate``'s strict schema of
    Kubernetes ``version``: descriptions and ``x-kubernetes-*`` hints dropped, ``null`` removed from
    every type (the Kubeflow CRDs embed these types without nullable), a Quantity an integer or a
    quantity string (format ``quantity``, checked by :func:`bertjob_api.kubenames.parse_quantity`), as
    the Kubeflow CRDs' int-or-string with their pattern is.

    Raises:
        ImportError: kubernetes-validate is not installed (``pip install '.[dev]'``).
    """
    from importlib.resources import files

    folder = files("kubernetes_validate") / "kubernetes-json-schema" / f"v{version}.0-local-strict"
    everything = json.loads((folder / "_definitions.json").read_text(encoding="utf-8"))["$defs"]
    needed: set[str] = set()
    pending = list(TYPES.values())
    while pending:
        name = pending.pop()
        if name not in needed:
            needed.add(name)
            pending.extend(_references(everything[name]))
    definitions = {name: _simplified(everything[name]) for name in sorted(needed)}
    definitions[QUANTITY] = {"type": ["string", "integer"], "format": "quantity"}
    if INT_OR_STRING in definitions:
        definitions[INT_OR_STRING] = {"type": ["string", "integer"]}
    return {
        "$comment": f"Generated by `python -m bertjob_api.passthrough` from kubernetes-validate's strict "
        f"schema of Kubernetes {version} (Apache-2.0, The Kubernetes Authors); do not edit.",
        "$defs": definitions,
    }


def _references(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value.rpartition("/")[2]
            else:
                yield from _references(value)
    elif isinstance(node, list):
        for value in node:
            yield from _references(value)


def _simplified(node: Any) -> Any:
    if isinstance(node, list):
        return [_simplified(value) for value in node]
    if not isinstance(node, Mapping):
        return node
    result = {}
    for key, value in node.items():
        if key == "description" or key.startswith("x-kubernetes-"):
            continue
        if key == "type" and isinstance(value, list):
            kept = [kind for kind in value if kind != "null"]
            value = kept[0] if len(kept) == 1 else kept
        result[key] = _simplified(value)
    return result


def schema_text(schema: Mapping[str, Any]) -> str:
    """The file's text: indented JSON, one definition after another, so that a change reads as a diff."""
    return json.dumps(schema, indent=1, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    """``python -m bertjob_api.passthrough``: rewrite :data:`SCHEMA_FILE` (temporary file, then rename)."""
    if argv:
        print("usage: python -m bertjob_api.passthrough", file=sys.stderr)
        return 2
    write_text(SCHEMA_FILE, schema_text(generate()))
    print(f"wrote {SCHEMA_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
