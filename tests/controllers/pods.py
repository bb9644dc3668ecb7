"""What the controllers tier's tests share: the pods a real controller made for a job, waiting for
them, ending one with an exit code (kwok's stage), and a BertPretrainJob's judgement by kstatus and
Argo CD."""

from __future__ import annotations

from typing import Any

from bertjob_api.contract import JOB_LABEL
from bertjob_testing.cluster.operator import RealCluster
from tests.kubeflow_env import literal_env


def pods(cluster: RealCluster, selector: str) -> list[dict[str, Any]]:
    """The live pods of the test's namespace that ``selector`` picks, by name."""
    return cluster.live_pods(selector)


def of_job(name: str, **labels: str) -> str:
    """The label selector of job ``name``'s pods, with ``labels`` too."""
    return ",".join([f"{JOB_LABEL}={name}", *(f"{key}={value}" for key, value in labels.items())])


def running(cluster: RealCluster, selector: str, count: int, what: str = "") -> list[dict[str, Any]]:
    """Wait until exactly ``count`` live pods match ``selector`` and all run; them.

    Raises:
        bertjob_testing.kube_emulator.WaitTimeoutError: not in the cluster's wait.
    """

    def probe() -> list[dict[str, Any]] | None:
        found = pods(cluster, selector)
        ok = len(found) == count and all(pod.get("status", {}).get("phase") == "Running" for pod in found)
        return found if ok else None

    return cluster.wait_for(what or f"{count} pods {selector} running", probe)


def end(cluster: RealCluster, pod: dict[str, Any], exit_code: int) -> None:
    """End running ``pod``: every container exits ``exit_code`` (kwok's stage; Succeeded for 0)."""
    cluster.end_pod(pod["metadata"]["name"], exit_code)


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    """The container ``name`` of ``pod``'s spec."""
    [found] = [c for c in pod["spec"]["containers"] if c["name"] == name]
    return found


def uid(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["uid"])


def field(pod: dict[str, Any], path: str) -> str:
    """The value of a ``fieldRef`` ``path`` for ``pod``, as the kubelet resolves it (the paths our
    pods and the controllers use: a label or annotation, the name, the namespace).

    Raises:
        ValueError: another path.
    """
    meta = pod["metadata"]
    for prefix, found in (
        ("metadata.annotations", meta.get("annotations")),
        ("metadata.labels", meta.get("labels")),
    ):
        if path.startswith(f"{prefix}['") and path.endswith("']"):
            return str((found or {})[path[len(prefix) + 2 : -2]])
    if path in ("metadata.name", "metadata.namespace"):
        return str(meta[path.split(".")[1]])
    raise ValueError(f"fieldRef {path} is not resolved here")


def env(pod: dict[str, Any], container_name: str) -> dict[str, str]:
    """Container ``container_name``'s environment as the process sees it: literal values and
    ``fieldRef`` ones resolved (:func:`field`); ``valueFrom`` of other kinds left out."""
    variables = container(pod, container_name).get("env", [])
    resolved = {
        v["name"]: field(pod, v["valueFrom"]["fieldRef"]["fieldPath"])
        for v in variables
        if "fieldRef" in (v.get("valueFrom") or {})
    }
    return literal_env(variables) | resolved
