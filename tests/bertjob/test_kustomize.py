"""kustomize/ by hand: every overlay x launcher component x accelerator component builds with
`kubectl kustomize`, as a GitOps user's kustomization would use them, and fits the upstream schema."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bertjob import launchers
from bertjob.launchers import mpijob
from bertjob.render import kustomize_build
from bertjob_api.contract import (
    DATA_VOLUME,
    JOB_CONFIG_VOLUME,
    NAME_ENV,
    NAMESPACE_ENV,
    SHM_VOLUME,
    TMP_VOLUME,
)
from bertjob_api.spec import parse_job
from bertjob_testing.jobs import REPO
from tests.k8s_schema import assert_valid

KUSTOMIZE = REPO / "kustomize"
DEVICES = {"nvidia-gpu": "nvidia.com/gpu", "habana-hpu": "habana.ai/gaudi", "xeon-cpu": None}
REPLICAS = {
    ("pytorchjob", "single-node"): {"Master": 1},
    ("pytorchjob", "multi-node"): {"Master": 1, "Worker": 1},
    ("mpijob", "single-node"): {"Launcher": 1, "Worker": 1},
    ("mpijob", "multi-node"): {"Launcher": 1, "Worker": 2},
}


def _build_by_hand(tmp_path: Path, overlay: str, *components: str) -> list[dict[str, Any]]:
    """What `kubectl kustomize` makes of a user's kustomization selecting these directories."""
    document = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(KUSTOMIZE / "overlays" / overlay, tmp_path)],
        "components": [os.path.relpath(KUSTOMIZE / "components" / name, tmp_path) for name in components],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(document))
    return [obj for obj in yaml.safe_load_all(kustomize_build(tmp_path)) if obj]


def _replicas(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = job["spec"]
    return dict(spec.get("pytorchReplicaSpecs") or spec["mpiReplicaSpecs"])


@pytest.mark.parametrize("accelerator", DEVICES)
@pytest.mark.parametrize("launcher", ["pytorchjob", "mpijob"])
@pytest.mark.parametrize("overlay", ["single-node", "multi-node"])
def test_every_combination_builds_by_hand(
    tmp_path: Path,
    overlay: str,
    launcher: str,
    accelerator: str,
    pytorchjob_schema: dict[str, Any],
    mpijob_schema: dict[str, Any],
) -> None:
    [job] = _build_by_hand(tmp_path, overlay, launcher, accelerator)

    assert job["kind"] == {"pytorchjob": "PyTorchJob", "mpijob": "MPIJob"}[launcher]
    assert "config.kubernetes.io/local-config" not in job["metadata"].get("annotations", {})
    replicas = _replicas(job)
    assert {name: spec["replicas"] for name, spec in replicas.items()} == REPLICAS[(launcher, overlay)]
    trainers = {name: spec for name, spec in replicas.items() if name != "Launcher"}
    device = DEVICES[accelerator]
    for spec in trainers.values():
        pod = spec["template"]["spec"]
        [container] = pod["containers"]
        limits = container.get("resources", {}).get("limits", {})
        assert limits == ({device: 1} if device else {})
        assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }
        assert [volume["name"] for volume in pod["volumes"]] == [
            JOB_CONFIG_VOLUME,
            DATA_VOLUME,
            SHM_VOLUME,
            TMP_VOLUME,
        ]
        env = {var["name"] for var in container["env"]}
        assert {NAME_ENV, NAMESPACE_ENV} <= env
        kubernetes_validate.validate(
            {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": "t"},
                "template": spec["template"],
            },
            "1.33",
            strict=True,
        )
    if launcher == "pytorchjob":
        assert all(spec == replicas["Master"] for spec in replicas.values()), "replicas must run the same pod"
        assert {spec["restartPolicy"] for spec in replicas.values()} == {"ExitCode"}
        assert_valid(job, pytorchjob_schema)
    else:
        assert_valid(job, mpijob_schema)
        launcher_pod = replicas["Launcher"]["template"]["spec"]
        [container] = launcher_pod["containers"]
        command = container["command"]
        assert "args" not in container
        forwarded = {command[i + 1] for i, arg in enumerate(command) if arg == "-x"}
        assert {var["name"] for var in container["env"]} <= forwarded, "ranks must get the Launcher's env"


@pytest.mark.parametrize("accelerator", DEVICES)
@pytest.mark.parametrize("overlay", ["single-node", "multi-node"])
def test_every_trainjob_combination_builds_by_hand(
    tmp_path: Path, overlay: str, accelerator: str, trainjob_schema: dict[str, Any]
) -> None:
    """By hand, components/trainjob is a TrainJob on the chart's torch runtime whose node pods are
    the base's trainer pod (the operator's own patch aside)."""
    [job] = _build_by_hand(tmp_path, overlay, "trainjob", accelerator)

    assert job["kind"] == "TrainJob"
    assert "config.kubernetes.io/local-config" not in job["metadata"].get("annotations", {})
    assert_valid(job, trainjob_schema)
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] == (1 if overlay == "single-node" else 2)
    assert trainer["numProcPerNode"] == (2 if accelerator == "xeon-cpu" else 1)
    device = DEVICES[accelerator]
    assert trainer.get("resourcesPerNode", {}).get("limits", {}) == ({device: 1} if device else {})
    assert {NAME_ENV, NAMESPACE_ENV} <= {var["name"] for var in trainer["env"]}
    pod = launchers.get("trainjob").trainer_template(job)
    assert pod["spec"]["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    [container] = pod["spec"]["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert [volume["name"] for volume in pod["spec"]["volumes"]] == [
        JOB_CONFIG_VOLUME,
        DATA_VOLUME,
        SHM_VOLUME,
        TMP_VOLUME,
    ]
    template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": pod}
    kubernetes_validate.validate(template, "1.33", strict=True)


def test_the_by_hand_mpijob_runs_the_launchers_trainer_command(tmp_path: Path) -> None:
    [job] = _build_by_hand(tmp_path, "multi-node", "mpijob", "nvidia-gpu")

    command = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    forwarded = [arg for pair in zip(["-x"] * 2, mpijob.FORWARDED_ENV, strict=True) for arg in pair]
    assert command == ["mpirun", "--hostfile", mpijob.HOSTFILE, *forwarded, *mpijob.TRAINER_COMMAND]


def test_the_kustomize_by_hand_example_builds(mpijob_schema: dict[str, Any]) -> None:
    directory = REPO / "examples" / "gitops" / "kustomize-by-hand"
    objects = [obj for obj in yaml.safe_load_all(kustomize_build(directory)) if obj]

    kinds = {obj["kind"]: obj for obj in objects}
    assert sorted(kinds) == ["ConfigMap", "MPIJob"]
    mpijob = kinds["MPIJob"]
    assert_valid(mpijob, mpijob_schema)
    job = parse_job(yaml.safe_load(kinds["ConfigMap"]["data"]["job.yaml"]))
    assert mpijob["metadata"]["name"] == job.metadata.name
    assert mpijob["spec"]["slotsPerWorker"] == job.spec.topology.processes_per_node
    assert mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == job.spec.topology.nodes
    images = {
        container["image"]
        for replica in mpijob["spec"]["mpiReplicaSpecs"].values()
        for container in replica["template"]["spec"]["containers"]
    }
    assert images == {job.spec.image}, "the pods must run the image the job file names"
    volumes = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["volumes"]
    [config_volume] = [volume for volume in volumes if volume["name"] == JOB_CONFIG_VOLUME]
    assert config_volume["configMap"]["name"] == kinds["ConfigMap"]["metadata"]["name"]
