"""render() with launcher trainjob: the Kubeflow Trainer v2 TrainJob a job becomes, through real
`kubectl kustomize`, checked against the upstream v2.3.0 CRD schema and against the PyTorchJob and
MPIJob the same job becomes (the pods must be the same pods, whichever launcher runs them).

Golden files are in tests/bertjob/test_render.py's table (trainjob-*.yaml).
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from bertjob.launchers import mpijob, registry
from bertjob.launchers.trainjob import MPI_ENV_LIST
from bertjob.render import render
from bertjob_api.contract import (
    JOB_LABEL,
    JOB_PATH,
    MPI_RUNTIME,
    MPIRUN_MCA_ENV,
    PREPARE_COMMAND,
    RUNTIME_PATCH_MANAGER,
    TORCH_RUNTIME,
    TRAINER_MODULE,
)
from bertjob_api.spec import SpecError, parse_job
from tests.bertjob.test_render import DEVICES, _job
from tests.k8s_schema import assert_valid

KUBERNETES_VERSION = "1.33"
TRAINJOB = registry.get("trainjob")
POD = {
    "nodeSelector": {"pool": "a100"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    },
    "env": [{"name": "HF_HOME", "value": "/data/hf"}, {"name": "NCCL_DEBUG", "value": "INFO"}],
    "securityContext": {"runAsNonRoot": True, "fsGroup": 1000},
    "imagePullSecrets": ["registry"],
    "resources": {"requests": {"cpu": 8, "memory": "64Gi"}},
}
VOLUMES = [
    {"name": "data", "mountPath": "/data", "source": {"persistentVolumeClaim": {"claimName": "bert"}}},
    {
        "name": "corpus",
        "mountPath": "/corpus",
        "readOnly": True,
        "source": {"nfs": {"server": "n", "path": "/c"}},
    },
]


def _trainjob(changes: dict[str, Any] | None = None, **job: Any) -> dict[str, Any]:
    return render(parse_job(_job(changes={"spec.launcher": "trainjob", **(changes or {})}, **job)))[-1]


def _patched_node(child: dict[str, Any]) -> dict[str, Any]:
    [patch] = child["spec"]["runtimePatches"]
    assert patch["manager"] == RUNTIME_PATCH_MANAGER
    [node] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"
    return dict(node["template"]["spec"]["template"])


def _env(container_or_trainer: dict[str, Any]) -> dict[str, Any]:
    return {
        env["name"]: env.get("value", env.get("valueFrom")) for env in container_or_trainer.get("env", [])
    }


# Every accelerator under each policy but habana-hpu under MPI, which validation refuses.
RUNNABLE = [
    (policy, accelerator)
    for policy in ("torch", "mpi")
    for accelerator in DEVICES
    if (policy, accelerator) != ("mpi", "habana-hpu")
]
MPI_ACCELERATORS = [accelerator for policy, accelerator in RUNNABLE if policy == "mpi"]


@pytest.mark.parametrize(("policy", "accelerator"), RUNNABLE)
@pytest.mark.parametrize("nodes", [1, 3])
def test_every_combination_is_a_trainjob_of_the_jobs_topology(
    nodes: int, policy: str, accelerator: str, trainjob_schema: dict[str, Any]
) -> None:
    child = _trainjob(
        {"spec.trainJob": {"mlPolicy": policy}}, nodes=nodes, processes=2, accelerator=accelerator
    )

    assert_valid(child, trainjob_schema)
    assert (child["apiVersion"], child["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert child["metadata"]["name"] == "demo"
    assert child["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": TORCH_RUNTIME if policy == "torch" else MPI_RUNTIME,
    }
    trainer = child["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (nodes, 2)
    device = DEVICES[accelerator]
    if device is not None:
        assert trainer["resourcesPerNode"]["limits"][device] == 2
    pod = TRAINJOB.trainer_template(child)
    template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "node"}, "template": pod}
    kubernetes_validate.validate(template, KUBERNETES_VERSION, strict=True)


def test_the_torch_trainjob_runs_the_pytorchjobs_torchrun_and_the_mpi_one_leaves_the_runtimes() -> None:
    pytorchjob = render(parse_job(_job()))[-1]
    [master] = pytorchjob["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]

    assert _trainjob()["spec"]["trainer"]["command"] == master["command"]
    # Trainer v2 gives a TrainJob's command to every `node` container: the MPI runtime's sshd too.
    assert "command" not in _trainjob({"spec.trainJob": {"mlPolicy": "mpi"}})["spec"]["trainer"]


@pytest.mark.parametrize("launcher", ["pytorchjob", "mpijob"])
def test_a_trainjobs_node_pods_are_the_other_launchers_trainer_pods(launcher: str) -> None:
    """What a pod needs (volumes, mounts, security, account, scheduling, image, environment, labels)
    is the same whichever launcher runs it; only the container's name, command and ports differ."""
    changes = {"spec.pod": POD, "spec.volumes": VOLUMES}
    other = render(parse_job(_job(changes={**changes, "spec.launcher": launcher})))[-1]
    replicas = other["spec"].get("pytorchReplicaSpecs") or other["spec"]["mpiReplicaSpecs"]
    expected = (replicas.get("Master") or replicas["Worker"])["template"]
    node = TRAINJOB.trainer_template(_trainjob(changes))

    def comparable(template: dict[str, Any]) -> dict[str, Any]:
        spec = dict(template["spec"])
        [container] = spec.pop("containers")
        spec.pop("restartPolicy", None)
        kept = {key: value for key, value in container.items() if key not in ("name", "command", "ports")}
        kept["env"] = sorted(kept.get("env", []), key=lambda env: env["name"])
        return {"labels": template["metadata"]["labels"], "spec": spec, "container": kept}

    assert comparable(node) == comparable(expected)


