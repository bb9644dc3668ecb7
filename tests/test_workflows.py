""".github/workflows: actionlint finds nothing, and the workflows do what the README says.

ci.yml runs the README's test command (the one .ci/run runs); release.yml, on a tag v*, builds and
pushes every image hack/build-images.sh builds and pushes the chart to the OCI registry the README's
``helm install`` names. Neither can run on the machines this project is built on (no GitHub runner,
no registry): these checks are what can be had here. actionlint (https://github.com/rhysd/actionlint)
checks the workflow syntax, expressions, action inputs and job needs, and, when ``shellcheck`` is on
PATH, the ``run:`` scripts.
"""

from __future__ import annotations

import hashlib
import os
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
    """The actionlint binary that make builds beside this Python (hack/versions.env's version)."""
    found = shutil.which("actionlint", path=str(Path(sys.executable).parent))
    assert found is not None, (
        "actionlint is missing: `make .venv/bin/actionlint` builds it from its Go module"
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
    broken = (WORKFLOWS / "ci.yml").read_text()
    for old, new in [
        ("runs-on: ubuntu-24.04", "runs-on: ubuntu-24.04\n    needs: build"),
        (" make test\n", " make ${{ matrix.target }}\n"),
    ]:
        assert old in broken
        broken = broken.replace(old, new)
    (tmp_path / "ci.yml").write_text(broken)

    result = _lint(tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "[job-needs]" in result.stdout and "[expression]" in result.stdout, result.stdout


def _readme_test_command() -> str:
    """The README's second command (the first code block's second line), without its comment."""
    block = re.search(r"```sh\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)
    assert block is not None, "README.md has no sh code block"
    return block.group(1).splitlines()[1].split("#", 1)[0].strip()


def _make_test(workflow: dict[Any, Any]) -> list[str]:
    """The words of ci.yml's one step that runs the README's test command."""
    [words] = [
        shlex.split(step["run"])
        for step in _steps(workflow, "test")
        if shlex.split(step.get("run", ""))[-2:] == ["make", "test"]
    ]
    return words


def test_ci_runs_the_readmes_test_command_as_ci_run_does() -> None:
    command = _readme_test_command()
    ci_run = [
        line.strip()
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    workflow = _workflow("ci.yml")
    # The command alone, without sudo and env with their options and settings before it.
    command_run = [
        word for word in _make_test(workflow) if word not in {"sudo", "env"} and not re.match(r"-|\w+=", word)
    ]

    assert command == "make test"
    assert ci_run[-1] == command
    assert shlex.join(command_run) == command
    assert set(workflow[True]) == {"push", "pull_request"}


def test_make_test_runs_as_root_on_the_runner() -> None:
    """GitHub's runner is not root, and some tests need root (image builds, tmpfs mounts: below),
    so the one test command runs under sudo, which must keep the job's environment (-E: CI=true, the
    tools directory) and be given again what it always resets (PATH, with setup-python's and
    setup-go's directories) or drops (LD_LIBRARY_PATH, setup-python's libpython)."""
    workflow = _workflow("ci.yml")
    job = workflow["jobs"]["test"]
    words = _make_test(workflow)

    # Tests that skip, and so fail under CI=true, unless they run as root.
    assert "os.geteuid() != 0" in (REPO / "tests" / "images" / "image_fixtures.py").read_text()
    assert '"mount", "-t", "tmpfs"' in (REPO / "tests" / "bertpretrain" / "test_volumes.py").read_text()
    assert str(job["runs-on"]).startswith("ubuntu-") and "container" not in job
    assert words[:3] == ["sudo", "-E", "env"], (
        f"make test is not run as root with the job's environment: {words}"
    )
    assert {"PATH=$PATH", "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"} <= set(words[3:-2])


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


def _cache_steps(kind: str) -> list[tuple[str, dict[str, Any]]]:
    """Every step of every workflow that uses ``actions/cache`` (``kind`` "") or its ``/restore`` or
    ``/save`` action, with its workflow's file name."""
    return [
        (path.name, step)
        for path in sorted(WORKFLOWS.glob("*.yml"))
        for job in yaml.safe_load(path.read_text())["jobs"].values()
        for step in job["steps"]
        if step.get("uses", "").startswith(f"actions/cache{kind}@")
    ]


def test_caches_are_saved_even_when_the_tests_fail() -> None:
    """actions/cache saves only after a green job: one failing test would keep every cache empty.
    Each restore has its save, which runs whatever happened before it, after the tests."""
    steps = _steps(_workflow("ci.yml"), "test")
    restores = {
        step["id"]: step for step in steps if step.get("uses", "").startswith("actions/cache/restore@")
    }
    saves = [step for step in steps if step.get("uses", "").startswith("actions/cache/save@")]
    tests = steps.index(next(step for step in steps if step.get("run", "").endswith("make test")))

    assert _cache_steps("") == []
    assert restores and len(saves) == len(restores)
    for save in saves:
        assert re.match(r"always\(\)( |$)", str(save.get("if", ""))), f"a save without if: always(): {save}"
        assert steps.index(save) > tests
        [restore_id] = re.findall(r"steps\.([\w-]+)\.outputs\.cache-primary-key", save["with"]["key"])
        assert save["with"]["path"] == restores[restore_id]["with"]["path"]


# Built by make into .venv, not by hack/build-cluster.sh into the tools directory.
NOT_A_TOOLS_VERSION = {"ACTIONLINT_VERSION"}
# The HOME of the runner's user, who runs the cache steps (make test's, under sudo, is root's).
RUNNER_HOME = "/home/runner"


def _run_step(step: dict[str, Any], cwd: Path) -> dict[str, str]:
    """What a ``run:`` step writes to $GITHUB_OUTPUT and $GITHUB_ENV (NAME=VALUE lines), run in
    ``cwd`` with bash as the workflow's defaults run it."""
    files = {name: cwd / f".{name}" for name in ("GITHUB_OUTPUT", "GITHUB_ENV")}
    for file in files.values():
        file.write_text("")
    environment = {
        "PATH": "/usr/bin:/bin",
        "HOME": RUNNER_HOME,
        **{name: str(file) for name, file in files.items()},
    }
    subprocess.run(["bash", "-e", "-o", "pipefail", "-c", step["run"]], cwd=cwd, env=environment, check=True)
    lines = "".join(file.read_text() for file in files.values()).splitlines()
    return {name: value for name, _, value in (line.partition("=") for line in lines)}


def _tools_caches(versions_env: str, tmp_path: Path) -> dict[str, tuple[str, str]]:
    """ci.yml's tools caches as the runner would evaluate them, with ``versions_env`` as
    hack/versions.env: each restore step's id -> (path, key)."""
    steps = _steps(_workflow("ci.yml"), "test")
    checkout = tmp_path / "checkout"
    shutil.rmtree(checkout, ignore_errors=True)
    (checkout / "hack").mkdir(parents=True)
    (checkout / "hack" / "versions.env").write_text(versions_env)
    [versions] = [step for step in steps if step.get("id") == "versions"]
    outputs = _run_step(versions, checkout)
    [tools] = [step for step in steps if "BERTJOB_TOOLS_DIR=" in step.get("run", "")]
    env = _run_step(tools, checkout)

    def hash_files(arguments: str) -> str:
        names = re.findall(r"'([^']+)'", arguments)
        contents = [
            versions_env.encode() if name == "hack/versions.env" else (REPO / name).read_bytes()
            for name in names
        ]
        return hashlib.sha256(b"\0".join(contents)).hexdigest()

    def evaluate(match: re.Match[str]) -> str:
        expression = match.group(1)
        if found := re.fullmatch(r"steps\.versions\.outputs\.(\w+)", expression):
            return outputs[found.group(1)]
        if found := re.fullmatch(r"env\.(\w+)", expression):
            return env[found.group(1)]
        if found := re.fullmatch(r"hashFiles\((.*)\)", expression):
            return hash_files(found.group(1))
        return {"runner.os": "Linux", "runner.arch": "X64"}[expression]

    def render(text: str) -> str:
        return re.sub(r"\$\{\{\s*(.*?)\s*\}\}", evaluate, text)

    return {
        step["id"]: (render(step["with"]["path"]), render(step["with"]["key"]))
        for step in steps
        if step.get("uses", "").startswith("actions/cache/restore@")
    }


def test_each_components_cache_is_keyed_on_its_own_version(tmp_path: Path) -> None:
    """One cache per directory hack/build-cluster.sh builds (<component>-<version> in the tools
    directory, which sudo's make test and the cache steps name alike), each key changed by its own
    component's versions and by no other's: a bumped Kueue rebuilds Kueue alone, not every tool."""
    versions_env = (REPO / "hack" / "versions.env").read_text()
    caches = _tools_caches(versions_env, tmp_path)
    # What the build script would build into an empty tools directory, as it names it.
    check = subprocess.run(
        [str(REPO / "hack" / "build-cluster.sh"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "BERTJOB_TOOLS_DIR": str(tmp_path / "tools")},
        check=False,
    )
    built = re.findall(r"build-cluster.sh: (\S+) (\S+) is not built", check.stderr)
    names = re.findall(r"^(\w+_VERSION)=(.*)$", versions_env, re.M)

    assert built, check.stderr
    assert sorted(path for path, _ in caches.values()) == sorted(
        f"{RUNNER_HOME}/.cache/bertjob/tools/{name}-{version}" for name, version in built
    )
    for file, step in _cache_steps("/restore") + _cache_steps("/save") + _cache_steps(""):
        assert "versions.env" not in str(step), f"{file}: a cache keyed on the whole versions file: {step}"
    for name, version in names:
        if name in NOT_A_TOOLS_VERSION:
            continue
        bumped = _tools_caches(
            versions_env.replace(f"{name}={version}\n", f"{name}={version}-bumped\n"), tmp_path
        )
        changed = [step for step in caches if caches[step][1] != bumped[step][1]]
        assert len(changed) == 1, f"a bumped {name} changes the keys of {changed}, not one component's"


def test_actionlint_is_built_from_its_pinned_module_not_a_pypi_repackaging() -> None:
    makefile = (REPO / "Makefile").read_text()
    pinned = re.search(
        r"^ACTIONLINT_VERSION=(v\d+\.\d+\.\d+)$", (REPO / "hack" / "versions.env").read_text(), re.M
    )
    assert pinned is not None
    assert 'go install "github.com/rhysd/actionlint/cmd/actionlint@$$ACTIONLINT_VERSION"' in makefile
    assert "actionlint" not in (REPO / "pyproject.toml").read_text()
    version = subprocess.run([_actionlint(), "-version"], capture_output=True, text=True, check=True).stdout
    assert version.splitlines()[0] == pinned.group(1)


def test_permissions_are_least_privilege() -> None:
    """Every workflow states its permissions (the token's default may be write-all); only the
    release's publishing jobs may write: packages, the OIDC token that signs, the attestations, and
    the GitHub release."""
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
        ("release.yml", "publish", "packages"): "write",
        ("release.yml", "publish", "id-token"): "write",
        ("release.yml", "publish", "attestations"): "write",
        ("release.yml", "chart", "packages"): "write",
        ("release.yml", "pypi", "id-token"): "write",
        ("release.yml", "github-release", "contents"): "write",
    }


def _tags(*targets: str) -> list[str]:
    """hack/build-images.sh --tags: the tags of ``targets`` (default: all it builds), ghcr.io/bertjob's."""
    return run_build_script("--tags", *targets).split()


def _needs(workflow: dict[Any, Any], job: str) -> set[str]:
    """Every job that ``job`` waits for, directly or through others."""
    direct = workflow["jobs"][job].get("needs", [])
    found = set([direct] if isinstance(direct, str) else direct)
    for name in list(found):
        found |= _needs(workflow, name)
    return found


# What publishes: a run: line with one of these, or a step using one of these actions.
PUSHING_COMMANDS = ("docker push", "skopeo copy", "helm push", "cosign sign", "gh release", "twine upload")
PUSHING_ACTIONS = ("actions/attest-build-provenance", "pypa/gh-action-pypi-publish")


def _pushes(step: dict[str, Any]) -> bool:
    return any(command in step.get("run", "") for command in PUSHING_COMMANDS) or step.get(
        "uses", ""
    ).startswith(PUSHING_ACTIONS)


def test_nothing_is_pushed_before_every_image_and_the_wheel_have_built() -> None:
    workflow = _workflow("release.yml")
    builders = {"images", "wheel"}
    pushing = {name for name, job in workflow["jobs"].items() if any(_pushes(step) for step in job["steps"])}

    assert pushing == {"publish", "chart", "pypi", "github-release"}
    for name in pushing:
        # A job that needs the matrix job waits for every leg, and is skipped if one fails, unless
        # its if: says always() or !cancelled() (or failure()).
        assert builders <= _needs(workflow, name), f"{name} may push before every image has built"
        condition = str(workflow["jobs"][name].get("if", ""))
        assert not re.search(r"always\(\)|cancelled\(\)|failure\(\)", condition), f"{name}: if: {condition}"
    for name in builders:
        assert not any(_pushes(step) for step in workflow["jobs"][name]["steps"]), f"{name} pushes"
        assert "packages" not in workflow["jobs"][name].get("permissions", {}), f"{name} may write packages"
    assert workflow["jobs"]["images"]["strategy"]["fail-fast"] is True
    # The chart and PyPI only after the images they name.
    assert "publish" in _needs(workflow, "chart") and "publish" in _needs(workflow, "pypi")


def test_the_check_of_the_order_fails_on_a_push_among_the_builds() -> None:
    workflow = _workflow("release.yml")
    workflow["jobs"]["images"]["steps"].append({"run": 'docker push "$image"'})
    assert any(_pushes(step) for step in workflow["jobs"]["images"]["steps"])
    workflow = _workflow("release.yml")
    workflow["jobs"]["publish"]["needs"] = ["version"]
    assert not {"images", "wheel"} <= _needs(workflow, "publish")


def test_release_builds_every_image_the_script_builds_for_its_platforms() -> None:
    workflow = _workflow("release.yml")
    job = workflow["jobs"]["images"]
    legs = {leg["target"]: leg["platforms"] for leg in job["strategy"]["matrix"]["include"]}
    runs = "\n".join(step.get("run", "") for step in job["steps"])

    assert workflow[True] == {"push": {"tags": ["v*"]}}
    # One leg per image the script builds by default, each built by the script into an archive.
    assert sorted(_tags(*legs)) == sorted(_tags()) and len(legs) == 4
    build = 'hack/build-images.sh --builder docker --oci-dir "$RUNNER_TEMP/images"'
    assert f'{build} --platform "$PLATFORMS" "$TARGET"' in runs
    assert legs == {
        "operator": "linux/amd64,linux/arm64",
        "cuda": "linux/amd64",
        "xeon": "linux/amd64",
        "gaudi": "linux/amd64",
    }
    assert sorted(workflow["jobs"]["publish"]["strategy"]["matrix"]["target"]) == sorted(legs)
    # The script refuses a trainer for another platform.
    refused = subprocess.run(
        [str(REPO / "hack" / "build-images.sh"), "--builder", "print", "--oci-dir", "/tmp/x", "--platform",
         "linux/amd64,linux/arm64", "cuda"], capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert refused.returncode == 2 and "linux/amd64 only" in refused.stderr
    printed = run_build_script(
        "--builder", "print", "--oci-dir", "/tmp/x", "--platform", "linux/amd64,linux/arm64", "operator"
    )
    assert "buildx build" in printed and "--sbom=true" in printed and "--provenance=mode=max" in printed


def test_each_image_is_pushed_signed_and_attested_by_digest() -> None:
    workflow = _workflow("release.yml")
    steps = _steps(workflow, "publish")
    [push] = [step for step in steps if step.get("id") == "push"]
    [attest] = [step for step in steps if step.get("uses", "").startswith("actions/attest-build-provenance@")]

    assert "skopeo copy --all --preserve-digests --digestfile" in push["run"]
    assert 'cosign sign --yes "${image%:*}@$digest"' in push["run"]
    assert any(step.get("uses", "").startswith("sigstore/cosign-installer@") for step in steps)
    assert attest["with"] == {
        "subject-name": "${{ steps.push.outputs.name }}",
        "subject-digest": "${{ steps.push.outputs.digest }}",
        "push-to-registry": True,
    }


def test_the_registry_is_the_owners_lower_cased() -> None:
    text = (WORKFLOWS / "release.yml").read_text()
    workflow = _workflow("release.yml")
    [check] = [step for step in _steps(workflow, "version") if step.get("id") == "check"]

    # No fixed registry: every step that names one takes the version job's.
    assert "env" not in workflow
    registries = {
        step["env"]["REGISTRY"]
        for job in workflow["jobs"].values()
        for step in job["steps"]
        if "REGISTRY" in step.get("env", {})
    }
    assert registries == {"${{ needs.version.outputs.registry }}"}
    assert "docker://ghcr.io" not in text and "oci://ghcr.io" not in text
    assert check["env"]["OWNER"] == "${{ github.repository_owner }}"
    script = check["run"].split('echo "registry=', 1)[1].split('"', 1)[0]
    lowered = subprocess.run(
        ["bash", "-c", f'OWNER=My-Fork; echo "{script}"'], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert lowered == "ghcr.io/my-fork"


def test_the_chart_job_names_the_registrys_images(tmp_path: Path) -> None:
    """The chart job's step that points the chart's images at the registry, run on a copy of the
    chart for a fork: the operator and the runtimes then name the fork's images."""
    workflow = _workflow("release.yml")
    [step] = [
        step
        for step in _steps(workflow, "chart")
        if step.get("name") == "name the registry's images in the chart"
    ]
    shutil.copytree(REPO / "charts", tmp_path / "charts")
    helm = Path(sys.executable).with_name("helm")
    version = yaml.safe_load((REPO / "charts" / "bertjob" / "Chart.yaml").read_text())["appVersion"]
    env = {"PATH": f"{helm.parent}:/usr/bin:/bin", "REGISTRY": "ghcr.io/my-fork", "VERSION": version}

    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", step["run"]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip

    assert done.returncode == 0, done.stderr
    values = (tmp_path / "charts" / "bertjob" / "values.yaml").read_text()
    assert "repository: my-fork/operator" in values and f"ghcr.io/my-fork/trainer:{version}-xeon" in values
    assert "bertjob/operator" not in values and "ghcr.io/bertjob/trainer" not in values


def test_release_pushes_the_chart_where_the_readme_installs_it_from() -> None:
    workflow = _workflow("release.yml")
    runs = [
        shlex.split(line)
        for step in _steps(workflow, "chart")
        for line in step.get("run", "").splitlines()
        if not line.rstrip().endswith("\\")
    ]
    chart = yaml.safe_load((REPO / "charts" / "bertjob" / "Chart.yaml").read_text())["name"]
    [installed] = re.findall(r"helm install \S+ (oci://\S+)", (REPO / "README.md").read_text())
    [push] = [words for words in runs if words[:2] == ["helm", "push"]]

    assert ["helm", "package", "charts/bertjob", "--destination", "$RUNNER_TEMP/charts"] in runs
    assert push[2] == f"$RUNNER_TEMP/charts/{chart}-$VERSION.tgz"
    # helm push puts the chart under the repository it is given, by its name; this repository's
    # owner is bertjob.
    assert push[3].replace("$REGISTRY", "ghcr.io/bertjob") + f"/{chart}" == installed
    assert workflow["jobs"]["chart"]["needs"] == ["version", "publish"]
