"""The real node (:mod:`bertjob_testing.cluster.node`): a pod placed there really runs, from an image
imported into containerd with no registry, its output is what ``kubectl logs`` serves through the
API server and the kubelet, a deleted pod's container gets SIGTERM and is gone; a pod resolves a
Service's name through CoreDNS and reaches it through kube-proxy's rules, and reaches the API server
through the ``kubernetes`` Service; stopping the plane leaves nothing of the node on the machine: no
process, mount, cgroup, network namespace, interface or route.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.node import TOLERATION, PodError, RealNode
from bertjob_testing.cluster.nodecleanup import cgroup_processes, hierarchies, mounts_under, naming
from bertjob_testing.cluster.oci import PAUSE_IMAGE
from bertjob_testing.cluster.operator import wait_until
from tests.cluster.test_harness import killed_holder, wait_gone

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
    assert node["status"]["nodeInfo"]["kubeProxyVersion"] in ("", real_node.plane.version)


def logs(plane: ControlPlane, name: str, namespace: str) -> str:
    """The output of pod ``name`` once it ended (asserting it Succeeded)."""
    wait_until(f"pod {name} to end", lambda: phase(plane, name, namespace) in ("Succeeded", "Failed"), WAIT_S)
    output = plane.kubectl("logs", name, "-n", namespace).stdout
    assert phase(plane, name, namespace) == "Succeeded", output
    return output


def test_a_pod_finds_a_service_by_name_and_reaches_it_and_the_api_server(
    real_node: RealNode, namespace: str
) -> None:
    plane = real_node.plane
    server = pod(real_node, "server", ["/probe", "serve", "8080"])
    server["metadata"]["labels"] = {"app": "echo"}
    plane.kubectl.apply(server, "-n", namespace)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "echo"},
        "spec": {"selector": {"app": "echo"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    plane.kubectl.apply(service, "-n", namespace)
    real_node.wait_for_pod("server", namespace, wait_s=WAIT_S)
    cluster_ip = plane.kubectl.get("service", "echo", "-n", namespace)["spec"]["clusterIP"]
    name = f"echo.{namespace}.svc.cluster.local"
    plane.kubectl.apply(pod(real_node, "lookup", ["/probe", "lookup", name]), "-n", namespace)
    assert logs(plane, "lookup", namespace).split() == [cluster_ip], "CoreDNS answers the Service's ClusterIP"
    plane.kubectl.apply(pod(real_node, "connect", ["/probe", "connect", f"{name}:80"]), "-n", namespace)
    assert logs(plane, "connect", namespace) == "connected\n", "kube-proxy's rules lead to the server pod"
    api = "kubernetes.default.svc.cluster.local:443"
    plane.kubectl.apply(pod(real_node, "api", ["/probe", "connect", api]), "-n", namespace)
    assert logs(plane, "api", namespace) == "connected\n", "the kubernetes Service leads to the API server"


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
    uid = real_node.wait_for_pod("sleeper", namespace, wait_s=WAIT_S)["metadata"]["uid"]
    # The pod's own cgroup (cgroupfs: <root>/kubepods/<qos>/pod<uid>): other pods, the operator's
    # among them, may run on the node meanwhile.
    running = cgroup_processes(f"{real_node.cgroup_root}/kubepods/besteffort/pod{uid}")
    assert running, "the pod's processes are in its cgroup under the node's"
    started = time.monotonic()
    plane.kubectl("delete", "pod", "sleeper", "-n", namespace, "--wait=true", timeout_s=WAIT_S)
    # pause exits on SIGTERM at once: well inside the 5 s grace period, no SIGKILL needed.
    assert time.monotonic() - started < 5 + 10
    wait_until(
        "the pod's processes to end", lambda: not (running & cgroup_processes(real_node.cgroup_root)), 30
    )


def test_a_pod_whose_image_is_not_on_the_node_is_named_with_the_import_command(
    real_node: RealNode, namespace: str
) -> None:
    missing = pod(real_node, "missing", ["/pause"])
    missing["spec"]["containers"][0]["image"] = "bertjob.dev/test/not-imported:1"
    real_node.plane.kubectl.apply(missing, "-n", namespace)
    with pytest.raises(PodError) as stuck:
        real_node.wait_for_pod("missing", namespace, wait_s=60)
    message = str(stuck.value)
    assert "bertjob.dev/test/not-imported:1" in message and "images import" in message, message


def test_a_pod_stuck_creating_reports_its_events(real_node: RealNode, namespace: str) -> None:
    stuck = pod(real_node, "stuck", ["/pause"])
    stuck["spec"]["volumes"] = [{"name": "absent", "configMap": {"name": "no-such-configmap"}}]
    stuck["spec"]["containers"][0]["volumeMounts"] = [{"name": "absent", "mountPath": "/absent"}]
    real_node.plane.kubectl.apply(stuck, "-n", namespace)
    with pytest.raises(PodError) as waited:
        real_node.wait_for_pod("stuck", namespace, wait_s=15)
    message = str(waited.value)
    assert "ContainerCreating" in message and "no-such-configmap" in message, message


def test_stopping_the_plane_leaves_nothing_of_the_node(tmp_path: Path) -> None:
    plane = ControlPlane(tmp_path / "plane")
    plane.workdir.mkdir()
    node = RealNode(plane, tmp_path / "node")
    try:
        plane.start()
        node.start()
        plane.kubectl.apply(pod(node, "left-running", ["/pause"]), "-n", "default")
        node.wait_for_pod("left-running", "default", wait_s=WAIT_S)
        assert mounts_under(node.workdir) and cgroup_processes(node.cgroup_root)
        assert node.netns_path.exists() and Path(f"/sys/class/net/{node.host_link}").exists()
        assert node.containerd_root.is_dir()
    finally:
        plane.stop()
    assert naming(node.workdir) == set(), "no containerd, shim, kubelet or container process"
    assert mounts_under(node.workdir) == []
    assert not node.containerd_root.exists(), "containerd's images and snapshots (GBs) are deleted"
    assert not [h for h in hierarchies() if (h / node.cgroup_root.lstrip("/")).exists()]
    assert not node.netns_path.exists(), "the namespace, with the bridge and kube-proxy's rules"
    assert not Path(f"/sys/class/net/{node.host_link}").exists(), "this machine's end of the link"
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True, check=True).stdout
    assert str(node.pods) not in routes
    assert json.loads(json.dumps(plane.pids)) == {}


# A test run that starts a control plane with a real node running a pod, then waits to be killed:
# what it made goes to a file the outer test reads.
HOLDER = """
import json, os, time
from pathlib import Path
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.node import RealNode
from tests.node.test_real_node import phase, pod

