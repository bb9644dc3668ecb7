"""Names and values as the Kubernetes API server checks them.

The rules of k8s.io/apimachinery's ``util/validation`` (DNS labels and subdomains, label values,
qualified names such as label keys, environment variable names) and of its resource quantities
(``api/resource``), so that a job the API server or a Kubeflow operator would refuse is refused
before anything is created, with a message naming the field. Each ``*_problem`` function returns
what is wrong with a value, or None when the API server takes it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# Names that become a label value, a Service or a Job (every pod's hostname) are DNS labels.
MAX_LABEL = 63
MAX_SUBDOMAIN = 253
# What the API server allows an object's annotations, keys and values together, in bytes.
MAX_ANNOTATIONS_BYTES = 256 * 1024

# ASCII classes only ([0-9], not \d) and fullmatch only: Python's $ also matches before a final
# newline, which the API server's Go regexps do not.
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL = re.compile(_LABEL)
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
ENV_VAR_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_UNCARRIED = re.compile("[\x01-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffe\uffff\ud800-\udfff]")
# JSON numbers pass through kustomize as 64-bit floats: integers beyond 2^53 come out rounded.
JSON_SAFE_INTEGER = 2**53
# The API server's patterns, for the CRD (Go's $ is the end of the text).
DNS_SUBDOMAIN_PATTERN = f"^{DNS_SUBDOMAIN.pattern}$"
LABEL_VALUE_PATTERN = f"^{LABEL_VALUE.pattern}$"

# <sign><digits>[.<digits>]<suffix>, the suffix binary SI, decimal SI, or a decimal exponent.
QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(\.[0-9]*)?|\.[0-9]+)(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
_BINARY = {f"{prefix}i": 2 ** (10 * power) for power, prefix in enumerate("KMGTPE", start=1)}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
# Exponents beyond these are out of range either way (or round to the smallest unit).
_EXPONENT_LIMIT = 64
STANDARD_RESOURCES = {"cpu", "memory", "ephemeral-storage"}


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters, for a one-line message about it."""
    if isinstance(value, int) and abs(value) > 10**limit:
        # repr() of an integer of over 4300 digits raises (CPython's int-to-string limit).
        return f"a {value.bit_length()}-bit integer"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def printable(value: str, limit: int = 200) -> str:
    """``value`` itself when it prints on one line (a path, say), else :func:`shown`."""
    return value if value.isprintable() and len(value) <= limit else shown(value, limit)


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_./-]{1,100}")


def field_path(where: str, parts: Iterable[str | int]) -> str:
    """``where`` followed by ``parts`` as YAML paths are written here (``spec.phases[0].steps``).
    A key from the input that is not a plain name is quoted (and cut) as JSON, so that a path
    holding a newline or a megabyte of text stays short and on one line: ``spec.pod["a\\nb"]``."""
    for part in parts:
        if isinstance(part, int):
            where += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            where += f".{part}" if where else part
        else:
            where += f"[{json.dumps(part if len(part) <= 60 else part[:57] + '...')}]"
    return where


def _pattern_problem(value: str, pattern: re.Pattern[str], limit: int, what: str, rule: str) -> str | None:
    """None when ``value`` is at most ``limit`` characters and matches ``pattern``; else the
    message ``<value> is not <what>: at most <limit> <rule>``."""
    if len(value) <= limit and pattern.fullmatch(value):
        return None
    return f"{shown(value)} is not {what}: at most {limit} {rule}"


def dns_label_problem(value: str) -> str | None:
    """RFC 1123 label: a namespace, a volume."""
    return _pattern_problem(
        value, DNS_LABEL, MAX_LABEL, "a DNS label",
        "lower-case letters, digits and '-', starting and ending with a letter or digit",
    )  # fmt: skip


def dns1035_label_problem(value: str) -> str | None:
    """RFC 1035 label: a Service, and so a Kubeflow job's name."""
    return _pattern_problem(
        value, DNS1035_LABEL, MAX_LABEL, "a DNS-1035 label",
        "lower-case letters, digits and '-', which start with a letter and end with a letter or digit",
    )  # fmt: skip


def dns_subdomain_problem(value: str) -> str | None:
    """RFC 1123 subdomain: most object names (ServiceAccount, Secret, PriorityClass)."""
    return _pattern_problem(
        value, DNS_SUBDOMAIN, MAX_SUBDOMAIN, "a DNS subdomain",
        "lower-case letters, digits, '-' and '.', each dot-separated part starting and ending with a "
        "letter or digit",
    )  # fmt: skip


def label_value_problem(value: str) -> str | None:
    """A label's value: empty, or up to 63 letters, digits, '-', '_' and '.' between alphanumerics."""
    return _pattern_problem(
        value, LABEL_VALUE, MAX_LABEL, "a valid label value",
        "letters, digits, '-', '_' and '.', starting and ending with a letter or digit",
    )  # fmt: skip