def test_pod_settings_reach_the_runtime_patch_as_written() -> None:
    child = _trainjob({"spec.pod": {**POD, "serviceAccountName": "trainer"}, "spec.volumes": VOLUMES})
    pod = _patched_node(child)["spec"]

    assert pod["nodeSelector"] == POD["nodeSelector"]
    assert pod["tolerations"] == POD["tolerations"]
    assert pod["affinity"] == POD["affinity"]
    assert pod["securityContext"] == POD["securityContext"]
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["serviceAccountName"] == "trainer"
    assert {"name": "corpus", "nfs": {"server": "n", "path": "/c"}} in pod["volumes"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "bert"}} in pod["volumes"]
    [container] = pod["containers"]
    assert {"name": "corpus", "mountPath": "/corpus", "readOnly": True} in container["volumeMounts"]
    assert _env(child["spec"]["trainer"])["NCCL_DEBUG"] == "INFO"
    assert child["spec"]["trainer"]["resourcesPerNode"] == {
        "requests": {"cpu": 8, "memory": "64Gi"},
        "limits": {"nvidia.com/gpu": 2},
    }


def test_the_job_name_reaches_the_pods_through_their_label() -> None:
    child = _trainjob()
    labels = _patched_node(child)["metadata"]["labels"]

    assert labels[JOB_LABEL] == "demo"
    assert _env(child["spec"]["trainer"])["BERTJOB_NAME"] == {
        "fieldRef": {"fieldPath": f"metadata.labels['{JOB_LABEL}']"}
    }


