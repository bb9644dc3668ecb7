"""The operator as a platform team runs it, on the real control plane: the chart installed by
``helm install`` (CRD with its CEL rules, RBAC, webhook with the chart's own certificates), the
operator holding only the chart's ServiceAccount's token, jobs applied with the cluster's kubectl.

What the real server does here that the emulator did not: it estimates the CEL rules' cost when
the CRD is created, applies the CRD's schema, defaults and CEL rules at apply, calls our webhook
over TLS through its Service (checking the chart's certificate against the configuration's CA
bundle), enforces the chart's RBAC on every call of the operator's, and deletes a job's children
through the controller-manager's garbage collector.

Why kwok: the lifecycle's pods ask for nvidia.com/gpu (kwok's GPU nodes), stand in for
training-operator's and end with exit 0 on demand; the rest needs no pod. For real: the chart's pod
in tests/node/test_operator_pod.py, a job under the chart's RBAC in tests/node/test_training.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from bertjob.render import JOB_LABEL
from bertjob_api.contract import PLURAL
from bertjob_api.crd import resource_schema
from bertjob_testing import cel
from bertjob_testing.admission_cases import JOB_CASES
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.nodes import EXIT_CODE_ANNOTATION
from bertjob_testing.cluster.operator import NAMESPACE, OPERATOR, RealCluster, wait_until
from tests.bertjob.e2e import named_job
from tests.kubeflow_env import kubeflow_condition

pytestmark = pytest.mark.timeout(300)

# Cases the API server refuses itself, before schema, CEL or webhook: an object's name must be an
# RFC 1123 subdomain for every resource.
SERVER_DECIDES = {"bad-name"}
# What a job's children are, by resource (kubectl's names); all carry the job's label.
CHILDREN = ("configmaps", "pytorchjobs", "pods")


def forbidden(cluster: RealCluster) -> list[str]:
    """The operator's log lines about a request the API server's RBAC refused it (its 403 names
    the user, the verb and the resource: 'is forbidden: User "..." cannot create resource ...').
    Not the 403 of a namespace being deleted ('is forbidden: unable to create new content in
    namespace ... because it is being terminated'), which the operator meets when it posts an
    Event about a job of another test whose namespace is going away."""
    # And the OwnerReferencesPermissionEnforcement plugin's refusal of a child's blockOwnerDeletion,
    # which names no verb: the chart must grant update on bertpretrainjobs/finalizers.
    return [
        line
        for line in cluster.log.read_text().splitlines()
        if "forbidden: User" in line or "cannot set blockOwnerDeletion" in line
    ]


def test_the_crd_is_served_with_its_cel_rules(operator: RealCluster) -> None:
    assert operator.plane is not None
    crd = operator.plane.kubectl.get("crd", f"{PLURAL}.bertjob.dev")
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True" and conditions["NamesAccepted"] == "True"
    rules = json.dumps(crd["spec"]["versions"]).count('"rule"')
    assert rules > 10, "the CRD as stored has lost its x-kubernetes-validations"


@pytest.mark.parametrize("case", JOB_CASES, ids=[case["id"] for case in JOB_CASES])
def test_apply_is_decided_by_cel_and_by_the_webhook(operator: RealCluster, case: dict[str, Any]) -> None:
    """Every job of the admission table at ``kubectl apply --dry-run=server``. Allowed ones pass
    schema, CEL and the webhook. The API server runs the CRD's schema and CEL rules before any
    validating webhook, so a refused job whose fields fail a CEL rule is refused by CEL alone,
    naming what the rules name (as bertjob_testing.cel evaluates them: the real server and our
    evaluator agree); the others reach our webhook over TLS, which names every field the table
    names, as kubectl prints it."""
    assert operator.plane is not None
    result = operator.plane.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=json.dumps(case["document"]), check=False
    )
    if case["allowed"]:
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode != 0, f"{case['id']} was let through: {result.stdout}"
    message = result.stderr
    webhook = 'admission webhook "bertpretrainjobs.bertjob.dev" denied the request'
    if case.get("schema") or case["id"] in SERVER_DECIDES:
        assert webhook not in message, message
        named = case["fields"]
    elif by_cel := {r.message.partition(": ")[0] for r in cel.refusals(case["document"], resource_schema())}:
        assert webhook not in message, message
        named = sorted(by_cel)
    else:
        assert webhook in message, message
        named = case["fields"]
    for field in named:
        assert field in message, f"{field} not named in: {message}"


def _stand_in_for_the_training_operator(plane: ControlPlane, namespace: str, name: str) -> list[str]:
    """What Kubeflow's training operator does with a PyTorchJob, as far as these tests need it:
    one pod per replica from each replica type's template, owned by the PyTorchJob, named as it
    names them (``<job>-master-0``, ``<job>-worker-<i>``). Returns the pods' names."""
    child = plane.kubectl.get("pytorchjob", name, "-n", namespace)
    owner = {
        "apiVersion": child["apiVersion"],
        "kind": child["kind"],
        "name": name,
        "uid": child["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    names = []
    for replica_type, replica in child["spec"]["pytorchReplicaSpecs"].items():
        for index in range(replica.get("replicas", 1)):
            pod_name = f"{name}-{replica_type.lower()}-{index}"
            template = replica["template"]
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    **template.get("metadata", {}),
                    "name": pod_name,
                    "ownerReferences": [owner],
                    "labels": {
                        **template.get("metadata", {}).get("labels", {}),
                        "training.kubeflow.org/job-name": name,
                        "training.kubeflow.org/replica-type": replica_type.lower(),
                        "training.kubeflow.org/replica-index": str(index),
                    },
                },
                "spec": template["spec"],
            }
            plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))
            names.append(pod_name)
    return names


