"""The BertPretrainJob field reference (``docs/reference.md``), generated from the CRD schema.

One Markdown table per object of :func:`bertjob_api.crd.resource_schema` (``spec``, ``spec.data``,
``spec.phases[]``, ..., ``status``), one row per field: its type, whether it is required, its
default, its constraints (range, length, pattern, enum) and its description; below it, the
object's CEL rules (``x-kubernetes-validations``, :mod:`bertjob_api.spec.cel`) by their
messages. Because the table comes from the same schema the API server enforces, the reference
cannot describe a field the CRD lacks, and a test fails when the committed file is stale.

    python -m bertjob_api.reference docs/reference.md   # (re)write the file
    python -m bertjob_api.reference                     # print it
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertjob_api.crd import resource_schema
from bertjob_api.files import write_text
from bertjob_api.spec import API_VERSION, KIND, PLURAL

HEADER = (
    "<!-- Generated from api/bertjob_api/crd.py by `python -m bertjob_api.reference docs/reference.md` "
    "(`make generate`); do not edit. -->\n"
)


@dataclass(frozen=True)
class Table:
    """The fields of one object: ``path`` as a user writes it (``spec.phases[]``)."""

    path: str
    description: str
    schema: Mapping[str, Any]


def _is_object(schema: Mapping[str, Any]) -> bool:
    """Whether ``schema`` declares fields of its own, and so gets a table."""
    return "properties" in schema


def _element(schema: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """For a list or map of objects: the suffix its table's path takes and the element's schema."""
    if schema.get("type") == "array" and isinstance(schema.get("items"), Mapping):
        return "[]", schema["items"]
    additional = schema.get("additionalProperties")
    if schema.get("type") == "object" and isinstance(additional, Mapping):
        return "{}", additional
    return None


def tables(schema: Mapping[str, Any], path: str) -> Iterator[Table]:
    """Every object under ``schema`` (itself included when it has fields), depth first in field
    order, so that a table follows the table that links to it."""
    if _is_object(schema):
        yield Table(path, str(schema.get("description", "")), schema)
        for name, sub in schema["properties"].items():
            yield from tables(sub, f"{path}.{name}" if path else name)
        return
    element = _element(schema)
    if element is not None and _is_object(element[1]):
        suffix, item = element
        yield Table(path + suffix, str(schema.get("description", "")), item)
        for name, sub in item["properties"].items():
            yield from tables(sub, f"{path}{suffix}.{name}")


def anchor(heading: str) -> str:
    """The fragment GitHub gives a heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces as ``-``."""
    text = re.sub(r"[^\w\- ]", "", heading.lower())
    return text.replace(" ", "-")


def _link(path: str) -> str:
    return f"[`{path}`](#{anchor(path)})"


def type_name(schema: Mapping[str, Any], path: str) -> str:
    """How a field's type reads in the table, linking to the table of an object it holds."""
    if schema.get("x-kubernetes-int-or-string"):
        return "integer or string"
    if _is_object(schema):
        return f"object, {_link(path)}"
    element = _element(schema)
    kind = schema.get("type")
    if element is not None:
        suffix, item = element
        inner = f"object, {_link(path + suffix)}" if _is_object(item) else type_name(item, path + suffix)
        return f"list of ({inner})" if suffix == "[]" else f"map of string to ({inner})"
    if kind == "object" and schema.get("x-kubernetes-preserve-unknown-fields"):
        return "object (any Kubernetes fields)"
    if kind is None:
        return "any"
    if "format" in schema:
        return f"{kind} ({schema['format']})"
    return str(kind)


def _literal(value: Any) -> str:
    """A value in code font: strings bare (as YAML writes them) unless empty, the rest as JSON."""
    return f"`{value}`" if isinstance(value, str) and value else f"`{json.dumps(value)}`"


