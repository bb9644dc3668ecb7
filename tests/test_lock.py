"""The images' locks in requirements/ (``pip install --require-hashes``), refreshed by ``make lock``
(hack/lock.sh), which needs PyPI; tests talk to no index, so they install from the wheelhouse that
make downloads from operator.lock.

- operator.lock pins, with hashes, a version within every specifier of pyproject.toml's
  dependencies and build-system requires, and pip refuses it, offline, when a dependency is missing.
- trainer.lock and torch.lock together pin the [trainer] extra the same way; torch.lock holds torch
  and only what torch alone needs on some platforms (its CUDA build's libraries); horovod.lock pins
  the source distribution that trainer_image/build_horovod.sh compiles. tests/images builds the
  Xeon image from them.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import NamedTuple

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.wheelhouse import WHEELHOUSE, wheelhouse_or_skip

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements" / "operator.lock"
TRAINER, TORCH, HOROVOD = (REPO / "requirements" / f"{name}.lock" for name in ("trainer", "torch", "horovod"))
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


class Pin(NamedTuple):
    """One pinned block of a lock: a name has one per marker where the resolution forks."""

    name: str
    version: str
    marker: str
    first: str  # the block's first line, for messages
    hashes: list[str]
    parents: list[str]  # uv's "via" note: what requires it


def _blocks(text: str) -> list[Pin]:
    """The pinned blocks of a lock's text, its header comments left out."""
    found = []
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    for block in re.split(r"\n(?=[A-Za-z0-9])", body.strip()):
        first = block.splitlines()[0]
        pinned = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", first)
        assert pinned is not None, first
        via = re.search(r"# via (.*)", block)
        found.append(Pin(
            canonicalize_name(pinned.group(1)),
            pinned.group(2),
            first.partition(";")[2].rstrip(" \\"),
            first,
            re.findall(r"--hash=sha256:([0-9a-f]{64})", block),
            [parent.strip() for parent in via.group(1).split(",")] if via else [],
        ))  # fmt: skip
    return found


def _pins(text: str) -> dict[str, tuple[str, list[str]]]:
    """{name: (version, hashes)} of a lock's text."""
    return {pin.name: (pin.version, pin.hashes) for pin in _blocks(text)}


def _assert_pins_within_specifiers(
    requirements: list[str], pins: dict[str, tuple[str, list[str]]], locks: str
) -> None:
    """Each of ``requirements`` pinned within its specifier in ``pins`` (read from ``locks``), and
    every pin with hashes."""
    for text in requirements:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in {locks}: run `make lock`"
        version, _ = pins[name]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{name}=={version} is not {requirement}: `make lock`"
        )
    assert all(hashes for _, hashes in pins.values())


def test_the_lock_pins_every_requirement_within_its_specifier_with_hashes() -> None:
    pins = _pins(LOCK.read_text())
    _assert_pins_within_specifiers(
        PYPROJECT["project"]["dependencies"] + PYPROJECT["build-system"]["requires"], pins, LOCK.name
    )
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


def test_the_trainer_locks_pin_the_trainer_extra_within_its_specifiers_with_hashes() -> None:
    trainer, torch = _pins(TRAINER.read_text()), _pins(TORCH.read_text())
    assert not trainer.keys() & torch.keys()
    project = PYPROJECT["project"]
    _assert_pins_within_specifiers(
        project["dependencies"]
        + project["optional-dependencies"]["trainer"]
        + PYPROJECT["build-system"]["requires"],
        trainer | torch,
        f"{TRAINER.name} or {TORCH.name}",
    )
    # Every image installs trainer.lock over its own torch: it must not replace it.
    assert "torch" in torch and "torch" not in trainer


def test_the_horovod_lock_pins_the_source_distribution_build_horovod_compiles() -> None:
    script = (REPO / "trainer_image" / "build_horovod.sh").read_text()
    version = re.search(r"^VERSION=(\S+)$", script, re.MULTILINE)
    assert version is not None
    pins = _pins(HOROVOD.read_text())
    assert pins.keys() == {"horovod"} and pins["horovod"][0] == version.group(1), pins
    # One file, the sdist: build_horovod.sh compiles it (pip download --no-binary --require-hashes).
    assert len(pins["horovod"][1]) == 1
    # Its dependencies are in trainer.lock, so installing the wheel fetches nothing unhashed.
    assert {"cloudpickle", "psutil", "cffi"} <= _pins(TRAINER.read_text()).keys()


def test_torch_lock_holds_torch_and_only_what_torch_alone_needs_on_some_platforms() -> None:
    blocks = {lock.name: _blocks(lock.read_text()) for lock in (TRAINER, TORCH, HOROVOD)}
    in_torch = {pin.name for pin in blocks[TORCH.name]}
    locked = {pin.name for found in blocks.values() for pin in found}

    def torch_only(marker: str, parents: list[str]) -> bool:
        platform = "sys_platform" in marker or "platform_machine" in marker
        return platform and bool(parents) and {canonicalize_name(p) for p in parents} <= in_torch

    for pin in blocks[TORCH.name]:
        assert pin.name == "torch" or torch_only(pin.marker, pin.parents), f"{pin.first}: not for torch.lock"
    for pin in blocks[TRAINER.name]:
        # Else the CPU images would install the CUDA build's libraries.
        assert not torch_only(pin.marker, pin.parents), f"{pin.first}: only torch needs it, on some platforms"
    for found in blocks.values():
        for pin in found:
            for parent in pin.parents:
                root = parent.startswith("-r ") or parent.split()[0] == "bertjob"
                assert root or canonicalize_name(parent) in locked, f"{pin.first}: needs {parent}, in no lock"
