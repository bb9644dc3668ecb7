"""Every default image reference names an image that hack/build-images.sh builds.

The script's own build commands (``--builder print``, which builds nothing) give the tags and the
Dockerfile targets; the references are read where a user meets them: the chart as ``helm template``
renders it (the operator's Deployment, the ClusterTrainingRuntimes), manifests/, the kustomize tree
as a user's kustomization builds it with each accelerator component, the examples' jobs, and every
``ghcr.io/bertjob/...`` written in the docs, examples, charts, kustomize tree and Dockerfiles.

Which build a default names (docs/images.md):

- the operator: ``operator``;
- a job's trainer: its accelerator's build (nvidia-gpu: ``cuda``, habana-hpu: ``gaudi``, xeon-cpu:
  ``xeon``), in the examples and in each accelerator component of the kustomize tree;
- the kustomize base (no accelerator chosen yet) and the chart's ``trainingRuntimes.image``: ``xeon``.
  The runtime image stays only in bertjob-mpi's launcher, which runs mpirun and needs no accelerator;
  the Gaudi path never runs under MPI (bertjob_api.validation refuses it).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bertjob.render import kustomize_build
from bertjob_api.spec.job import JobSpec
from bertjob_testing.jobs import REPO
from tests.helm_chart import CHART, NAMESPACE, RELEASE, helm_or_skip

BUILD = REPO / "hack" / "build-images.sh"
KUSTOMIZE = REPO / "kustomize"
EXAMPLES = REPO / "examples"
# The trainer build for each spec.accelerator (docs/images.md).
ACCELERATOR_TARGETS = {"nvidia-gpu": "cuda", "habana-hpu": "gaudi", "xeon-cpu": "xeon"}
# The build that runs where no accelerator is chosen: the kustomize base, the MPI runtime's launcher.
NEUTRAL_TARGET = "xeon"
# Where a user reads or copies an image reference. tests/, testing/ and benchmarks/ hold fixtures:
# a job there names an image only because the field is required, and never pulls it.
SCANNED = (
    "README.md",
    "DEVELOPERS.md",
    "Dockerfile",
    "trainer_image/Dockerfile",
    "docs/*.md",
    "examples/**/*.yaml",
    "charts/bertjob/**/*",
    "kustomize/**/*.yaml",
    "manifests/*.yaml",
    "hack/*.sh",
    ".github/workflows/*.yml",
    "api/bertjob_api/**/*.py",
    "operator/bertjob/**/*.py",
)
# A reference: the repository, then a tag when one follows. A placeholder such as VERSION-TARGET is
# no tag (it starts with no digit), so it counts as a reference without one.
REFERENCE = re.compile(r"ghcr\.io/bertjob/(?P<repository>[a-z0-9._/-]*[a-z0-9])(?::(?P<tag>[0-9][\w.-]*))?")


def _chart() -> dict[str, Any]:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())


def _stages(dockerfile: Path) -> set[str]:
    """The named stages (``FROM ... AS name``) of a Dockerfile."""
    return set(
        re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)\s*$", dockerfile.read_text(), re.MULTILINE | re.IGNORECASE)
    )


def run_build_script(*arguments: str) -> str:
    """What ``hack/build-images.sh ARGUMENTS`` prints, with ghcr.io/bertjob as its registry (a
    ``REGISTRY`` of this environment left out); it must succeed."""
    environment = {key: value for key, value in os.environ.items() if key != "REGISTRY"}
    result = subprocess.run(
        [str(BUILD), *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def built() -> dict[str, str]:
    """{build-images.sh target: the tag it builds}, from the docker commands the script prints.

    Each trainer target is checked to be a stage of the Dockerfile the command names."""
    tags: dict[str, str] = {}
    for line in run_build_script("--builder", "print").splitlines():
        words = shlex.split(line)
        options = dict(itertools.pairwise(words))
        dockerfile = Path(options["--file"])
        target = options.get("--target")
        if target is None:
            tags["operator"] = options["-t"]
        else:
            assert target in _stages(dockerfile), f"{BUILD} builds target {target}, which {dockerfile} lacks"
            tags[target] = options["-t"]
    return tags


def test_the_script_builds_the_operator_and_a_trainer_per_accelerator(built: dict[str, str]) -> None:
    assert set(built) == {"operator", *ACCELERATOR_TARGETS.values()}


def test_the_build_tags_are_the_charts_app_version(built: dict[str, str]) -> None:
    """The images' version is the chart's appVersion; the chart's own version and the Python
    package's agree with it (a release tag vX.Y.Z publishes all of them, .github/workflows/release.yml)."""
    chart = _chart()
    version = str(chart["appVersion"])
    package = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]

    assert built["operator"] == f"ghcr.io/bertjob/operator:{version}"
    for target in ACCELERATOR_TARGETS.values():
        assert built[target] == f"ghcr.io/bertjob/trainer:{version}-{target}"
    assert (str(chart["version"]), package) == (version, version)


