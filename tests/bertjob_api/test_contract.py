"""The manifests' literals against :mod:`bertjob_api.contract`, where operator and trainer agree.

The kustomize YAML keeps its own literals, since it is usable by hand; the golden children (what
the operator renders) and the generated CRD are YAML too. Each literal there that the trainer or
the operator relies on is checked here against the one module that defines it, so that a change
on one side shows up as a failure here rather than as a pod that cannot find its job file.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bertjob.launchers import registry
from bertjob_api import contract
from bertjob_api.crd import Progress

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "kustomize" / "base"
GOLDEN = sorted((ROOT / "tests" / "bertjob" / "golden").glob("*.yaml"))
# The progress fields the trainer sets besides its log values (PROGRESS_FIELDS).
PROGRESS_KEYS = {"phase", "step", "totalSteps", "updateTime"}
TRAINER_COMMAND = [
    "python",
    "-m",
    contract.TRAINER_MODULE,
    contract.RUN_COMMAND,
    "--config",
    contract.JOB_PATH,
]
PREPARE_COMMAND = [
    "python",
    "-m",
    contract.TRAINER_MODULE,
    contract.PREPARE_COMMAND,
    "--config",
    contract.JOB_PATH,
]


def _load(path: Path) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def _one(path: Path) -> dict[str, Any]:
    [document] = _load(path)
    return document


def _by_name(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in entries}


def _replicas(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = document.get("spec") or {}
    return spec.get("pytorchReplicaSpecs") or spec.get("mpiReplicaSpecs") or {}


def _pods(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, pod spec) of every pod template in a document."""
    if document["kind"] == "Job":
        yield f"{document['metadata']['name']} (Job)", document["spec"]["template"]["spec"]
    if document["kind"] == "TrainJob":
        # The node pods as Trainer v2 makes them from the TrainJob's trainer and runtime patch.
        yield (
            f"{document['metadata']['name']} node",
            registry.get("trainjob").trainer_template(document)["spec"],
        )
    for role, replica in _replicas(document).items():
        yield f"{document['metadata']['name']} {role}", replica["template"]["spec"]


def _runs_the_trainer(container: dict[str, Any]) -> bool:
    return contract.TRAINER_MODULE in container.get("command", [])


# --- kustomize/base ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trainer_pod() -> dict[str, Any]:
    """The base's trainer PodTemplate's pod spec."""
    return _one(BASE / "trainer-pod.yaml")["template"]["spec"]


def test_the_base_trainer_container_has_the_contracts_name(trainer_pod: dict[str, Any]) -> None:
    assert [container["name"] for container in trainer_pod["containers"]] == [contract.TRAINER_CONTAINER]
    # kustomization.yaml copies the trainer container's fields into the replicas by that name.
    text = (BASE / "kustomization.yaml").read_text()
    assert f"containers.[name={contract.TRAINER_CONTAINER}]" in text


def test_the_base_mounts_the_contracts_volumes_at_its_paths(trainer_pod: dict[str, Any]) -> None:
    [container] = trainer_pod["containers"]
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    assert mounts == {
        contract.JOB_CONFIG_VOLUME: contract.CONFIG_DIR,
        contract.DATA_VOLUME: contract.DATA_MOUNT_PATH,
        contract.SHM_VOLUME: contract.SHM_MOUNT_PATH,
        contract.TMP_VOLUME: contract.TMP_MOUNT_PATH,
        contract.PROGRESS_TOKEN_VOLUME: contract.PROGRESS_TOKEN_DIR,
    }
    assert _by_name(container["volumeMounts"])[contract.JOB_CONFIG_VOLUME]["readOnly"] is True
    assert _by_name(container["volumeMounts"])[contract.PROGRESS_TOKEN_VOLUME]["readOnly"] is True
    # The names a job's volumes may not take are mounted where the contract says.
    assert {name: mounts[name] for name in contract.RESERVED_VOLUMES} == contract.RESERVED_VOLUMES
    volumes = _by_name(trainer_pod["volumes"])
    assert set(volumes) == set(mounts)
    assert "configMap" in volumes[contract.JOB_CONFIG_VOLUME]
    assert "emptyDir" in volumes[contract.DATA_VOLUME]
    assert volumes[contract.SHM_VOLUME]["emptyDir"] == {"medium": "Memory"}
    # The token for the operator's audience only, where the trainer reads it.
    [source] = volumes[contract.PROGRESS_TOKEN_VOLUME]["projected"]["sources"]
    token = source["serviceAccountToken"]
    assert (token["audience"], token["path"]) == (contract.PROGRESS_AUDIENCE, contract.PROGRESS_TOKEN_FILE)


