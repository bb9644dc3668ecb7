"""examples/bert-tiny-cluster.yaml, the job any cluster accepts, trained to an export by its own pod
command: the operator's rendering of the file exactly as written, the Master pod's command run on
this machine with the environment the training operator gives it (:mod:`tests.kubeflow_env`), and
each of the job's volumes a directory here (its ``mountPath`` mapped in the job file the pod reads).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from bertjob.render import render
from bertjob_api.defaults import volumes
from bertjob_api.jobfile import load_job
from bertjob_api.kubenames import parse_quantity
from bertjob_api.validation import cluster_job
from bertjob_testing.jobs import EXAMPLES
from tests.kubeflow_env import pytorchjob_pod_command, pytorchjob_pod_env

EXAMPLE = EXAMPLES / "bert-tiny-cluster.yaml"
CONFIG_IN_POD = "/etc/bertjob/job.yaml"
# The whole job, data stage included, took 38 s here on 2 cores shared with other work (load
# average 3.5), and 132 s at load 7 in an earlier, twice as long version; the limit leaves room
# for a busier machine within pytest's own 600 s.
TIMEOUT_SECONDS = 420

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


def _stop(pod: subprocess.Popen[bytes]) -> None:
    """Kill every process left in the pod's session: a rank outlives a killed torchrun agent."""
    try:
        os.killpg(pod.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    pod.wait()


def _mlm_losses(output: str, phase: int) -> list[float]:
    return [float(v) for v in re.findall(rf"phase {phase}/2 step \d+/\d+ loss .*?\(mlm ([\d.]+)", output)]


def test_the_small_cluster_example_trains_to_an_export_in_its_pod(tmp_path: Path) -> None:
    job = load_job(EXAMPLE)
    spec = cluster_job(job).spec  # with the operator's defaults: the export and logs paths
    configmap, *_, child = render(job)
    assert child["kind"] == "PyTorchJob" and list(child["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    mounts = {volume.mount_path: tmp_path / f"volume-{volume.name}" for volume in volumes(spec)}
    document = yaml.safe_load(configmap["data"]["job.yaml"])
    in_pod = {spec.data.shards, spec.checkpoint.path, spec.export.path, spec.logging.path}
    assert all(path is not None and path.startswith("/data/") for path in in_pod), in_pod
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(_on_this_machine(document, mounts)))
    assert not re.search(r"(?m)[ '\"]/data\b", config.read_text()), (
        "a path in the job file is still the pod's"
    )

    env = pytorchjob_pod_env(child, "Master", 0, master_port=_free_port())
    command = [
        str(config) if arg == CONFIG_IN_POD else arg for arg in pytorchjob_pod_command(child, "Master")
    ]
    # The image's PATH finds python: here, this interpreter. The wrapper reports the largest
    # process's peak resident memory (kB), to hold against the pod's memory limit.
    peak = (
        "import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
        "print('peak rss kB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)"
    )
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    # One intra-op thread, as in the other pod tests: the CI machine's two cores are shared, and with
    # two threads contending with other processes this job trained at 6 sequences/s here.
    variables = {**os.environ, "PATH": path, "OMP_NUM_THREADS": "1", **env}
    log = tmp_path / "master-0.log"
    with log.open("w") as out:
        pod = subprocess.Popen(
            [sys.executable, "-c", peak, *command],
            env=variables,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # so that a timeout stops the whole pod, torchrun's agent and rank
        )
        try:
            code = pod.wait(TIMEOUT_SECONDS)
        finally:
            _stop(pod)
    output = log.read_text()

    assert code == 0, output[-4000:]
    assert "world size 1" in output
    first, second = _mlm_losses(output, 1), _mlm_losses(output, 2)
    assert len(first) == spec.phases[0].steps // spec.logging.every_steps, output[-4000:]
    assert first[-1] < first[0] - 1.0, f"phase 1's masked-LM loss did not fall: {first}"
    assert second, output[-4000:]
    export = _on_this_machine(spec.export.path, mounts)
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json"):
        assert (Path(export) / name).is_file(), f"{name} is not in the export {export}"
    assert (Path(_on_this_machine(spec.logging.path, mounts)) / "train.jsonl").is_file()
    limit, problem = parse_quantity(spec.pod.resources.limits["memory"])
    assert limit is not None, problem
    # The limit holds for all the pod's processes together: one of them may take half of it.
    rss = int(re.findall(r"peak rss kB (\d+)", output)[-1]) * 1024
    assert rss < limit / 2, f"a process of the pod peaked at {rss / 2**30:.2f} GiB, limit {limit / 2**30} GiB"
