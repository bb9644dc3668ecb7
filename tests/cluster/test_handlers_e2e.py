"""The operator end to end on the real control plane: the chart's operator (`kopf run` under the
chart's ServiceAccount, tests/cluster/conftest.py) and the real API server, each test in a namespace
of its own; the test talks to the server through the kubernetes client, as `kubectl` would, and
plays the part of Kubeflow's operators by patching the children's status subresource (held to the
upstream CRDs' schemas). Waits are bounded.

A bad spec reaches the operator only where the API server stores it: the cases here are those
that the CRD's schema and CEL rules take and only the operator (and its webhook) refuses, in a
namespace the webhook does not serve (``unguarded``); the others, which the real server refuses at
create, are tested on the emulator (tests/bertjob/test_invalid_stored_job_e2e.py).

Why kwok: no pod needs to run: these are the operator's handlers against a real API server; the
test writes each child status (Running, Restarting, Succeeded, Failed) on demand as Kubeflow would.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml
from kubernetes.client import CoreV1Api, CustomObjectsApi, V1ConfigMap
from kubernetes.client.exceptions import ApiException

from bertjob.children import ForeignObjectError, create_children
from bertjob.render import render
from bertjob_api.spec import GROUP, PLURAL, VERSION, parse_job
from bertjob_testing.cluster.operator import RealCluster as Cluster
from bertjob_testing.jobs import valid_job, with_value
from tests.bertjob.e2e import CHILD_RESOURCES, LAUNCHERS, assert_fails_naming, children_of, home
from tests.bertjob.test_invalid_stored_job_e2e import REFUSED_BY_THE_CRD
from tests.k8s_schema import assert_valid
from tests.kubeflow_env import kubeflow_condition

pytestmark = pytest.mark.xdist_group("operator")


def _named(document: dict[str, Any], name: str, launcher: str = "pytorchjob") -> dict[str, Any]:
    return with_value(with_value(document, "metadata.name", name), "spec.launcher", launcher)


def _in(document: dict[str, Any], namespace: str) -> dict[str, Any]:
    """``document`` with ``metadata.namespace`` set (render puts its objects in ``default``)."""
    return with_value(document, "metadata.namespace", namespace)


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
        # One condition of each type: the MPIJob CRD's conditions are a list-map keyed by type, and
        # the real server refuses a status with two Running ones ('Duplicate value').
        latest = {c["type"]: c for c in conditions}
        latest["Running"] = kubeflow_condition("Running", "True" if type_ != "Succeeded" else "False")
        if type_ != "Running":
            latest[type_] = kubeflow_condition(type_)
        conditions = list(latest.values())
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


@pytest.mark.parametrize(
    ("name", "field", "value", "named"),
    [
        # The schema and CEL take these; the operator's checks do not.
        ("nowhere", "spec.checkpoint.path", "/ckpt", "spec.checkpoint.path"),
        # A valid custom resource name, but the job's children need a DNS label.
        ("dotted.name", "metadata.name", "dotted.name", "metadata.name"),
        # Renders a 1.8 MB PyTorchJob (the image in the Master and the Worker), which etcd would
        # refuse ('etcdserver: request is too large', tests/cluster/test_object_size.py).
        (
            "too-large",
            "spec",
            {**valid_job()["spec"], "image": "x" * 900_000, "topology": {"nodes": 2}},
            "spec.image",
        ),
    ],
)
def test_a_bad_spec_fails_the_job_naming_the_field(
    unguarded: Cluster, name: str, field: str, value: Any, named: str
) -> None:
    cluster = unguarded
    cluster.create_job(with_value(_named(valid_job(), name), field, value))

    assert_fails_naming(cluster, name, named)


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


@pytest.mark.parametrize(
    ("name", "field", "value", "named"), REFUSED_BY_THE_CRD, ids=[case[0] for case in REFUSED_BY_THE_CRD]
)
def test_the_server_refuses_what_only_the_emulator_stores(
    unguarded: Cluster, name: str, field: str, value: Any, named: str
) -> None:
    """The bad specs tested on the emulator (tests/bertjob/test_invalid_stored_job_e2e.py) are
    refused at create by the CRD's schema or CEL rules, where the webhook does not judge them."""
    document = with_value(_named(valid_job(), name), field, value)

    with pytest.raises(ApiException) as refused:
        unguarded.create_job(document)

    message = str(json.loads(str(refused.value.body))["message"])
    assert refused.value.status == 422, message
    assert "admission webhook" not in message
    assert f'BertPretrainJob.bertjob.dev "{name}" is invalid' in message, message
    assert named.split(":")[0] in message, message
    assert unguarded.stored(f"{GROUP}/{VERSION}/{PLURAL}", home(unguarded)) == []


