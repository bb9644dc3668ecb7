"""The package as `pip install bertjob` gives it: the wheel built from this tree, installed into a
new virtual environment (not editable, no torch) from the wheelhouse that `make` downloads the
package's own dependencies into (tests talk to no index). From another directory, the installed
``bertjob`` validates and renders an example (render builds the overlays that the wheel carries, with
kubectl's kustomize), and kubectl finds ``kubectl-bertjob`` through its plugin lookup."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.wheelhouse import WHEELHOUSE, wheelhouse_or_skip

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "bert-tiny-cluster.yaml"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _run(*command: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    assert result.returncode == 0, f"{' '.join(map(str, command))}: {result.stdout}{result.stderr}"
    return result


# What a source distribution of the package holds; copied so that the build starts clean (a build
# in the repository reuses its build/ directory) and writes nothing there.
SOURCES = (
    "pyproject.toml",
    "setup.py",
    "MANIFEST.in",
    "README.md",
    "api",
    "operator",
    "trainer_image",
    "kustomize",
    "testing",
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this tree, built without build isolation (setuptools from this venv: no index)."""
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(
                REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            shutil.copyfile(REPO / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, source)
    [built] = out.glob("bertjob-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A new venv with the wheel and its dependencies from the wheelhouse; its bin directory."""
    wheelhouse_or_skip()
    venv = tmp_path_factory.mktemp("venv")
    _run(sys.executable, "-m", "venv", venv)
    _run(venv / "bin" / "pip", "install", "-q", "--no-index", f"--find-links={WHEELHOUSE}", wheel)
    yield venv / "bin"


def test_the_wheel_carries_the_overlays_and_no_test_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "bertjob/kustomize/overlays/single-node/kustomization.yaml" in names
    assert "bertjob/kustomize/base/kustomization.yaml" in names
    assert not [name for name in names if name.startswith(("bertjob_testing/", "tests/"))]
    entry_points = next(name for name in names if name.endswith(".dist-info/entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert (
        "bertjob = bertjob.cli:entrypoint" in scripts
        and "kubectl-bertjob = bertjob.cli:entrypoint" in scripts
    )


def test_the_installed_cli_validates_and_renders_from_another_directory_without_torch(
    installed: Path, tmp_path: Path
) -> None:
    python = installed / "python"
    modules = "('torch', 'kopf', 'kubernetes')"
    found = f"import importlib.util as u; print([m for m in {modules} if not u.find_spec(m)])"
    missing = _run(python, "-c", found)
    assert missing.stdout.strip() == "['torch']"
    job = tmp_path / "job.yaml"
    shutil.copyfile(EXAMPLE, job)
    # Only the venv and the system's tools (kubectl) on PATH: nothing of the repository's.
    env = {**os.environ, "PATH": f"{installed}{os.pathsep}{os.environ['PATH']}"}
    env.pop("BERTJOB_KUSTOMIZE_DIR", None)
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()

    validated = _run(installed / "bertjob", "validate", job, cwd=workdir, env=env)
    assert "valid BertPretrainJob" in validated.stdout

    rendered = _run(installed / "bertjob", "render", "-n", "research", job, cwd=workdir, env=env)
    kinds = [obj["kind"] for obj in yaml.safe_load_all(rendered.stdout) if obj]
    assert "ConfigMap" in kinds and ("PyTorchJob" in kinds or "MPIJob" in kinds or "TrainJob" in kinds)
    assert str(REPO) not in rendered.stdout + rendered.stderr

    version = _run(installed / "bertjob", "--version", cwd=workdir, env=env)
    assert version.stdout.strip() == f"bertjob {VERSION}"


def test_kubectl_finds_the_cli_as_its_plugin(installed: Path, tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no kubectl on PATH")
        pytest.skip("no kubectl on PATH")
    env = {**os.environ, "PATH": f"{installed}{os.pathsep}{os.environ['PATH']}"}
    # Its exit code counts warnings about other plugins on this machine's PATH: not ours to judge.
    listed = subprocess.run(
        [kubectl, "plugin", "list"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert str(installed / "kubectl-bertjob") in listed.stdout, listed.stdout + listed.stderr

    version = _run(kubectl, "bertjob", "--version", env=env, cwd=tmp_path)
    assert version.stdout.strip() == f"bertjob {VERSION}"