def test_the_base_sets_the_contracts_variables(trainer_pod: dict[str, Any]) -> None:
    [container] = trainer_pod["containers"]
    env = _by_name(container["env"])
    assert set(env) == {contract.NAME_ENV, contract.NAMESPACE_ENV}
    name_from = env[contract.NAME_ENV]["valueFrom"]["fieldRef"]["fieldPath"]
    assert name_from == f"metadata.labels['{contract.JOB_LABEL}']"
    assert env[contract.NAMESPACE_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_the_pytorchjob_runs_the_contracts_command_and_restarts_on_its_codes() -> None:
    [master] = _replicas(_one(BASE / "pytorchjob.yaml")).values()
    [container] = master["template"]["spec"]["containers"]
    assert container["command"] == [
        "python",
        "-m",
        contract.LAUNCH_MODULE,
        "--module",
        *TRAINER_COMMAND[2:],
    ]
    assert master["restartPolicy"] == "ExitCode"


def test_the_trainjob_runs_the_contracts_command_on_the_charts_runtime_and_patches_its_node() -> None:
    trainjob = _one(BASE / "trainjob.yaml")
    spec = trainjob["spec"]
    assert spec["runtimeRef"]["name"] == contract.TORCH_RUNTIME
    assert spec["trainer"]["command"] == [
        "python",
        "-m",
        contract.LAUNCH_MODULE,
        "--module",
        *TRAINER_COMMAND[2:],
    ]
    [patch] = spec["runtimePatches"]
    assert patch["manager"] == contract.RUNTIME_PATCH_MANAGER
    [node] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    [container] = node["template"]["spec"]["template"]["spec"]["containers"]
    assert node["name"] == container["name"] == contract.TRAINJOB_NODE


def test_the_mpijob_launcher_runs_the_contracts_command_with_its_variables() -> None:
    replicas = _replicas(_one(BASE / "mpijob.yaml"))
    command = replicas["Launcher"]["template"]["spec"]["containers"][0]["command"]
    assert command[-len(TRAINER_COMMAND) :] == TRAINER_COMMAND
    forwarded = {command[i + 1] for i, word in enumerate(command) if word == "-x"}
    assert forwarded == {contract.NAME_ENV, contract.NAMESPACE_ENV}


# --- exit codes ----------------------------------------------------------------------------------


def test_exit_codes_are_what_the_restart_and_pod_failure_policies_act_on() -> None:
    """Kubeflow's ``restartPolicy: ExitCode`` restarts a pod on 128-255 only."""
    assert contract.EXIT_PREEMPTED == 128 + signal.SIGTERM == 143
    assert all(128 <= code <= 255 for code in contract.RETRYABLE_EXIT_CODES)
    assert all(0 < code < 128 for code in contract.PERMANENT_EXIT_CODES)
    # No signal's death (128 + N, N <= SIGRTMAX) reads as a full disk.
    assert contract.EXIT_DISK_FULL > 128 + signal.SIGRTMAX
    codes = [contract.EXIT_SUCCESS, *contract.PERMANENT_EXIT_CODES, *contract.RETRYABLE_EXIT_CODES]
    assert len(codes) == len(set(codes))


# --- what the operator renders (golden children) -----------------------------------------------


@pytest.fixture(scope="module", params=GOLDEN, ids=[path.stem for path in GOLDEN])
def golden(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """The documents of one golden rendering."""
    return _load(request.param)


def test_golden_files_exist() -> None:
    assert GOLDEN, "tests/bertjob/golden/*.yaml are missing"


def test_rendered_trainer_pods_keep_the_contract(golden: list[dict[str, Any]]) -> None:
    [config_map] = [document for document in golden if document["kind"] == "ConfigMap"]
    assert set(config_map["data"]) == {contract.JOB_FILE}
    commands = mounting = 0
    for where, pod in _pods_of(golden):
        volumes = _by_name(pod.get("volumes", []))
        for container in pod["containers"]:
            # Where the trainer starts (an MPIJob's Launcher starts it on the Workers, over ssh).
            if _runs_the_trainer(container):
                commands += 1
                assert container["command"][-2:] == ["--config", contract.JOB_PATH], where
                env = _by_name(container.get("env", []))
                assert {contract.NAME_ENV, contract.NAMESPACE_ENV} <= set(env), where
                label = env[contract.NAME_ENV]["valueFrom"]["fieldRef"]["fieldPath"]
                assert label == f"metadata.labels['{contract.JOB_LABEL}']", where
            # Where it runs: every pod with the trainer pod's volumes.
            mounts = {mount["name"]: mount["mountPath"] for mount in container.get("volumeMounts", [])}
            if mounts:
                mounting += 1
                assert mounts[contract.JOB_CONFIG_VOLUME] == contract.CONFIG_DIR, where
                assert mounts[contract.DATA_VOLUME] == contract.DATA_MOUNT_PATH, where
                assert mounts[contract.SHM_VOLUME] == contract.SHM_MOUNT_PATH, where
                job_config = volumes[contract.JOB_CONFIG_VOLUME]["configMap"]
                assert job_config["name"] == config_map["metadata"]["name"], where
    # An MPI-policy TrainJob has no command: its runtime's launcher runs the trainer, as
    # tests/charts/test_trainingruntimes.py checks.
    runtime_runs_it = any(
        doc["kind"] == "TrainJob" and "command" not in doc["spec"]["trainer"] for doc in golden
    )
    assert (commands or runtime_runs_it) and mounting, (
        "no container runs the trainer, or none mounts the job file"
    )


def _pods_of(documents: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for document in documents:
        yield from _pods(document)


def test_the_rendered_data_job_fails_on_the_permanent_codes(golden: list[dict[str, Any]]) -> None:
    jobs = [document for document in golden if document["kind"] == "Job"]
    for job in jobs:
        [container] = job["spec"]["template"]["spec"]["containers"]
        assert container["name"] == contract.PREPARE_CONTAINER
        assert container["command"] == PREPARE_COMMAND
        [fail] = [rule for rule in job["spec"]["podFailurePolicy"]["rules"] if rule["action"] == "FailJob"]
        assert fail["onExitCodes"] == {
            "containerName": contract.PREPARE_CONTAINER,
            "operator": "In",
            "values": list(contract.PERMANENT_EXIT_CODES),
        }


def test_a_rendered_pytorchjob_restarts_on_exit_codes(golden: list[dict[str, Any]]) -> None:
    """A PyTorchJob's replicas restart by the trainer's exit code (an MPIJob's Launcher restarts
    OnFailure: mpirun's exit status is the trainer's)."""
    for training in (document for document in golden if document["kind"] == "PyTorchJob"):
        assert {replica["restartPolicy"] for replica in _replicas(training).values()} == {"ExitCode"}


def test_a_jobs_pods_report_to_the_path_the_operators_endpoint_takes(golden: list[dict[str, Any]]) -> None:
    from bertjob.progress import PATH

    assert not [
        document for document in golden if document["kind"] in ("Role", "RoleBinding", "ServiceAccount")
    ]
    [config_map] = [document for document in golden if document["kind"] == "ConfigMap"]
    job = config_map["metadata"]["labels"][contract.JOB_LABEL]
    match = PATH.match(contract.status_path(config_map["metadata"]["namespace"], job))
    assert match is not None and match["name"] == job


# --- the CRD -------------------------------------------------------------------------------------


def test_the_resource_path_is_the_api_servers() -> None:
    assert contract.status_path("team-a", "wiki") == (
        "/apis/bertjob.dev/v1alpha1/namespaces/team-a/bertpretrainjobs/wiki/status"
    )


def test_the_generated_crd_names_the_contracts_resource() -> None:
    [crd] = _load(ROOT / "manifests" / "crd.yaml")
    assert crd["metadata"]["name"] == f"{contract.PLURAL}.{contract.GROUP}"
    assert crd["spec"]["group"] == contract.GROUP
    assert crd["spec"]["names"]["kind"] == contract.KIND
    assert crd["spec"]["names"]["plural"] == contract.PLURAL
    [version] = crd["spec"]["versions"]
    assert version["name"] == contract.VERSION
    assert "status" in version["subresources"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    progress = status["properties"]["progress"]["properties"]
    assert set(progress) == PROGRESS_KEYS | set(contract.PROGRESS_FIELDS.values())


def test_the_progress_model_declares_the_contracts_fields() -> None:
    declared = {field.alias or name for name, field in Progress.model_fields.items()}
    assert declared == PROGRESS_KEYS | set(contract.PROGRESS_FIELDS.values())
    # The trainer's log keys are the fields' own names, snake_case.
    assert set(contract.PROGRESS_FIELDS) <= set(Progress.model_fields)
