"""render(): the ConfigMap and the PyTorchJob a job becomes, through real `kubectl kustomize`.

Golden files: tests/bertjob/golden/*.yaml. After an intended change, regenerate them with

    BERTJOB_UPDATE_GOLDEN=1 .venv/bin/pytest tests/bertjob/test_render.py -k golden

and review the diff.
"""

from __future__ import annotations

import difflib
import os
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bertjob.render import (
    KUSTOMIZE_DIR_ENV,
    ProgressEndpoint,
    RenderError,
    cached_build,
    component,
    job_labels,
    kustomize_dir,
    render,
)
from bertjob_api.contract import JOB_FILE, PROGRESS_CA_KEY, PROGRESS_URL_KEY
from bertjob_api.defaults import with_defaults
from bertjob_api.spec import SpecError, parse_job, to_document
from bertjob_testing.jobs import INJECTIONS, valid_job, with_value
from tests.k8s_schema import assert_valid

GOLDEN = Path(__file__).parent / "golden"
KUBERNETES_VERSION = "1.33"
DEVICES = {"nvidia-gpu": "nvidia.com/gpu", "habana-hpu": "habana.ai/gaudi", "xeon-cpu": None}


def _job(
    nodes: int = 1, processes: int = 2, accelerator: str = "nvidia-gpu", changes: dict[str, Any] | None = None
) -> dict[str, Any]:
    document = valid_job()
    # 96 and 48 sequences divide over every world size used here (1 to 6 processes).
    for field, value in {
        "spec.topology.nodes": nodes,
        "spec.topology.processesPerNode": processes,
        "spec.accelerator": accelerator,
        "spec.phases.0.globalBatchSize": 96,
        "spec.phases.1.globalBatchSize": 48,
        **(changes or {}),
    }.items():
        document = with_value(document, field, value)
    return document


def _pods(child: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = child["spec"]
    replicas = spec.get("pytorchReplicaSpecs") or spec["mpiReplicaSpecs"]
    return {name: replica["template"] for name, replica in replicas.items()}


def _trainer_pods(child: dict[str, Any]) -> list[dict[str, Any]]:
    return [pod for name, pod in _pods(child).items() if name != "Launcher"]


def _by_kind(rendered: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {obj["kind"]: obj for obj in rendered}


def _validate_core(obj: dict[str, Any]) -> None:
    if obj["kind"] in ("PyTorchJob", "MPIJob"):
        for name, pod in _pods(obj).items():
            template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name.lower()}}
            kubernetes_validate.validate({**template, "template": pod}, KUBERNETES_VERSION, strict=True)
    else:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


# Every pair but mpijob with habana-hpu, which validation refuses (the Gaudi image has no Horovod).
RUNNABLE = [
    (launcher, accelerator)
    for launcher in ("pytorchjob", "mpijob")
    for accelerator in DEVICES
    if (launcher, accelerator) != ("mpijob", "habana-hpu")
]


