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

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.wheelhouse import WHEELHOUSE, wheelhouse_or_skip

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements" / "operator.lock"
TRAINER, TORCH, HOROVOD = (REPO / "requirements" / f"{name}.lock" for name in ("trainer", "torch", "horovod"))
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


def _blocks(text: str) -> list[tuple[str, str, str, list[str]]]:
    """(name, marker, first line, "via" parents) of each pinned block of a lock's text; a name has
    one block per marker where the resolution forks."""
    found = []
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    for block in re.split(r"\n(?=[A-Za-z0-9])", body.strip()):
        first = block.splitlines()[0]
        via = re.search(r"# via (.*)", block)
        found.append((
            canonicalize_name(re.match(r"[A-Za-z0-9_.-]+", first).group(0)),  # type: ignore[union-attr]
            first.partition(";")[2].rstrip(" \\"),
            first,
            [parent.strip() for parent in via.group(1).split(",")] if via else [],
        ))  # fmt: skip
    return found


def test_the_trainer_locks_pin_the_trainer_extra_within_its_specifiers_with_hashes() -> None:
    trainer, torch = _pins(TRAINER.read_text()), _pins(TORCH.read_text())
    assert not trainer.keys() & torch.keys()
    pins = trainer | torch
    project = PYPROJECT["project"]
    wanted = [
        Requirement(text)
        for text in project["dependencies"] + project["optional-dependencies"]["trainer"]
        + PYPROJECT["build-system"]["requires"]
    ]  # fmt: skip
    for requirement in wanted:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is in neither {TRAINER.name} nor {TORCH.name}: run `make lock`"
        assert requirement.specifier.contains(pins[name][0], prereleases=True), f"{name}: `make lock`"
    assert all(hashes for _, hashes in pins.values())
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
    in_torch = {name for name, *_ in blocks[TORCH.name]}
    locked = {name for found in blocks.values() for name, *_ in found}

    def torch_only(marker: str, parents: list[str]) -> bool:
        platform = "sys_platform" in marker or "platform_machine" in marker
        return platform and bool(parents) and {canonicalize_name(p) for p in parents} <= in_torch

    for name, marker, first, parents in blocks[TORCH.name]:
        assert name == "torch" or torch_only(marker, parents), f"{first}: not for torch.lock ({parents})"
    for _, marker, first, parents in blocks[TRAINER.name]:
        # Else the CPU images would install the CUDA build's libraries.
        assert not torch_only(marker, parents), f"{first}: only torch needs it, on some platforms"
    for found in blocks.values():
        for _, _, first, parents in found:
            for parent in parents:
                root = parent.startswith("-r ") or parent.split()[0] == "bertjob"
                assert root or canonicalize_name(parent) in locked, f"{first}: needs {parent}, in no lock"