def constraints(schema: Mapping[str, Any]) -> list[str]:
    """The checks the API server makes on a field, each as a short phrase."""
    found: list[str] = []
    if "enum" in schema:
        found.append("one of " + ", ".join(_literal(value) for value in schema["enum"]))
    if "minimum" in schema:
        found.append(("> " if schema.get("exclusiveMinimum") else "≥ ") + _number(schema["minimum"]))
    if "maximum" in schema:
        found.append(("< " if schema.get("exclusiveMaximum") else "≤ ") + _number(schema["maximum"]))
    for key, what in (
        ("minLength", "length ≥"),
        ("maxLength", "length ≤"),
        ("minItems", "items ≥"),
        ("maxItems", "items ≤"),
    ):
        if key in schema:
            found.append(f"{what} {schema[key]}")
    if "pattern" in schema:
        found.append(f"matches `{schema['pattern']}`")
    if schema.get("x-kubernetes-list-type") == "map":
        keys = ", ".join(f"`{key}`" for key in schema.get("x-kubernetes-list-map-keys", []))
        found.append(f"one entry per {keys}")
    return found


def _number(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _cell(text: str) -> str:
    """Text that stays inside one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def render_table(table: Table, heading: str | None = None) -> str:
    """One object's heading (default: its path), description and field table."""
    required = set(table.schema.get("required", []))
    lines = [f"### {heading or table.path}", ""]
    if table.description:
        lines += [_cell(table.description), ""]
    lines += [
        "| Field | Type | Required | Default | Constraints | Description |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, field in table.schema["properties"].items():
        path = f"{table.path}.{name}" if table.path else name
        default = _literal(field["default"]) if "default" in field else ""
        row = [
            f"`{name}`",
            type_name(field, path),
            "yes" if name in required else "",
            default,
            "; ".join(constraints(field)),
            str(field.get("description", "")),
        ]
        lines.append("| " + " | ".join(_cell(cell) for cell in row) + " |")
    rules = table.schema.get("x-kubernetes-validations", [])
    if rules:
        lines += [
            "",
            "Checked across these fields by the API server too (CEL rules; the message it gives):",
            "",
        ]
        lines += [f"- {_cell(rule['message'])}" for rule in rules]
    return "\n".join(lines) + "\n"


def generate(schema: Mapping[str, Any]) -> str:
    """The whole reference for a resource's ``openAPIV3Schema``: a contents list, then one table
    per object, the resource itself first."""
    found = list(tables(schema, ""))
    top, nested = found[0], found[1:]
    parts = [
        HEADER,
        f"# {KIND} reference\n",
        f"`apiVersion: {API_VERSION}`, `kind: {KIND}` (plural `{PLURAL}`, short name `bpj`). "
        "Every field of the CustomResourceDefinition in `manifests/crd.yaml`, as the API server "
        "checks it: a value outside a field's constraints is refused when the job is applied. "
        "Checks across fields (a batch size the world size must divide, paths on a writable "
        "volume, ...) are made by `bertjob validate` and by the operator, which reports them in "
        "the job's `Failed` condition (`docs/operator.md`). Those that core CEL can state on "
        "bounded fields are also rules of the CRD (`x-kubernetes-validations`, listed below each "
        "object's table), so that the API server refuses them at `kubectl apply` even where the "
        "operator's admission webhook is not installed or not reachable. A rule reads the job after "
        "the defaults above and iterates only lists with a maximum (`spec.phases`, "
        "`spec.finetune`), and its message is built of literals and numbers, so that the API "
        "server's estimate of a rule's cost stays within its budget.\n",
        "Objects: " + ", ".join(_link(table.path) for table in nested) + ".\n",
        render_table(top, heading=KIND),
        *(render_table(table) for table in nested),
    ]
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bertjob_api.reference [FILE]``: write the reference to FILE, or print it."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) > 1:
        print("usage: python -m bertjob_api.reference [FILE]", file=sys.stderr)
        return 2
    text = generate(resource_schema())
    if args:
        write_text(Path(args[0]), text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
