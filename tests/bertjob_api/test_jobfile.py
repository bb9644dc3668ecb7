"""Job files are read as kubectl reads them (go-yaml v2, then JSON), and hostile ones are refused.

kubectl sends JSON: it reads YAML with go-yaml v2 (through sigs.k8s.io/yaml) and the API server
reads that JSON back, where a whole number is an integer. The expected values below are what the
API server receives; the comment says what PyYAML's YAML 1.1 reads instead, where that differs.
"""

from __future__ import annotations

import io
import re

import pytest
import yaml

from bertjob_api import jobfile
from bertjob_api.jobfile import (
    MAX_BYTES,
    MAX_DEPTH,
    MAX_VALUES,
    JobFileError,
    dump,
    dump_all,
    load_job,
    read_document,
)
from bertjob_api.spec import SpecError
from bertjob_testing.jobs import valid_job


def _read(tmp_path, text: str | bytes):
    path = tmp_path / "job.yaml"
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8")
    else:
        path.write_bytes(text)
    return read_document(path)


def _refusal(tmp_path, text: str | bytes) -> str:
    with pytest.raises(SpecError) as caught:
        _read(tmp_path, text)
    assert str(caught.value).startswith(f"{tmp_path / 'job.yaml'}: invalid BertPretrainJob")
    return str(caught.value)


@pytest.mark.parametrize(
    ("scalar", "value"),
    [
        ("4:16", "4:16"),  # PyYAML: the base-60 integer 256
        ("1:30:00", "1:30:00"),  # PyYAML: 5400
        ("1e-4", 0.0001),  # PyYAML: the string "1e-4"
        ("1E3", 1000),  # PyYAML: "1E3"; a whole number reaches the API server as an integer
        ("6e-3", 0.006),
        ("2.0", 2),  # PyYAML: the float 2.0
        ("1.5", 1.5),
        (".5", 0.5),
        ("-.5", -0.5),
        ("1.", 1),
        ("0777", 511),
        ("0o777", 511),  # PyYAML: the string "0o777"
        ("-0o17", -15),
        ("0x1F", 31),
        ("0b101", 5),
        ("+12", 12),
        ("1_000", 1000),
        ("08", 8),  # not octal: go-yaml reads the float 8.0, which JSON carries as 8
        ("9223372036854775807", 9223372036854775807),
        ("1e400", "1e400"),  # too large for a float64: go-yaml keeps the string
        ("y", True),  # PyYAML: the string "y"
        ("Y", True),
        ("yes", True),
        ("On", True),
        ("TRUE", True),
        ("n", False),  # PyYAML: the string "n"
        ("No", False),
        ("off", False),
        ("yES", "yES"),
        ("~", None),
        ("null", None),
        ("NULL", None),
        ("", None),
        ("2001-12-14", "2001-12-14"),  # PyYAML: a datetime.date
        ("2001-12-14T21:59:43.10-05:00", "2001-12-14T21:59:43.10-05:00"),  # PyYAML: a datetime
        ("nan", "nan"),
        ("NaN", "NaN"),
        ("=", "="),  # PyYAML: the tag:yaml.org,2002:value it cannot construct
        ("<<", "<<"),  # a merge only as a key
        ("1,000", "1,000"),
        ("0x", "0x"),
        ("'0777'", "0777"),
        ('"yes"', "yes"),
        ("!!str 12", "12"),
        ("!!float 1", 1),
        ("!!float 0.5", 0.5),
        ("!!int 0x10", 16),
        ("!!bool yes", True),
        ("!!null ~", None),
    ],
)
def test_scalars_are_read_as_go_yaml_reads_them(tmp_path, scalar, value):
    got = _read(tmp_path, f"value: {scalar}\n")["value"]
    assert got == value
    assert type(got) is type(value)


