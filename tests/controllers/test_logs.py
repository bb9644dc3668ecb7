"""``kubectl logs`` on the launcher pod, as users of the reference systems follow a job: the small
cluster example (examples/bert-tiny-cluster.yaml, applied as written with its claim) runs through
the real training-operator; the test runs, on this machine, the command and environment that
training-operator put in the real Master pod's spec, with the job file of the ConfigMap the pod
mounts, to an export; kwok serves that output as the pod's log (a kwok ``Logs`` object naming a
file of CRI log lines) and ends the pod with the trainer's exit code.

What differs from a real node: the pod's network (its ``MASTER_ADDR``, the Master's Service name,
resolves to nothing here: it becomes 127.0.0.1 and a free port) and its volumes (each a directory
here, its ``mountPath`` mapped in the job file). This is the one run of the example's whole job in
the tests (it carries what the run without a cluster checked: the losses, the export, memory).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from bertjob_api.contract import CONFIG_DIR, JOB_CONFIG_VOLUME, JOB_FILE, JOB_PATH
from bertjob_api.defaults import volumes
from bertjob_api.jobfile import load_job
from bertjob_api.kubenames import parse_quantity
from bertjob_api.validation import cluster_job
from bertjob_testing.cluster.operator import RealCluster
from bertjob_testing.cluster.process import free_port
from bertjob_testing.jobs import EXAMPLES
from tests.bertjob.e2e import PYTORCHJOBS
from tests.controllers import pods

EXAMPLE = EXAMPLES / "bert-tiny-cluster.yaml"
CLAIM = EXAMPLES / "storage" / "bert-tiny-data.yaml"
CONTAINER = "pytorch"
# The whole job, data stage included, took 38 s here on 2 cores shared with other work (load
# average 3.5), and 132 s at load 7 in an earlier, twice as long version.
TIMEOUT_SECONDS = 420

pytestmark = pytest.mark.slow


def _on_this_machine(value: Any, mounts: dict[str, Path]) -> Any:
    """``value`` (the job document, or any part of it) with every path under a volume's
    ``mountPath`` moved to that volume's directory on this machine."""
    if isinstance(value, dict):
        return {key: _on_this_machine(item, mounts) for key, item in value.items()}
    if isinstance(value, list):
        return [_on_this_machine(item, mounts) for item in value]
    if isinstance(value, str) and value.startswith("/"):
        for mount, directory in mounts.items():
            if PurePosixPath(value).is_relative_to(mount):
                return str(directory / PurePosixPath(value).relative_to(mount))
    return value


def _claim_with_a_volume(cluster: RealCluster) -> None:
    """The example's claim, as its file says, and a PersistentVolume it binds to (the cluster has
    no StorageClass, as one without a provisioner)."""
    assert cluster.plane is not None
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{cluster.default_namespace}-data"},
        "spec": {
            "capacity": {"storage": "5Gi"},
            "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": "/tmp/bertjob-test-volume"},
            "claimRef": {"namespace": cluster.default_namespace, "name": "bert-tiny-data"},
        },
    }
    cluster.plane.kubectl("apply", "-f", "-", input=json.dumps(volume))
    cluster.plane.kubectl("apply", "-n", cluster.default_namespace, "-f", str(CLAIM))


def _run_the_pods_command(pod: dict[str, Any], job_file: str, tmp_path: Path) -> tuple[int, str, Path]:
    """Run the Master pod's command with its environment here; (exit code, output, the directory of
    the ``data`` volume)."""
    job = load_job(EXAMPLE)
    spec = cluster_job(job).spec
    mounts = {volume.mount_path: tmp_path / f"volume-{volume.name}" for volume in volumes(spec)}
    config = tmp_path / JOB_FILE
    config.write_text(yaml.safe_dump(_on_this_machine(yaml.safe_load(job_file), mounts)))
    container = pods.container(pod, CONTAINER)
    command = [
        str(config) if arg == JOB_PATH else arg for arg in container["command"] + container.get("args", [])
    ]
    environment = pods.env(pod, CONTAINER)
    port = str(free_port())
    for name in ("MASTER_ADDR", "PET_MASTER_ADDR"):
        environment[name] = "127.0.0.1"
    for name in ("MASTER_PORT", "PET_MASTER_PORT"):
        environment[name] = port
    # The image's PATH finds python: here, this interpreter. The wrapper reports the largest
    # process's peak resident memory (kB), to hold against the pod's memory limit; one intra-op
    # thread, as the other pod tests: the machine's two cores are shared.
    peak = (
        "import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
        "print('peak rss kB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
        "sys.exit(code)"
    )
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    variables = {**os.environ, "PATH": path, "OMP_NUM_THREADS": "1", **environment}
    log = tmp_path / "master-0.out"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", peak, *command],
            env=variables,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = process.wait(TIMEOUT_SECONDS)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # a rank outlives a killed torchrun agent
            process.wait()
    return code, log.read_text(), mounts["/data"]


