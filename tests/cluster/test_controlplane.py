"""The test cluster itself (bertjob_testing.cluster): what the operator's end-to-end tests rely on
from it, each checked against the real components.

- the API server reports the pinned version (the build stamps it; unstamped it says v0.0.0);
- kwok's fake nodes carry the accelerators' resources, and a pod the scheduler places on one runs
  and ends with the exit code a test chooses (Failed with 137, Succeeded with 0), as the Job
  controller then counts it;
- the garbage collector deletes what an owner leaves behind, and a namespace is deleted whole;
- a service account's token (TokenRequest) is a user whom RBAC holds to its Role.

Why kwok: it checks kwok's fake nodes themselves, as the other kwok tests use them: GPUs and Gaudis
this machine lacks, and a pod ended with the exit code a test picks; the rest needs no pod. The
real node is checked in tests/node/test_real_node.py.
"""

from __future__ import annotations

import json
from typing import Any

from bertjob_testing.cluster.catalog import versions
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.nodes import EXIT_CODE_ANNOTATION, NODES
from bertjob_testing.cluster.operator import wait_until

WAIT_S = 60.0


def test_the_server_reports_the_pinned_version(control_plane: ControlPlane) -> None:
    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert version["gitVersion"] == versions()["KUBERNETES_VERSION"]
    print(f"control plane start-to-ready (s): {control_plane.timings}")


def test_fake_nodes_offer_cpus_gpus_and_gaudis(control_plane: ControlPlane) -> None:
    nodes = {node["metadata"]["name"]: node for node in control_plane.kubectl.get("nodes")["items"]}
    assert set(NODES) <= set(nodes)
    assert nodes["gpu-0"]["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert nodes["gaudi-0"]["status"]["allocatable"]["habana.ai/gaudi"] == "8"


def pod(name: str, resources: dict[str, str]) -> dict[str, Any]:
    """A pod asking for ``resources`` (limits), with restartPolicy Never."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "trainer", "resources": {"limits": resources}}],
        },
    }


def test_a_gpu_pod_is_scheduled_runs_and_fails_with_the_chosen_exit_code(
    control_plane: ControlPlane, namespace: str
) -> None:
    control_plane.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(pod("gpu", {"nvidia.com/gpu": "8"}))
    )
    running = wait_until(
        "the pod to run",
        lambda: (
            (found := control_plane.kubectl.get("pod", "gpu", "-n", namespace))
            and found["status"].get("phase") == "Running"
            and found
        ),
    )
    assert running["spec"]["nodeName"].startswith("gpu-")
    control_plane.kubectl("annotate", "pod", "gpu", "-n", namespace, f"{EXIT_CODE_ANNOTATION}=137")
    failed = wait_until(
        "the pod to fail",
        lambda: (
            (found := control_plane.kubectl.get("pod", "gpu", "-n", namespace))
            and found["status"].get("phase") == "Failed"
            and found
        ),
    )
    [status] = failed["status"]["containerStatuses"]
    assert status["state"]["terminated"]["exitCode"] == 137


def test_a_pod_asking_for_more_gpus_than_a_node_has_stays_pending(
    control_plane: ControlPlane, namespace: str
) -> None:
    control_plane.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(pod("big", {"nvidia.com/gpu": "9"}))
    )
    unschedulable = wait_until(
        "the scheduler's verdict",
        lambda: [
            condition
            for condition in (
                control_plane.kubectl.get("pod", "big", "-n", namespace)["status"].get("conditions") or []
            )
            if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable"
        ],
    )
    assert "nvidia.com/gpu" in unschedulable[0]["message"]


def test_the_job_controller_completes_a_job_whose_pod_succeeded(
    control_plane: ControlPlane, namespace: str
) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "prepare"},
        "spec": {"backoffLimit": 0, "template": {"spec": pod("ignored", {"cpu": "1"})["spec"]}},
    }
    control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job))
    running = wait_until(
        "the Job's pod to run",
        lambda: [
            item["metadata"]["name"]
            for item in control_plane.kubectl.get("pods", "-n", namespace, "-l", "job-name=prepare")["items"]
            if item["status"].get("phase") == "Running"
        ],
    )
    control_plane.kubectl("annotate", "pod", running[0], "-n", namespace, f"{EXIT_CODE_ANNOTATION}=0")
    wait_until(
        "the Job to complete",
        lambda: any(
            condition["type"] == "Complete" and condition["status"] == "True"
            for condition in control_plane.kubectl.get("job", "prepare", "-n", namespace)["status"].get(
                "conditions"
            )
            or []
        ),
    )


def test_the_garbage_collector_deletes_what_an_owner_leaves(
    control_plane: ControlPlane, namespace: str
) -> None:
    control_plane.kubectl("create", "configmap", "owner", "-n", namespace)
    owner = control_plane.kubectl.get("configmap", "owner", "-n", namespace)
    child = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "child",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
            ],
        },
    }
    control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(child))
    control_plane.kubectl("delete", "configmap", "owner", "-n", namespace)
    wait_until(
        "the child to be collected",
        lambda: control_plane.kubectl.get("configmap", "child", "-n", namespace) is None,
    )


def test_a_namespace_is_deleted_with_what_it_holds(control_plane: ControlPlane) -> None:
    control_plane.kubectl("create", "namespace", "cp-doomed")
    control_plane.kubectl("create", "configmap", "inside", "-n", "cp-doomed")
    control_plane.kubectl("delete", "namespace", "cp-doomed", "--wait=false")
    wait_until("the namespace to go", lambda: control_plane.kubectl.get("namespace", "cp-doomed") is None)


def test_a_service_account_token_is_held_to_its_role(
    control_plane: ControlPlane, namespace: str, tmp_path: Any
) -> None:
    control_plane.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    control_plane.kubectl(
        "create", "role", "reader", "-n", namespace, "--verb=get,list", "--resource=configmaps"
    )
    control_plane.kubectl(
        "create",
        "rolebinding",
        "reader",
        "-n",
        namespace,
        "--role=reader",
        f"--serviceaccount={namespace}:reader",
    )
    token = control_plane.kubectl.service_account_token(namespace, "reader")
    config = control_plane.kubeconfig_for_token(tmp_path / "reader.kubeconfig", token)
    allowed = control_plane.kubectl("get", "configmaps", "-n", namespace, kubeconfig=config, check=False)
    assert allowed.returncode == 0, allowed.stderr
    refused = control_plane.kubectl(
        "create", "configmap", "nope", "-n", namespace, kubeconfig=config, check=False
    )
    assert refused.returncode != 0
    assert (
        f'User "system:serviceaccount:{namespace}:reader" cannot create resource "configmaps"'
        in refused.stderr
    )
