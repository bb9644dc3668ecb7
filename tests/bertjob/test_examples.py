"""examples/*.yaml: every job file fits the CRD and the spec, and every cluster example renders, as
the operator would, into objects that Kubernetes and the Kubeflow operators accept.

The files are enumerated, so a new example is tested without being named here; only the local
demo (``make demo``), whose paths are relative to this machine, is not a cluster job. One cluster
example, the quickstart's first, must ask for nothing a small cluster lacks; its pod trains it on
the real node in tests/node/test_training.py.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any, get_args

import kubernetes_validate
import pytest
import yaml

from bertjob.launchers import registry
from bertjob.render import component, kustomize_build, render
from bertjob_api.jobfile import load_job
from bertjob_api.kubenames import parse_quantity
from bertjob_api.spec import Accelerator, BertPretrainJob, LauncherName, SpecError, parse_job
from bertjob_api.validation import cluster_job
from bertjob_testing.jobs import EXAMPLES, REPO
from tests.k8s_schema import assert_valid

KUBERNETES_VERSION = "1.33"
# Run by `bertjob run` on this machine, not by the operator.
LOCAL_ONLY = {"bert-tiny-local.yaml"}
ALL = sorted(path.name for path in EXAMPLES.glob("*.yaml"))
CLUSTER = [name for name in ALL if name not in LOCAL_ONLY]
STORAGE = EXAMPLES / "storage"
# The job any cluster accepts: a laptop's kind or minikube node, a default StorageClass.
SMALL = "bert-tiny-cluster.yaml"
SMALL_NODE = {"cpu": 2, "memory": 4 * 2**30}  # what one pod may ask of such a node
SMALL_CLAIM = 10 * 2**30  # bytes
# Volume sources every cluster serves (no hostPath, NFS server or cloud disk named in the job); the
# projected one is the service-account token of progress reports (Kubernetes 1.20 and later).
PORTABLE_VOLUMES = {"persistentVolumeClaim", "emptyDir", "configMap", "projected"}
DEVICES = {"nvidia-gpu": "nvidia.com/gpu", "habana-hpu": "habana.ai/gaudi", "xeon-cpu": None}
# The trainer image's tag suffix for each accelerator (trainer_image/Dockerfile's targets).
IMAGE_TARGETS = {"nvidia-gpu": "cuda", "habana-hpu": "gaudi", "xeon-cpu": "xeon"}


def _document(name: str) -> dict[str, Any]:
    document = yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


def _replicas(child: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The child's replicas by role; a TrainJob's ``node`` pods as one replica of ``numNodes``."""
    spec = child["spec"]
    if child["kind"] == "TrainJob":
        template = registry.get("trainjob").trainer_template(child)
        return {"Node": {"replicas": spec["trainer"]["numNodes"], "template": template}}
    return dict(spec.get("pytorchReplicaSpecs") or spec["mpiReplicaSpecs"])


def _claims() -> dict[str, dict[str, Any]]:
    """The PersistentVolumeClaims of examples/storage, by name, as `kubectl kustomize` builds them."""
    objects = [obj for obj in yaml.safe_load_all(kustomize_build(STORAGE)) if obj]
    return {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == "PersistentVolumeClaim"}


def _multi_node(job: BertPretrainJob) -> bool:
    spec = job.spec
    return spec.topology.nodes > 1 or (spec.elastic is not None and spec.elastic.max_nodes > 1)


def test_the_examples_are_found() -> None:
    assert CLUSTER, "no cluster example found under examples/"
    assert set(ALL) >= LOCAL_ONLY, "an exempted example no longer exists"


@pytest.mark.parametrize("name", ALL)
def test_every_example_fits_the_crd_schema_and_the_spec(name: str, bertjob_schema: dict[str, Any]) -> None:
    assert_valid(_document(name), bertjob_schema)
    assert load_job(EXAMPLES / name).kind == "BertPretrainJob"


@pytest.mark.parametrize("name", sorted(LOCAL_ONLY))
def test_a_local_only_example_is_refused_as_a_cluster_job(name: str) -> None:
    # The exemption must not hide a cluster example: the operator would refuse this one.
    with pytest.raises(SpecError, match="absolute path in the container"):
        cluster_job(load_job(EXAMPLES / name))