def test_a_spec_too_large_for_kopfs_annotation_is_handled_once(cluster: Cluster) -> None:
    """A valid job whose spec (a 300 KB image) is larger than the 256 KiB of annotations the real
    server allows: the operator handles it once and records it (as a digest: bertjob.diffbase),
    and a change of it is still applied. Before, the server refused kopf's record ('metadata.
    annotations: Too long: may not be more than 262144 bytes') and kopf created the job again on
    every event."""
    offset = cluster.log.stat().st_size
    cluster.create_job(with_value(_named(valid_job(), "big"), "spec.image", "x" * 300_000))
    cluster.status_when("big", "Pending")

    record = f"{GROUP}/last-handled-configuration"
    recorded = cluster.wait_for(
        "kopf's record of the job",
        lambda: (cluster.job("big")["metadata"].get("annotations") or {}).get(record),
    )

    assert len(recorded) < 1024
    cluster.patch_job("big", {"spec": {"runPolicy": {"backoffLimit": 4}}})
    cluster.wait_for(
        "the change applied to the child",
        lambda: (
            (cluster.object(CHILD_RESOURCES["pytorchjob"], "big") or {})["spec"]["runPolicy"].get(
                "backoffLimit"
            )
            == 4
        ),
    )
    log = cluster.log.read_bytes()[offset:].decode(errors="replace")
    assert "Too long" not in log
    assert log.count("[" + home(cluster) + "/big] Creation is processed") == 1


def test_a_misspelt_field_is_dropped_by_the_server(cluster: Cluster) -> None:
    """The real server prunes a field the CRD's schema does not know (kubectl's strict field
    validation would refuse it at apply; a client that asks for none gets a warning): the job it
    stores is valid and runs, where the emulator kept the field and the operator failed the job."""
    cluster.create_job(with_value(_named(valid_job(), "misspelt"), "spec.phases.0.batchSize", 64))

    cluster.status_when("misspelt", "Pending")

    assert "batchSize" not in cluster.job("misspelt")["spec"]["phases"][0]


def test_a_name_taken_by_someone_else_fails_the_job(cluster: Cluster) -> None:
    CoreV1Api(cluster.api).create_namespaced_config_map(
        home(cluster), V1ConfigMap.model_validate({"metadata": {"name": "taken-job"}, "data": {}})
    )
    cluster.create_job(_named(valid_job(), "taken"))

    status = cluster.status_when("taken", "Failed")

    assert status["conditions"][-1]["reason"] == "ChildConflict"
    assert "ConfigMap taken-job already exists" in status["conditions"][-1]["message"]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_training_job_name_taken_fails_the_job(cluster: Cluster, launcher: str) -> None:
    name = f"taken-{launcher}"
    group, version, plural = CHILD_RESOURCES[launcher].split("/")
    foreign = render(parse_job(_in(_named(valid_job(), name, launcher), home(cluster))))[-1]
    CustomObjectsApi(cluster.api).create_namespaced_custom_object(
        group, version, home(cluster), plural, foreign
    )
    cluster.create_job(_named(valid_job(), name, launcher))

    status = cluster.status_when(name, "Failed")

    assert status["conditions"][-1]["reason"] == "ChildConflict"
    assert f"{name} already exists and is not owned by this job" in status["conditions"][-1]["message"]


def test_creating_the_children_again_is_a_no_op(cluster: Cluster) -> None:
    """The children the operator made, created again with their owner's uid (as a retried handler
    or a restarted operator does), are left as they are; with another uid, refused."""
    job = cluster.create_job(_named(valid_job(), "twice"))
    cluster.status_when("twice", "Pending")
    objects = render(parse_job(_in(_named(valid_job(), "twice"), home(cluster))))
    uid = job["metadata"]["uid"]
    for obj in objects:
        obj["metadata"]["ownerReferences"] = [
            {"apiVersion": "bertjob.dev/v1alpha1", "kind": "BertPretrainJob", "name": "twice", "uid": uid}
        ]
    before = children_of(cluster, "twice")

    create_children(cluster.api, copy.deepcopy(objects), owner_uid=uid)
    create_children(cluster.api, copy.deepcopy(objects), owner_uid=uid)

    counts = {resource: len(found) for resource, found in children_of(cluster, "twice").items()}
    assert len(counts) == len(objects) and set(counts.values()) == {1}
    assert children_of(cluster, "twice") == before, "an existing child was written again"
    with pytest.raises(ForeignObjectError, match="PyTorchJob twice already exists"):
        create_children(cluster.api, objects[-1:], owner_uid="another-uid")
