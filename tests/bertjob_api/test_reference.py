"""docs/reference.md: generated from the CRD schema, complete, and current."""

from __future__ import annotations

import copy
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from bertjob_api import files, reference
from bertjob_api.crd import resource_schema
from bertjob_testing.jobs import REPO

REFERENCE = REPO / "docs" / "reference.md"


def _sections(markdown: str) -> dict[str, dict[str, list[str]]]:
    """Each ``### heading`` of the reference with its table: field name -> the row's cells."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for line in markdown.splitlines():
        if line.startswith("### "):
            current = sections.setdefault(line.removeprefix("### "), {})
        elif current is not None and line.startswith("| `"):
            # Split on the pipes that end a cell, not on escaped ones inside it.
            cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
            current[cells[0].strip("`")] = cells
    return sections


def _fields(schema: dict[str, Any], path: str) -> set[tuple[str, str]]:
    """(table, field) for every field under ``schema``, found without the generator's help."""
    found: set[tuple[str, str]] = set()
    for name, sub in schema.get("properties", {}).items():
        found.add((path or "BertPretrainJob", name))
        child = f"{path}.{name}" if path else name
        found |= _fields(sub, child)
        if isinstance(sub.get("items"), dict):
            found |= _fields(sub["items"], child + "[]")
        if isinstance(sub.get("additionalProperties"), dict):
            found |= _fields(sub["additionalProperties"], child + "{}")
    return found


def test_the_committed_reference_is_current() -> None:
    expected = reference.generate(resource_schema())

    assert REFERENCE.read_text(encoding="utf-8") == expected, (
        "docs/reference.md is stale: run `make generate` (python -m bertjob_api.reference docs/reference.md)"
    )


def test_every_field_of_the_crd_has_a_row_in_its_objects_table() -> None:
    sections = _sections(reference.generate(resource_schema()))

    listed = {(table, field) for table, rows in sections.items() for field in rows}
    assert listed == _fields(resource_schema(), "")
    # Spot checks that the columns carry the schema's facts.
    phases = sections["spec.phases[]"]
    assert phases["maxSeqLength"][2] == "yes"
    assert phases["warmupProportion"][3:5] == ["`0.01`", "≥ 0; < 1"]
    assert phases["learningRate"][4] == "> 0"
    assert "one of `pytorchjob`, `mpijob`" in sections["spec"]["launcher"][4]
    assert "[`spec.data.sources[]`](#specdatasources)" in sections["spec.data"]["sources"][1]


def test_a_field_added_to_the_schema_shows_up() -> None:
    schema = copy.deepcopy(resource_schema())
    schema["properties"]["spec"]["properties"]["data"]["properties"]["shuffleBuffer"] = {
        "type": "integer",
        "description": "Documents held | shuffled\nat once.",
        "default": 1000,
        "minimum": 1,
        "maximum": 100000,
    }
    schema["properties"]["spec"]["properties"]["hooks"] = {
        "type": "array",
        "description": "Commands run between phases.",
        "items": {
            "type": "object",
            "description": "One hook.",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z]+$", "minLength": 1},
                "when": {"type": "string", "enum": ["before", "after"], "default": "after"},
                "env": {"type": "object", "additionalProperties": {"x-kubernetes-int-or-string": True}},
            },
        },
    }

    markdown = reference.generate(schema)
    sections = _sections(markdown)

    assert sections["spec.data"]["shuffleBuffer"] == [
        "`shuffleBuffer`",
        "integer",
        "",
        "`1000`",
        "≥ 1; ≤ 100000",
        "Documents held \\| shuffled at once.",
    ]
    assert "list of (object, [`spec.hooks[]`](#spechooks))" in sections["spec"]["hooks"][1]
    hooks = sections["spec.hooks[]"]
    assert hooks["name"][2:5] == ["yes", "", "length ≥ 1; matches `^[a-z]+$`"]
    assert hooks["when"][3:5] == ["`after`", "one of `before`, `after`"]
    assert hooks["env"][1] == "map of string to (integer or string)"
    assert "[`spec.hooks[]`](#spechooks)" in markdown.split("###")[0], "the contents list links every table"


def test_anchors_are_the_ones_github_gives_the_headings() -> None:
    assert reference.anchor("spec.phases[]") == "specphases"
    assert reference.anchor("spec.runPolicy.schedulingPolicy") == "specrunpolicyschedulingpolicy"
    assert reference.anchor("BertPretrainJob") == "bertpretrainjob"


def test_main_prints_without_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert reference.main([]) == 0

    assert capsys.readouterr().out == reference.generate(resource_schema())


def test_main_replaces_the_file_in_one_rename(tmp_path: Path) -> None:
    target = tmp_path / "reference.md"
    target.write_text("old\n")
    target.chmod(0o640)

    assert reference.main([str(target)]) == 0

    assert target.read_text(encoding="utf-8") == reference.generate(resource_schema())
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert os.listdir(tmp_path) == ["reference.md"], "no temporary file left behind"


def test_a_failed_write_leaves_the_old_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "reference.md"
    target.write_text("old\n")

    def refuse(source: str, destination: Path) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        reference.main([str(target)])

    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["reference.md"]


def test_a_new_file_is_world_readable(tmp_path: Path) -> None:
    target = tmp_path / "new.md"

    files.write_text(target, "text\n")

    assert stat.S_IMODE(target.stat().st_mode) == 0o644
