"""Job files read as kubectl reads them, and YAML written so that kubectl reads back what was meant.

kubectl never sends YAML: it turns each document into JSON with go-yaml v2 (through
sigs.k8s.io/yaml) and the API server reads that JSON. PyYAML reads YAML 1.1, which differs:
``4:16`` is the base-60 integer 256 there and a string for go-yaml, ``6e-3`` a string there and a
number for go-yaml, ``y`` a string there and ``true`` for go-yaml, and ``.inf`` a float that JSON
cannot hold at all. So that ``bertjob validate`` passes exactly the files the cluster would accept
as written, PyYAML here only parses (events, then nodes); each plain scalar then gets the value
go-yaml v2's ``resolve`` gives it, and the result is what the API server would receive: JSON
values, with a whole number an integer.

Refused, with the line: a duplicate key (kubectl's strict decoding refuses it too; a key a merge
brings in counts), NaN and infinity, integers outside 64 bits, tags other than the core ones, keys
that are not strings, integers or booleans, and anything but one non-empty document. Hostile files
are refused in bounded time and memory: at most :data:`MAX_BYTES`, nesting at most
:data:`MAX_DEPTH` deep, at most :data:`MAX_VALUES` values once aliases are expanded (go-yaml's
"excessive aliasing"), and no alias inside the value its anchor names.

:func:`read_documents` reads a stream of documents instead (a ``kubectl kustomize`` output, a file
of several jobs, standard input), with the same guarantees for each document (at most
:data:`MAX_BYTES`, :data:`MAX_DEPTH` and :data:`MAX_VALUES`) and bounds on the whole stream
(:data:`MAX_STREAM_BYTES`, :data:`MAX_STREAM_VALUES`); :func:`input_files` expands directories as
``kubectl apply -f DIR`` does. :func:`dump_all` writes a string of several lines as a literal
block scalar (``|``), so that a rendered ConfigMap's ``job.yaml`` reads as the file it holds.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import yaml
from yaml.composer import Composer
from yaml.error import Mark, MarkedYAMLError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader, ReaderError
from yaml.resolver import BaseResolver
from yaml.scanner import Scanner

from bertjob_api.spec import BertPretrainJob, SpecError, parse_job

# The operator stores the job file in a ConfigMap, which Kubernetes limits to 1 MiB.
MAX_BYTES = 1 << 20
# A job nests about a dozen levels (an affinity is the deepest part); PyYAML's composer recurses
# once per level, and Python's stack ends near 1000 frames.
MAX_DEPTH = 100
# A job holds a few hundred values; a "billion laughs" file of 2 kB expands to billions.
MAX_VALUES = 100_000
# A stream (standard input, a file of several documents) holds many jobs, each within the bounds
# above; these bound the whole, so that a stream of small alias bombs, each under MAX_VALUES, is
# refused in bounded time and memory too. 8 MiB holds a few thousand jobs.
MAX_STREAM_BYTES = 8 << 20
MAX_STREAM_VALUES = 10 * MAX_VALUES
# The name standard input takes among files, as for kubectl's -f.
STDIN = "-"
STDIN_NAME = "stdin"  # standard input's name in messages
# What a directory contributes, as for kubectl's -f DIR.
EXTENSIONS = (".yaml", ".yml", ".json")
JOB_KIND = "BertPretrainJob"
JOB_GROUP = "bertjob.dev"
LIST_KIND = "List"  # kubectl get -o yaml's wrapper of several objects (apiVersion v1, items)
_SHOWN_KIND = 40

_CORE = "tag:yaml.org,2002:"
_STR, _INT, _FLOAT, _BOOL, _NULL = (f"{_CORE}{name}" for name in ("str", "int", "float", "bool", "null"))
_MAP, _SEQ, _MERGE = f"{_CORE}map", f"{_CORE}seq", f"{_CORE}merge"
# A plain scalar without a tag: its type is decided here, as go-yaml decides it.
_PLAIN = "tag:bertjob.dev,2024:plain"

# go-yaml v2's resolve.go: the words it reads as booleans, null, infinities and NaN.
_WORDS: dict[str, Any] = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False),
    **dict.fromkeys(("", "~", "null", "Null", "NULL"), None),
    **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf),
}
# Go's strconv.ParseInt(s, 0, 64) syntax, which go-yaml applies after deleting underscores: a
# leading 0 means octal, and 0x, 0o, 0b prefixes.
_GO_INT = re.compile(r"[-+]?(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)")
_GO_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")  # go-yaml's yamlStyleFloat
_DOT_FLOAT = re.compile(r"\.[0-9]+([eE][-+]?[0-9]+)?")  # what Go's ParseFloat takes after a leading dot
_PREFIXES = {"0x": 16, "0o": 8, "0b": 2}
_INT64 = range(-(2**63), 2**63)
_SURROGATE = re.compile("[\ud800-\udfff]")


# The longest integer literal that can hold a 64-bit value: 0b and 64 binary digits.
_MAX_INT_LITERAL = 66


def resolve_plain(text: str) -> Any:
    """The value go-yaml v2 gives the untagged plain scalar ``text`` (``resolve`` in its resolve.go).

    Returns a ``bool``, ``None``, an ``int`` (any size: the caller checks the range; ``2**64`` for
    a literal too long to be a 64-bit integer in any base), a ``float``
    (NaN and infinities included) or ``text`` itself. Timestamps stay strings, as go-yaml leaves
    them when it decodes into an ``interface{}``; there is no base-60.
    """
    if text in _WORDS:
        return _WORDS[text]
    if text[0] == ".":
        return float(text) if _DOT_FLOAT.fullmatch(text) else text
    if text[0] not in "+-0123456789":
        return text
    plain = text.replace("_", "")
    if _GO_INT.fullmatch(plain):
        digits = plain.lstrip("+-")
        prefix = digits[:2].lower()
        if len(digits) > _MAX_INT_LITERAL:
            # Out of every 64-bit range in any base; not converted: Python refuses to turn more than
            # 4300 digits into an int (a bound against quadratic conversion time).
            value = 1 << 64
        elif prefix in _PREFIXES:
            value = int(digits[2:], _PREFIXES[prefix])
        else:
            value = int(digits, 8 if digits[0] == "0" else 10)
        return -value if plain[0] == "-" else value
    if _GO_FLOAT.fullmatch(plain):
        number = float(plain)
        # Go's ParseFloat fails on overflow, and go-yaml then keeps the string.
        return number if math.isfinite(number) else text
    return text


class _ReadError(Exception):
    """A problem found while reading, at ``line`` (1-based); ``path`` is the field path, if any."""

    def __init__(self, line: int | None, message: str, path: str = ""):
        super().__init__(message)
        self.line, self.message, self.path = line, message, path


def _line(node_or_mark: Node | Mark) -> int:
    mark = node_or_mark.start_mark if isinstance(node_or_mark, Node) else node_or_mark
    return mark.line + 1


class _Composer(Reader, Scanner, Parser, Composer, BaseResolver):
    """PyYAML's reader, scanner, parser and composer, with no implicit types, and bounds on the
    nesting depth and the number of nodes (an alias is not a new node: it shares its anchor's)."""

    def __init__(self, text: str):
        Reader.__init__(self, text)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        BaseResolver.__init__(self)
        self.depth = 0
        self.nodes = 0

    def compose_document(self) -> Node | None:
        # The bound is per document: a stream of many jobs holds many nodes in all.
        self.nodes = 0
        return super().compose_document()  # type: ignore[no-any-return,no-untyped-call,unused-ignore]

    def resolve(self, kind: type[Node], value: Any, implicit: tuple[bool, bool]) -> str:
        if kind is ScalarNode and implicit[0]:
            return _PLAIN
        # PyYAML has no type hints (types-PyYAML leaves these methods untyped).
        return str(super().resolve(kind, value, implicit))  # type: ignore[no-untyped-call,unused-ignore]

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        line = _line(self.peek_event().start_mark)  # type: ignore[no-untyped-call,unused-ignore]
        if not self.check_event(yaml.AliasEvent):
            self.nodes += 1
            if self.nodes > MAX_VALUES:
                raise _ReadError(line, f"more than {MAX_VALUES} values")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _ReadError(line, f"nested more than {MAX_DEPTH} levels deep")
        # PyYAML resolves a node tagged "!" as an untagged one; go-yaml keeps the tag (and reads
        # "! 12" as a string). Kept here, it is refused with the other unsupported tags.
        unresolved = getattr(self.peek_event(), "tag", None) == "!"  # type: ignore[no-untyped-call,unused-ignore]
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        if unresolved and node is not None:
            node.tag = "!"
        return node


class _Converter:
    """Nodes to JSON values, expanding aliases as go-yaml does, within MAX_DEPTH and MAX_VALUES."""

    def __init__(self) -> None:
        self.values = 0
        self.open: set[int] = set()  # the nodes being converted: an alias to one of them is a cycle

    @contextmanager
    def _entering(self, node: Node, path: str, depth: int) -> Iterator[None]:
        if id(node) in self.open:
            raise _ReadError(_line(node), "an alias refers to a value that contains it", path)
        self.values += 1
        if self.values > MAX_VALUES:
            # The composer refused documents with this many nodes: aliases made these values.
            message = f"excessive aliasing: the aliases expand to more than {MAX_VALUES} values"
            raise _ReadError(_line(node), message)
        if depth > MAX_DEPTH:
            raise _ReadError(
                _line(node), f"nested more than {MAX_DEPTH} levels deep once aliases are expanded"
            )
        self.open.add(id(node))
        try:
            yield
        finally:
            self.open.discard(id(node))

    def value(self, node: Node, path: str, depth: int) -> Any:
        """The JSON value of ``node``, ``depth`` levels deep, at the field ``path``."""
        with self._entering(node, path, depth):
            if isinstance(node, ScalarNode):
                return _scalar(node, path)
            if isinstance(node, SequenceNode):
                _check_tag(node, _SEQ, path)
                return [self.value(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(node.value)]
            return self._mapping(node, path, depth)[0]

    def _mapping(self, node: Node, path: str, depth: int) -> tuple[dict[str, Any], dict[str, int]]:
        """The mapping ``node`` as a dict, and the line of each key."""
        _check_tag(node, _MAP, path)
        result: dict[str, Any] = {}
        lines: dict[str, int] = {}

        def put(key: str, value: Any, line: int) -> None:
            if key in result:
                raise _ReadError(
                    line, f"duplicate key {key!r} (also at line {lines[key]})", _child(path, key)
                )
            result[key], lines[key] = value, line

        for key_node, value_node in node.value:
            if _is_merge(key_node):
                # go-yaml's strict decoding refuses a merged key set again, so the order of the
                # merged mappings and of the keys beside them does not matter.
                sources = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
                if not all(isinstance(source, MappingNode) for source in sources):
                    message = "a merge (<<) takes a mapping or a list of mappings"
                    raise _ReadError(_line(value_node), message, path)
                for source in sources:
                    with self._entering(source, path, depth + 1):
                        merged, merged_lines = self._mapping(source, path, depth + 1)
                    for key, value in merged.items():
                        put(key, value, merged_lines[key])
                continue
            key = _key(self.value(key_node, path, depth + 1), key_node, path)
            put(key, self.value(value_node, _child(path, key), depth + 1), _line(key_node))
        return result, lines


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _is_merge(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.value == "<<" and node.tag in (_PLAIN, _MERGE)


def _short(tag: str) -> str:
    return "!!" + tag.removeprefix(_CORE) if tag.startswith(_CORE) else tag


def _check_tag(node: Node, expected: str, path: str) -> None:
    if node.tag != expected:
        raise _ReadError(_line(node), f"tag {_short(node.tag)} is not supported", path)


def _scalar(node: Node, path: str) -> Any:
    text = node.value
    if node.tag == _STR:
        value: Any = text
    elif node.tag == _PLAIN:
        value = resolve_plain(text)
    elif node.tag in (_INT, _FLOAT, _BOOL, _NULL):
        # go-yaml resolves an explicitly tagged scalar as a plain one, then checks the type.
        value = resolve_plain(text)
        if node.tag == _FLOAT and type(value) is int:
            value = float(value)
        if _tag_of(value) != node.tag:
            raise _ReadError(_line(node), f"cannot read {_shown(text)!r} as {_short(node.tag)}", path)
    else:
        raise _ReadError(_line(node), f"tag {_short(node.tag)} is not supported", path)
    return _as_json(value, text, _line(node), path)


def _tag_of(value: Any) -> str:
    for kind, tag in ((bool, _BOOL), (int, _INT), (float, _FLOAT), (str, _STR)):
        if isinstance(value, kind):
            return tag
    return _NULL


def _as_json(value: Any, text: str, line: int, path: str) -> Any:
    """``value`` as the API server receives it from kubectl's JSON."""
    if isinstance(value, str):
        if _SURROGATE.search(value):
            raise _ReadError(line, "a lone UTF-16 surrogate (\\ud800-\\udfff escapes come in pairs)", path)
        return value
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if value not in _INT64:
            raise _ReadError(line, f"{_shown(text)} is outside the 64-bit integers Kubernetes holds", path)
        return value
    if not math.isfinite(value):
        raise _ReadError(
            line, f"{_shown(text)} is not a number JSON can hold; kubectl refuses NaN and infinity", path
        )
    # Go writes a whole float64 without a fraction, and the API server reads that as an integer.
    return int(value) if value.is_integer() and int(value) in _INT64 else value


def _shown(text: str, limit: int = 40) -> str:
    """``text`` for a message: cut to ``limit`` characters, saying how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _key(key: Any, node: Node, path: str) -> str:
    """A mapping key as JSON spells it: sigs.k8s.io/yaml turns integers and booleans into strings."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    kind = "null" if key is None else {float: "a float", dict: "a mapping", list: "a list"}[type(key)]
    raise _ReadError(_line(node), f"a key must be a string, an integer or a boolean, not {kind}", path)


def _location(error: _ReadError) -> str:
    line = f"line {error.line}" if error.line else ""
    if error.path:
        return f"{error.path} ({line})" if line else error.path
    return line or "file"


def _yaml_problem(error: MarkedYAMLError) -> tuple[str, str]:
    mark = error.problem_mark or error.context_mark
    location = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "file"
    message = f"not valid YAML: {error.problem or error.context}"
    if error.context and error.problem:
        context = error.context_mark
        where = f" at line {context.line + 1}, column {context.column + 1}" if context else ""
        message += f" ({error.context}{where})"
    return location, message


class JobFileError(SpecError):
    """An input refused as a whole, in one line ``SOURCE: MESSAGE``: a file that does not exist or
    cannot be read, or a document of another kind than a BertPretrainJob where one was expected.
    A :class:`SpecError` (its one problem is ``("file", message)``), so that every caller that
    reports a refused job file reports this too."""

    def __init__(self, source: str, message: str):
        super().__init__(source, [("file", message)])
        self.message = message
        self.args = (f"{source}: {message}",)


def _read_bytes(path: Path, source: str, limit: int) -> bytes:
    try:
        with path.open("rb") as file:
            return _bounded(file, source, limit)
    except FileNotFoundError:
        raise JobFileError(source, "no such file or directory") from None
    except IsADirectoryError:
        raise JobFileError(source, "is a directory") from None
    except OSError as error:
        raise JobFileError(source, f"cannot read ({error.strerror or error})") from None


def _bounded(file: BinaryIO, source: str, limit: int) -> bytes:
    data = file.read(limit + 1)
    if len(data) > limit:
        what = "the most a ConfigMap holds" if limit == MAX_BYTES else "the most a stream may hold"
        raise SpecError(source, [("file", f"larger than {limit} bytes, {what}")])
    return data


def _decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        problem = f"not UTF-8 (byte 0x{data[error.start]:02x}); save the file as UTF-8"
        raise SpecError(source, [(f"line {line}", problem)]) from None


def _parse(text: str, source: str) -> Iterator[tuple[int, Any]]:
    """``(line, value)`` for each non-empty document of ``text``, the value as the API server would
    receive it; a document refused on its own (too large, a duplicate key, NaN, aliases that expand
    too far) yields ``(line, _ReadError)`` and the next document is read.

    Raises:
        SpecError: ``text`` is not YAML (from the line where it stops being so), a document nests
            too deep or holds too many nodes (PyYAML cannot go on past it), or the documents hold
            more than :data:`MAX_STREAM_VALUES` values in all.
    """
    values = 0
    try:
        composer = _Composer(text)
        while composer.check_node():
            node = composer.get_node()
            if node is None:
                continue
            line = _line(node)
            size = len(text[node.start_mark.index : node.end_mark.index].encode("utf-8"))
            if size > MAX_BYTES:
                yield (
                    line,
                    _ReadError(line, f"a document larger than {MAX_BYTES} bytes, the most a ConfigMap holds"),
                )
                continue
            converter = _Converter()
            try:
                value = converter.value(node, "", 1)
            except _ReadError as error:
                value = error
            values += converter.values
            if values > MAX_STREAM_VALUES:
                raise _ReadError(line, f"more than {MAX_STREAM_VALUES} values in all documents")
            if value is not None:
                yield line, value
    except _ReadError as error:
        raise SpecError(source, [(_location(error), error.message)]) from None
    except MarkedYAMLError as error:
        raise SpecError(source, [_yaml_problem(error)]) from None
    except ReaderError as error:
        line = text.count("\n", 0, error.position) + 1
        problem = f"not valid YAML: unacceptable character #x{error.character:04x}: {error.reason}"
        raise SpecError(source, [(f"line {line}", problem)]) from None


def read_document(path: str | Path) -> Any:
    """Read a YAML (or JSON) file as kubectl would send it to the API server.

    Returns the one non-empty document's value: dicts with string keys, lists, strings, bools,
    ``None``, 64-bit ints and finite floats (a whole number is an int). Empty documents are
    skipped, as kubectl skips them.

    Raises:
        JobFileError: the file does not exist or cannot be read.
        SpecError: the file is larger than MAX_BYTES, is not UTF-8 or not YAML, holds anything but
            one non-empty document, or a value kubectl would read otherwise than PyYAML or refuse;
            the problem names the line, and the field where there is one.
    """
    source = str(path)
    text = _decode(_read_bytes(Path(path), source, MAX_BYTES), source)
    documents = list(_parse(text, source))
    for _, value in documents:
        if isinstance(value, _ReadError):
            raise SpecError(source, [(_location(value), value.message)])
    if not documents:
        raise SpecError(source, [("file", "holds no YAML document")])
    if len(documents) > 1:
        lines = ", ".join(str(line) for line, _ in documents[:-1]) + f" and {documents[-1][0]}"
        message = f"holds {len(documents)} documents (at lines {lines}); a job file holds one BertPretrainJob"
        raise SpecError(source, [("file", message)])
    return documents[0][1]


@dataclass(frozen=True)
class Document:
    """One document of a stream, read as :func:`read_document` reads a job file.

    ``source`` names it: the file (:data:`STDIN_NAME` for standard input) when the stream holds only this
    document, else ``FILE#N``, N counting the stream's non-empty documents from 1. ``line`` is the
    1-based line of the stream where it starts. ``value`` is its JSON value, ``None`` where
    ``error`` says why it was refused on its own.
    """

    source: str
    line: int
    value: Any = None
    error: SpecError | None = None

    @property
    def kind(self) -> str | None:
        """The document's ``kind``, where it is a mapping with a string there."""
        return kind_of(self.value)


def kind_of(document: Any) -> str | None:
    """``document``'s ``kind`` where it is a mapping with a string ``kind``, else ``None``."""
    kind = document.get("kind") if isinstance(document, dict) else None
    return kind if isinstance(kind, str) else None


def other_kind(document: Any) -> str | None:
    """Why ``document`` is an object of another kind, ``not a BertPretrainJob (kind: Namespace)``,
    or ``None`` where it is to be validated as a job. A document of this API's group
    (``apiVersion: bertjob.dev/...``) or without a string ``kind`` is a job whatever its kind says,
    so that a misspelt ``kind`` is refused by name rather than passed over."""
    kind = kind_of(document)
    api_version = document.get("apiVersion") if isinstance(document, dict) else None
    if kind is None or kind == JOB_KIND:
        return None
    if isinstance(api_version, str) and api_version.split("/")[0] == JOB_GROUP:
        return None
    shown = kind if kind.isprintable() and len(kind) <= _SHOWN_KIND else repr(_shown(kind))
    return f"not a {JOB_KIND} (kind: {shown})"


def read_documents(name: str, stdin: BinaryIO | None = None) -> list[Document]:
    """Every non-empty document of the file ``name``, or of ``stdin`` where ``name`` is :data:`STDIN`,
    as kubectl reads a stream for ``apply -f`` (YAML documents separated by ``---``, or JSON).

    Each document keeps :func:`read_document`'s guarantees: at most :data:`MAX_BYTES`,
    :data:`MAX_DEPTH` levels and :data:`MAX_VALUES` values; a document refused on its own carries
    its :class:`SpecError` (the problem names the stream's line) and the others are still read.

    Raises:
        JobFileError: the file does not exist or cannot be read.
        SpecError: the stream is larger than :data:`MAX_STREAM_BYTES` or holds more than
            :data:`MAX_STREAM_VALUES` values, is not UTF-8, is not YAML from some line on, or holds
            a document too deep or with too many nodes to read past.
    """
    if name == STDIN:
        shown = STDIN_NAME
        if stdin is None:
            raise JobFileError(shown, "standard input is not available")
        data = _bounded(stdin, shown, MAX_STREAM_BYTES)
    else:
        shown = name
        data = _read_bytes(Path(name), name, MAX_STREAM_BYTES)
    parsed = list(_parse(_decode(data, shown), shown))
    documents = []
    for index, (line, value) in enumerate(parsed, start=1):
        source = shown if len(parsed) == 1 else f"{shown}#{index}"
        if isinstance(value, _ReadError):
            documents.append(
                Document(source, line, error=SpecError(source, [(_location(value), value.message)]))
            )
        elif kind_of(value) == LIST_KIND:
            documents.extend(_list_items(f"{shown}#{index}", line, value))
        else:
            documents.append(Document(source, line, value))
    return documents


def _list_items(source: str, line: int, value: dict[str, Any]) -> list[Document]:
    """A ``kind: List``'s objects, as kubectl's builder flattens them: item ``i`` is named
    ``FILE#N items[i]`` (``N`` the List's place in the stream, even where it is the only document),
    and starts at the List's line."""
    items = value.get("items", [])
    if not isinstance(items, list):
        found = next((name for kind, name in _JSON_KINDS if isinstance(items, kind)), "null")
        problem = ("items", f"a {LIST_KIND}'s items must be a list, not {found}")
        return [Document(source, line, error=SpecError(source, [problem]))]
    return [Document(f"{source} items[{i}]", line, item) for i, item in enumerate(items)]


_JSON_KINDS = ((bool, "a boolean"), (dict, "an object"), (str, "a string"), ((int, float), "a number"))


def without_status(document: Any) -> Any:
    """``document`` without its ``status``, where it is a mapping: what a user may apply is the rest
    (``kubectl get -o yaml`` prints a live object's status; the API server ignores it on create and
    update of the main resource, and the admission webhook leaves it out too)."""
    if not isinstance(document, dict) or "status" not in document:
        return document
    return {key: value for key, value in document.items() if key != "status"}


def input_files(names: Sequence[str], recursive: bool = False) -> list[str]:
    """The files that ``names`` stand for, in order, as ``kubectl apply -f`` takes them: a file as
    it is, :data:`STDIN` as it is (once), a directory as its files named ``*.yaml``, ``*.yml`` or
    ``*.json`` in sorted order (with ``recursive``, those of its subdirectories too, each at its
    place in that order, as kubectl's walk goes). A named directory may be a symbolic link; one
    found inside it is not followed (see :func:`_directory_files`).

    Raises:
        JobFileError: a name that does not exist, a directory without such a file, or standard
            input named twice.
    """
    files: list[str] = []
    for name in names:
        path = Path(name)
        if name == STDIN:
            if STDIN in files:
                raise JobFileError(name, "standard input can be read only once")
            files.append(name)
        elif path.is_dir():
            found = _directory_files(path, recursive)
            if not found:
                wanted = ", ".join(f"*{extension}" for extension in EXTENSIONS)
                raise JobFileError(name, f"a directory without a {wanted} file")
            files.extend(found)
        elif path.exists():
            files.append(name)
        else:
            raise JobFileError(name, "no such file or directory")
    return files


def _directory_files(directory: Path, recursive: bool) -> list[str]:
    """The job files of ``directory`` in name order, and with ``recursive`` those of each
    subdirectory at its name's place, as Go's ``filepath.Walk`` (kubectl's ``-R``) visits them.

    A symbolic link to a file is read (its name must end as a job file's); one to a directory is
    not followed, as ``filepath.Walk`` follows none (``kubectl apply -R`` skips it, checked with
    kubectl 1.32): a link back to a parent cannot loop, and a tree reached twice is not read twice.
    """
    files: list[str] = []
    for entry in sorted(directory.iterdir(), key=lambda entry: entry.name):
        if entry.is_file() and entry.name.endswith(EXTENSIONS):
            files.append(str(entry))
        elif recursive and entry.is_dir() and not entry.is_symlink():
            files.extend(_directory_files(entry, recursive))
    return files


def load_job(path: str | Path) -> BertPretrainJob:
    """Read a job file as kubectl would (:func:`read_document`) and validate it.

    Raises:
        JobFileError: the file does not exist or cannot be read, or holds an object of another
            kind (``not a BertPretrainJob (kind: Namespace)``).
        SpecError: the file is refused (see :func:`read_document`), or its document does not fit
            the API.
    """
    document = read_document(path)
    other = other_kind(document)
    if other is not None:
        raise JobFileError(str(path), other)
    return parse_job(document, str(path))


def _go_tag(tag: str, kind: type[Node], value: Any, implicit: tuple[bool, bool]) -> str:
    """The tag a dumper gives a scalar: the resolver's ``tag``, except for a string that go-yaml
    would read as another type, which gets that type's tag so that the emitter quotes it."""
    if kind is ScalarNode and implicit[0] and tag == _STR and not isinstance(resolve_plain(value), str):
        return _tag_of(resolve_plain(value))
    return tag


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, quoting also each string that go-yaml would read as another type."""

    def resolve(self, kind: type[Node], value: Any, implicit: tuple[bool, bool]) -> str:
        tag = str(super().resolve(kind, value, implicit))  # type: ignore[no-untyped-call,unused-ignore]
        return _go_tag(tag, kind, value, implicit)


# PyYAML's wheels carry libyaml; a PyYAML built without it has no CSafeDumper, and then every
# document goes through the Python emitter.
_HAS_LIBYAML = hasattr(yaml, "CSafeDumper")


class _CDumper(yaml.CSafeDumper if _HAS_LIBYAML else yaml.SafeDumper):  # type: ignore[misc]
    """:class:`_Dumper` with libyaml's emitter (four times faster); used only for documents whose
    text both emitters write alike (:func:`_emitted_alike`)."""

    def resolve(self, kind: type[Node], value: Any, implicit: tuple[bool, bool]) -> str:
        if kind is ScalarNode and isinstance(value, str):
            return _scalar_tag(value, implicit)
        tag = str(super().resolve(kind, value, implicit))  # type: ignore[no-untyped-call,unused-ignore]
        return _go_tag(tag, kind, value, implicit)


_RESOLVER = yaml.resolver.Resolver()


@functools.lru_cache(maxsize=4096)
def _scalar_tag(value: str, implicit: tuple[bool, bool]) -> str:
    """:class:`_Dumper`'s tag for a scalar, which depends on its text alone: remembered, as the
    same texts come back in every job's document (each is resolved twice, by regular expressions)."""
    tag = str(_RESOLVER.resolve(ScalarNode, value, implicit))  # type: ignore[no-untyped-call,unused-ignore]
    return _go_tag(tag, ScalarNode, value, implicit)


# libyaml's emitter writes what PyYAML's does for these documents only (a differential comparison of
# both on random documents, in tests/bertjob_api/test_jobfile_dump.py): they differ in where they
# fold a double-quoted string (any with an escape, i.e. outside printable ASCII), in writing an
# empty key, and in writing a key over 128 characters as a simple key.
_PRINTABLE_ASCII = re.compile(r"[ -~]*")
_MAX_KEY = 100
_MAX_STRING = 512


def _emitted_alike(document: Any) -> bool:
    """Whether ``document`` holds only JSON values whose strings are printable ASCII (keys of 1 to
    :data:`_MAX_KEY` characters, other strings at most :data:`_MAX_STRING`)."""
    pending = [document]
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            if len(value) > _MAX_STRING or not _PRINTABLE_ASCII.fullmatch(value):
                return False
        elif isinstance(value, dict):
            for key in value:
                if (
                    not isinstance(key, str)
                    or not 0 < len(key) <= _MAX_KEY
                    or not _PRINTABLE_ASCII.fullmatch(key)
                ):
                    return False
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
        elif value is not None and type(value) not in (bool, int, float):
            return False
    return True


def dump(document: Any) -> str:
    """``document`` as YAML that PyYAML and go-yaml (kubectl) both read back as ``document``."""
    dumper = _CDumper if _HAS_LIBYAML and _emitted_alike(document) else _Dumper
    return yaml.dump(document, Dumper=dumper, sort_keys=False)


class _BlockDumper(_Dumper):
    """:class:`_Dumper`, writing each string of several lines as a literal block scalar."""


def _represent_str(dumper: _BlockDumper, value: str) -> ScalarNode:
    # "|" is a wish: PyYAML's emitter writes a string that a block cannot hold exactly (a space
    # before a line break, a tab, a control character, a key) double-quoted instead, and a
    # one-line string as _Dumper does.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar(_STR, value, style=style)  # type: ignore[no-untyped-call,unused-ignore,no-any-return]


_BlockDumper.add_representer(str, _represent_str)


def dump_all(documents: Iterable[Any]) -> str:
    """``documents`` as a multi-document YAML stream that PyYAML and go-yaml (kubectl) both read back
    as ``documents``: written as :func:`dump` writes one, except that a string of several lines (a
    ConfigMap's file) is a literal block scalar (``|``), as ``kubectl get -o yaml`` writes it."""
    return yaml.dump_all(documents, Dumper=_BlockDumper, sort_keys=False)
