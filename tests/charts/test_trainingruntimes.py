"""charts/bertjob/templates/trainingruntimes.yaml: the Kubeflow Trainer v2 ClusterTrainingRuntimes that the
TrainJobs of ``spec.launcher: trainjob`` name, through the real helm, against Trainer v2.3.0's CRD.

The commands are compared with the kustomize base's PyTorchJob and MPIJob (what the other launchers run),
the names and exit codes with bertjob_api.contract; the failure policy's meaning follows JobSet
(kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go: FailurePolicyRule, DependsOn) and the Job
controller's podFailurePolicy (kubernetes pkg/controller/job/pod_failure_policy.go).
"""

from __future__ import annotations

import json
import posixpath
import re
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bertjob.launchers import mpijob
from bertjob_api.contract import (
    JOB_PATH,
    MPI_RUNTIME,
    PERMANENT_EXIT_CODES,
    RETRYABLE_EXIT_CODES,
    RUN_COMMAND,
    TORCH_RUNTIME,
    TRAINER_MODULE,
    TRAINJOB_LAUNCHER,
    TRAINJOB_NODE,
)
from bertjob_testing.cluster.build import upstream_crd
from bertjob_testing.jobs import REPO
from tests.helm_chart import CHART, KUBERNETES_VERSION, NAMESPACE, RELEASE, leaves
from tests.k8s_schema import assert_valid, errors, load_crd_schema

Helm = Callable[..., subprocess.CompletedProcess[str]]
Object = dict[str, Any]

KIND = "ClusterTrainingRuntime"
SERVED = "trainer.kubeflow.org/v1alpha1/ClusterTrainingRuntime"
CRD_FILE = "trainer.kubeflow.org_clustertrainingruntimes.yaml"
BASE = REPO / "kustomize" / "base"
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
# JobSet's webhook refuses a failure policy rule whose name does not match this (jobset_types.go).
RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
DEFAULT_IMAGE = "ghcr.io/bertjob/trainer:0.1.0-xeon"


@pytest.fixture(scope="module")
def runtime_schema() -> dict[str, Any]:
    """openAPIV3Schema of Trainer v2.3.0's ClusterTrainingRuntime v1alpha1, from Trainer's module."""
    return load_crd_schema(upstream_crd(CRD_FILE), "v1alpha1")


@pytest.fixture(scope="module")
def template(
    helm: Helm, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``template(values, *flags)``: ``helm template`` of the chart with those values (a dict, written as
    a values file) and flags; the completed process, not checked."""
    directory = tmp_path_factory.mktemp("runtime-values")
    counter = iter(range(1_000_000))

    def run(values: dict[str, Any] | None = None, *flags: str) -> subprocess.CompletedProcess[str]:
        path = directory / f"{next(counter)}.yaml"
        # JSON is YAML: the values reach helm exactly as the test wrote them.
        path.write_text(json.dumps(values or {}))
        return helm("template", RELEASE, str(CHART), f"--namespace={NAMESPACE}", f"--values={path}", *flags)

    return run


@pytest.fixture(scope="module")
def runtimes(template: Callable[..., subprocess.CompletedProcess[str]]) -> Callable[..., dict[str, Object]]:
    """``runtimes(values, *flags)``: the rendered ClusterTrainingRuntimes by name; helm must succeed."""

    def run(values: dict[str, Any] | None = None, *flags: str) -> dict[str, Object]:
        result = template(values, *flags)
        assert result.returncode == 0, result.stderr
        found = [obj for obj in yaml.safe_load_all(result.stdout) if obj and obj["kind"] == KIND]
        named = {obj["metadata"]["name"]: obj for obj in found}
        assert len(named) == len(found), "a runtime rendered twice"
        return named

    return run


@pytest.fixture(scope="module")
def installed(runtimes: Callable[..., dict[str, Object]]) -> dict[str, Object]:
    """Both runtimes as the defaults render them on a cluster that serves the kind."""
    return runtimes(None, f"--api-versions={SERVED}")


def _jobs(runtime: Object) -> dict[str, Object]:
    """The runtime's replicated jobs by name, in their order."""
    return {job["name"]: job for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]}


def _pods(runtime: Object) -> Iterator[tuple[str, Object]]:
    for name, job in _jobs(runtime).items():
        yield name, job["template"]["spec"]["template"]["spec"]


