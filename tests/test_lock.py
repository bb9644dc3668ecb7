"""requirements/operator.lock, from which the operator image installs (``pip install
--require-hashes``): it pins, with hashes, a version within every specifier of pyproject.toml's
dependencies and build-system requires, and pip refuses it, offline, when a dependency is missing
from it. Refreshed by ``make lock`` (hack/lock.sh), which needs PyPI; tests talk to no index, so they
install from the wheelhouse that make downloads from the same lock."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.wheelhouse import WHEELHOUSE, wheelhouse_or_skip

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements" / "operator.lock"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _pins(text: str) -> dict[str, tuple[str, list[str]]]:
    """{name: (version, hashes)} of a lock's text."""
    pins = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text.strip()):
        if block.startswith("#"):
            block = "\n".join(line for line in block.splitlines() if not line.startswith("#"))
            if not block.strip():
                continue
        found = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", block)
        assert found is not None, block[:80]
        pins[canonicalize_name(found.group(1))] = (
            found.group(2),
            re.findall(r"--hash=sha256:([0-9a-f]{64})", block),
        )
    return pins


def test_the_lock_pins_every_requirement_within_its_specifier_with_hashes() -> None:
    pins = _pins(LOCK.read_text())
    wanted = [
        Requirement(text)
        for text in PYPROJECT["project"]["dependencies"] + PYPROJECT["build-system"]["requires"]
    ]
    for requirement in wanted:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in {LOCK.name}: run `make lock`"
        version, _ = pins[name]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{name}=={version} is not {requirement}: `make lock`"
        )
    assert all(hashes for _, hashes in pins.values())
    assert "torch" not in pins  # the operator image has no torch


def _pip_dry_run(lock: Path) -> subprocess.CompletedProcess[str]:
    """pip resolving ``lock`` as the image does (hash-checking), offline, installing nothing."""
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--require-hashes",
         "--no-index", f"--find-links={WHEELHOUSE}", "-r", str(lock)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_pip_installs_the_lock_and_refuses_it_without_one_dependency(tmp_path: Path) -> None:
    wheelhouse_or_skip()
    whole = _pip_dry_run(LOCK)
    assert whole.returncode == 0, whole.stdout + whole.stderr

    # kopf's own dependency aiohttp, left out: pip must not fetch it unpinned.
    text = LOCK.read_text()
    without = re.sub(r"\naiohttp==[^\n]*(\n    [^\n]*)*", "", text)
    assert without != text and "aiohttp==" not in without
    lock = tmp_path / "operator.lock"
    lock.write_text(without)
    refused = _pip_dry_run(lock)
    assert refused.returncode != 0
    assert "aiohttp" in refused.stderr and "hash" in refused.stderr.lower(), refused.stderr
