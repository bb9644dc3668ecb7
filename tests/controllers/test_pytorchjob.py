"""PyTorchJob children through the real training-operator v1 (``--enable-scheme=pytorchjob``): the
pods it makes carry what we rendered and the environment we assumed it adds
(:mod:`tests.kubeflow_env`), they run on kwok's GPU nodes, and their exit codes drive the job:
retried under ``restartPolicy: ExitCode`` for 128 and above, fatal below; a deleted node's pods are
replaced; suspend and resume reach the pods.

Why kwok: the pods ask for nvidia.com/gpu (kwok's gpu-0 and gpu-1), end with exit 143, 200, 201 or
1 on demand for ``restartPolicy: ExitCode``, and a node is deleted under them; 143 (SIGTERM) and 1
happen for real in tests/node/test_faults.py.
"""

from __future__ import annotations

from bertjob_api.contract import CONFIG_DIR, JOB_CONFIG_VOLUME, JOB_LABEL, JOB_PATH, NAME_ENV, NAMESPACE_ENV
from bertjob_testing.cluster.operator import RealCluster
from tests.bertjob.e2e import PYTORCHJOBS, named_job
from tests.cluster.test_kstatus_e2e import judged
from tests.controllers import pods
from tests.kubeflow_env import literal_env, pytorchjob_pod_env

REPLICA_TYPE = "training.kubeflow.org/replica-type"
REPLICA_INDEX = "training.kubeflow.org/replica-index"


def _job(name: str, processes_per_node: int = 1, **fields: object) -> dict[str, object]:
    """A job of two nodes (a Master and a Worker) of ``processes_per_node`` GPUs each."""
    topology = {"nodes": 2, "processesPerNode": processes_per_node}
    return named_job(name, "pytorchjob", spec__topology=topology, **fields)


def test_the_pods_carry_what_we_rendered_and_the_job_succeeds(cluster: RealCluster) -> None:
    name = "ddp"
    cluster.create_job(_job(name, processes_per_node=8))
    master, worker = pods.running(cluster, pods.of_job(name), 2)
    child = cluster.object(PYTORCHJOBS, name)
    assert child is not None
    configmap = cluster.job(name)["status"]["configMap"]

    for pod, (replica, index) in ((master, ("Master", 0)), (worker, ("Worker", 0))):
        assert (pod["metadata"]["labels"][REPLICA_TYPE], pod["metadata"]["labels"][REPLICA_INDEX]) == (
            replica.lower(),
            str(index),
        )
        assert pod["metadata"]["labels"][JOB_LABEL] == name
        trainer = pods.container(pod, "pytorch")
        assert trainer["command"][-2:] == ["--config", JOB_PATH]
        assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert pod["spec"]["nodeName"] in {"gpu-0", "gpu-1"}
        from_fields = {
            v["name"]: v["valueFrom"]["fieldRef"]["fieldPath"] for v in trainer["env"] if "valueFrom" in v
        }
        assert from_fields[NAME_ENV] == f"metadata.labels['{JOB_LABEL}']"
        assert from_fields[NAMESPACE_ENV] == "metadata.namespace"
        # The environment training-operator gave the pod is the one our pod tests assume.
        literal = literal_env(trainer["env"])
        assert literal == pytorchjob_pod_env(child, replica, index, master_addr=f"{name}-master-0")
        [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == JOB_CONFIG_VOLUME]
        assert volume["configMap"]["name"] == configmap
        [mount] = [m for m in trainer["volumeMounts"] if m["name"] == JOB_CONFIG_VOLUME]
        assert mount["mountPath"] == CONFIG_DIR
    assert {master["spec"]["nodeName"], worker["spec"]["nodeName"]} == {"gpu-0", "gpu-1"}, "8 GPUs each"
    assert cluster.status_when(name, "Running")

    pods.end(cluster, worker, 0)
    pods.end(cluster, master, 0)

    status = cluster.status_when(name, "Succeeded")
    assert [c["type"] for c in status["conditions"] if c["status"] == "True"][-1:] == ["Ready"] or status
    conditions, verdict, health = judged(cluster, name)
    assert (verdict, health, conditions["Ready"][0]) == ("Current", "Healthy", "True"), conditions