def _container(runtime: Object, job: str) -> Object:
    [container] = _jobs(runtime)[job]["template"]["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _base_container(filename: str, replica: str) -> Object:
    # The kustomize base as written: the other launchers' commands, not a copy of them.
    document = yaml.safe_load((BASE / filename).read_text())
    specs = document["spec"].get("pytorchReplicaSpecs") or document["spec"]["mpiReplicaSpecs"]
    [container] = specs[replica]["template"]["spec"]["containers"]
    return dict(container)


INSTALLING = [
    ({}, (f"--api-versions={SERVED}",)),
    ({"trainingRuntimes": {"install": True}}, ()),
    ({"trainingRuntimes": {"install": True}}, (f"--api-versions={SERVED}",)),
]


@pytest.mark.parametrize(("values", "flags"), INSTALLING, ids=["auto-served", "true", "true-served"])
def test_both_runtimes_render_and_fit_trainer_v2s_crd(
    runtimes: Callable[..., dict[str, Object]],
    runtime_schema: dict[str, Any],
    values: dict[str, Any],
    flags: tuple[str, ...],
) -> None:
    found = runtimes(values, *flags)

    assert sorted(found) == sorted([TORCH_RUNTIME, MPI_RUNTIME])
    for runtime in found.values():
        assert runtime["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
        assert "namespace" not in runtime["metadata"], "cluster-scoped"
        assert_valid(runtime, runtime_schema)
        # The CRD embeds JobSet's JobTemplateSpec; the core schema checks the same Job again.
        for job in _jobs(runtime).values():
            kubernetes_validate.validate(
                {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}, **job["template"]},
                KUBERNETES_VERSION,
                strict=True,
            )


@pytest.mark.parametrize(
    ("values", "flags"),
    [
        ({}, ()),
        ({"trainingRuntimes": {"install": "auto"}}, ("--api-versions=trainer.kubeflow.org/v1/TrainJob",)),
        ({"trainingRuntimes": {"install": False}}, ()),
        ({"trainingRuntimes": {"install": False}}, (f"--api-versions={SERVED}",)),
    ],
    ids=["auto", "auto-other-kind", "false", "false-served"],
)
def test_no_runtime_unless_served_or_asked_for(
    runtimes: Callable[..., dict[str, Object]], values: dict[str, Any], flags: tuple[str, ...]
) -> None:
    assert runtimes(values, *flags) == {}


def test_the_crd_schema_refuses_a_misspelt_field_down_to_the_container(
    installed: dict[str, Object], runtime_schema: dict[str, Any]
) -> None:
    # Whether the checks above can fail at all: the CRD closes JobSet's template, the Job and the pod.
    def misspelt(edit: Callable[[Object], None]) -> list[str]:
        runtime = json.loads(json.dumps(installed[TORCH_RUNTIME]))
        edit(runtime)
        return errors(runtime, runtime_schema)

    spec = lambda r: r["spec"]  # noqa: E731
    jobset = lambda r: r["spec"]["template"]["spec"]  # noqa: E731
    job = lambda r: jobset(r)["replicatedJobs"][0]["template"]["spec"]  # noqa: E731
    container = lambda r: job(r)["template"]["spec"]["containers"][0]  # noqa: E731
    assert misspelt(lambda r: spec(r)["mlPolicy"]["torch"].update(numProcPerNode=1))
    assert misspelt(lambda r: jobset(r)["failurePolicy"].update(maxRestart=3))
    assert misspelt(lambda r: job(r).update(backOffLimit=0))
    assert misspelt(lambda r: container(r).update(comand=["x"]))
    assert misspelt(lambda r: container(r)["securityContext"].update(allowPrivilegeEscalaton=False))
    assert misspelt(lambda r: jobset(r)["failurePolicy"]["rules"][0].update(action="Fail"))
    assert misspelt(lambda r: container(r).update(command="python"))
    assert not misspelt(lambda r: None)


def test_labels(installed: dict[str, Object]) -> None:
    for name, framework in [(TORCH_RUNTIME, "torch"), (MPI_RUNTIME, "mpi")]:
        labels = installed[name]["metadata"]["labels"]
        assert labels["trainer.kubeflow.org/framework"] == framework
        assert labels["app.kubernetes.io/name"] == "bertjob"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


def test_the_torch_runtime_runs_what_the_pytorchjob_runs(installed: dict[str, Object]) -> None:
    runtime = installed[TORCH_RUNTIME]
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 1, "torch": {}}
    [(name, job)] = _jobs(runtime).items()
    assert name == TRAINJOB_NODE
    # Trainer v2 gives the TrainJob's trainer (image, command, resources) to this step's node container.
    assert job["template"]["metadata"]["labels"] == {ANCESTOR: "trainer"}
    node = _container(runtime, TRAINJOB_NODE)
    assert node["name"] == TRAINJOB_NODE
    assert node["command"] == _base_container("pytorchjob.yaml", "Master")["command"]
    assert node["image"] == DEFAULT_IMAGE


