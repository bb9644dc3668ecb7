"""examples/gitops: the Argo CD Applications and the Flux objects that install the operator (the chart)
and keep the jobs, checked without Argo CD or Flux.

The checks on each kind are the fields its controller requires, written from the Argo CD and Flux
API documentation (Application argoproj.io/v1alpha1; GitRepository source.toolkit.fluxcd.io/v1,
Kustomization kustomize.toolkit.fluxcd.io/v1, HelmRelease helm.toolkit.fluxcd.io/v2). Then: every
path they name exists and builds, the jobs they apply pass the CRD schema and the operator's checks
and render, and the Helm values they carry pass the chart's values.schema.json.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml
from jsonschema import Draft7Validator

from bertjob.render import kustomize_build, render
from bertjob_api.spec import parse_job
from bertjob_api.validation import cluster_job
from bertjob_testing.jobs import EXAMPLES, REPO
from tests.helm_chart import CHART, helm_or_skip
from tests.k8s_schema import assert_valid

GITOPS = EXAMPLES / "gitops"
KUBERNETES_VERSION = "1.33"
# Flux's metav1.Duration pattern (kubebuilder validation of interval, timeout, retryInterval).
DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$")
PRUNE_PROTECTION = {
    "argocd.argoproj.io/sync-options": "Prune=false,Delete=false",
    "kustomize.toolkit.fluxcd.io/prune": "disabled",
}

Obj = dict[str, Any]


@functools.cache
def _built(directory: Path) -> str:
    # The folders do not change during a run; building each once keeps the module fast.
    return kustomize_build(directory)


def _build(directory: Path) -> list[Obj]:
    return [obj for obj in yaml.safe_load_all(_built(directory)) if obj]


def _file(path: Path) -> Obj:
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


def _get(obj: Mapping[str, Any], dotted: str) -> Any:
    node: Any = obj
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _missing(obj: Mapping[str, Any], *fields: str) -> list[str]:
    return [f"{field} is required" for field in fields if _get(obj, field) in (None, "")]


def _repo_path(path: str) -> Path | None:
    """``path`` (as Argo CD or Flux names a folder of the repository) under the checkout, or None
    when it leaves the repository."""
    relative = PurePosixPath(path)
    if relative.is_absolute() or ".." in relative.parts:
        return None
    return REPO / relative


def _builds(directory: Path) -> str | None:
    """Why ``directory`` is not something Argo CD or Flux can apply, or None."""
    if not directory.is_dir():
        return f"{directory.relative_to(REPO)} is not a directory of the repository"
    if (directory / "kustomization.yaml").is_file():
        try:
            _build(directory)
        except Exception as error:  # the build's own message is the useful part
            return f"{directory.relative_to(REPO)} does not build: {error}"
    return None


# --- the fields each kind requires ---------------------------------------------------------------


def application_problems(app: Mapping[str, Any]) -> list[str]:
    """What Argo CD would refuse in an Application (argoproj.io/v1alpha1)."""
    found = _missing(app, "metadata.name", "metadata.namespace", "spec.project", "spec.source.repoURL")
    if app.get("apiVersion") != "argoproj.io/v1alpha1" or app.get("kind") != "Application":
        found.append("apiVersion/kind must be argoproj.io/v1alpha1 Application")
    destination = _get(app, "spec.destination") or {}
    if ("server" in destination) == ("name" in destination):
        found.append("spec.destination needs exactly one of server and name")
    source = _get(app, "spec.source") or {}
    if "chart" not in source and not source.get("path"):
        found.append("spec.source.path is required for a Git source")
    if "path" in source:
        directory = _repo_path(source["path"])
        if directory is None:
            found.append(f"spec.source.path {source['path']} leaves the repository")
        elif "helm" in source:
            if not (directory / "Chart.yaml").is_file():
                found.append(f"spec.source.path {source['path']} holds no Chart.yaml")
            for name in _get(source, "helm.valueFiles") or []:
                if not (directory / name).is_file():
                    found.append(f"spec.source.helm.valueFiles: {name} is not in the chart")
        elif (problem := _builds(directory)) is not None:
            found.append(f"spec.source.path: {problem}")
    for option in _get(app, "spec.syncPolicy.syncOptions") or []:
        if not re.fullmatch(r"[A-Za-z]+=[A-Za-z0-9,]+", option):
            found.append(f"spec.syncPolicy.syncOptions: {option!r} is not Name=value")
    return found


def git_repository_problems(repo: Mapping[str, Any]) -> list[str]:
    """What source-controller would refuse in a GitRepository (source.toolkit.fluxcd.io/v1)."""
    found = _missing(repo, "metadata.name", "metadata.namespace", "spec.interval", "spec.url")
    if repo.get("apiVersion") != "source.toolkit.fluxcd.io/v1":
        found.append("apiVersion must be source.toolkit.fluxcd.io/v1")
    if not DURATION.match(str(_get(repo, "spec.interval"))):
        found.append("spec.interval is not a duration")
    if not re.match(r"^(https?|ssh)://", str(_get(repo, "spec.url"))):
        found.append("spec.url must be http(s):// or ssh://")
    ref = _get(repo, "spec.ref") or {}
    if not set(ref) & {"branch", "tag", "semver", "name", "commit"}:
        found.append("spec.ref needs a branch, tag, semver, name or commit")
    return found


def flux_kustomization_problems(ks: Mapping[str, Any], sources: Mapping[str, Obj]) -> list[str]:
    """What kustomize-controller would refuse in a Kustomization (kustomize.toolkit.fluxcd.io/v1);
    ``sources``: the GitRepositories by ``namespace/name``."""
    found = _missing(ks, "metadata.name", "metadata.namespace", "spec.interval", "spec.sourceRef.name")
    if ks.get("apiVersion") != "kustomize.toolkit.fluxcd.io/v1":
        found.append("apiVersion must be kustomize.toolkit.fluxcd.io/v1")
    if not isinstance(_get(ks, "spec.prune"), bool):
        found.append("spec.prune is required (true or false)")
    for field in ("interval", "timeout", "retryInterval"):
        value = _get(ks, f"spec.{field}")
        if value is not None and not DURATION.match(str(value)):
            found.append(f"spec.{field} is not a duration")
    reference = _get(ks, "spec.sourceRef") or {}
    if reference.get("kind") not in ("GitRepository", "OCIRepository", "Bucket"):
        found.append("spec.sourceRef.kind must be GitRepository, OCIRepository or Bucket")
    key = f"{reference.get('namespace', _get(ks, 'metadata.namespace'))}/{reference.get('name')}"
    if reference.get("kind") == "GitRepository" and key not in sources:
        found.append(f"spec.sourceRef: no GitRepository {key} beside it")
    directory = _repo_path(str(_get(ks, "spec.path") or "."))
    if directory is None:
        found.append(f"spec.path {_get(ks, 'spec.path')} leaves the repository")
    elif (problem := _builds(directory)) is not None:
        found.append(f"spec.path: {problem}")
    return found


def helm_release_problems(release: Mapping[str, Any], sources: Mapping[str, Obj]) -> list[str]:
    """What helm-controller would refuse in a HelmRelease (helm.toolkit.fluxcd.io/v2)."""
    found = _missing(release, "metadata.name", "metadata.namespace", "spec.interval")
    if release.get("apiVersion") != "helm.toolkit.fluxcd.io/v2":
        found.append("apiVersion must be helm.toolkit.fluxcd.io/v2")
    if not DURATION.match(str(_get(release, "spec.interval"))):
        found.append("spec.interval is not a duration")
    spec = release.get("spec") or {}
    if ("chart" in spec) == ("chartRef" in spec):
        found.append("spec needs exactly one of chart and chartRef")
    if len(str(spec.get("releaseName", ""))) > 53:
        found.append("spec.releaseName is longer than 53 characters")
    if "chart" in spec:
        found += _missing(release, "spec.chart.spec.chart", "spec.chart.spec.sourceRef.name")
        reference = _get(release, "spec.chart.spec.sourceRef") or {}
        if reference.get("kind") not in ("HelmRepository", "GitRepository", "Bucket"):
            found.append("spec.chart.spec.sourceRef.kind must be HelmRepository, GitRepository or Bucket")
        if reference.get("kind") == "GitRepository":
            key = f"{reference.get('namespace', _get(release, 'metadata.namespace'))}/{reference.get('name')}"
            if key not in sources:
                found.append(f"spec.chart.spec.sourceRef: no GitRepository {key} beside it")
            chart = _repo_path(str(_get(release, "spec.chart.spec.chart")))
            if chart is None or not (chart / "Chart.yaml").is_file():
                found.append(
                    f"spec.chart.spec.chart {_get(release, 'spec.chart.spec.chart')} holds no Chart.yaml"
                )
            for name in _get(release, "spec.chart.spec.valuesFiles") or []:
                if _repo_path(name) is None or not (REPO / name).is_file():
                    found.append(f"spec.chart.spec.valuesFiles: {name} is not in the repository")
    return found


# --- what the folders hold -----------------------------------------------------------------------


def _applications() -> dict[str, Obj]:
    # argocd/ also builds Argo CD's argocd-cm, with the health check (test_argocd_health.py).
    return {app["metadata"]["name"]: app for app in _by_kind(_build(GITOPS / "argocd"), "Application")}


def _flux() -> list[Obj]:
    """Everything Flux ends up holding: the objects of flux/ and those its Kustomizations apply
    from flux/ itself (the HelmRelease), plus the no-Helm alternative."""
    objects = [*_build(GITOPS / "flux"), _file(GITOPS / "flux" / "operator-without-helm.yaml")]
    for ks in [obj for obj in objects if obj["kind"] == "Kustomization"]:
        directory = REPO / ks["spec"]["path"]
        if directory.is_relative_to(GITOPS / "flux"):
            objects += _build(directory)
    return objects


def _by_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [obj for obj in objects if obj["kind"] == kind]


def _sources(objects: list[Obj]) -> dict[str, Obj]:
    return {
        f"{obj['metadata']['namespace']}/{obj['metadata']['name']}": obj
        for obj in _by_kind(objects, "GitRepository")
    }


def _helm_values() -> dict[str, Mapping[str, Any]]:
    """The values each GitOps object gives the chart, by where they come from."""
    values: dict[str, Mapping[str, Any]] = {}
    for name, app in _applications().items():
        helm = _get(app, "spec.source.helm")
        if helm is not None:
            merged: Mapping[str, Any] = {}
            for file in helm.get("valueFiles", []):
                merged = _coalesce(merged, _file(REPO / app["spec"]["source"]["path"] / file))
            if "values" in helm:
                merged = _coalesce(merged, yaml.safe_load(helm["values"]))
            values[f"Application {name}"] = _coalesce(merged, helm.get("valuesObject", {}))
    for release in _by_kind(_flux(), "HelmRelease"):
        merged = {}
        for file in _get(release, "spec.chart.spec.valuesFiles") or []:
            merged = _coalesce(merged, _file(REPO / file))
        values[f"HelmRelease {release['metadata']['name']}"] = _coalesce(
            merged, release["spec"].get("values", {})
        )
    return values


def _coalesce(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's merge of values: maps merge key by key, anything else replaces, null removes."""
    result = copy.deepcopy(dict(base))
    for key, value in override.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = _coalesce(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def _chart_default_values() -> dict[str, Any]:
    return _file(CHART / "values.yaml")


# --- tests ---------------------------------------------------------------------------------------


def test_every_gitops_folder_builds_with_kustomize() -> None:
    folders = sorted(path.parent for path in GITOPS.rglob("kustomization.yaml"))

    assert {folder.name for folder in folders} >= {"argocd", "flux", "jobs", "kustomize-by-hand"}
    for folder in folders:
        assert _build(folder), f"{folder} builds to nothing"


def test_the_argo_cd_applications_have_what_argo_cd_requires() -> None:
    apps = _applications()

    assert apps
    for name, app in apps.items():
        assert application_problems(app) == [], name


def test_argo_cd_installs_the_chart_and_applies_the_jobs() -> None:
    apps = list(_applications().values())
    charts = [app for app in apps if "helm" in app["spec"]["source"]]
    jobs = [app for app in apps if app["spec"]["source"]["path"] == str((GITOPS / "jobs").relative_to(REPO))]

    assert [app["spec"]["source"]["path"] for app in charts] == [str(CHART.relative_to(REPO))]
    [chart], [job] = charts, jobs
    assert job["spec"]["destination"]["namespace"] == _jobs_namespace()
    # Synced as children of one parent Application, the operator's wave comes first.
    wave = "argocd.argoproj.io/sync-wave"
    assert int(chart["metadata"]["annotations"][wave]) < int(job["metadata"]["annotations"][wave])


@pytest.mark.parametrize(
    ("field", "says"),
    [
        ("spec.project", "spec.project is required"),
        ("spec.destination.server", "exactly one of server and name"),
        ("spec.source.repoURL", "spec.source.repoURL is required"),
        ("spec.source.path", "spec.source.path is required"),
    ],
)
def test_the_application_checks_catch_a_missing_field(field: str, says: str) -> None:
    app = copy.deepcopy(_applications()["bertjob-jobs"])
    *parents, last = field.split(".")
    del _get(app, ".".join(parents))[last]

    assert any(says in problem for problem in application_problems(app))


def test_the_application_checks_catch_a_path_that_is_not_there() -> None:
    apps = _applications()
    jobs = copy.deepcopy(apps["bertjob-jobs"])
    jobs["spec"]["source"]["path"] = "examples/gitops/no-such-folder"
    chart = copy.deepcopy(apps["bertjob-operator"])
    chart["spec"]["source"]["path"] = "examples/gitops/jobs"
    chart["spec"]["source"]["helm"]["valueFiles"] = ["values-production.yaml"]

    assert any("not a directory" in problem for problem in application_problems(jobs))
    chart_problems = application_problems(chart)
    assert any("holds no Chart.yaml" in problem for problem in chart_problems)
    assert any("values-production.yaml is not in the chart" in problem for problem in chart_problems)


def test_the_flux_objects_have_what_flux_requires() -> None:
    objects = _flux()
    sources = _sources(objects)

    assert sources
    for repo in sources.values():
        assert git_repository_problems(repo) == []
    for ks in _by_kind(objects, "Kustomization"):
        assert flux_kustomization_problems(ks, sources) == [], ks["metadata"]["name"]
    releases = _by_kind(objects, "HelmRelease")
    assert releases
    for release in releases:
        assert helm_release_problems(release, sources) == [], release["metadata"]["name"]


def test_flux_installs_the_chart_and_applies_the_jobs_after_it() -> None:
    objects = _build(GITOPS / "flux")
    kustomizations = {ks["metadata"]["name"]: ks for ks in _by_kind(objects, "Kustomization")}
    jobs = [
        ks
        for ks in kustomizations.values()
        if ks["spec"]["path"] == f"./{(GITOPS / 'jobs').relative_to(REPO)}"
    ]

    [job] = jobs
    [dependency] = [ref["name"] for ref in job["spec"]["dependsOn"]]
    operator = kustomizations[dependency]
    assert operator["spec"]["wait"] is True, "the jobs must wait until the release is Ready, not just applied"
    [release] = _by_kind(_build(REPO / operator["spec"]["path"]), "HelmRelease")
    assert release["spec"]["chart"]["spec"]["chart"] == f"./{CHART.relative_to(REPO)}"
    without_helm = _file(GITOPS / "flux" / "operator-without-helm.yaml")
    assert without_helm["metadata"]["name"] == dependency, "the jobs depend on whichever operator is used"


def _seconds(duration: str) -> float:
    """A Flux duration (metav1.Duration: 1h30m, 90s) in seconds."""
    unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(
        float(amount) * unit[suffix]
        for amount, _, suffix in re.findall(r"([0-9]+(\.[0-9]+)?)(ms|s|m|h)", duration)
    )


def test_flux_waits_for_the_jobs_health() -> None:
    [job] = [
        ks
        for ks in _by_kind(_build(GITOPS / "flux"), "Kustomization")
        if ks["spec"]["path"] == f"./{(GITOPS / 'jobs').relative_to(REPO)}"
    ]

    # kstatus on each job: Ready (running), Stalled (failed, a change refused), Reconciling.
    assert job["spec"]["wait"] is True, "Flux must read the jobs' kstatus conditions, not just apply them"
    # Enough for the data Job and the pods' scheduling; Flux's default (the interval) is not meant.
    assert DURATION.match(job["spec"]["timeout"])
    assert _seconds(job["spec"]["timeout"]) >= 15 * 60
    readme = (GITOPS / "README.md").read_text(encoding="utf-8")
    assert "wait: true" in readme and f"timeout: {job['spec']['timeout']}" in readme


@pytest.mark.parametrize(
    ("kind", "field", "says"),
    [
        ("Kustomization", "spec.prune", "spec.prune is required"),
        ("Kustomization", "spec.sourceRef.kind", "spec.sourceRef.kind must be"),
        ("Kustomization", "spec.interval", "spec.interval is required"),
        ("HelmRelease", "spec.chart", "exactly one of chart and chartRef"),
        ("HelmRelease", "spec.chart.spec.sourceRef.kind", "sourceRef.kind must be"),
        ("GitRepository", "spec.url", "spec.url is required"),
        ("GitRepository", "spec.ref.branch", "spec.ref needs"),
    ],
)
def test_the_flux_checks_catch_a_missing_field(kind: str, field: str, says: str) -> None:
    objects = _flux()
    sources = _sources(objects)
    obj = copy.deepcopy(_by_kind(objects, kind)[0])
    *parents, last = field.split(".")
    del _get(obj, ".".join(parents))[last]

    check = {
        "Kustomization": lambda: flux_kustomization_problems(obj, sources),
        "HelmRelease": lambda: helm_release_problems(obj, sources),
        "GitRepository": lambda: git_repository_problems(obj),
    }[kind]
    assert any(says in problem for problem in check()), check()


def test_the_flux_checks_catch_a_path_or_source_that_is_not_there() -> None:
    objects = _flux()
    sources = _sources(objects)
    ks = copy.deepcopy(_by_kind(objects, "Kustomization")[0])
    ks["spec"]["path"] = "./examples/gitops/no-such-folder"
    ks["spec"]["sourceRef"]["name"] = "elsewhere"
    release = copy.deepcopy(_by_kind(objects, "HelmRelease")[0])
    release["spec"]["chart"]["spec"]["chart"] = "./charts/no-such-chart"
    release["spec"]["interval"] = "ten minutes"

    problems = flux_kustomization_problems(ks, sources)
    assert any("not a directory" in problem for problem in problems)
    assert any("no GitRepository flux-system/elsewhere" in problem for problem in problems)
    problems = helm_release_problems(release, sources)
    assert any("holds no Chart.yaml" in problem for problem in problems)
    assert any("not a duration" in problem for problem in problems)


def test_argo_cd_and_flux_install_the_same_release_from_the_same_repository() -> None:
    [chart_app] = [app for app in _applications().values() if "helm" in app["spec"]["source"]]
    [release] = _by_kind(_flux(), "HelmRelease")
    [repo] = _sources(_flux()).values()

    assert chart_app["spec"]["source"]["repoURL"].removesuffix(".git") == repo["spec"]["url"].removesuffix(
        ".git"
    )
    assert chart_app["spec"]["source"]["helm"]["releaseName"] == release["spec"]["releaseName"]
    assert chart_app["spec"]["destination"]["namespace"] == release["metadata"]["namespace"]
    assert {app["spec"]["source"]["repoURL"] for app in _applications().values()} == {
        chart_app["spec"]["source"]["repoURL"]
    }


def _jobs_namespace() -> str:
    [namespace] = [obj["metadata"]["name"] for obj in _build(GITOPS / "jobs") if obj["kind"] == "Namespace"]
    return namespace


def test_the_jobs_folder_builds_into_jobs_the_operator_accepts(
    bertjob_schema: dict[str, Any], pytorchjob_schema: dict[str, Any], mpijob_schema: dict[str, Any]
) -> None:
    objects = _build(GITOPS / "jobs")
    jobs = _by_kind(objects, "BertPretrainJob")
    claims = {obj["metadata"]["name"]: obj for obj in _by_kind(objects, "PersistentVolumeClaim")}

    assert jobs
    assert {obj["kind"] for obj in objects} <= {"BertPretrainJob", "PersistentVolumeClaim", "Namespace"}
    for document in jobs:
        assert document["metadata"]["namespace"] == _jobs_namespace()
        assert_valid(document, bertjob_schema)
        job = cluster_job(parse_job(document, document["metadata"]["name"]))
        child = render(parse_job(document))[-1]
        assert_valid(child, pytorchjob_schema if job.spec.launcher == "pytorchjob" else mpijob_schema)
        for volume in job.spec.volumes:
            claim = volume.source.get("persistentVolumeClaim", {}).get("claimName")
            if claim is not None:
                assert claim in claims, f"{job.metadata.name}: claim {claim} is not in examples/gitops/jobs"
                if job.spec.topology.nodes > 1:
                    assert "ReadWriteMany" in claims[claim]["spec"]["accessModes"]
    for obj in objects:
        if obj["kind"] != "BertPretrainJob":
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_neither_tool_deletes_the_jobs_namespace_or_claims() -> None:
    for obj in _build(GITOPS / "jobs"):
        if obj["kind"] in ("Namespace", "PersistentVolumeClaim"):
            annotations = obj["metadata"].get("annotations", {})
            assert PRUNE_PROTECTION.items() <= annotations.items(), obj["metadata"]["name"]


def test_the_helm_values_pass_the_charts_schema() -> None:
    validator = Draft7Validator(json.loads((CHART / "values.schema.json").read_text()))
    values = _helm_values()

    assert sorted(values) == ["Application bertjob-operator", "HelmRelease bertjob"]
    for where, given in values.items():
        merged = _coalesce(_chart_default_values(), given)
        problems = [
            f"{'.'.join(map(str, error.path))}: {error.message}" for error in validator.iter_errors(merged)
        ]
        assert problems == [], where


def test_the_values_schema_check_catches_a_bad_value() -> None:
    validator = Draft7Validator(json.loads((CHART / "values.schema.json").read_text()))
    [given] = [values for where, values in _helm_values().items() if where.startswith("HelmRelease")]

    for bad in ({"replicas": 2}, {"crds": {"install": "yes"}}, {"image": {"tag": 1}}):
        assert list(validator.iter_errors(_coalesce(_chart_default_values(), _coalesce(given, bad)))), bad


def test_the_operator_serves_the_jobs_namespace() -> None:
    namespace = _jobs_namespace()

    for where, given in _helm_values().items():
        watched = _coalesce(_chart_default_values(), given)["watchNamespaces"]
        assert not watched or namespace in watched, (
            f"{where}: the operator would ignore the jobs in {namespace}"
        )


def test_helm_renders_the_chart_with_the_gitops_values(tmp_path: Path) -> None:
    binary = helm_or_skip()
    [release] = _by_kind(_flux(), "HelmRelease")
    version = _file(CHART / "Chart.yaml")["appVersion"]

    for where, given in _helm_values().items():
        values = tmp_path / "values.json"
        values.write_text(json.dumps(given))
        result = subprocess.run(
            [
                binary,
                "template",
                release["spec"]["releaseName"],
                str(CHART),
                f"--namespace={release['metadata']['namespace']}",
                f"--values={values}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, f"{where}: {result.stderr}"
        objects = [obj for obj in yaml.safe_load_all(result.stdout) if obj]
        kinds = {obj["kind"] for obj in objects}
        assert {"CustomResourceDefinition", "Deployment"} <= kinds, where
        [deployment] = _by_kind(objects, "Deployment")
        images = {container["image"] for container in deployment["spec"]["template"]["spec"]["containers"]}
        assert all(image.endswith(f":{given['image']['tag']}") for image in images), images
        assert given["image"]["tag"] == version, (
            f"{where}: pins an operator other than the chart's appVersion"
        )


def test_the_flux_no_helm_patch_keeps_the_crd(tmp_path: Path) -> None:
    without_helm = _file(GITOPS / "flux" / "operator-without-helm.yaml")
    # What kustomize-controller does with spec.path and spec.patches: a kustomization over the path.
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(REPO / without_helm["spec"]["path"], tmp_path)],
        "patches": without_helm["spec"]["patches"],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))

    objects = _build(tmp_path)

    crds = _by_kind(objects, "CustomResourceDefinition")
    assert sorted(crd["metadata"]["name"] for crd in crds) == [
        "bertpretrainjobs.bertjob.dev",
        "clusterkopfpeerings.kopf.dev",
    ]
    for crd in crds:
        assert crd["metadata"]["annotations"]["kustomize.toolkit.fluxcd.io/prune"] == "disabled"
    assert {"Deployment", "ServiceAccount"} <= {obj["kind"] for obj in objects}