@pytest.mark.parametrize(
    ("text", "location", "message"),
    [
        (
            "value: .inf\n",
            "value (line 1)",
            ".inf is not a number JSON can hold; kubectl refuses NaN and infinity",
        ),
        ("value: -.Inf\n", "value (line 1)", "-.Inf is not a number JSON can hold"),
        ("value: .nan\n", "value (line 1)", ".nan is not a number JSON can hold"),
        ("a:\n  b: [1, !!float .NaN]\n", "a.b[1] (line 2)", ".NaN is not a number JSON can hold"),
        (
            "value: 9223372036854775808\n",
            "value (line 1)",
            "9223372036854775808 is outside the 64-bit integers Kubernetes holds",
        ),
        (
            "value: -9223372036854775809\n",
            "value (line 1)",
            "-9223372036854775809 is outside the 64-bit integers Kubernetes holds",
        ),
        (
            # Longer than the 4300 digits Python turns into an int: refused, not a traceback, and
            # the message shows the start of the value, not all of it.
            f"value: {'9' * 5000}\n",
            "value (line 1)",
            f"{'9' * 40}... (5000 characters) is outside the 64-bit integers Kubernetes holds",
        ),
        (
            f"value: 0x{'f' * 5000}\n",
            "value (line 1)",
            f"0x{'f' * 38}... (5002 characters) is outside the 64-bit integers Kubernetes holds",
        ),
        ("value: !!int abc\n", "value (line 1)", "cannot read 'abc' as !!int"),
        ("value: !!float yes\n", "value (line 1)", "cannot read 'yes' as !!float"),
        ("value: !!binary aGk=\n", "value (line 1)", "tag !!binary is not supported"),
        ("value: !!timestamp 2001-12-14\n", "value (line 1)", "tag !!timestamp is not supported"),
        ("value: !!set {a}\n", "value (line 1)", "tag !!set is not supported"),
        ("value: !custom x\n", "value (line 1)", "tag !custom is not supported"),
        ("value: ! 12\n", "value (line 1)", "tag ! is not supported"),
        ('value: "\\ud800"\n', "value (line 1)", "a lone UTF-16 surrogate"),
    ],
)
def test_values_json_cannot_hold_are_refused(tmp_path, text, location, message):
    assert f"  {location}: {message}" in _refusal(tmp_path, text)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("{1: a}\n", {"1": "a"}),
        ("{yes: a}\n", {"true": "a"}),  # go-yaml reads the key as a boolean, JSON spells it
        ("{2.0: a}\n", {"2": "a"}),
        ("base: &b {x: 1}\nm: {<<: *b, z: 2}\n", {"base": {"x": 1}, "m": {"x": 1, "z": 2}}),
        (
            "a: &a {x: 1}\nb: &b {z: 2}\nm: {<<: [*a, *b]}\n",
            {"a": {"x": 1}, "b": {"z": 2}, "m": {"x": 1, "z": 2}},
        ),
        ("m: {!!merge <<: {x: 1}}\n", {"m": {"x": 1}}),
        ("m: {'<<': {x: 1}}\n", {"m": {"<<": {"x": 1}}}),
    ],
)
def test_keys_and_merges(tmp_path, text, value):
    assert _read(tmp_path, text) == value


@pytest.mark.parametrize(
    ("text", "location", "message"),
    [
        ("a: 1\nb: 2\na: 3\n", "a (line 3)", "duplicate key 'a' (also at line 1)"),
        ("s:\n  x: 1\n  x: 1\n", "s.x (line 3)", "duplicate key 'x' (also at line 2)"),
        ("{on: a, true: b}\n", "true (line 1)", "duplicate key 'true'"),
        ("{1: a, '1': b}\n", "1 (line 1)", "duplicate key '1'"),
        # A merged key that an explicit key overrides: go-yaml's strict decoding refuses it too.
        ("base: &b {x: 1}\nm:\n  <<: *b\n  x: 2\n", "m.x (line 4)", "duplicate key 'x' (also at line 1)"),
        ("a: &a {x: 1}\nb: &b {x: 2}\nm: {<<: [*a, *b]}\n", "m.x (line 2)", "duplicate key 'x'"),
        ("m: {<<: 1}\n", "m (line 1)", "a merge (<<) takes a mapping or a list of mappings"),
        ("m: {<<: [1]}\n", "m (line 1)", "a merge (<<) takes a mapping or a list of mappings"),
        ("{~: a}\n", "line 1", "a key must be a string, an integer or a boolean"),
        ("{0.5: a}\n", "line 1", "a key must be a string, an integer or a boolean"),
        ("? [1]\n: a\n", "line 1", "a key must be a string, an integer or a boolean"),
    ],
)
def test_duplicate_and_unreadable_keys_are_refused(tmp_path, text, location, message):
    assert f"  {location}: {message}" in _refusal(tmp_path, text)