def _containers(value: Any) -> Iterator[dict[str, Any]]:
    """Every container (an object in a ``containers`` or ``initContainers`` list), at any depth."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("containers", "initContainers") and isinstance(item, list):
                yield from (container for container in item if isinstance(container, dict))
            else:
                yield from _containers(item)
    elif isinstance(value, list):
        for item in value:
            yield from _containers(item)


def _images(objects: list[dict[str, Any]]) -> set[str]:
    """The images of every container in ``objects``, and every TrainJob's spec.trainer.image."""
    images = {container["image"] for obj in objects for container in _containers(obj) if "image" in container}
    images |= {obj["spec"]["trainer"]["image"] for obj in objects if obj.get("kind") == "TrainJob"}
    return images


def test_the_charts_defaults_name_built_images(built: dict[str, str], tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(json.dumps({"trainingRuntimes": {"install": True}}))
    rendered = subprocess.run(
        [helm_or_skip(), "template", RELEASE, str(CHART), f"--namespace={NAMESPACE}", f"--values={values}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    objects = [obj for obj in yaml.safe_load_all(rendered.stdout) if obj]

    by_kind = {
        kind: _images([obj for obj in objects if obj["kind"] == kind])
        for kind in ("Deployment", "ClusterTrainingRuntime")
    }
    assert by_kind == {"Deployment": {built["operator"]}, "ClusterTrainingRuntime": {built[NEUTRAL_TARGET]}}
    assert _images(objects) <= set(built.values())


def test_the_generated_manifests_name_the_built_operator(built: dict[str, str]) -> None:
    objects = [
        obj
        for path in sorted((REPO / "manifests").glob("*.yaml"))
        for obj in yaml.safe_load_all(path.read_text())
        if obj
    ]
    assert _images(objects) == {built["operator"]}


def test_the_kustomize_base_names_the_neutral_build(built: dict[str, str]) -> None:
    [pod] = [obj for obj in yaml.safe_load_all((KUSTOMIZE / "base" / "trainer-pod.yaml").read_text()) if obj]
    assert _images([pod]) == {built[NEUTRAL_TARGET]}


@pytest.mark.parametrize("accelerator", sorted(ACCELERATOR_TARGETS))
@pytest.mark.parametrize("launcher", ["pytorchjob", "mpijob", "trainjob"])
def test_a_kustomization_by_hand_runs_its_accelerators_build(
    built: dict[str, str], tmp_path: Path, launcher: str, accelerator: str
) -> None:
    """A user's kustomization of the tree, as docs/operator.md describes: every pod of the job (the
    MPIJob Launcher's too) and a TrainJob's trainer run the accelerator component's build."""
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        # kustomize takes directories outside the kustomization's root only as relative paths.
        "resources": [os.path.relpath(KUSTOMIZE / "overlays" / "multi-node", tmp_path)],
        "components": [
            os.path.relpath(KUSTOMIZE / "components" / name, tmp_path) for name in (launcher, accelerator)
        ],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    objects = [obj for obj in yaml.safe_load_all(kustomize_build(tmp_path)) if obj]

    assert _images(objects) == {built[ACCELERATOR_TARGETS[accelerator]]}


def test_the_kustomize_by_hand_example_runs_the_xeon_build(built: dict[str, str]) -> None:
    objects = [
        obj for obj in yaml.safe_load_all(kustomize_build(EXAMPLES / "gitops" / "kustomize-by-hand")) if obj
    ]
    assert _images(objects) == {built["xeon"]}


def _example_jobs() -> list[tuple[str, dict[str, Any]]]:
    return [
        (str(path.relative_to(REPO)), document)
        for path in sorted(EXAMPLES.rglob("*.yaml"))
        for document in yaml.safe_load_all(path.read_text())
        if isinstance(document, dict) and document.get("kind") == "BertPretrainJob"
    ]


@pytest.mark.parametrize(("path", "job"), _example_jobs(), ids=[path for path, _ in _example_jobs()])
def test_an_example_job_runs_its_accelerators_build(
    built: dict[str, str], path: str, job: dict[str, Any]
) -> None:
    accelerator = job["spec"].get("accelerator", JobSpec.model_fields["accelerator"].default)
    assert job["spec"]["image"] == built[ACCELERATOR_TARGETS[accelerator]], path


def _scanned_files() -> list[Path]:
    return sorted({path for pattern in SCANNED for path in REPO.glob(pattern) if path.is_file()})


def _references(paths: list[Path], root: Path = REPO) -> list[tuple[str, str, str | None]]:
    """(file:line, repository, tag or None) of every ghcr.io/bertjob reference in ``paths``, each
    file named relative to ``root``."""
    found: list[tuple[str, str, str | None]] = []
    for path in paths:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            found.extend(
                (f"{path.relative_to(root)}:{number}", match["repository"], match["tag"])
                for match in REFERENCE.finditer(line)
            )
    return found


def _unbuilt(references: list[tuple[str, str, str | None]], built: dict[str, str]) -> list[str]:
    """The references that name no image the script builds: a tagged one must be one of its tags, an
    untagged one a repository it pushes to, or the chart's OCI repository."""
    tags = set(built.values())
    repositories = {tag.rsplit(":", 1)[0] for tag in tags}
    chart = f"ghcr.io/bertjob/charts/{_chart()['name']}"
    return [
        f"{where}: ghcr.io/bertjob/{repository}{':' + tag if tag else ''}"
        for where, repository, tag in references
        if (
            f"ghcr.io/bertjob/{repository}:{tag}" not in tags
            if tag
            else f"ghcr.io/bertjob/{repository}" not in repositories | {chart, "ghcr.io/bertjob/charts"}
        )
    ]


def test_every_written_reference_names_a_built_image(built: dict[str, str]) -> None:
    references = _references(_scanned_files())

    assert len(references) > 20, "the scan found too few references to be reading the repository"
    assert _unbuilt(references, built) == []


def test_a_reference_to_an_unbuilt_tag_is_found(built: dict[str, str], tmp_path: Path) -> None:
    """The check above can fail: the tag issue 31 found (no accelerator suffix), an unknown
    repository are reported; the chart's OCI address and a placeholder are not."""
    written = tmp_path / "README.md"
    written.write_text(
        "image: ghcr.io/bertjob/trainer:0.1.0\n"
        "docker pull ghcr.io/bertjob/trainer:0.1.0-xeon ghcr.io/bertjob/trainr:0.1.0-xeon\n"
        "helm install bertjob oci://ghcr.io/bertjob/charts/bertjob --version 0.1.0\n"
        "ghcr.io/bertjob/trainer:VERSION-TARGET\n"
    )
    assert _unbuilt(_references([written], tmp_path), built) == [
        "README.md:1: ghcr.io/bertjob/trainer:0.1.0",
        "README.md:2: ghcr.io/bertjob/trainr:0.1.0-xeon",
    ]
