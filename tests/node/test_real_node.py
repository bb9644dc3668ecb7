"""The real node (:mod:`bertjob_testing.cluster.node`): a pod placed there really runs, from an image
imported into containerd with no registry, its output is what ``kubectl logs`` serves through the
API server and the kubelet, a deleted pod's container gets SIGTERM and is gone, and stopping the
plane leaves nothing of the node on the machine: no process, mount, cgroup or interface.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.node import TOLERATION, RealNode
from bertjob_testing.cluster.nodecleanup import cgroup_processes, hierarchies, mounts_under, naming
from bertjob_testing.cluster.oci import PAUSE_IMAGE
from bertjob_testing.cluster.operator import wait_until

WAIT_S = 90.0


def pod(node: RealNode, name: str, command: list[str]) -> dict[str, Any]:
    """A pod of the pause image pinned to ``node`` (tolerating its taint), running ``command``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node.name,
            "tolerations": [TOLERATION],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {"name": "main", "image": PAUSE_IMAGE, "imagePullPolicy": "IfNotPresent", "command": command}
            ],
        },
    }


def phase(plane: ControlPlane, name: str, namespace: str) -> str:
    found = plane.kubectl.get("pod", name, "-n", namespace)
    return str((found or {}).get("status", {}).get("phase", ""))


def test_the_node_is_ready_with_its_address_and_taint(real_node: RealNode) -> None:
    node = real_node.plane.kubectl.get("node", real_node.name)
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == real_node.address
    assert {"key": "bertjob.dev/real-node", "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.")


def test_a_pod_runs_there_and_kubectl_logs_shows_its_output(real_node: RealNode, namespace: str) -> None:
    plane = real_node.plane
    plane.kubectl.apply(pod(real_node, "version", ["/pause", "-v"]), "-n", namespace)
    wait_until(
        "the pod to end", lambda: phase(plane, "version", namespace) in ("Succeeded", "Failed"), WAIT_S
    )
    found = plane.kubectl.get("pod", "version", "-n", namespace)
    assert found["status"]["phase"] == "Succeeded"
    [status] = found["status"]["containerStatuses"]
    assert status["state"]["terminated"]["exitCode"] == 0
    assert status["containerID"].startswith("containerd://")
    logs = plane.kubectl("logs", "version", "-n", namespace).stdout
    assert logs == "pause.c bertjob-test\n"


def test_a_deleted_pod_is_stopped_and_its_processes_are_gone(real_node: RealNode, namespace: str) -> None:
    plane = real_node.plane
    plane.kubectl.apply(pod(real_node, "sleeper", ["/pause"]), "-n", namespace)
    wait_until("the pod to run", lambda: phase(plane, "sleeper", namespace) == "Running", WAIT_S)
    running = cgroup_processes(real_node.cgroup_root)
    assert running, "the pod's processes are in the node's cgroups"
    started = time.monotonic()
    plane.kubectl("delete", "pod", "sleeper", "-n", namespace, "--wait=true", timeout_s=WAIT_S)
    # pause exits on SIGTERM at once: well inside the 5 s grace period, no SIGKILL needed.
    assert time.monotonic() - started < 5 + 10
    wait_until(
        "the pod's processes to end", lambda: not (running & cgroup_processes(real_node.cgroup_root)), 30
    )


def test_stopping_the_plane_leaves_nothing_of_the_node(tmp_path: Path) -> None:
    plane = ControlPlane(tmp_path / "plane")
    plane.workdir.mkdir()
    node = RealNode(plane, tmp_path / "node")
    try:
        plane.start()
        node.start()
        plane.kubectl.apply(pod(node, "left-running", ["/pause"]), "-n", "default")
        wait_until("the pod to run", lambda: phase(plane, "left-running", "default") == "Running", WAIT_S)
        assert mounts_under(node.workdir) and cgroup_processes(node.cgroup_root)
        assert Path(f"/sys/class/net/{node.bridge}").exists()
    finally:
        plane.stop()
    assert naming(node.workdir) == set(), "no containerd, shim, kubelet or container process"
    assert mounts_under(node.workdir) == []
    assert not [h for h in hierarchies() if (h / node.cgroup_root.lstrip("/")).exists()]
    assert not Path(f"/sys/class/net/{node.bridge}").exists()
    assert json.loads(json.dumps(plane.pids)) == {}