def test_hold(tmp_path):
    plane = ControlPlane(tmp_path / "plane")
    plane.workdir.mkdir()
    plane.start()
    node = RealNode(plane, tmp_path / "node")
    node.start()
    plane.kubectl.apply(pod(node, "held", ["/pause"]), "-n", "default")
    while phase(plane, "held", "default") != "Running":
        time.sleep(0.2)
    made = {"workdir": str(node.workdir), "netns": str(node.netns_path), "cgroup": node.cgroup_root,
            "pids": [*plane.pids.values(), plane.reaper]}
    Path(os.environ["HOLDER_STATE"]).write_text(json.dumps(made))
    time.sleep(600)
"""


def test_a_test_run_killed_with_sigkill_leaves_nothing_of_its_node(
    real_node: RealNode, tmp_path: Path
) -> None:
    """The reaper of a killed run undoes its node too (``real_node`` only asks for root)."""
    made = killed_holder(tmp_path, HOLDER, lambda _: None)
    workdir = Path(made["workdir"])
    wait_until("the reaper to undo the node", lambda: not Path(made["netns"]).exists(), 60)
    # The reaper deletes the namespace before the last processes have exited (a full run once saw
    # one still there): they must be gone soon after, not at once.
    wait_until(
        "every process of the node to exit",
        lambda: not naming(workdir),
        30,
    )
    assert mounts_under(workdir) == []
    assert not [h for h in hierarchies() if (h / made["cgroup"].lstrip("/")).exists()]
    # The plane's processes and the reaper itself go after the node (CI once saw one still running
    # the moment the node's last process had gone): they too get a while, as in test_harness.
    assert not wait_gone(made["pids"]), "the plane's processes or the reaper outlived the killed run"