@pytest.mark.parametrize("name", CLUSTER)
def test_every_cluster_example_renders_into_objects_the_cluster_accepts(
    name: str,
    pytorchjob_schema: dict[str, Any],
    mpijob_schema: dict[str, Any],
    trainjob_schema: dict[str, Any],
) -> None:
    job = load_job(EXAMPLES / name)
    spec = job.spec

    rendered = render(job)  # with the operator's defaults and every cluster check

    child = rendered[-1]
    assert component(child) == "train"
    for obj in rendered[:-1]:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    schemas = {"pytorchjob": pytorchjob_schema, "mpijob": mpijob_schema, "trainjob": trainjob_schema}
    assert_valid(child, schemas[spec.launcher])
    replicas = _replicas(child)
    for role, replica in replicas.items():
        template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": role.lower()}}
        kubernetes_validate.validate(
            {**template, "template": replica["template"]}, KUBERNETES_VERSION, strict=True
        )
    trainers = {role: replica for role, replica in replicas.items() if role != "Launcher"}
    assert sum(replica["replicas"] for replica in trainers.values()) == spec.topology.nodes
    if spec.launcher == "pytorchjob":
        assert child["spec"]["nprocPerNode"] == str(spec.topology.processes_per_node)
    elif spec.launcher == "trainjob":
        assert child["spec"]["trainer"]["numProcPerNode"] == spec.topology.processes_per_node
    else:
        assert child["spec"]["slotsPerWorker"] == spec.topology.processes_per_node
    claims = {
        volume.source["persistentVolumeClaim"]["claimName"]
        for volume in spec.volumes
        if "persistentVolumeClaim" in volume.source
    }
    for replica in trainers.values():
        pod = replica["template"]["spec"]
        [container] = pod["containers"]
        device = DEVICES[spec.accelerator]
        if device is not None:
            assert container["resources"]["limits"][device] == spec.topology.processes_per_node
        mounted = {
            v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v
        }
        assert mounted == claims


