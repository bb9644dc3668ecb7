"""Finished runs on disk, so that an interrupted benchmark loses none: ``<out>/runs/<key>.json``.

A run's key is made of everything that decides its result: its kind, name and replicate seed,
its budget, the size, and its settings (our job's ``spec`` with the work directory's path taken
out, or the peer's settings), plus :data:`RECORD_VERSION` and the evaluation's settings. Two
invocations that would train the same run find the same file; a run whose settings changed gets
another. A record is written under a temporary name and renamed, so a file that exists is whole.
The code of the trainer is not in the key: after changing it, start from an empty ``--out``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from ttq.settings import EVAL_MASKING, PAIRS_PREDICTIONS, SINGLES_PREDICTIONS

# Bump when a record's content or meaning changes: older records are then not reused.
RECORD_VERSION = 1
_EVALUATION = {"masking": EVAL_MASKING, "singles": SINGLES_PREDICTIONS, "pairs": PAIRS_PREDICTIONS}


def without_paths(value: Any, work: Path) -> Any:
    """``value`` (JSON-like) with every string that starts with ``work``'s path rewritten to start
    with ``<work>``: the output directory decides nothing about a run."""
    prefix = str(work)
    if isinstance(value, dict):
        return {key: without_paths(item, work) for key, item in value.items()}
    if isinstance(value, list):
        return [without_paths(item, work) for item in value]
    if isinstance(value, str) and value.startswith(prefix):
        return "<work>" + value[len(prefix) :]
    return value


def run_key(kind: str, name: str, seed: int, budget: float, size: str, settings: dict[str, Any]) -> str:
    """``<name>-<seed>-<budget>s-<hash>``: readable, and unique to the run's content (the first 16
    hex digits of the SHA-256 of the canonical JSON of all of it). ``settings`` must already be
    free of paths (:func:`without_paths`)."""
    content = {
        "version": RECORD_VERSION,
        "evaluation": _EVALUATION,
        "kind": kind,
        "name": name,
        "seed": seed,
        "budget": budget,
        "size": size,
        "settings": settings,
    }
    digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{name}-{seed}-{budget:g}s")
    return f"{readable}-{digest}"


class RunStore:
    """The directory of finished runs' records."""

    def __init__(self, directory: Path):
        self.directory = directory

    def path(self, key: str) -> Path:
        """Where run ``key``'s record is."""
        return self.directory / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """Run ``key``'s record, or None when it has not finished.

        Raises:
            ValueError: the file is not a record of this key (named in the message).
        """
        path = self.path(key)
        if not path.is_file():
            return None
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or record.get("key") != key:
            raise ValueError(f"{path}: not the record of run {key}; remove it")
        return record

    def put(self, record: dict[str, Any]) -> Path:
        """Write ``record`` (with its ``key``) under a temporary name, then rename it into place."""
        path = self.path(record["key"])
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(temporary, path)
        return path

    def __len__(self) -> int:
        return len(list(self.directory.glob("*.json"))) if self.directory.is_dir() else 0