def test_the_mpi_runtime_launches_mpirun_after_the_nodes_run_sshd(installed: dict[str, Object]) -> None:
    runtime = installed[MPI_RUNTIME]
    mpi = runtime["spec"]["mlPolicy"]["mpi"]
    assert runtime["spec"]["mlPolicy"]["numNodes"] == 1 and set(runtime["spec"]["mlPolicy"]) == {
        "numNodes",
        "mpi",
    }
    assert mpi == {
        "numProcPerNode": 1,
        "mpiImplementation": "OpenMPI",
        "sshAuthMountPath": yaml.safe_load((BASE / "mpijob.yaml").read_text())["spec"]["sshAuthMountPath"],
        "runLauncherAsNode": False,
    }
    jobset = runtime["spec"]["template"]["spec"]
    jobs = _jobs(runtime)
    # JobSet refuses dependsOn on the first replicated job: the nodes come first, the launcher waits.
    assert list(jobs) == [TRAINJOB_NODE, TRAINJOB_LAUNCHER]
    assert "dependsOn" not in jobs[TRAINJOB_NODE]
    assert jobs[TRAINJOB_LAUNCHER]["dependsOn"] == [{"name": TRAINJOB_NODE, "status": "Ready"}]
    assert jobs[TRAINJOB_NODE]["template"]["metadata"]["labels"] == {ANCESTOR: "trainer"}
    assert ANCESTOR not in jobs[TRAINJOB_LAUNCHER]["template"].get("metadata", {}).get("labels", {})
    assert jobset["successPolicy"] == {"operator": "All", "targetReplicatedJobs": [TRAINJOB_LAUNCHER]}
    assert jobset["network"] == {"publishNotReadyAddresses": True}

    # The launcher's container is not named node: Trainer v2 refuses a runtime patch of a node
    # container's env, and the operator patches the job's env into this one for mpirun to forward.
    # So it mounts what Trainer v2's MPI plugin adds to its pod (mounted only in node containers).
    launcher = _container(runtime, TRAINJOB_LAUNCHER)
    assert launcher["name"] == TRAINJOB_LAUNCHER
    mounts = {mount["name"]: mount["mountPath"] for mount in launcher["volumeMounts"]}
    assert mounts == {
        "mpi-ssh-auth": mpi["sshAuthMountPath"],
        "mpi-hostfile": posixpath.dirname(mpijob.HOSTFILE),
    }
    command = launcher["command"]
    # No process count: one rank per hostfile slot, numProcPerNode slots per node.
    assert not {"-np", "-n", "--np", "-c"} & set(command)
    assert command == [
        *mpijob.LAUNCHER_WRAPPER,
        "mpirun",
        "--hostfile",
        mpijob.HOSTFILE,
        *mpijob.RANK_COMMAND,
    ]
    assert mpijob.RANK_COMMAND[-5:] == ["-m", TRAINER_MODULE, RUN_COMMAND, "--config", JOB_PATH]
    base = _base_container("mpijob.yaml", "Launcher")["command"]
    assert command[:7] == base[:7], "mpirun, wrapped, over the same hostfile path as the MPIJob's"
    ranks = len(mpijob.RANK_COMMAND)
    assert command[-ranks:] == base[-ranks:], "the ranks run what the MPIJob's ranks run"

    sshd = _container(runtime, TRAINJOB_NODE)["command"]
    assert sshd == _base_container("mpijob.yaml", "Worker")["command"]
    assert sshd[:8] == [*mpijob.WORKER_WRAPPER, "/usr/sbin/sshd", "-De", "-f"]
    # The user's sshd configuration beside the keys Trainer v2 mounts.
    assert posixpath.dirname(sshd[8]) == posixpath.dirname(mpi["sshAuthMountPath"].rstrip("/"))


@pytest.mark.parametrize("name", [TORCH_RUNTIME, MPI_RUNTIME])
def test_permanent_exit_codes_fail_the_jobset_and_others_restart_it(
    installed: dict[str, Object], name: str
) -> None:
    jobset = installed[name]["spec"]["template"]["spec"]
    policy = jobset["failurePolicy"]
    assert policy["maxRestarts"] == 3
    [rule] = policy["rules"]
    assert RULE_NAME.fullmatch(rule["name"])
    assert (rule["action"], rule["onJobFailureReasons"]) == ("FailJobSet", ["PodFailurePolicy"])
    assert not rule.get("targetReplicatedJobs"), "every replicated job"
    for job_name, job in _jobs(installed[name]).items():
        spec = job["template"]["spec"]
        # A failure that is not permanent fails the Job at once, and the JobSet restarts every Job.
        assert spec["backoffLimit"] == 0, job_name
        assert spec["template"]["spec"]["restartPolicy"] == "Never", "podFailurePolicy needs Never"
        fail, ignore = spec["podFailurePolicy"]["rules"]
        [container] = spec["template"]["spec"]["containers"]
        assert fail == {
            "action": "FailJob",
            "onExitCodes": {
                "containerName": container["name"],
                "operator": "In",
                "values": list(PERMANENT_EXIT_CODES),
            },
        }
        assert not set(RETRYABLE_EXIT_CODES) & set(fail["onExitCodes"]["values"])
        assert ignore == {
            "action": "Ignore",
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
        }