def test_run_policy_and_queue_reach_the_trainjob() -> None:
    child = _trainjob(
        {"spec.runPolicy": {"suspend": True, "activeDeadlineSeconds": 3600}, "spec.queueName": "team-a"}
    )

    assert child["spec"]["suspend"] is True
    assert child["spec"]["activeDeadlineSeconds"] == 3600
    assert child["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert "activeDeadlineSeconds" not in _trainjob()["spec"]
    assert "kueue.x-k8s.io/queue-name" not in _trainjob()["metadata"]["labels"]


def test_a_platform_runtime_replaces_the_charts() -> None:
    child = _trainjob({"spec.trainJob": {"runtimeRef": {"name": "team-torch", "kind": "TrainingRuntime"}}})

    assert child["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
        "name": "team-torch",
    }


@pytest.mark.parametrize("accelerator", MPI_ACCELERATORS)
@pytest.mark.parametrize("deepspeed", [False, True])
def test_mpi_ranks_get_what_the_mpijob_launcher_forwards(accelerator: str, deepspeed: bool) -> None:
    """The variables Open MPI forwards to the ranks started over ssh are those `mpirun -x` forwards
    under launcher mpijob, and the placement is the MPIJob Launcher's (both the contract's
    MPIRUN_MCA_ENV, as Open MPI's MCA variables)."""
    changes: dict[str, Any] = {"spec.pod": {"env": POD["env"]}}
    if deepspeed:
        changes["spec.distributed"] = {"deepspeed": {"zeroStage": 1}}
    as_mpijob = parse_job(
        _job(nodes=2, accelerator=accelerator, changes={**changes, "spec.launcher": "mpijob"})
    )
    command = mpijob.launcher_command(as_mpijob.spec, "demo", "default")
    forwarded = [command[i + 1] for i, arg in enumerate(command) if arg == "-x"]
    child = _trainjob({**changes, "spec.trainJob": {"mlPolicy": "mpi"}}, nodes=2, accelerator=accelerator)
    env = _env(child["spec"]["trainer"])

    listed = env["OMPI_MCA_mca_base_env_list"].split(";")
    assert [name.split("=")[0] for name in forwarded] == listed
    if deepspeed:
        # Rank 0 runs on the first node pod, the hostfile's first line under Trainer v2.
        assert env["MASTER_ADDR"] == "demo-node-0-0.demo"
        assert env["MASTER_PORT"] == str(mpijob.DEEPSPEED_MASTER_PORT)
    launcher = render(as_mpijob)[-1]["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    [container] = launcher["containers"]
    mca = {name: value for name, value in _env(container).items() if name.startswith("OMPI_MCA_")}
    assert mca == MPIRUN_MCA_ENV.get(accelerator, {})
    assert {name: env[name] for name in env if name.startswith("OMPI_MCA_") and name != MPI_ENV_LIST} == mca


@pytest.mark.parametrize("policy", ["torch", "mpi"])
def test_the_mpi_launcher_gets_the_environment_its_ranks_need(
    policy: str, trainjob_schema: dict[str, Any]
) -> None:
    """Trainer v2 gives the TrainJob's environment only to the nodes (the replicated job labelled
    trainer): under the MPI policy a second patch gives it to the runtime's launcher container,
    whose mpirun forwards it to the ranks."""
    child = _trainjob({"spec.trainJob": {"mlPolicy": policy}, "spec.pod": {"env": POD["env"]}}, nodes=2)
    [patch] = child["spec"]["runtimePatches"]
    jobs = {
        job["name"]: job["template"]["spec"]["template"]
        for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    }

    assert_valid(child, trainjob_schema)
    if policy == "torch":
        assert set(jobs) == {"node"}
        return
    assert set(jobs) == {"node", "launcher"}
    [container] = jobs["launcher"]["spec"]["containers"]
    assert container == {"name": "launcher", "env": child["spec"]["trainer"]["env"]}
    assert jobs["launcher"]["metadata"]["labels"][JOB_LABEL] == "demo"
    listed = _env(container)["OMPI_MCA_mca_base_env_list"].split(";")
    assert set(listed) <= set(_env(container)), "Open MPI forwards nothing after a variable it lacks"


def test_the_data_job_runs_in_the_trainjobs_node_pod() -> None:
    rendered = render(
        parse_job(_job(changes={"spec.launcher": "trainjob", "spec.prepare": {"enabled": True}}))
    )
    [prepare] = [obj for obj in rendered if obj["kind"] == "Job"]
    pod = prepare["spec"]["template"]["spec"]
    node = TRAINJOB.trainer_template(rendered[-1])["spec"]
    [container] = pod["containers"]
    [trainer] = node["containers"]

    assert container["image"] == trainer["image"]
    assert container["command"] == ["python", "-m", TRAINER_MODULE, PREPARE_COMMAND, "--config", JOB_PATH]
    assert container["volumeMounts"] == trainer["volumeMounts"]
    assert container["env"] == trainer["env"]
    assert "resources" not in container
    assert pod["volumes"] == node["volumes"]
    assert pod.get("serviceAccountName") == node.get("serviceAccountName")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"spec.elastic": {"minNodes": 1, "maxNodes": 3}}, "spec.elastic"),
        ({"spec.trainJob": {"mlPolicy": "mpi"}, "spec.mpi": {"command": "horovodrun"}}, "spec.mpi.command"),
        (
            {"spec.trainJob": {"mlPolicy": "mpi"}, "spec.mpi": {"sshAuthMountPath": "/root/.ssh"}},
            "spec.mpi.sshAuthMountPath",
        ),
        ({"spec.runPolicy": {"backoffLimit": 3}}, "spec.runPolicy.backoffLimit"),
        ({"spec.runPolicy": {"ttlSecondsAfterFinished": 60}}, "spec.runPolicy.ttlSecondsAfterFinished"),
        ({"spec.runPolicy": {"cleanPodPolicy": "All"}}, "spec.runPolicy.cleanPodPolicy"),
        ({"spec.runPolicy": {"schedulingPolicy": {"minAvailable": 2}}}, "spec.runPolicy.schedulingPolicy"),
        ({"spec.pod": {"priorityClassName": "high"}}, "spec.pod.priorityClassName"),
        ({"spec.pod": {"schedulerName": "volcano"}}, "spec.pod.schedulerName"),
        ({"spec.pod": {"imagePullPolicy": "Always"}}, "spec.pod.imagePullPolicy"),
        ({"spec.pod": {"env": [{"name": "PET_MASTER_PORT", "value": "1"}]}}, "spec.pod.env[0].name"),
        (
            {"spec.trainJob": {"mlPolicy": "mpi"}, "spec.pod": {"env": [{"name": "A;B", "value": "1"}]}},
            "spec.pod.env[0].name",
        ),
        (
            {"spec.trainJob": {"mlPolicy": "mpi"}, "spec.distributed": {"gradientCompression": "bf16"}},
            "spec.distributed.gradientCompression",
        ),
    ],
)
def test_what_a_trainjob_cannot_carry_is_refused_naming_the_field(
    changes: dict[str, Any], field: str
) -> None:
    with pytest.raises(SpecError) as refused:
        render(parse_job(_job(nodes=2, changes={"spec.launcher": "trainjob", **changes})))

    assert field in [path for path, _ in refused.value.problems]
    # The same spec is fine for the launcher that has the field (the refusal is trainjob's).
    if field not in (
        "spec.elastic",
        "spec.mpi.command",
        "spec.pod.env[0].name",
        "spec.distributed.gradientCompression",
    ):
        render(parse_job(_job(nodes=2, changes=changes)))


def test_a_name_too_long_for_trainer_v2s_pod_names_is_refused() -> None:
    long_name = "a" * 54  # the hostname <name>-node-0-2 is a DNS label: 54 + 9 characters fit in 63
    fits = _job(nodes=3, changes={"spec.launcher": "trainjob", "metadata.name": long_name})
    render(parse_job(fits))

    with pytest.raises(SpecError, match="Trainer v2's last node pod"):
        render(
            parse_job(_job(nodes=3, changes={"spec.launcher": "trainjob", "metadata.name": long_name + "a"}))
        )