@pytest.mark.parametrize(("launcher", "accelerator"), RUNNABLE)
@pytest.mark.parametrize("nodes", [1, 3])
def test_every_combination_renders_valid_objects_in_order(
    nodes: int,
    launcher: str,
    accelerator: str,
    pytorchjob_schema: dict[str, Any],
    mpijob_schema: dict[str, Any],
) -> None:
    prepare = nodes == 3  # the data Job with and without, over both launchers and every accelerator
    changes = {"spec.launcher": launcher, "spec.prepare": {"enabled": prepare}}
    rendered = render(parse_job(_job(nodes, 2, accelerator, changes)))

    kind = {"pytorchjob": "PyTorchJob", "mpijob": "MPIJob"}[launcher]
    expected = [
        ("ConfigMap", "demo-job", "config"),
        *([("Job", "demo-prepare", "prepare")] if prepare else []),
        (kind, "demo", "train"),
    ]
    assert [(obj["kind"], obj["metadata"]["name"], component(obj)) for obj in rendered] == expected
    for obj in rendered:
        assert obj["metadata"]["namespace"] == "default"
        assert {"app.kubernetes.io/name": "bertjob", "bertjob.dev/job": "demo"}.items() <= obj["metadata"][
            "labels"
        ].items()
        _validate_core(obj)
    child = rendered[-1]
    assert_valid(child, pytorchjob_schema if launcher == "pytorchjob" else mpijob_schema)
    if launcher == "pytorchjob":
        assert child["spec"]["nprocPerNode"] == "2"
        counts = {"Master": 1} if nodes == 1 else {"Master": 1, "Worker": nodes - 1}
        replicas = child["spec"]["pytorchReplicaSpecs"]
        assert {name: replica["replicas"] for name, replica in replicas.items()} == counts
        assert {replica["restartPolicy"] for replica in replicas.values()} == {"ExitCode"}
    else:
        assert child["spec"]["slotsPerWorker"] == 2
        assert child["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == nodes
        [container] = _pods(child)["Launcher"]["spec"]["containers"]
        command = container["command"]
        assert "args" not in container
        assert command[:4] == ["python", "-m", "bertpretrain.mpilaunch", "--"]
        assert command[4:9] == ["mpirun", "-np", str(nodes * 2), "--hostfile", "/etc/mpi/hostfile"]
        rank = ["python", "-m", "bertpretrain.mpilaunch", "--rank", "--"]
        trainer = ["python", "-m", "bertpretrain", "run", "--config", "/etc/bertjob/job.yaml"]
        assert command[-11:] == [*rank, *trainer]
        assert not [arg for arg in command if "MASTER" in arg or "RANK" in arg]
    for pod in _pods(child).values():
        assert pod["metadata"]["labels"] == job_labels("demo", "train")
        assert "serviceAccountName" not in pod["spec"]  # the namespace's default account
        [container] = pod["spec"]["containers"]
        assert container["image"] == "ghcr.io/bertjob/trainer:0.1.0"
        env = {var["name"]: var for var in container["env"]}
        assert (
            env["BERTJOB_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['bertjob.dev/job']"
        )
        assert env["BERTJOB_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    for pod in _trainer_pods(child):
        [container] = pod["spec"]["containers"]
        device = DEVICES[accelerator]
        limits = container.get("resources", {}).get("limits", {})
        assert limits == ({device: 2} if device else {})
        config_volume = next(volume for volume in pod["spec"]["volumes"] if volume["name"] == "job-config")
        assert config_volume["configMap"]["name"] == "demo-job"


ELASTIC = {"minNodes": 1, "maxNodes": 4, "maxRestarts": 2}


@pytest.mark.parametrize(
    ("launcher", "nodes", "accelerator"),
    # Elastic Horovod starts on 2 nodes or more (bertjob_api.validation).
    [
        (launcher, nodes, accelerator)
        for launcher, nodes in [("pytorchjob", 1), ("pytorchjob", 2), ("mpijob", 2), ("mpijob", 3)]
        for accelerator in DEVICES
        if (launcher, accelerator) in RUNNABLE
    ],
)
def test_an_elastic_job_renders_valid_objects(
    nodes: int,
    launcher: str,
    accelerator: str,
    pytorchjob_schema: dict[str, Any],
    mpijob_schema: dict[str, Any],
) -> None:
    changes = {
        "spec.launcher": launcher,
        "spec.elastic": ELASTIC,
        "spec.mpi": {"command": "horovodrun"},
        "spec.prepare": {"enabled": True},
    }
    rendered = render(parse_job(_job(nodes, 2, accelerator, changes)))

    for obj in rendered:
        _validate_core(obj)
    child = rendered[-1]
    device = DEVICES[accelerator]
    [trainer] = _trainer_pods(child)
    [container] = trainer["spec"]["containers"]
    assert container.get("resources", {}).get("limits", {}) == ({device: 2} if device else {})
    # The data Job copies the pod that runs the trainer, whichever replica that is.
    assert _by_kind(rendered)["Job"]["spec"]["template"]["spec"]["volumes"] == trainer["spec"]["volumes"]
    if launcher == "pytorchjob":
        assert_valid(child, pytorchjob_schema)
        spec = child["spec"]
        assert {name: replica["replicas"] for name, replica in spec["pytorchReplicaSpecs"].items()} == {
            "Worker": nodes
        }
        assert spec["elasticPolicy"] == {
            "minReplicas": 1,
            "maxReplicas": 4,
            "rdzvBackend": "c10d",
            "rdzvId": "demo",
            "maxRestarts": 2,
        }
        assert container["env"][-2:] == [
            {"name": "PET_NPROC_PER_NODE", "value": "2"},
            {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"},
        ]
    else:
        assert_valid(child, mpijob_schema)
        assert child["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == nodes
        command = _pods(child)["Launcher"]["spec"]["containers"][0]["command"]
        assert command[4:9] == ["horovodrun", "-np", str(2 * nodes), "--min-np", "2"]
        assert "--hostfile" not in command
        assert command[command.index("--host-discovery-script") + 1] == "/etc/mpi/discover_hosts.sh"


# The objects each Kubeflow operator names after its job (mpi-operator v2's controller: the
# hostfile ConfigMap `<job>-config`, the Launcher Job, the Workers' Service, the ssh Secret; the
# training operator: a Service per replica). One of ours under such a name makes the Kubeflow
# operator refuse to start the job ("not controlled by this MPIJob").
KUBEFLOW_OWN_NAMES = {
    "mpijob": ("-config", "-launcher", "-worker", "-ssh"),
    "pytorchjob": ("-master-0", "-worker-0", "-worker-1"),
}


@pytest.mark.parametrize("launcher", ["pytorchjob", "mpijob"])
def test_no_object_takes_a_name_the_kubeflow_operator_gives_its_own(launcher: str) -> None:
    changes = {"spec.launcher": launcher, "spec.prepare": {"enabled": True}}
    rendered = render(parse_job(_job(3, 2, "xeon-cpu", changes)))
    [child] = [obj for obj in rendered if component(obj) == "train"]
    theirs = {child["metadata"]["name"] + suffix for suffix in KUBEFLOW_OWN_NAMES[launcher]}
    assert not theirs & {obj["metadata"]["name"] for obj in rendered if obj is not child}


def test_no_rbac_is_rendered_and_the_pods_keep_their_namespaces_account_unless_named() -> None:
    default = render(parse_job(_job()))
    named = _by_kind(render(parse_job(_job(changes={"spec.pod": {"serviceAccountName": "team-a"}}))))

    assert [obj["kind"] for obj in default] == ["ConfigMap", "PyTorchJob"]
    assert all("serviceAccountName" not in pod["spec"] for pod in _pods(default[-1]).values())
    assert {pod["spec"]["serviceAccountName"] for pod in _pods(named["PyTorchJob"]).values()} == {"team-a"}


def test_the_config_map_tells_the_trainer_where_to_report_and_which_ca_to_trust() -> None:
    ca = "-----BEGIN CERTIFICATE-----\n"
    endpoint = ProgressEndpoint("https://bertjob-operator-progress.ops.svc:8443", ca)
    config_map = render(parse_job(_job()), endpoint)[0]

    assert config_map["data"][PROGRESS_URL_KEY] == (
        "https://bertjob-operator-progress.ops.svc:8443"
        "/apis/bertjob.dev/v1alpha1/namespaces/default/bertpretrainjobs/demo/status"
    )
    assert config_map["data"][PROGRESS_CA_KEY] == ca
    # Without an endpoint (bertjob render, an operator serving none) the trainer reports nothing.
    assert set(render(parse_job(_job()))[0]["data"]) == {JOB_FILE}


@pytest.mark.parametrize("launcher", ["pytorchjob", "mpijob"])
def test_the_prepare_job_runs_in_the_trainers_pod(launcher: str) -> None:
    changes = {
        "spec.launcher": launcher,
        "spec.prepare": {"enabled": True, "resources": {"requests": {"cpu": 32}}},
        "spec.runPolicy": {"backoffLimit": 4, "suspend": True},
        "spec.pod": {"nodeSelector": {"pool": "cpu"}, "env": [{"name": "A", "value": "1"}]},
        "spec.volumes": [
            {"name": "data", "mountPath": "/data", "source": {"persistentVolumeClaim": {"claimName": "d"}}}
        ],
    }
    objects = _by_kind(render(parse_job(_job(nodes=2, changes=changes))))

    job = objects["Job"]
    assert (job["spec"]["backoffLimit"], job["spec"]["suspend"]) == (4, True)
    pod = job["spec"]["template"]
    assert pod["metadata"]["labels"] == job_labels("demo", "prepare")
    trainer = _trainer_pods(objects[{"pytorchjob": "PyTorchJob", "mpijob": "MPIJob"}[launcher]])[0]
    for field in ("volumes", "nodeSelector", "securityContext", "serviceAccountName"):
        assert pod["spec"].get(field) == trainer["spec"].get(field)
    assert pod["spec"]["restartPolicy"] == "Never"
    [container] = pod["spec"]["containers"]
    assert container["command"] == [
        "python",
        "-m",
        "bertpretrain",
        "prepare",
        "--config",
        "/etc/bertjob/job.yaml",
    ]
    assert container["resources"] == {"requests": {"cpu": 32}}
    assert container["volumeMounts"] == trainer["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "A", "value": "1"} in container["env"]


def test_the_config_map_holds_the_job_after_defaults() -> None:
    job = parse_job(_job(nodes=3))

    config_map = render(job)[0]

    document = yaml.safe_load(config_map["data"]["job.yaml"])
    assert document == to_document(job.model_copy(update={"spec": with_defaults(job.spec)}))
    assert document["spec"]["phases"][0]["microBatchSize"] == 16  # 96 over 3 x 2 processes
    assert parse_job(document).spec.export.path == "/data/checkpoints/hf"


EVERYTHING = {
    "spec.pod": {
        "labels": {"team": "nlp", "example.com/cost-centre": "r-and-d"},
        "annotations": {"sidecar.istio.io/inject": "false", "example.com/note": "a: {b}"},
        "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "96Gi"}},
        "imagePullPolicy": "Always",
        "imagePullSecrets": ["registry"],
        "nodeSelector": {"pool": "a100"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
        "serviceAccountName": "trainer",
        "priorityClassName": "research",
        "schedulerName": "volcano",
        "securityContext": {"runAsUser": 1000, "fsGroup": 1000, "runAsNonRoot": True},
    },
    "spec.volumes": [
        {"name": "data", "mountPath": "/data", "source": {"persistentVolumeClaim": {"claimName": "bert"}}},
        {"name": "corpus", "mountPath": "/corpus", "readOnly": True},
    ],
    "spec.runPolicy": {
        "cleanPodPolicy": "Running",
        "ttlSecondsAfterFinished": 600,
        "activeDeadlineSeconds": 86400,
        "backoffLimit": 3,
        "suspend": True,
        "schedulingPolicy": {
            "minAvailable": 2,
            "queue": "q",
            "priorityClass": "p",
            "scheduleTimeoutSeconds": 60,
        },
    },
    "spec.queueName": "team-a",
    "spec.prepare": {"enabled": True, "resources": {"requests": {"cpu": "16"}}},
}


@pytest.mark.parametrize(
    ("name", "document"),
    [
        ("single-node", valid_job()),
        ("multi-node", _job(nodes=3, processes=2, accelerator="habana-hpu")),
        ("mpijob-single-node", _job(accelerator="xeon-cpu", changes={"spec.launcher": "mpijob"})),
        (
            "mpijob-multi-node",
            _job(nodes=2, changes={"spec.launcher": "mpijob", "spec.mpi": {"command": "horovodrun"}}),
        ),
        ("everything", _job(nodes=2, changes=EVERYTHING)),
        (
            "elastic",
            _job(
                nodes=2,
                changes={"spec.elastic": ELASTIC, "spec.distributed": {"gradientCompression": "bf16"}},
            ),
        ),
        ("trainjob-single-node", _job(changes={"spec.launcher": "trainjob"})),
        (
            "trainjob-multi-node",
            _job(
                nodes=3,
                accelerator="habana-hpu",
                changes={
                    "spec.launcher": "trainjob",
                    "spec.queueName": "team-a",
                    "spec.prepare": {"enabled": True},
                },
            ),
        ),
        (
            "trainjob-mpi",
            _job(
                nodes=2,
                accelerator="xeon-cpu",
                changes={
                    "spec.launcher": "trainjob",
                    "spec.trainJob": {"mlPolicy": "mpi"},
                    "spec.distributed": {"deepspeed": {"zeroStage": 1}},
                    "spec.pod": {
                        "env": [{"name": "OMP_NUM_THREADS", "value": "16"}],
                        "labels": {"team": "nlp"},
                        "annotations": {"sidecar.istio.io/inject": "false"},
                    },
                },
            ),
        ),
        (
            "mpijob-elastic",
            _job(
                nodes=2,
                accelerator="xeon-cpu",
                changes={
                    "spec.launcher": "mpijob",
                    "spec.mpi": {"command": "horovodrun"},
                    "spec.elastic": ELASTIC,
                },
            ),
        ),
    ],
)
def test_golden(name: str, document: dict[str, Any]) -> None:
    rendered = render(parse_job(document))
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("BERTJOB_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(_dump(rendered))
    golden = list(yaml.safe_load_all(path.read_text()))
    diff = "\n".join(
        difflib.unified_diff(
            _dump(golden).splitlines(), _dump(rendered).splitlines(), str(path), "rendered", lineterm=""
        )
    )
    assert rendered == golden, f"render() no longer matches {path}:\n{diff}"


def _master(child: dict[str, Any]) -> dict[str, Any]:
    return dict(child["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"])


def _container(child: dict[str, Any]) -> dict[str, Any]:
    return dict(_master(child)["containers"][0])


# (field set on the job, value, where it lands in the rendered PyTorchJob, what it is there)
PASS_THROUGH = [
    (
        "spec.pod.resources",
        {"requests": {"cpu": 4}},
        lambda c: _container(c)["resources"],
        {"requests": {"cpu": 4}, "limits": {"nvidia.com/gpu": 1}},
    ),
    (
        "spec.pod.resources",
        {"limits": {"nvidia.com/gpu": 2}},
        lambda c: _container(c)["resources"],
        {"limits": {"nvidia.com/gpu": 2}},
    ),
    ("spec.pod.imagePullPolicy", "Never", lambda c: _container(c)["imagePullPolicy"], "Never"),
    ("spec.pod.imagePullSecrets", ["s"], lambda c: _master(c)["imagePullSecrets"], [{"name": "s"}]),
    ("spec.pod.nodeSelector", {"k": "v"}, lambda c: _master(c)["nodeSelector"], {"k": "v"}),
    (
        "spec.pod.tolerations",
        [{"operator": "Exists"}],
        lambda c: _master(c)["tolerations"],
        [{"operator": "Exists"}],
    ),
    ("spec.pod.affinity", {"nodeAffinity": {}}, lambda c: _master(c)["affinity"], {"nodeAffinity": {}}),
    (
        "spec.pod.env",
        [{"name": "X", "value": "1"}],
        lambda c: _container(c)["env"][-1],
        {"name": "X", "value": "1"},
    ),
    ("spec.pod.serviceAccountName", "sa", lambda c: _master(c)["serviceAccountName"], "sa"),
    ("spec.pod.priorityClassName", "high", lambda c: _master(c)["priorityClassName"], "high"),
    ("spec.pod.schedulerName", "volcano", lambda c: _master(c)["schedulerName"], "volcano"),
    ("spec.pod.securityContext", {"fsGroup": 7}, lambda c: _master(c)["securityContext"], {"fsGroup": 7}),
    (
        "spec.volumes",
        [{"name": "data", "mountPath": "/data", "source": {"hostPath": {"path": "/d"}}}],
        lambda c: (_master(c)["volumes"][1], _container(c)["volumeMounts"][1]),
        ({"name": "data", "hostPath": {"path": "/d"}}, {"name": "data", "mountPath": "/data"}),
    ),
    (
        "spec.volumes",
        [{"name": "c", "mountPath": "/c", "readOnly": True}],
        lambda c: (_master(c)["volumes"][-1], _container(c)["volumeMounts"][-1]),
        ({"name": "c", "emptyDir": {}}, {"name": "c", "mountPath": "/c", "readOnly": True}),
    ),
    (
        "spec.runPolicy",
        {"cleanPodPolicy": "All", "schedulingPolicy": {"minAvailable": 1}},
        lambda c: c["spec"]["runPolicy"],
        {"cleanPodPolicy": "All", "suspend": False, "schedulingPolicy": {"minAvailable": 1}},
    ),
    (
        "spec.runPolicy",
        {"ttlSecondsAfterFinished": 5, "activeDeadlineSeconds": 6, "backoffLimit": 7},
        lambda c: c["spec"]["runPolicy"],
        {"ttlSecondsAfterFinished": 5, "activeDeadlineSeconds": 6, "backoffLimit": 7, "suspend": False},
    ),
    ("spec.queueName", "lq", lambda c: c["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "lq"),
]


@pytest.mark.parametrize(
    ("field", "value", "where", "expected"), PASS_THROUGH, ids=[p[0] for p in PASS_THROUGH]
)
def test_each_pass_through_field_lands_where_it_should(
    field: str, value: Any, where: Any, expected: Any
) -> None:
    parent, _, name = field.rpartition(".")
    changes = {parent: {name: value}} if parent == "spec.pod" else {field: value}
    child = render(parse_job(_job(processes=1, changes=changes)))[-1]

    assert where(child) == expected


def test_the_pod_security_context_is_restricted_unless_given() -> None:
    child = render(parse_job(_job()))[-1]

    assert _master(child)["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert _container(child)["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }


def test_the_mpijob_fields_and_commands() -> None:
    changes = {
        "spec.launcher": "mpijob",
        "spec.mpi": {"command": "horovodrun", "sshAuthMountPath": "/home/trainer/.ssh"},
    }
    child = render(parse_job(_job(nodes=2, processes=4, changes=changes)))[-1]

    spec = child["spec"]
    assert (spec["slotsPerWorker"], spec["sshAuthMountPath"]) == (4, "/home/trainer/.ssh")
    assert (spec["launcherCreationPolicy"], spec["mpiImplementation"]) == ("WaitForWorkersReady", "OpenMPI")
    pods = _pods(child)
    command = pods["Launcher"]["spec"]["containers"][0]["command"]
    assert command[4:9] == ["horovodrun", "-np", "8", "--hostfile", "/etc/mpi/hostfile"]
    assert "-x" not in command  # horovodrun forwards the whole environment itself
    worker = pods["Worker"]["spec"]["containers"][0]
    assert worker["command"] == [
        *["python", "-m", "bertpretrain.mpilaunch", "--worker", "--"],
        *["/usr/sbin/sshd", "-De", "-f", "/home/trainer/.sshd_config"],
    ]


HOSTILE = INJECTIONS


@pytest.mark.parametrize("launcher", ["pytorchjob", "mpijob"])
@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_come_out_verbatim(value: str, launcher: str) -> None:
    # Every field that takes any text: paths, the image, env values, a volume source's fields.
    shards = f"/data/{value}"  # on the data volume, as every path the job writes must be
    changes = {
        "spec.launcher": launcher,
        "spec.image": value,
        "spec.data.shards": shards,
        "spec.pod": {
            "env": [{"name": "HOSTILE", "value": value}],
            "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "spec.volumes": [
            {"name": "extra", "mountPath": f"/{value}", "source": {"configMap": {"name": value}}}
        ],
        "spec.mpi": {"sshAuthMountPath": f"/{value}/.ssh"},
        "spec.prepare": {"enabled": True},
    }
    rendered = render(parse_job(_job(nodes=2, changes=changes)))

    assert [component(obj) for obj in rendered] == [
        "config",
        "prepare",
        "train",
    ]
    config_map, child = rendered[0], rendered[-1]
    pods = [*_pods(child).values(), rendered[1]["spec"]["template"]]
    for pod in pods:
        [container] = pod["spec"]["containers"]
        assert container["image"] == value
        assert {"name": "HOSTILE", "value": value} in container["env"]
    for pod in [*_trainer_pods(child), rendered[1]["spec"]["template"]]:
        assert {"name": "extra", "configMap": {"name": value}} in pod["spec"]["volumes"]
        assert {"name": "extra", "mountPath": f"/{value}"} in pod["spec"]["containers"][0]["volumeMounts"]
    if launcher == "mpijob":
        assert child["spec"]["sshAuthMountPath"] == f"/{value}/.ssh"
        command = _pods(child)["Launcher"]["spec"]["containers"][0]["command"]
        assert command[command.index("HOSTILE") - 1] == "-x"
    job_file = yaml.safe_load(config_map["data"]["job.yaml"])
    assert (job_file["spec"]["image"], job_file["spec"]["data"]["shards"]) == (value, shards)
    assert child["metadata"]["name"] == "demo"


# Fields that name Kubernetes objects or labels, which the API server would refuse such text in.
NAMED = {
    "metadata.namespace": "metadata.namespace",
    "spec.queueName": "spec.queueName",
    "spec.pod.serviceAccountName": "spec.pod.serviceAccountName",
    "spec.pod.env": "spec.pod.env[0].name",
    "spec.pod.nodeSelector": "spec.pod.nodeSelector",
    "spec.pod.tolerations": "spec.pod.tolerations[0].key",
}


@pytest.mark.parametrize("field", NAMED)
@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_names_are_refused_naming_the_field(value: str, field: str) -> None:
    changes: dict[str, Any] = {
        "spec.pod.env": [{"name": value, "value": "1"}],
        "spec.pod.nodeSelector": {value: "v"},
        "spec.pod.tolerations": [{"key": value, "operator": "Exists"}],
    }
    value_of = changes.get(field, value)
    parent, _, name = field.rpartition(".")
    change = {parent: {name: value_of}} if parent == "spec.pod" else {field: value_of}
    with pytest.raises(SpecError) as refused:
        render(parse_job(_job(changes=change)))

    assert [path for path, _ in refused.value.problems] == [NAMED[field]]


def test_an_inconsistent_spec_is_refused_naming_the_field() -> None:
    with pytest.raises(SpecError) as refused:
        render(parse_job(_job(nodes=5)))

    assert [path for path, _ in refused.value.problems] == [
        "spec.phases[0].globalBatchSize",
        "spec.phases[1].globalBatchSize",
    ]


def _copy_of_kustomize(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    copy = tmp_path / "kustomize"
    shutil.copytree(kustomize_dir(), copy)
    monkeypatch.setenv(KUSTOMIZE_DIR_ENV, str(copy))
    return copy


def test_the_kustomize_tree_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = _copy_of_kustomize(tmp_path, monkeypatch) / "base" / "pytorchjob.yaml"
    base.write_text(base.read_text().replace("restartPolicy: ExitCode", "restartPolicy: OnFailure"))

    pytorchjob = render(parse_job(_job()))[-1]

    assert pytorchjob["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolicy"] == "OnFailure"


def test_a_base_that_moved_the_container_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = _copy_of_kustomize(tmp_path, monkeypatch) / "base" / "pytorchjob.yaml"
    base.write_text(base.read_text().replace("- name: pytorch", "- name: trainer"))

    with pytest.raises(RenderError, match="kustomize"):
        render(parse_job(_job()))


def test_without_kustomize_or_kubectl_render_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    cached_build.cache_clear()  # as in a new process: the builds are cached per process
    monkeypatch.setenv("PATH", "")

    with pytest.raises(RenderError, match="neither kustomize nor kubectl"):
        render(parse_job(_job()))


class _GoldenDumper(yaml.SafeDumper):
    """Multi-line strings (the job file) as literal blocks, so that golden diffs read well."""


def _literal_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_GoldenDumper.add_representer(str, _literal_str)


def _dump(objects: list[dict[str, Any]]) -> str:
    return yaml.dump_all(objects, Dumper=_GoldenDumper, sort_keys=False)


def test_a_fractional_quantity_renders_as_a_string_kubeflow_takes(
    pytorchjob_schema: dict[str, Any], mpijob_schema: dict[str, Any]
) -> None:
    # The Kubeflow CRDs take a quantity as an integer or a string: 0.5 would be refused there.
    resources = {"requests": {"cpu": 0.5, "memory": 2**30}, "limits": {"cpu": 1.5}}
    for launcher, schema in (("pytorchjob", pytorchjob_schema), ("mpijob", mpijob_schema)):
        changes = {"spec.launcher": launcher, "spec.pod": {"resources": resources}}
        child = render(parse_job(_job(nodes=2, processes=1, accelerator="xeon-cpu", changes=changes)))[-1]

        for pod in _trainer_pods(child):
            assert pod["spec"]["containers"][0]["resources"] == {
                "requests": {"cpu": "0.5", "memory": 2**30},
                "limits": {"cpu": "1.5"},
            }
        assert_valid(child, schema)
