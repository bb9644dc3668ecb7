"""The CRD's CEL rules (``x-kubernetes-validations``) evaluated on an object as the API server
evaluates them, with a real CEL implementation (cel-python, ``celpy``).

What the API server does before and while running the rules, which no Python CEL library does:

- structural defaulting (:func:`apply_defaults`): a property's ``default`` fills it where it is
  absent (or null and not nullable) in an object that is there, top-down, and the defaults
  put in are defaulted in turn; an absent object stays absent;
- typing by the schema (:func:`to_cel`): a ``number`` is a double even when written ``0``, an
  ``integer`` an int, an object a map; a field the schema keeps whole (preserve-unknown-fields)
  is plain JSON;
- each rule runs where it sits, with ``self`` the value at that node, once per list item for a
  rule under a list, and not at all where the value is absent (:func:`refusals`);
- a ``messageExpression`` that fails or gives an empty string falls back to ``message``.

Kubernetes' cost estimate and its extension libraries are not modelled: the rules use core CEL
only, on bounded lists (:mod:`bertjob_api.spec.cel`, tests/bertjob_api/test_cel.py).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import celpy
from celpy import celtypes

RULES = "x-kubernetes-validations"


def apply_defaults(obj: Any, schema: Mapping[str, Any]) -> Any:
    """A deep copy of ``obj`` with ``schema``'s defaults applied as the API server applies them
    (k8s.io/apiextensions-apiserver structuraldefaulting.Default)."""
    result = copy.deepcopy(obj)
    _default(result, schema)
    return result


def _default(value: Any, schema: Mapping[str, Any]) -> None:
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for name, sub in properties.items():
            if "default" not in sub:
                continue
            if name not in value or (value[name] is None and not sub.get("nullable")):
                value[name] = copy.deepcopy(sub["default"])
        additional = schema.get("additionalProperties")
        for name, item in value.items():
            if name in properties:
                _default(item, properties[name])
            elif isinstance(additional, Mapping):
                _default(item, additional)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            _default(item, schema["items"])


def to_cel(value: Any, schema: Mapping[str, Any]) -> Any:
    """``value`` as a CEL value of the type ``schema`` declares.

    Raises:
        TypeError: a value of another type than its schema's (the schema check refuses it first).
    """
    if value is None:
        return None
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        return celpy.json_to_cel(value)
    kind = schema.get("type")
    if kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
        return celtypes.IntType(value)
    if kind == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return celtypes.DoubleType(float(value))
    if kind == "string" and isinstance(value, str):
        return celtypes.StringType(value)
    if kind == "boolean" and isinstance(value, bool):
        return celtypes.BoolType(value)
    if kind == "array" and isinstance(value, list):
        return celtypes.ListType([to_cel(item, schema.get("items", {})) for item in value])
    if kind == "object" and isinstance(value, dict):
        properties, additional = schema.get("properties", {}), schema.get("additionalProperties")
        converted = {}
        for name, item in value.items():
            sub = properties.get(name, additional if isinstance(additional, Mapping) else {})
            converted[celtypes.StringType(name)] = to_cel(item, sub)
        return celtypes.MapType(converted)
    raise TypeError(f"{value!r} is not of type {kind}")


@dataclass(frozen=True)
class Site:
    """A rule where it sits: ``path`` is the node's path in the object (``spec.phases[]`` for
    every item of ``spec.phases``), ``entry`` the rule as the CRD spells it."""

    path: str
    entry: Mapping[str, str]


def sites(schema: Mapping[str, Any], path: str = "") -> Iterator[Site]:
    """Every rule of ``schema``, depth first."""
    for entry in schema.get(RULES, []):
        yield Site(path or "<root>", entry)
    for name, sub in schema.get("properties", {}).items():
        yield from sites(sub, f"{path}.{name}" if path else name)
    if isinstance(schema.get("items"), Mapping):
        yield from sites(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), Mapping):
        yield from sites(schema["additionalProperties"], f"{path}{{}}")


@dataclass(frozen=True)
class Refusal:
    """One rule that failed: the object's ``path`` where it ran (``spec.phases[1]``), the field
    the API server reports (``path`` + the rule's fieldPath), the rule, and the message shown.
    ``error`` is set when the rule could not be evaluated (the API server refuses then too)."""

    path: str
    field: str
    rule: str
    message: str
    error: str | None = None


_ENVIRONMENT = celpy.Environment()


@functools.cache
def _program(expression: str) -> celpy.Runner:
    return _ENVIRONMENT.program(_ENVIRONMENT.compile(expression))


def evaluate(expression: str, self_value: Any) -> Any:
    """``expression`` evaluated with ``self`` bound to a CEL value.

    Raises:
        celpy.CELEvalError: the expression failed (a missing field, an overflow, a division by 0).
    """
    result = _program(expression).evaluate({"self": self_value})
    if isinstance(result, celpy.CELEvalError):
        raise result
    return result


def refusals(obj: Any, schema: Mapping[str, Any], defaults: bool = True) -> list[Refusal]:
    """Every rule of ``schema`` that ``obj`` fails, after the schema's defaults (unless
    ``defaults`` is false), in schema order."""
    if defaults:
        obj = apply_defaults(obj, schema)
    return list(_check(obj, schema, ""))


def _check(value: Any, schema: Mapping[str, Any], path: str) -> Iterator[Refusal]:
    if value is None:
        return
    if schema.get(RULES):
        self_value = to_cel(value, schema)
        for entry in schema[RULES]:
            refusal = _run(entry, self_value, path)
            if refusal is not None:
                yield refusal
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        additional = schema.get("additionalProperties")
        for name, item in value.items():
            sub = properties.get(name, additional if isinstance(additional, Mapping) else None)
            if sub is not None:
                yield from _check(item, sub, f"{path}.{name}" if path else name)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            yield from _check(item, schema["items"], f"{path}[{index}]")


def _run(entry: Mapping[str, str], self_value: Any, path: str) -> Refusal | None:
    field = path + entry.get("fieldPath", "")
    try:
        passed = evaluate(entry["rule"], self_value)
    except celpy.CELEvalError as error:
        return Refusal(path, field, entry["rule"], entry["message"], error=str(error))
    if not isinstance(passed, bool | celtypes.BoolType):
        return Refusal(path, field, entry["rule"], entry["message"], error=f"not a bool: {passed!r}")
    if passed:
        return None
    message = entry["message"]
    if "messageExpression" in entry:
        try:
            shown = evaluate(entry["messageExpression"], self_value)
        except celpy.CELEvalError:
            shown = None
        if isinstance(shown, str) and shown:
            message = str(shown)
    return Refusal(path, field, entry["rule"], message)
