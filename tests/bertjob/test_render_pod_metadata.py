"""spec.pod.labels and spec.pod.annotations on every pod a job renders: each launcher's replicas
(PyTorchJob Master and Workers, MPIJob Launcher and Workers, a TrainJob's ``node`` and MPI
``launcher`` pods through its runtime patch) and the data-preparation Job's pod, beside the
operator's own labels, which they cannot replace. Istio's sidecar opt-out
(``sidecar.istio.io/inject: "false"``, docs/operator.md "Kubeflow") is one of the annotations.
The goldens of tests/bertjob/test_render.py (everything, trainjob-mpi) show the same in full."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from bertjob.render import JOB_LABEL, job_labels, render
from bertjob_api.contract import RUNTIME_PATCH_MANAGER
from bertjob_api.spec import parse_job
from bertjob_api.spec.cluster import reserved_pod_label
from bertjob_testing.jobs import valid_job, with_value
from tests.k8s_schema import assert_valid

KUBERNETES_VERSION = "1.33"
LABELS = {"team": "nlp", "example.com/cost-centre": "r-and-d", "empty": ""}
ANNOTATIONS = {
    "sidecar.istio.io/inject": "false",
    # A value that YAML or a template would read otherwise: it must come out as written.
    "example.com/note": "{{ .x }}: [1]\n# not a comment",
}
SCHEMAS = {"PyTorchJob": "pytorchjob_schema", "MPIJob": "mpijob_schema", "TrainJob": "trainjob_schema"}

# (id, spec fields, the pod templates rendered besides the data Job's: (kind, replica)).
CASES: list[tuple[str, dict[str, Any], set[tuple[str, str]]]] = [
    ("pytorchjob-one-node", {}, {("PyTorchJob", "Master")}),
    (
        "pytorchjob-three-nodes",
        {"spec.topology.nodes": 3},
        {("PyTorchJob", "Master"), ("PyTorchJob", "Worker")},
    ),
    (
        "pytorchjob-elastic",
        {"spec.topology.nodes": 2, "spec.elastic": {"minNodes": 1, "maxNodes": 3}},
        {("PyTorchJob", "Worker")},
    ),
    (
        "mpijob",
        {"spec.launcher": "mpijob", "spec.topology.nodes": 2, "spec.accelerator": "xeon-cpu"},
        {("MPIJob", "Launcher"), ("MPIJob", "Worker")},
    ),
    ("trainjob-torch", {"spec.launcher": "trainjob", "spec.topology.nodes": 2}, {("TrainJob", "node")}),
    (
        "trainjob-mpi",
        {
            "spec.launcher": "trainjob",
            "spec.trainJob": {"mlPolicy": "mpi"},
            "spec.topology.nodes": 2,
            "spec.accelerator": "xeon-cpu",
        },
        {("TrainJob", "node"), ("TrainJob", "launcher")},
    ),
]


def _document(changes: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    document = valid_job()
    for field, value in {
        "spec.prepare": {"enabled": True},
        "spec.pod": pod,
        "spec.phases.0.globalBatchSize": 48,
        "spec.phases.1.globalBatchSize": 48,
        **changes,
    }.items():
        document = with_value(document, field, value)
    return document


def pod_templates(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Every pod template of the rendered ``objects`` by (kind, replica): a Kubeflow job's replicas,
    the replicated jobs of a TrainJob's operator-managed runtime patch, a Job's template."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for obj in objects:
        kind, spec = obj["kind"], obj.get("spec", {})
        if kind in ("PyTorchJob", "MPIJob"):
            replicas = spec.get("pytorchReplicaSpecs") or spec["mpiReplicaSpecs"]
            found |= {(kind, name): replica["template"] for name, replica in replicas.items()}
        elif kind == "TrainJob":
            [patch] = [entry for entry in spec["runtimePatches"] if entry["manager"] == RUNTIME_PATCH_MANAGER]
            for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
                found[(kind, job["name"])] = job["template"]["spec"]["template"]
        elif kind == "Job":
            found[(kind, obj["metadata"]["name"])] = spec["template"]
    return found


@pytest.mark.parametrize(
    ("changes", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_every_pod_gets_the_labels_and_annotations_beside_the_operators(
    changes: dict[str, Any], expected: set[tuple[str, str]], request: pytest.FixtureRequest
) -> None:
    objects = render(parse_job(_document(changes, {"labels": LABELS, "annotations": ANNOTATIONS})))

    pods = pod_templates(objects)
    assert set(pods) == {*expected, ("Job", "demo-prepare")}
    for (kind, name), pod in pods.items():
        metadata = pod["metadata"]
        own = job_labels("demo", "prepare" if kind == "Job" else "train")
        # The data Job's pod takes its labels from bertjob.render._prepare_job, not the launcher.
        user = {} if kind == "Job" else LABELS
        assert metadata["labels"] == {**metadata["labels"], **user, **own}, (kind, name)
        assert metadata["annotations"] == ANNOTATIONS, (kind, name)
    for obj in objects:
        if obj["kind"] in SCHEMAS:
            assert_valid(obj, request.getfixturevalue(SCHEMAS[obj["kind"]]))
        elif obj["kind"] == "Job":
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("changes", [case[1] for case in CASES], ids=[case[0] for case in CASES])
def test_without_them_the_pods_carry_only_reserved_labels_and_no_annotations(changes: dict[str, Any]) -> None:
    # Every label key the operator, the kustomize base and the launchers put on a pod is one that
    # spec.pod.labels may not set: a new one must join the reserved set.
    pods = pod_templates(render(parse_job(_document(changes, {}))))

    for where, pod in pods.items():
        assert JOB_LABEL in pod["metadata"]["labels"], where
        assert [key for key in pod["metadata"]["labels"] if not reserved_pod_label(key)] == [], where
        assert "annotations" not in pod["metadata"], where


def test_the_objects_themselves_keep_their_own_labels() -> None:
    # Pods only: the ConfigMap, the Job and the child are the operator's objects, found by its labels.
    objects = render(parse_job(_document({}, {"labels": LABELS, "annotations": ANNOTATIONS})))

    for obj in objects:
        assert not LABELS.keys() & obj["metadata"]["labels"].keys(), obj["kind"]
        assert not ANNOTATIONS.keys() & obj["metadata"].get("annotations", {}).keys(), obj["kind"]
