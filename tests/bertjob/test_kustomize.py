"""kustomize/ by hand: every overlay x launcher component x accelerator component builds with
`kubectl kustomize`, as a GitOps user's kustomization would use them, and fits the upstream schema."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bertjob.launchers import mpijob, registry
from bertjob.render import kustomize_build, render
from bertjob_api.contract import (
    DATA_VOLUME,
    JOB_CONFIG_VOLUME,
    MPIRUN_MCA_ENV,
    NAME_ENV,
    NAMESPACE_ENV,
    PROGRESS_TOKEN_VOLUME,
    SHM_VOLUME,
    TMP_VOLUME,
)
from bertjob_api.spec import parse_job
from bertjob_testing.jobs import REPO
from tests.bertjob.test_render import _job
from tests.k8s_schema import assert_valid

KUSTOMIZE = REPO / "kustomize"
EXAMPLES = REPO / "examples"
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
            PROGRESS_TOKEN_VOLUME,
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
        # Open MPI's own variables are for mpirun (which passes OMPI_* on to the ranks itself).
        env = {var["name"] for var in container["env"] if not var["name"].startswith("OMPI_MCA_")}
        assert env <= forwarded, "ranks must get the Launcher's env"
        mca = {var["name"]: var["value"] for var in container["env"] if var["name"].startswith("OMPI_MCA_")}
        assert mca == MPIRUN_MCA_ENV.get(accelerator, {})
        assert command == _by_hand_launcher_command(accelerator)
    for spec in replicas.values():
        [container] = spec["template"]["spec"]["containers"]
        names = [var["name"] for var in container["env"]]
        assert names[:2] == [NAME_ENV, NAMESPACE_ENV], "the base pod's variables stay first, in order"


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
    pod = registry.get("trainjob").trainer_template(job)
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
        PROGRESS_TOKEN_VOLUME,
    ]
    template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": pod}
    kubernetes_validate.validate(template, "1.33", strict=True)


def _by_hand_launcher_command(accelerator: str) -> list[str]:
    """The by-hand Launcher's mpirun line: the operator's, less -np (mpirun starts one process per
    slot of the hostfile), forwarding the job's variables and the accelerator's."""
    accelerators: dict[str, list[str]] = dict(mpijob.ACCELERATOR_ENV)
    names = [*mpijob.FORWARDED_ENV, *accelerators.get(accelerator, [])]
    forwarded = [arg for name in names for arg in ("-x", name)]
    return [
        *mpijob.LAUNCHER_WRAPPER,
        "mpirun",
        "--hostfile",
        mpijob.HOSTFILE,
        *forwarded,
        *mpijob.RANK_COMMAND,
    ]


def test_the_by_hand_mpijob_runs_the_launchers_trainer_command(tmp_path: Path) -> None:
    [job] = _build_by_hand(tmp_path, "multi-node", "mpijob", "nvidia-gpu")

    command = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    forwarded = [arg for pair in zip(["-x"] * 2, mpijob.FORWARDED_ENV, strict=True) for arg in pair]
    assert command == [
        *mpijob.LAUNCHER_WRAPPER,
        "mpirun",
        "--hostfile",
        mpijob.HOSTFILE,
        *forwarded,
        *mpijob.RANK_COMMAND,
    ]


def _json_patch_paths(value: Any) -> Iterator[str]:
    """The ``path`` and ``from`` of every JSON-patch operation in ``value`` (a kustomization, or a
    patch file's documents): the operations of ``patches`` and ``patchesJson6902`` entries, inline
    (``patch``, YAML or JSON) or in a file (``path``)."""
    if isinstance(value, list):
        for item in value:
            yield from _json_patch_paths(item)
    elif isinstance(value, dict):
        if "op" in value and "path" in value:
            yield from (str(value[key]) for key in ("path", "from") if key in value)
        for key, item in value.items():
            if key == "patch" and isinstance(item, str):
                yield from _json_patch_paths(yaml.safe_load(item))
            else:
                yield from _json_patch_paths(item)


def _numeric_json_patch_paths(root: Path) -> list[str]:
    """Every JSON-patch path under ``root`` with a numeric segment (a list entry by position)."""
    found = []
    for path in sorted([*root.rglob("*.yaml"), *root.rglob("*.yml")]):
        for document in yaml.safe_load_all(path.read_text()):
            for patch_path in _json_patch_paths(document):
                if any(segment.isdigit() for segment in patch_path.split("/")):
                    found.append(f"{path.relative_to(root)}: {patch_path}")
    return found


@pytest.mark.parametrize("root", [KUSTOMIZE, EXAMPLES], ids=lambda root: root.name)
def test_no_json_patch_in_the_kustomize_tree_finds_an_entry_by_position(root: Path) -> None:
    """Patches find containers, env and volumes by name (strategic merge, with the merge keys of
    components/kubeflow-schema), never as containers/0 or volumes/1: in the kustomize tree and in
    the examples built on it (gitops/kustomize-by-hand)."""
    assert _numeric_json_patch_paths(root) == []


def test_a_positional_json_patch_is_found(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "patches": [
                    {"target": {"kind": "MPIJob"}, "patch": patch}
                    for patch in (
                        "- {op: add, path: /spec/a/containers/0/x, value: 1}",
                        '[{"op": "move", "from": "/a/1", "path": "/b/-"}]',
                        "- {op: add, path: /spec/env/-, value: 1}",
                    )
                ]
            }
        )
    )
    assert _numeric_json_patch_paths(tmp_path) == [
        "kustomization.yaml: /spec/a/containers/0/x",
        "kustomization.yaml: /a/1",
    ]


def test_each_component_that_patches_a_kubeflow_pod_by_name_brings_the_merge_keys() -> None:
    """kustomize reads a schema only in the kustomization that names it and keeps it for the rest of
    the build, so a component without it would merge by name only after another that has it."""
    for directory in sorted((KUSTOMIZE / "components").iterdir()):
        kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
        patches = [entry["patch"] for entry in kustomization.get("patches", [])]
        by_name = [patch for patch in patches if not isinstance(yaml.safe_load(patch), list)]
        if by_name and directory.name != "kubeflow-schema":
            assert "../kubeflow-schema" in kustomization.get("components", []), directory.name


def test_without_the_merge_keys_a_patch_would_replace_the_containers(tmp_path: Path) -> None:
    """What components/kubeflow-schema is for: the same build with a schema that defines no kinds
    loses the base's container fields (kustomize replaces the whole list)."""
    tree = tmp_path / "kustomize"
    shutil.copytree(KUSTOMIZE, tree)
    schema = tree / "components" / "kubeflow-schema"
    document = yaml.safe_load((schema / "kustomization.yaml").read_text())
    (schema / "nothing.json").write_text('{"definitions": {}}')
    for build, openapi in (("with", document["openapi"]), ("without", {"path": "nothing.json"})):
        (schema / "kustomization.yaml").write_text(yaml.safe_dump({**document, "openapi": openapi}))
        out = tmp_path / build
        out.mkdir()
        kustomization = {
            "resources": [os.path.relpath(tree / "overlays" / "single-node", out)],
            "components": [
                os.path.relpath(tree / "components" / name, out) for name in ("mpijob", "xeon-cpu")
            ],
        }
        (out / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        [job] = [obj for obj in yaml.safe_load_all(kustomize_build(out)) if obj]
        [launcher] = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
        assert ("command" in launcher) == (build == "with"), launcher


@pytest.mark.parametrize("command", ["mpirun", "horovodrun"])
@pytest.mark.parametrize("accelerator", [name for name in DEVICES if name != "habana-hpu"])  # refused
def test_the_operators_launcher_has_the_contracts_mca_variables(command: str, accelerator: str) -> None:
    """mpirun's placement reaches the operator's Launcher as the same OMPI_MCA_* variables as the
    kustomize tree's, from bertjob_api.contract.MPIRUN_MCA_ENV, and never as options on its line;
    horovodrun (which passes mpirun its own) has none."""
    changes = {"spec.launcher": "mpijob", "spec.mpi": {"command": command}}
    child = render(parse_job(_job(nodes=2, accelerator=accelerator, changes=changes)))[-1]
    [container] = child["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    mca = {var["name"]: var["value"] for var in container["env"] if var["name"].startswith("OMPI_MCA_")}
    assert mca == (MPIRUN_MCA_ENV.get(accelerator, {}) if command == "mpirun" else {})
    assert not {"--map-by", "--bind-to"} & set(container["command"])


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