@pytest.mark.parametrize(
    "name", [name for name in CLUSTER if load_job(EXAMPLES / name).spec.launcher == "pytorchjob"]
)
def test_a_pytorchjob_example_moves_to_trainer_v2_by_its_launcher_field_alone(name: str) -> None:
    """Moving to Kubeflow Trainer v2 is one field: the same job with launcher trainjob renders, and its
    node pods run the PyTorchJob's torchrun command in the PyTorchJob's pod."""
    document = _document(name)
    pytorchjob = render(load_job(EXAMPLES / name))[-1]
    document["spec"]["launcher"] = "trainjob"

    trainjob = render(parse_job(document))[-1]

    node = registry.get("trainjob").trainer_template(trainjob)
    [master] = pytorchjob["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    [container] = node["spec"]["containers"]
    assert container["command"] == master["command"]
    assert container["resources"] == master["resources"]
    assert (
        node["spec"]["volumes"]
        == pytorchjob["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["volumes"]
    )


def test_the_examples_cover_every_accelerator_launcher_and_topology() -> None:
    jobs = [load_job(EXAMPLES / name).spec for name in CLUSTER]

    assert {spec.accelerator for spec in jobs} == set(get_args(Accelerator))
    assert {spec.launcher for spec in jobs} == set(get_args(LauncherName))
    assert {spec.topology.nodes > 1 for spec in jobs} == {False, True}, "single-node and multi-node"
    gpu = [spec for spec in jobs if spec.accelerator == "nvidia-gpu" and spec.launcher == "pytorchjob"]
    assert {spec.topology.nodes > 1 for spec in gpu} == {False, True}, (
        "GPU PyTorchJobs on one and on several nodes"
    )


@pytest.mark.parametrize("name", CLUSTER)
def test_a_cluster_example_runs_its_accelerators_trainer_image(name: str) -> None:
    spec = load_job(EXAMPLES / name).spec
    version = importlib.metadata.version("bertjob")

    assert spec.image == f"ghcr.io/bertjob/trainer:{version}-{IMAGE_TARGETS[spec.accelerator]}"


@pytest.mark.parametrize("name", CLUSTER)
def test_a_cluster_examples_claims_are_in_examples_storage_and_shared_when_multi_node(name: str) -> None:
    job = cluster_job(load_job(EXAMPLES / name))
    claims = _claims()

    outputs = [job.spec.data.shards, job.spec.checkpoint.path, job.spec.export.path, job.spec.logging.path]
    for volume in job.spec.volumes:
        source = volume.source.get("persistentVolumeClaim")
        if source is None:
            continue
        claim = claims.get(source["claimName"])
        assert claim is not None, f"{name}: claim {source['claimName']} is not in examples/storage"
        writes_here = any(
            path is not None and PurePosixPath(path).is_relative_to(volume.mount_path) for path in outputs
        )
        if _multi_node(job) and (writes_here or volume.name == "data"):
            assert "ReadWriteMany" in claim["spec"]["accessModes"], (
                f"{name}: every node mounts {volume.name}, whose claim must be ReadWriteMany"
            )


def test_the_storage_claims_are_valid_kubernetes_objects() -> None:
    claims = _claims()

    assert claims
    for claim in claims.values():
        kubernetes_validate.validate(claim, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("name", ALL)
def test_every_example_says_what_it_is_and_how_to_run_it(name: str) -> None:
    text = (EXAMPLES / name).read_text(encoding="utf-8")
    header = text[: text.index("apiVersion:")]
    job = load_job(EXAMPLES / name)

    assert header.startswith("# ") and all(line.startswith("#") for line in header.splitlines())
    assert len(header.splitlines()) >= 3, "say what the job is, then how to run it"
    if name in LOCAL_ONLY:
        assert f"bertjob run examples/{name}" in header
        return
    assert f"bertjob validate examples/{name}" in header
    assert f"kubectl apply -f examples/{name}" in header
    # The pod (or Job) whose log follows training, under the names the Kubeflow operators give.
    if job.spec.launcher == "mpijob":
        assert f"kubectl logs -f job/{job.metadata.name}-launcher" in header
    elif job.spec.launcher == "trainjob":
        # JobSet's Job <jobset>-<replicated job>-<index>: the first node's, or the MPI launcher's.
        replicated = "node" if job.spec.train_job.ml_policy == "torch" else "launcher"
        assert f"kubectl logs -f job/{job.metadata.name}-{replicated}-0" in header
    else:
        role = "worker" if job.spec.elastic is not None else "master"
        assert f"kubectl logs -f {job.metadata.name}-{role}-0" in header


def test_the_tensorboard_pod_sees_every_examples_logs_and_exports() -> None:
    pod = yaml.safe_load((EXAMPLES / "tools" / "tensorboard.yaml").read_text(encoding="utf-8"))
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    [container] = pod["spec"]["containers"]
    logdir = PurePosixPath(container["command"][container["command"].index("--logdir") + 1])
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    claims = {
        volume["persistentVolumeClaim"]["claimName"]: mounts[volume["name"]]
        for volume in pod["spec"]["volumes"]
        if "persistentVolumeClaim" in volume
    }
    assert set(claims) <= set(_claims()), "the pod mounts a claim examples/storage does not make"

    seen = 0
    for name in CLUSTER:
        spec = cluster_job(load_job(EXAMPLES / name)).spec
        for volume in spec.volumes:
            claim = volume.source.get("persistentVolumeClaim", {}).get("claimName")
            if claim not in claims or volume.mount_path != claims[claim]:
                continue
            seen += 1
            assert spec.logging.path is not None and spec.export.path is not None
            assert PurePosixPath(spec.logging.path).is_relative_to(logdir), (
                f"{name}: TensorBoard misses its logs"
            )
            assert PurePosixPath(spec.export.path).is_relative_to(volume.mount_path), name
    assert seen, "no example writes to the claim the TensorBoard pod mounts"
    assert container["image"].startswith("ghcr.io/bertjob/trainer:"), (
        "TensorBoard comes with the trainer image"
    )


def test_every_example_the_readme_names_exists() -> None:
    readme = (EXAMPLES.parent / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"examples/[\w./-]*[\w/]", readme))

    assert named
    missing = sorted(path for path in named if not (EXAMPLES.parent / path).exists())
    assert missing == [], "README.md names files that are not in the repository"


def _quantity(amount: int | str) -> float:
    value, problem = parse_quantity(amount)
    assert value is not None, problem
    return float(value)


def test_the_small_example_asks_for_nothing_a_small_cluster_lacks() -> None:
    job = load_job(EXAMPLES / SMALL)
    spec = cluster_job(job).spec
    [child] = [obj for obj in render(job) if component(obj) in {"train", "prepare"}]

    replicas = _replicas(child)
    assert sum(int(replica.get("replicas", 1)) for replica in replicas.values()) == 1, "one pod"
    [replica] = replicas.values()
    pod = replica["template"]["spec"]
    [container] = pod["containers"]
    for kind in ("requests", "limits"):
        for name, amount in container["resources"].get(kind, {}).items():
            assert name in SMALL_NODE, f"{kind}: {name} is a resource a small cluster's node may lack"
            assert _quantity(amount) <= SMALL_NODE[name], f"{kind}: {name} {amount} is more than a small node"
    assert not {"nodeSelector", "tolerations", "affinity"} & set(pod), "a small cluster may have no such node"
    assert all(source.path.startswith("builtin:") for source in spec.data.sources), "a corpus to upload"
    claims = _claims()
    for volume in pod["volumes"]:
        [source] = set(volume) - {"name"}
        assert source in PORTABLE_VOLUMES, f"volume {volume['name']}: {source}"
        if source != "persistentVolumeClaim":
            continue
        claim = claims[volume[source]["claimName"]]["spec"]
        assert claim["accessModes"] == ["ReadWriteOnce"], "the access mode every StorageClass provides"
        assert "storageClassName" not in claim, "the cluster's default StorageClass"
        assert _quantity(claim["resources"]["requests"]["storage"]) <= SMALL_CLAIM


def test_the_data_shell_mounts_the_small_examples_claim_where_its_job_does() -> None:
    pod = yaml.safe_load((STORAGE / "data-shell.yaml").read_text(encoding="utf-8"))
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    spec = cluster_job(load_job(EXAMPLES / SMALL)).spec
    [container] = pod["spec"]["containers"]
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    shell = {
        volume["persistentVolumeClaim"]["claimName"]: mounts[volume["name"]]
        for volume in pod["spec"]["volumes"]
        if "persistentVolumeClaim" in volume
    }
    job = {
        volume.source["persistentVolumeClaim"]["claimName"]: volume.mount_path
        for volume in spec.volumes
        if "persistentVolumeClaim" in volume.source
    }

    assert shell == job, "the paths docs/data.md gives for the shell are not the job's"
    assert set(shell) <= set(_claims())
    # kubectl cp runs tar as the image's user: the trainer's, with the job's fsGroup.
    assert container["image"] == spec.image
    assert spec.pod.security_context is not None
    assert pod["spec"]["securityContext"]["fsGroup"] == spec.pod.security_context["fsGroup"]


def test_the_quickstart_checks_and_applies_the_small_example_first() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    quickstart = readme[readme.index("## Quickstart on a cluster") :]

    for command in (
        r"bertjob validate \S+",
        r"bertjob render \S+",
        r"kubectl apply -f examples/[a-z0-9-]+\.yaml",
    ):
        first = re.search(command, quickstart)
        assert first is not None and first[0].endswith(f"examples/{SMALL}"), f"{command}: {first}"


def _fetch(container: dict[str, Any], url: str, path: Path) -> subprocess.CompletedProcess[str]:
    """The fetch Job's container command, run here with its URL and FILE replaced."""
    env = {**os.environ, "URL": url, "FILE": str(path)}
    command = [sys.executable, *container["command"][1:], *container["args"]]
    assert container["command"][0] == "python"
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_the_fetch_job_fills_the_claim_the_xeon_job_reads_with_whole_files_only(tmp_path: Path) -> None:
    job = yaml.safe_load((STORAGE / "fetch-wikipedia.yaml").read_text(encoding="utf-8"))
    kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    claims = {
        volume["persistentVolumeClaim"]["claimName"]: mounts[volume["name"]]
        for volume in pod["volumes"]
        if "persistentVolumeClaim" in volume
    }
    target = PurePosixPath({var["name"]: var["value"] for var in container["env"]}["FILE"])
    assert set(claims) <= set(_claims())
    readers = [
        name
        for name in CLUSTER
        for volume in load_job(EXAMPLES / name).spec.volumes
        if volume.source.get("persistentVolumeClaim", {}).get("claimName") in claims
        and claims[volume.source["persistentVolumeClaim"]["claimName"]] == volume.mount_path
        and any(source.path == str(target) for source in load_job(EXAMPLES / name).spec.data.sources)
    ]
    assert readers, f"no example reads {target} from the claim the Job fills"

    dump = tmp_path / "dump.xml.bz2"
    dump.write_bytes(os.urandom(3 << 20))
    path = tmp_path / "corpus" / "enwiki.xml.bz2"
    first = _fetch(container, dump.as_uri(), path)
    assert first.returncode == 0, first.stderr
    assert path.read_bytes() == dump.read_bytes()
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name], "a partial file was left"
    dump.write_bytes(b"another dump")
    again = _fetch(container, dump.as_uri(), path)
    assert again.returncode == 0 and "is there already" in again.stdout, again.stderr
    assert path.stat().st_size == 3 << 20, "a file already there was fetched again"
    missing = _fetch(container, (tmp_path / "nothing").as_uri(), tmp_path / "corpus" / "other.bz2")
    assert missing.returncode != 0 and not (tmp_path / "corpus" / "other.bz2").exists()
