"""The operator end to end: `kopf run` against kmock's Kubernetes emulator on 127.0.0.1.

The operator runs for real (the session's ``cluster`` fixture, :mod:`kube_emulator`); the test
talks to the same emulator through the kubernetes client, as `kubectl` would, and plays the part of
Kubeflow's operators by patching the children's status. Waits are bounded.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from kubernetes.client import CoreV1Api, CustomObjectsApi, V1ConfigMap

from bertjob.children import ForeignObjectError, create_children
from bertjob.render import render
from bertjob_api.spec import parse_job
from bertjob_testing.jobs import valid_job, with_value
from bertjob_testing.kube_emulator import Cluster, answers
from tests.bertjob.e2e import CHILD_RESOURCES, LAUNCHERS, children_of
from tests.k8s_schema import assert_valid
from tests.kubeflow_env import kubeflow_condition


def _named(document: dict[str, Any], name: str, launcher: str = "pytorchjob") -> dict[str, Any]:
    return with_value(with_value(document, "metadata.name", name), "spec.launcher", launcher)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_valid_job_gets_owned_children_and_a_status(
    cluster: Cluster, bertjob_schema: dict[str, Any], launcher: str
) -> None:
    name = f"demo-{launcher}"
    job = cluster.create_job(_named(valid_job(), name, launcher))

    status = cluster.status_when(name, "Pending")

    child_resource = CHILD_RESOURCES[launcher]
    group_version = child_resource.rsplit("/", 1)[0]
    [child_ref] = status["children"]
    assert (child_ref["apiVersion"], child_ref["name"]) == (group_version, name)
    assert status["configMap"] == f"{name}-job"
    assert status["observedGeneration"] == 1
    # Ready and Reconciling: kstatus' conditions (test_kstatus_e2e.py).
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [
        ("Created", "True"),
        ("Ready", "False"),
        ("Reconciling", "True"),
    ]
    assert_valid(status, bertjob_schema["properties"]["status"])
    owner = {
        "apiVersion": "bertjob.dev/v1alpha1",
        "kind": "BertPretrainJob",
        "name": name,
        "uid": job["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    children = children_of(cluster, name)
    assert {"v1/configmaps", child_resource} <= set(children)
    for resource, objects in children.items():
        for obj in objects:
            assert obj["metadata"]["ownerReferences"] == [owner], f"{resource} {obj['metadata']['name']}"
    [config_map] = children["v1/configmaps"]
    assert yaml.safe_load(config_map["data"]["job.yaml"])["spec"]["image"] == "ghcr.io/bertjob/trainer:0.1.0"
    [child] = children[child_resource]
    assert child["spec"]["runPolicy"]["suspend"] is False
    assert "ghcr.io/bertjob/trainer:0.1.0" in yaml.safe_dump(child)
    cluster.wait_for(
        "a Pending event",
        lambda: [e for e in cluster.events(name) if e["type"] == "Normal" and e["reason"] == "Pending"],
    )


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_the_childs_conditions_are_mirrored_into_the_job(cluster: Cluster, launcher: str) -> None:
    name = f"mirrored-{launcher}"
    cluster.create_job(_named(valid_job(), name, launcher))
    cluster.status_when(name, "Pending")
    resource = CHILD_RESOURCES[launcher]
    conditions = [kubeflow_condition("Created")]

    for type_, phase in (("Running", "Running"), ("Restarting", "Running"), ("Succeeded", "Succeeded")):
        conditions = [c for c in conditions if c["type"] != "Running"] + [
            kubeflow_condition("Running", "True" if type_ != "Succeeded" else "False"),
            kubeflow_condition(type_),
        ]
        cluster.report(resource, name, {"conditions": conditions})
        status = cluster.wait_for(
            f"{name} to mirror {type_}",
            lambda t=type_, p=phase: (
                (s := cluster.job(name)["status"])["phase"] == p
                and any(c["type"] == t for c in s["conditions"])
                and s
            ),
        )

    by_type = {c["type"]: c for c in status["conditions"]}
    assert set(by_type) == {"Created", "Running", "Restarting", "Succeeded", "Ready"}
    assert (by_type["Succeeded"]["reason"], by_type["Succeeded"]["message"]) == (
        "JobSucceeded",
        "the job is succeeded",
    )
    assert by_type["Running"]["status"] == "False"
    assert by_type["Succeeded"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert "completionTime" in status and "startTime" in status
    cluster.reasons_when(name, lambda reasons: {"Pending", "Running", "Succeeded"} <= set(reasons))


def test_a_failed_child_fails_the_job_with_a_warning(cluster: Cluster) -> None:
    cluster.create_job(_named(valid_job(), "child-fails"))
    cluster.status_when("child-fails", "Pending")

    cluster.report(
        CHILD_RESOURCES["pytorchjob"], "child-fails", {"conditions": [kubeflow_condition("Failed")]}
    )

    status = cluster.status_when("child-fails", "Failed")
    assert status["conditions"][-1]["reason"] == "JobFailed"
    cluster.wait_for(
        "a warning", lambda: [e for e in cluster.events("child-fails") if e["type"] == "Warning"]
    )


HUGE = "x" * 200_000


@pytest.mark.parametrize(
    ("name", "field", "value", "named"),
    [
        # Fits the schema, but 64 sequences cannot be split over 3 processes.
        ("indivisible", "spec.topology.processesPerNode", 3, "spec.phases[0].globalBatchSize"),
        ("phase-2-shorter", "spec.phases.1.maxSeqLength", 100, "spec.phases[1].maxSeqLength"),
        ("nowhere", "spec.checkpoint.path", "/ckpt", "spec.checkpoint.path"),
        # What a cluster without the CRD (or with schema validation off) would let through.
        ("mistyped", "spec.image", 5, "spec.image"),
        ("misspelt", "spec.phases.0.batchSize", 64, "spec.phases[0].batchSize"),
        ("not-a-mapping", "spec", "hello", "spec: Input should be a valid dictionary"),
        ("a-list", "spec", [1, 2], "spec: Input should be a valid dictionary"),
        ("huge-launcher", "spec.launcher", HUGE, "spec.launcher"),
        ("templated-launcher", "spec.launcher", "{{ 7 * 7 }}: {a: [b", "spec.launcher"),
        ("nested-wrong", "spec.runPolicy", {"suspend": "yes"}, "spec.runPolicy.suspend"),
        # A valid custom resource name, but the job's children need a DNS label.
        ("dotted.name", "metadata.name", "dotted.name", "metadata.name"),
        # Renders a 1.8 MB PyTorchJob (the image in the Master and the Worker), which etcd would refuse.
        (
            "too-large",
            "spec",
            {**valid_job()["spec"], "image": "x" * 900_000, "topology": {"nodes": 2}},
            "spec.image",
        ),
    ],
)
def test_a_bad_spec_fails_the_job_naming_the_field(
    cluster: Cluster, name: str, field: str, value: Any, named: str
) -> None:
    cluster.create_job(with_value(_named(valid_job(), name), field, value))

    status = cluster.status_when(name, "Failed")

    condition, ready, stalled = status["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == ("Failed", "True", "InvalidSpec")
    # kstatus: the failure is final until the spec changes (test_kstatus_e2e.py).
    assert [(c["type"], c["status"], c["reason"]) for c in (ready, stalled)] == [
        ("Ready", "False", "InvalidSpec"),
        ("Stalled", "True", "InvalidSpec"),
    ]
    assert named in condition["message"]
    assert len(condition["message"]) <= 1024
    assert children_of(cluster, name) == {}
    cluster.wait_for(
        f"an InvalidSpec event about {name}",
        lambda: [e for e in cluster.events(name) if e["reason"] == "InvalidSpec" and named in e["message"]],
    )
    assert cluster.operator is not None and cluster.operator.poll() is None and answers(cluster.liveness)


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [
        # YAML and template syntax in strings reach the children as data, verbatim.
        ("hostile-image", "spec.image", "{{ lookup('env', 'HOME') }}\n---\nkind: Secret"),
        ("hostile-source", "spec.data.sources.0.path", "/data/${HOME}/{% raw %}: [x, {y: z}]"),
        ("huge-source", "spec.data.sources.0.path", "/data/" + "y" * 100_000),
    ],
)
def test_hostile_strings_are_data(cluster: Cluster, name: str, field: str, value: str) -> None:
    cluster.create_job(with_value(_named(valid_job(), name), field, value))

    cluster.status_when(name, "Pending")

    [config_map] = children_of(cluster, name)["v1/configmaps"]
    document = yaml.safe_load(config_map["data"]["job.yaml"])
    assert with_value(document, field, value) == document


def test_a_name_taken_by_someone_else_fails_the_job(cluster: Cluster) -> None:
    CoreV1Api(cluster.api).create_namespaced_config_map(
        "default", V1ConfigMap.model_validate({"metadata": {"name": "taken-job"}, "data": {}})
    )
    cluster.create_job(_named(valid_job(), "taken"))

    status = cluster.status_when("taken", "Failed")

    assert status["conditions"][-1]["reason"] == "ChildConflict"
    assert "ConfigMap taken-job already exists" in status["conditions"][-1]["message"]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_training_job_name_taken_fails_the_job(cluster: Cluster, launcher: str) -> None:
    name = f"taken-{launcher}"
    group, version, plural = CHILD_RESOURCES[launcher].split("/")
    foreign = render(parse_job(_named(valid_job(), name, launcher)))[-1]
    CustomObjectsApi(cluster.api).create_namespaced_custom_object(group, version, "default", plural, foreign)
    cluster.create_job(_named(valid_job(), name, launcher))

    status = cluster.status_when(name, "Failed")

    assert status["conditions"][-1]["reason"] == "ChildConflict"
    assert f"{name} already exists and is not owned by this job" in status["conditions"][-1]["message"]


def test_creating_the_children_again_is_a_no_op(cluster: Cluster) -> None:
    objects = render(parse_job(_named(valid_job(), "twice")))
    for obj in objects:
        obj["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "bertjob.dev/v1alpha1",
                "kind": "BertPretrainJob",
                "name": "twice",
                "uid": "uid-of-twice",
            }
        ]

    create_children(cluster.api, copy.deepcopy(objects), owner_uid="uid-of-twice")
    create_children(cluster.api, copy.deepcopy(objects), owner_uid="uid-of-twice")

    counts = {resource: len(found) for resource, found in children_of(cluster, "twice").items()}
    assert len(counts) == len(objects) and set(counts.values()) == {1}
    with pytest.raises(ForeignObjectError, match="PyTorchJob twice already exists"):
        create_children(cluster.api, objects[-1:], owner_uid="another-uid")