def test_a_file_that_is_not_utf8_is_refused_with_its_line(tmp_path):
    message = _refusal(tmp_path, b"a: 1\nb: caf\xe9\n")
    assert "  line 2: not UTF-8 (byte 0xe9); save the file as UTF-8" in message


def test_a_utf8_byte_order_mark_is_allowed(tmp_path):
    assert _read(tmp_path, b"\xef\xbb\xbfa: 1\n") == {"a": 1}


def test_a_utf16_file_is_refused(tmp_path):
    assert "not UTF-8 (byte 0xff)" in _refusal(tmp_path, "a: 1\n".encode("utf-16"))


def test_control_characters_are_refused(tmp_path):
    assert "  line 2: not valid YAML: unacceptable character #x0007" in _refusal(tmp_path, "a: 1\nb: \x07\n")


def test_a_syntax_error_names_its_line(tmp_path):
    message = _refusal(tmp_path, "a: 1\nb: [unclosed\n")
    assert "  line 3, column 1: not valid YAML: expected ',' or ']'" in message


def test_a_file_over_the_limit_is_refused_before_it_is_parsed(tmp_path):
    message = _refusal(tmp_path, "a: " + "x" * MAX_BYTES + "\n")
    assert f"larger than {MAX_BYTES} bytes" in message


@pytest.mark.parametrize("opening", ["[", "{a: ", "- "])
def test_deep_nesting_is_refused(tmp_path, opening):
    depth = 500
    if opening == "- ":
        text = "".join("  " * i + "-\n" for i in range(depth)) + "  " * depth + "x\n"
    else:
        text = "a: " + opening * depth + "1" + ("]" if opening == "[" else "}") * depth + "\n"
    assert f"nested more than {MAX_DEPTH} levels deep" in _refusal(tmp_path, text)


def test_nesting_through_aliases_is_bounded_too(tmp_path):
    lines = ["a0: &a0 [1]"] + [f"a{i}: &a{i} [*a{i - 1}]" for i in range(1, 200)]
    assert f"nested more than {MAX_DEPTH} levels deep" in _refusal(tmp_path, "\n".join(lines) + "\n")


@pytest.mark.parametrize(
    "text",
    ["a: &a [*a]\n", "a: &a {x: *a}\n", "a: &a {<<: *a}\n", "a: &a {x: [1, {y: *a}]}\n"],
)
def test_an_alias_inside_its_own_anchor_is_refused(tmp_path, text):
    assert "an alias refers to a value that contains it" in _refusal(tmp_path, text)