def _as_cri_log(output: str, path: Path) -> Path:
    """``output`` as the kubelet writes a container's log: ``<RFC3339Nano> stdout F <line>``."""
    at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    path.write_text("".join(f"{at} stdout F {line}\n" for line in output.splitlines()))
    return path


def _mlm_losses(output: str, phase: int) -> list[float]:
    return [float(v) for v in re.findall(rf"phase {phase}/2 step \d+/\d+ loss .*?\(mlm ([\d.]+)", output)]


def test_kubectl_logs_on_the_master_pod_shows_the_trainers_lines(
    cluster: RealCluster, tmp_path: Path
) -> None:
    assert cluster.plane is not None
    _claim_with_a_volume(cluster)
    cluster.plane.kubectl("apply", "-n", cluster.default_namespace, "-f", str(EXAMPLE))
    name = "bert-tiny-cluster"
    [master] = pods.running(cluster, pods.of_job(name), 1, "the Master pod running")
    child = cluster.object(PYTORCHJOBS, name)
    assert child is not None and list(child["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    [volume] = [v for v in master["spec"]["volumes"] if v["name"] == JOB_CONFIG_VOLUME]
    configmap = cluster.plane.kubectl.get(
        "configmap", volume["configMap"]["name"], "-n", cluster.default_namespace
    )
    assert configmap is not None
    assert any(m["mountPath"] == CONFIG_DIR for m in pods.container(master, CONTAINER)["volumeMounts"])

    code, output, data = _run_the_pods_command(master, configmap["data"][JOB_FILE], tmp_path)

    log = _as_cri_log(output, tmp_path / "master-0.log")
    logs = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Logs",
        "metadata": {"name": master["metadata"]["name"], "namespace": cluster.default_namespace},
        "spec": {"logs": [{"containers": [CONTAINER], "logsFile": str(log)}]},
    }
    cluster.plane.kubectl("apply", "-f", "-", input=json.dumps(logs))
    pods.end(cluster, master, code)

    plane, pod = cluster.plane, master["metadata"]["name"]

    def logs_shown() -> str | None:
        result = plane.kubectl("logs", pod, "-c", CONTAINER, "-n", cluster.default_namespace, check=False)
        return result.stdout if result.returncode == 0 and result.stdout else None

    shown = cluster.wait_for("kubectl logs to show the trainer's output", logs_shown)
    assert shown.splitlines() == output.splitlines()
    assert "\r" not in shown, "a carriage-return progress bar in kubectl logs"
    steps = [line for line in shown.splitlines() if re.match(r"phase \d/2 step \d+/\d+ loss ", line)]
    assert steps and all(" seq/s " in line for line in steps), "one line per logged step, with its rate"
    assert code == 0, output[-4000:]
    ended = cluster.wait_for(
        "the Master pod ended",
        lambda: (
            (p := pods.pods(cluster, pods.of_job(name))) and p[0]["status"]["phase"] == "Succeeded" and p[0]
        ),
    )
    [state] = ended["status"]["containerStatuses"]
    assert state["state"]["terminated"]["exitCode"] == code
    assert cluster.status_when(name, "Succeeded")

    # What the run itself must show: one process, the loss falling, the export, the memory.
    spec = cluster_job(load_job(EXAMPLE)).spec
    assert "world size 1" in output
    first, second = _mlm_losses(output, 1), _mlm_losses(output, 2)
    assert len(first) == spec.phases[0].steps // spec.logging.every_steps, output[-4000:]
    assert first[-1] < first[0] - 1.0, f"phase 1's masked-LM loss did not fall: {first}"
    assert second, output[-4000:]
    mounts = {"/data": data}
    export = Path(_on_this_machine(spec.export.path, mounts))
    for file in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json"):
        assert (export / file).is_file(), f"{file} is not in the export {export}"
    assert (Path(_on_this_machine(spec.logging.path, mounts)) / "train.jsonl").is_file()
    limit, problem = parse_quantity(spec.pod.resources.limits["memory"])
    assert limit is not None, problem
    rss = int(re.findall(r"peak rss kB (\d+)", output)[-1]) * 1024
    assert rss < limit / 2, f"a process of the pod peaked at {rss / 2**30:.2f} GiB, limit {limit / 2**30} GiB"