def qualified_name_problem(value: str, what: str = "label key") -> str | None:
    """A label or annotation key, or a resource name: ``[prefix/]name``, the prefix a DNS subdomain
    and the name up to 63 letters, digits, '-', '_' and '.' between alphanumerics. ``what`` names
    the kind of key in the message."""
    prefix, slash, name = value.rpartition("/")
    if (
        len(name) <= MAX_LABEL
        and _NAME_PART.fullmatch(name)
        and (not slash or (len(prefix) <= MAX_SUBDOMAIN and DNS_SUBDOMAIN.fullmatch(prefix)))
    ):
        return None
    return (
        f"{shown(value)} is not a valid {what}: an optional DNS-subdomain prefix and '/', then at "
        f"most {MAX_LABEL} letters, digits, '-', '_' and '.' starting and ending with a letter or digit"
    )


def annotations_size_problem(annotations: Mapping[str, str]) -> str | None:
    """The API server's limit on an object's annotations: their keys and values together at most
    :data:`MAX_ANNOTATIONS_BYTES` (256 KiB) of UTF-8."""
    size = sum(len(key.encode("utf-8", "surrogatepass")) for key in annotations)
    size += sum(len(value.encode("utf-8", "surrogatepass")) for value in annotations.values())
    if size <= MAX_ANNOTATIONS_BYTES:
        return None
    return (
        f"keys and values take {size} bytes, over the {MAX_ANNOTATIONS_BYTES} Kubernetes allows an "
        "object's annotations"
    )


def env_var_name_problem(value: str) -> str | None:
    """An environment variable's name: letters, digits, '-', '.' and '_', not starting with a digit."""
    if ENV_VAR_NAME.fullmatch(value):
        return None
    return (
        f"{shown(value)} is not a valid environment variable name: letters, digits, '_', '-' and '.', "
        "not starting with a digit"
    )


def resource_name_problem(value: str) -> str | None:
    """A container resource: cpu, memory, ephemeral-storage, hugepages-<size>, or a domain-prefixed
    (extended) resource such as nvidia.com/gpu."""
    if "/" in value:
        return None if qualified_name_problem(value) is None else _resource_name_message(value)
    if value in STANDARD_RESOURCES:
        return None
    size = value.removeprefix("hugepages-")
    if size != value and parse_quantity(size)[1] is None:
        return None
    return _resource_name_message(value)


def _resource_name_message(value: str) -> str:
    return (
        f"{shown(value)} is not a resource name: cpu, memory, ephemeral-storage, hugepages-<size>, "
        "or a domain-prefixed name such as nvidia.com/gpu"
    )


def string_problem(value: str) -> str | None:
    """What makes ``value`` unfit for a Kubernetes object or a path: a NUL character (which no
    file name, argument or environment value can hold), a lone surrogate (not UTF-8), or a
    control character other than tab, newline and carriage return, or U+FFFE/U+FFFF (kustomize
    refuses DEL, the C1 controls and those two, and turns U+0085 into a line break)."""
    if "\0" in value:
        return "contains a NUL character"
    found = _UNCARRIED.search(value)
    if found is None:
        return None
    if "\ud800" <= found[0] <= "\udfff":
        return "is not valid Unicode text (it holds a lone surrogate)"
    return (
        f"contains U+{ord(found[0]):04X}, a control character or noncharacter YAML does not carry as written"
    )


def image_problem(value: str) -> str | None:
    """A container image reference: the API server refuses one with surrounding whitespace."""
    if value != value.strip():
        return f"{shown(value)} starts or ends with whitespace"
    return None


def parse_quantity(value: Any) -> tuple[Decimal | None, str | None]:
    """The amount a Kubernetes quantity stands for (``"500m"`` -> 0.5, ``"1Gi"`` -> 1073741824,
    ``2`` -> 2), or None and what is wrong with it: not a number or quantity string, negative, or
    more than 2^63-1 (which the API server would silently lower to that)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        kind = "a boolean" if isinstance(value, bool) else type(value).__name__
        return None, f"must be a quantity (a number, or a string such as 500m or 64Gi), not {kind}"
    if isinstance(value, float) and not math.isfinite(value):
        return None, f"{value} is not a quantity: it must be a finite number"
    match = QUANTITY.fullmatch(str(value)) if not isinstance(value, int) else None
    if match is None and not isinstance(value, int):
        return None, f"{shown(value)} is not a Kubernetes quantity (such as 2, 1.5, 500m or 64Gi)"
    if match is None:
        amount = Decimal(value)
    else:
        amount = Decimal(match["number"])
        suffix = match["suffix"] or ""
        if suffix in _BINARY:
            amount *= _BINARY[suffix]
        else:
            exponent = _DECIMAL[suffix] if suffix in _DECIMAL else int(suffix[1:])
            exponent = max(min(exponent, _EXPONENT_LIMIT), -_EXPONENT_LIMIT)
            amount = amount.scaleb(exponent)
        if match["sign"] == "-":
            amount = -amount
    if amount < 0:
        return None, f"{shown(value)} is negative; a quantity here must not be"
    if amount > INT64_MAX:
        return None, f"{shown(value)} is more than 2^63-1, the largest quantity Kubernetes holds"
    return amount, None


def quantity(value: Any) -> int | str:
    """``value`` as a quantity the Kubeflow CRDs take (an integer, or a string matching their
    pattern): integers and strings unchanged, a float as its shortest decimal string (0.5 -> "0.5").

    Raises:
        ValueError: saying what is wrong (see :func:`parse_quantity`).
    """
    _, problem = parse_quantity(value)
    if problem is not None:
        raise ValueError(problem)
    return repr(value) if isinstance(value, float) else value