def _alias_bomb(levels: int = 9, width: int = 9) -> str:
    """Billion laughs: each level holds ``width`` aliases of the one before (width**levels values)."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(30)
def test_an_alias_bomb_is_refused_quickly(tmp_path):
    text = _alias_bomb()
    assert len(text) < 2000
    message = _refusal(tmp_path, text)
    assert f"excessive aliasing: the aliases expand to more than {MAX_VALUES} values" in message


def test_many_values_without_aliases_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(jobfile, "MAX_VALUES", 1000)  # a smaller limit, for a smaller file
    message = _refusal(tmp_path, "a: [" + ", ".join(["1"] * 1000) + "]\n")
    assert "  line 1: more than 1000 values" in message
    assert "aliasing" not in message


def test_aliases_within_the_limits_are_expanded(tmp_path):
    assert _read(tmp_path, "a: &a {x: [1, 2]}\nb: *a\n") == {"a": {"x": [1, 2]}, "b": {"x": [1, 2]}}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("a: 1\n", {"a": 1}),
        ("---\na: 1\n", {"a": 1}),
        ("---\na: 1\n---\n", {"a": 1}),  # kubectl skips empty documents
        ("---\n---\na: 1\n...\n", {"a": 1}),
    ],
)
def test_one_document_and_any_empty_ones(tmp_path, text, value):
    assert _read(tmp_path, text) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: 1\n---\nb: 2\n", "holds 2 documents (at lines 1 and 3); a job file holds one BertPretrainJob"),
        ("", "holds no YAML document"),
        ("# nothing\n", "holds no YAML document"),
        ("---\n~\n", "holds no YAML document"),
    ],
)
def test_anything_but_one_document_is_refused(tmp_path, text, message):
    assert message in _refusal(tmp_path, text)


@pytest.mark.parametrize(
    ("name", "message"), [("nope.yaml", "no such file or directory"), (".", "is a directory")]
)
def test_a_file_that_cannot_be_read_is_refused_in_one_line(tmp_path, name, message):
    with pytest.raises(JobFileError) as caught:
        read_document(tmp_path / name)
    assert str(caught.value) == f"{tmp_path / name}: {message}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: bert}\n",
            "not a BertPretrainJob (kind: Namespace)",
        ),
        ('apiVersion: v1\nkind: "x\\n  evil: true"\n', "not a BertPretrainJob (kind: 'x\\n  evil: true')"),
    ],
)
def test_load_job_refuses_another_kind_by_name(tmp_path, text, message):
    path = tmp_path / "ns.yaml"
    path.write_text(text)
    with pytest.raises(JobFileError) as caught:
        load_job(path)
    assert str(caught.value) == f"{path}: {message}"


def test_load_job_refuses_a_misspelt_kind_of_this_api_field_by_field(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(dump({**valid_job(), "kind": "BertPretrainjob"}))
    with pytest.raises(SpecError) as caught:
        load_job(path)
    assert caught.value.problems == [("kind", "Input should be 'BertPretrainJob'")]


def _stream(tmp_path, text: str):
    path = tmp_path / "stream.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _job_yaml(name: str) -> str:
    return dump({**valid_job(), "metadata": {"name": name}})


# A 'billion laughs' value of 9**5 strings: under MAX_VALUES once (59,049 strings and lists), and
# over MAX_STREAM_VALUES in a stream of a few dozen documents.
_BOMB = (
    "[&l0 ["
    + ", ".join(["lol"] * 9)
    + "], "
    + ", ".join(f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 5))
    + "]\n"
)


@pytest.mark.parametrize(
    ("text", "read"),
    [
        # Each document is named by its place; empty ones are skipped, as kubectl skips them.
        ("a: 1\n---\n---\nb: 2\n", [("stream.yaml#1", 1, {"a": 1}), ("stream.yaml#2", 4, {"b": 2})]),
        ("a: 1\n", [("stream.yaml", 1, {"a": 1})]),
        # A document refused on its own does not stop the next one.
        (
            "a: .nan\n---\nb: 2\n",
            [("stream.yaml#1", 1, "a (line 1): .nan is not a number"), ("stream.yaml#2", 3, {"b": 2})],
        ),
        (
            "a: &x [*x]\n---\nb: 2\n",
            [
                ("stream.yaml#1", 1, "an alias refers to a value that contains it"),
                ("stream.yaml#2", 3, {"b": 2}),
            ],
        ),
        (
            "a: 1\na: 2\n---\nb: y\n",
            [("stream.yaml#1", 1, "duplicate key 'a'"), ("stream.yaml#2", 4, {"b": True})],
        ),
        # A List (kubectl get -o yaml) is its items, named by the List's place even when alone.
        (
            "apiVersion: v1\nkind: List\nitems:\n- a: 1\n- b: 2\n",
            [("stream.yaml#1 items[0]", 1, {"a": 1}), ("stream.yaml#1 items[1]", 1, {"b": 2})],
        ),
        (
            "a: 1\n---\nkind: List\nitems: []\n---\nkind: List\nitems: [{c: 3}]\n",
            [("stream.yaml#1", 1, {"a": 1}), ("stream.yaml#3 items[0]", 6, {"c": 3})],
        ),
        (
            "kind: List\nitems: 3\n",
            [("stream.yaml#1", 1, "items: a List's items must be a list, not a number")],
        ),
    ],
)
def test_read_documents_reads_each_document_of_a_stream(tmp_path, text, read):
    documents = jobfile.read_documents(str(_stream(tmp_path, text)))
    assert [document.source.removeprefix(f"{tmp_path}/") for document in documents] == [
        name for name, _, _ in read
    ]
    assert [document.line for document in documents] == [line for _, line, _ in read]
    for document, (_, _, expected) in zip(documents, read, strict=True):
        if isinstance(expected, str):
            assert document.value is None and expected in str(document.error)
            assert str(document.error).startswith(f"{document.source}: invalid BertPretrainJob")
        else:
            assert (document.value, document.error) == (expected, None)


def test_without_status_leaves_out_a_live_objects_status_only():
    live = {"kind": "BertPretrainJob", "metadata": {"name": "a"}, "spec": {}, "status": {"phase": "Running"}}
    assert jobfile.without_status(live) == {"kind": "BertPretrainJob", "metadata": {"name": "a"}, "spec": {}}
    assert "status" in live  # the document read is not changed
    assert jobfile.without_status(["status"]) == ["status"]


def test_a_stream_holds_more_nodes_than_one_document_may(tmp_path):
    # Each document has 60,000 nodes, under MAX_VALUES; the stream has more than MAX_VALUES.
    document = "[" + ", ".join(["1"] * 60_000) + "]\n"
    documents = jobfile.read_documents(str(_stream(tmp_path, document + "---\n" + document)))
    assert [len(document.value) for document in documents] == [60_000, 60_000]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("---\n".join([_BOMB] * 20), f"more than {jobfile.MAX_STREAM_VALUES} values in all documents"),
        ("a: " + "x" * (jobfile.MAX_STREAM_BYTES + 1), f"larger than {jobfile.MAX_STREAM_BYTES} bytes"),
        ("a: 1\n---\nb: [\n", "line 4, column 1: not valid YAML"),
        ("---\n" + "[" * 200 + "]" * 200, f"line 2: nested more than {MAX_DEPTH} levels deep"),
    ],
)
def test_a_stream_is_refused_as_a_whole_past_its_bounds_or_its_syntax(tmp_path, text, message):
    with pytest.raises(SpecError) as caught:
        jobfile.read_documents(str(_stream(tmp_path, text)))
    assert message in str(caught.value)


def test_a_document_of_a_stream_keeps_the_size_of_a_configmap(tmp_path):
    big = "a: " + "x" * MAX_BYTES + "\n"
    (first, second) = jobfile.read_documents(str(_stream(tmp_path, big + "---\nb: 2\n")))
    assert f"a document larger than {MAX_BYTES} bytes" in str(first.error)
    assert second.value == {"b": 2}


def test_read_documents_reads_standard_input_by_the_name_stdin():
    stream = io.BytesIO((_job_yaml("one") + "---\n" + _job_yaml("two")).encode())
    documents = jobfile.read_documents(jobfile.STDIN, stream)
    assert [(document.source, document.kind) for document in documents] == [
        ("stdin#1", "BertPretrainJob"),
        ("stdin#2", "BertPretrainJob"),
    ]


@pytest.mark.parametrize(
    ("files", "names", "recursive", "expected"),
    [
        # A directory: its YAML and JSON files in sorted order, not its subdirectories' (kubectl -f DIR).
        (["d/b.yaml", "d/a.json", "d/c.txt", "d/s/e.yml"], ["d"], False, ["d/a.json", "d/b.yaml"]),
        (
            ["d/b.yaml", "d/a.json", "d/c.txt", "d/s/e.yml"],
            ["d"],
            True,
            ["d/a.json", "d/b.yaml", "d/s/e.yml"],
        ),
        (["x.yaml", "d/a.yml"], ["x.yaml", "-", "d"], False, ["x.yaml", "-", "d/a.yml"]),
        ([], ["nope.yaml"], False, "nope.yaml: no such file or directory"),
        (["d/c.txt"], ["d"], False, "d: a directory without a *.yaml, *.yml, *.json file"),
        ([], ["-", "-"], False, "-: standard input can be read only once"),
    ],
)
def test_input_files_expands_names_as_kubectl_apply_f_does(
    tmp_path, monkeypatch, files, names, recursive, expected
):
    monkeypatch.chdir(tmp_path)
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("a: 1\n")
    if isinstance(expected, str):
        with pytest.raises(JobFileError, match=re.escape(expected)):
            jobfile.input_files(names, recursive)
    else:
        assert jobfile.input_files(names, recursive) == expected


# Strings a literal block scalar must carry exactly, or leave to double quotes.
BLOCK_STRINGS = [
    "a\nb",
    "a\nb\n",
    "a\n\n\n",
    "\n",
    "  leading\nspaces",
    "\nleading break",
    "trailing space \nx",
    "tab\tin\nit",
    "---\n...\n# not a comment\n",
    "caf\u00e9\n\u00fc\n",
    "a\r\nb",
    "x: 1\n  evil: true\n",
    "line\u2028sep\nx",
]


@pytest.mark.parametrize("text", BLOCK_STRINGS)
def test_dump_all_writes_lines_as_a_block_that_both_readers_read_back(tmp_path, text):
    documents = [{"data": {"job.yaml": text}, "other": "y"}, {"k": text}]
    written = dump_all(documents)
    assert list(yaml.safe_load_all(written)) == documents
    assert [
        document.value for document in jobfile.read_documents(str(_stream(tmp_path, written)))
    ] == documents


def test_dump_all_writes_a_job_file_as_a_block(tmp_path):
    written = dump_all([{"data": {"job.yaml": _job_yaml("demo")}}])
    assert written.startswith("data:\n  job.yaml: |\n    apiVersion: bertjob.dev/v1alpha1\n")


def test_load_job_validates_what_it_reads(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(dump(valid_job()).replace("learningRate: 0.006", "learningRate: 6e-3"))
    assert load_job(path).spec.phases[0].learning_rate == 0.006


@pytest.mark.parametrize(
    "text", ["y", "n", "Y", "N", "1e3", "0o17", "-0x1F", "08", "+.5", "1_0.5", "2001-12-14", "4:16", "on", ""]
)
def test_dump_quotes_every_string_either_reader_would_read_as_another_type(tmp_path, text):
    document = {"metadata": {"name": text}, text or "k": [text]}
    written = dump(document)
    assert yaml.safe_load(written) == document
    assert _read(tmp_path, written) == document


def test_dump_all_writes_each_document(tmp_path):
    written = dump_all([{"a": "y"}, {"b": "1e3"}])
    assert list(yaml.safe_load_all(written)) == [{"a": "y"}, {"b": "1e3"}]


def test_the_trainer_reads_the_config_map_as_the_job_was_written(tmp_path):
    from bertjob.render import JOB_FILE, render
    from bertjob_api.spec import parse_job, to_document
    from bertjob_testing.jobs import with_value

    # Strings that YAML 1.1 writes unquoted, and go-yaml would read as a boolean or a number.
    document = with_value(valid_job(), "metadata.name", "y")
    document = with_value(
        document, "spec.pod", {"env": [{"name": "A", "value": "n"}, {"name": "B", "value": "1e3"}]}
    )
    job = parse_job(document)
    config_map = render(job)[0]
    path = tmp_path / JOB_FILE
    path.write_text(config_map["data"][JOB_FILE])
    read = to_document(load_job(path))
    assert read == yaml.safe_load(config_map["data"][JOB_FILE])
    assert read["metadata"]["name"] == "y"
    assert read["spec"]["pod"]["env"] == [{"name": "A", "value": "n"}, {"name": "B", "value": "1e3"}]