def _replaced(
    cluster: RealCluster, selector: str, old: dict[str, object], what: str, wait_s: float = 30
) -> dict[str, object]:
    """The running pod that replaced ``old`` (same name, new uid)."""

    def probe() -> dict[str, object] | None:
        found = [p for p in pods.pods(cluster, selector) if p["metadata"]["name"] == old["metadata"]["name"]]  # type: ignore[index]
        new = [
            p for p in found if pods.uid(p) != pods.uid(old) and p.get("status", {}).get("phase") == "Running"
        ]
        return new[0] if new else None

    return cluster.wait_for(what, probe, wait_s)


def test_exit_codes_of_128_and_above_restart_the_pod_and_1_fails_the_job(cluster: RealCluster) -> None:
    """``restartPolicy: ExitCode``: training-operator deletes a pod that failed with 128 or more
    and makes it again, and fails the job on a lower code. ``backoffLimit`` does not bound those
    restarts: training-operator v1.9 counts only containers' in-place restarts (its
    ``PastBackoffLimit``), and a pod made again has none (docs/launchers.md)."""
    name = "exit-codes"
    cluster.create_job(_job(name, spec__runPolicy={"backoffLimit": 1}))
    _, worker = pods.running(cluster, pods.of_job(name), 2)
    assert cluster.status_when(name, "Running")
    worker_selector = pods.of_job(name, **{REPLICA_TYPE: "worker"})

    for code in (143, 200, 201):
        pods.end(cluster, worker, code)
        worker = _replaced(cluster, worker_selector, worker, f"worker-0 made again after exit {code}")
        assert cluster.job(name)["status"]["phase"] == "Running"

    pods.end(cluster, worker, 1)

    status = cluster.status_when(name, "Failed")
    [failed] = [c for c in status["conditions"] if c["type"] == "Failed"]
    assert failed["status"] == "True"
    assert f"pod {name}-worker-0 exited with code 1: a failure no retry mends" in failed["message"], failed
    restarting = [c for c in status["conditions"] if c["type"] == "Restarting"]
    assert all(c["status"] == "False" for c in restarting), "training-operator dropped Restarting"


def test_a_deleted_nodes_pod_is_made_again_on_another_node(cluster: RealCluster) -> None:
    """The node under a running worker is deleted: the pod-GC controller deletes its orphaned
    pod, and training-operator makes it again where the scheduler finds room."""
    name = "node-lost"
    cluster.create_job(_job(name))
    _, worker = pods.running(cluster, pods.of_job(name), 2)
    node = worker["spec"]["nodeName"]
    assert cluster.plane is not None
    try:
        cluster.plane.kubectl("delete", "node", node)
        worker = _replaced(
            cluster,
            pods.of_job(name, **{REPLICA_TYPE: "worker"}),
            worker,
            f"worker-0 made again after {node} went",
            # The pod-GC controller deletes a pod of a node that is gone 40 s after it first finds
            # it so (its quarantine), checking every 20 s (both constants of the controller).
            wait_s=90,
        )
        assert worker["spec"]["nodeName"] != node  # type: ignore[index]
        assert cluster.job(name)["status"]["phase"] == "Running"
    finally:
        cluster.plane.add_nodes([node])


def test_suspend_and_resume_reach_the_pods(cluster: RealCluster) -> None:
    name = "pausing"
    cluster.create_job(_job(name))
    before = pods.running(cluster, pods.of_job(name), 2)
    assert cluster.status_when(name, "Running")

    cluster.patch_job(name, {"spec": {"runPolicy": {"suspend": True}}})

    cluster.wait_for("the pods deleted", lambda: pods.pods(cluster, pods.of_job(name)) == [])
    assert cluster.status_when(name, "Suspended")
    # training-operator writes its own Suspended condition after it has deleted the pods, which
    # may be after our status (set from the spec) says Suspended.
    cluster.wait_for(
        "training-operator's own Suspended condition",
        lambda: any(
            c["type"] == "Suspended" and c["status"] == "True"
            for c in ((cluster.object(PYTORCHJOBS, name) or {}).get("status") or {}).get("conditions") or []
        ),
    )

    cluster.patch_job(name, {"spec": {"runPolicy": {"suspend": False}}})

    after = pods.running(cluster, pods.of_job(name), 2, "the pods made again")
    assert {pods.uid(p) for p in after}.isdisjoint(pods.uid(p) for p in before)
    assert cluster.status_when(name, "Running")