def _report(plane: ControlPlane, namespace: str, name: str, *types: str) -> None:
    status = {"status": {"conditions": [kubeflow_condition(type_) for type_ in types]}}
    plane.kubectl(
        "patch",
        "pytorchjob",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )


def _phase(operator: RealCluster, namespace: str, name: str, phase: str) -> dict[str, Any]:
    """The job's status once its phase is ``phase``; a timeout names any request the API server
    refused the operator (RBAC's 403 names the verb and the resource)."""
    plane = operator.plane
    assert plane is not None
    try:
        return wait_until(  # type: ignore[no-any-return]
            f"{name} to be {phase}",
            lambda: (
                (job := plane.kubectl.get(PLURAL, name, "-n", namespace))
                and (job.get("status") or {}).get("phase") == phase
                and job["status"]
            ),
        )
    except AssertionError as error:
        refused = "\n".join(forbidden(operator)) or "none"
        raise AssertionError(f"{error}; requests the API server refused the operator: {refused}") from None


def test_a_job_runs_its_lifecycle_under_the_charts_rbac_and_its_children_are_collected(
    operator: RealCluster, namespace: str
) -> None:
    plane = operator.plane
    assert plane is not None
    name = "lifecycle"
    plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(named_job(name)))
    _phase(operator, namespace, name, "Pending")
    pods = _stand_in_for_the_training_operator(plane, namespace, name)

    running = wait_until(
        "the pods to run",
        lambda: (
            (found := [plane.kubectl.get("pod", pod, "-n", namespace) for pod in pods])
            and all(pod["status"].get("phase") == "Running" for pod in found)
            and found
        ),
    )
    for pod in running:
        # The pod as the real server stored it keeps what we rendered.
        [container] = [c for c in pod["spec"]["containers"] if c["name"] == "pytorch"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert {volume["name"] for volume in pod["spec"]["volumes"]} >= {"job-config", "data", "dshm"}
        assert pod["spec"]["nodeName"].startswith("gpu-")
    _report(plane, namespace, name, "Created", "Running")
    _phase(operator, namespace, name, "Running")

    for pod in pods:
        plane.kubectl("annotate", "pod", pod, "-n", namespace, f"{EXIT_CODE_ANNOTATION}=0")
    wait_until(
        "the pods to succeed",
        lambda: all(
            plane.kubectl.get("pod", pod, "-n", namespace)["status"].get("phase") == "Succeeded"
            for pod in pods
        ),
    )
    _report(plane, namespace, name, "Created", "Running", "Succeeded")
    status = _phase(operator, namespace, name, "Succeeded")
    ready = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True", status["conditions"]

    labelled = f"{JOB_LABEL}={name}"
    before = {kind: plane.kubectl.get(kind, "-n", namespace, "-l", labelled)["items"] for kind in CHILDREN}
    assert all(before[kind] for kind in ("configmaps", "pytorchjobs"))
    # No RBAC of a job's own: its pods report progress to the operator (tests/cluster/test_progress.py).
    assert not any(
        plane.kubectl.get(kind, "-n", namespace, "-l", labelled)["items"]
        for kind in ("serviceaccounts", "roles", "rolebindings")
    )
    plane.kubectl("delete", PLURAL, name, "-n", namespace, "--wait=false")
    wait_until(
        "the garbage collector to delete every child",
        lambda: (
            not any(plane.kubectl.get(kind, "-n", namespace, "-l", labelled)["items"] for kind in CHILDREN)
            and not any(plane.kubectl.get("pod", pod, "-n", namespace) for pod in pods)
        ),
    )
    assert not forbidden(operator), "the API server refused the operator:\n" + "\n".join(forbidden(operator))


def test_the_operator_runs_as_the_charts_service_account(operator: RealCluster) -> None:
    """The operator's identity is the chart's ServiceAccount, which cannot do what the chart does
    not grant (so the lifecycle above proves the chart's RBAC is enough)."""
    plane = operator.plane
    assert plane is not None
    account = f"system:serviceaccount:{NAMESPACE}:{OPERATOR}"
    can = plane.kubectl("auth", "can-i", "create", "pytorchjobs.kubeflow.org", f"--as={account}", check=False)
    assert can.stdout.strip() == "yes"
    cannot = plane.kubectl("auth", "can-i", "delete", "nodes", f"--as={account}", check=False)
    assert cannot.stdout.strip() == "no"