@pytest.mark.parametrize("name", [TORCH_RUNTIME, MPI_RUNTIME])
def test_every_pod_runs_non_root_without_privilege_escalation(
    installed: dict[str, Object], name: str
) -> None:
    pods = list(_pods(installed[name]))
    assert pods
    for job, pod in pods:
        assert pod["securityContext"] == {
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        }, job
        containers = [*pod["containers"], *pod.get("initContainers", [])]
        assert containers
        for container in containers:
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, (job, container["name"])
            assert security["capabilities"]["drop"] == ["ALL"], (job, container["name"])
            assert not security.get("privileged") and security.get("runAsNonRoot", True) is True


def _images(runtimes: dict[str, Object]) -> list[str]:
    return [
        container["image"]
        for runtime in runtimes.values()
        for _, pod in _pods(runtime)
        for container in pod["containers"]
    ]


def _shape(runtimes: dict[str, Object]) -> dict[str, dict[str, Any]]:
    # Every leaf but the images: what a value must not be able to change.
    return {
        name: {path: value for path, value in leaves(runtime) if not path.endswith(".image")}
        for name, runtime in runtimes.items()
    }


HOSTILE = [
    "x\n  evil: 1",
    "x\nevil: 1",
    "{{ .Release.Name }}",
    "{{.Release.Name}}",
    '" , "x": {"y": 1} ,"',
    "x'\n---\nkind: Secret",
    "a: [b]",
]


@pytest.mark.parametrize("image", HOSTILE, ids=range(len(HOSTILE)))
def test_an_image_value_is_data_never_yaml_or_a_template(
    template: Callable[..., subprocess.CompletedProcess[str]],
    runtimes: Callable[..., dict[str, Object]],
    installed: dict[str, Object],
    image: str,
) -> None:
    values = {"trainingRuntimes": {"install": True, "image": image}}

    checked = template(values)
    # The values schema takes image references only.
    assert checked.returncode != 0
    assert "at '/trainingRuntimes/image'" in checked.stderr, checked.stderr

    # Past the schema too, the template quotes it: the same objects, with the image verbatim.
    rendered = runtimes(values, "--skip-schema-validation")
    assert _images(rendered) == [image] * 3
    assert _shape(rendered) == _shape(installed)
    everything = template(values, "--skip-schema-validation")
    assert [doc["kind"] for doc in yaml.safe_load_all(everything.stdout) if doc].count("Secret") == 0


@pytest.mark.parametrize(
    "image",
    [
        DEFAULT_IMAGE,
        "trainer",
        "localhost:5000/team/trainer:v1.2-rc_3",
        "registry.example.com/bertjob/trainer@sha256:" + "0" * 64,
    ],
)
def test_an_image_reference_passes_the_schema_and_renders_as_written(
    runtimes: Callable[..., dict[str, Object]], image: str
) -> None:
    rendered = runtimes({"trainingRuntimes": {"install": True, "image": image}})
    assert _images(rendered) == [image] * 3


@pytest.mark.parametrize("install", ["true", "yes", "", 1])
def test_install_is_auto_true_or_false(
    template: Callable[..., subprocess.CompletedProcess[str]], install: Any
) -> None:
    result = template({"trainingRuntimes": {"install": install}})
    assert result.returncode != 0
    assert "at '/trainingRuntimes/install'" in result.stderr, result.stderr
    # Past the schema, the template refuses it too rather than guessing.
    unchecked = template({"trainingRuntimes": {"install": install}}, "--skip-schema-validation")
    assert unchecked.returncode != 0 and "trainingRuntimes.install" in unchecked.stderr, unchecked.stderr


def test_the_ci_values_file_installs_them(runtimes: Callable[..., dict[str, Object]]) -> None:
    values = yaml.safe_load((CHART / "ci" / "trainingruntimes-values.yaml").read_text())
    assert sorted(runtimes(values)) == sorted([TORCH_RUNTIME, MPI_RUNTIME])
