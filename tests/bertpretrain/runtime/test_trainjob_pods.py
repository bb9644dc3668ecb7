"""The rendered TrainJob's pods, run on this machine with exactly the environment Kubeflow Trainer v2
gives them on the chart's ClusterTrainingRuntimes (:mod:`kubeflow_env`), every pod on 127.0.0.1:

- torch policy: two node pods of one process each, whose torchrun meet at the first one;
- MPI policy: the launcher's mpirun over the hostfile, starting the ranks through an ssh stand-in
  that, as a node pod's sshd does, gives them a clean environment: they see only what mpirun
  forwards (``OMPI_MCA_mca_base_env_list``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.bertpretrain.runtime.test_kubeflow_pods import (
    Pods,
    _free_port,
    _in_pod,
    _job,
    _mlm_losses,
    _pod_env,
)
from tests.helm_chart import CHART, RELEASE, helm_or_skip
from tests.kubeflow_env import (
    trainjob_mpi_hostfile,
    trainjob_mpi_launcher_command,
    trainjob_mpi_launcher_env,
    trainjob_node_command,
    trainjob_node_env,
)

pytestmark = pytest.mark.slow

# Open MPI starts its daemon on a host that is none of this machine's addresses through the rsh
# agent (here, the ssh stand-in), as it does on a real job's node pods; a loopback address still
# reaches this machine.
NODE_HOST = "127.0.0.2"
# What a node pod's sshd gives a command: the image's PATH and the user's HOME, nothing of the
# launcher's environment. Options (-o ConnectionAttempts=10, ...) and the host name are dropped.
SSH_STAND_IN = """#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -o) shift 2;; -*) shift;; *) break;; esac; done
shift
exec env -i PATH="$PATH" HOME="$HOME" /bin/sh -c "$*"
"""
PROBE = "BERTJOB_PROBE"


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[Pods]:
    started = Pods(tmp_path)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def runtimes() -> dict[str, dict[str, Any]]:
    """The chart's ClusterTrainingRuntimes, by name, as the real helm renders them."""
    helm = helm_or_skip()
    rendered = subprocess.run(
        [helm, "template", RELEASE, str(CHART), "--set", "trainingRuntimes.install=true"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {
        obj["metadata"]["name"]: obj
        for obj in yaml.safe_load_all(rendered)
        if obj and obj["kind"] == "ClusterTrainingRuntime"
    }


def _runtime(job: dict[str, Any], runtimes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    assert job["kind"] == "TrainJob"
    ref = job["spec"]["runtimeRef"]
    assert ref["kind"] == "ClusterTrainingRuntime"
    return runtimes[ref["name"]]


def test_trainjob_torch_nodes_train_together(
    tmp_path: Path, pods: Pods, runtimes: dict[str, dict[str, Any]]
) -> None:
    job, config = _job(tmp_path, launcher="trainjob", topology={"nodes": 2, "processesPerNode": 1})
    runtime = _runtime(job, runtimes)
    port = _free_port()
    for rank in range(2):
        env = trainjob_node_env(job, runtime, rank, master_port=port)
        command = _in_pod(trainjob_node_command(job, runtime), config)
        pods.start(f"node-{rank}", command, _pod_env(env))
    codes = pods.wait(timeout=180)
    output = pods.output()
    assert codes == [0, 0], output[-4000:]
    assert "world: started by torchrun, rank 0 of 2" in output
    assert "world: started by torchrun, rank 1 of 2" in output
    losses = _mlm_losses(output)
    assert len(losses) == 6 and losses[-1] < losses[0], output
    export = tmp_path / "checkpoints" / "hf"
    assert (export / "config.json").exists() and (export / "model.safetensors").exists()


def _mpi_or_skip() -> None:
    hvd = pytest.importorskip("horovod.torch", reason="horovod is not installed (make test builds it)")
    if shutil.which("mpirun") is None or not hvd.mpi_built():
        pytest.skip("Open MPI is not installed, or horovod was built without MPI")


def _mpi_launcher(
    tmp_path: Path, runtimes: dict[str, dict[str, Any]], **spec: Any
) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """An MPI-policy TrainJob of 2 nodes x 1 process with ``spec`` fields: the TrainJob, the
    launcher's command line and its environment, its hostfile and ssh stand-in in ``tmp_path``."""
    job, config = _job(
        tmp_path,
        launcher="trainjob",
        trainJob={"mlPolicy": "mpi"},
        topology={"nodes": 2, "processesPerNode": 1},
        **spec,
    )
    runtime = _runtime(job, runtimes)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(trainjob_mpi_hostfile(job, runtime, host=NODE_HOST))
    ssh = tmp_path / "ssh"
    ssh.write_text(SSH_STAND_IN)
    ssh.chmod(0o755)
    env = trainjob_mpi_launcher_env(job, runtime, str(hostfile))
    env["OMPI_MCA_plm_rsh_agent"] = str(ssh)
    # The downward API's values, which the kubelet puts in (Open MPI stops forwarding at the first
    # listed variable missing from mpirun's environment).
    env.update(BERTJOB_NAME="demo", BERTJOB_NAMESPACE="default")
    return job, _in_pod(trainjob_mpi_launcher_command(job, runtime, str(hostfile)), config), env


def test_trainjob_mpi_launcher_trains_over_the_hostfile(
    tmp_path: Path, pods: Pods, runtimes: dict[str, dict[str, Any]]
) -> None:
    _mpi_or_skip()
    _, launcher, env = _mpi_launcher(tmp_path, runtimes)
    assert launcher[4:7] == ["mpirun", "--hostfile", str(tmp_path / "hostfile")] and "-np" not in launcher
    pods.start("launcher", launcher, _pod_env(env))
    codes = pods.wait(timeout=180)
    output = pods.output()
    assert codes == [0], output[-4000:]
    for rank in range(2):
        assert f"world: started by mpirun, rank {rank} of 2" in output, output[-4000:]
    assert "Horovod 0.28.1" in output
    losses = _mlm_losses(output)
    assert len(losses) == 6 and losses[-1] < losses[0], output
    export = tmp_path / "checkpoints" / "hf"
    assert (export / "config.json").exists() and (export / "model.safetensors").exists()


def _ranks_env(tmp_path: Path, launcher: list[str], env: dict[str, str]) -> list[dict[str, str]]:
    """Each rank's environment when the launcher's mpirun, with its own options and ``env``,
    starts a probe instead of the trainer."""
    mpirun = launcher[launcher.index("mpirun") : launcher.index("python", launcher.index("mpirun"))]
    # Each rank writes a file of its own: mpirun forwards the ranks' output in chunks, and two
    # long lines printed at once came out interleaved on a loaded machine.
    write = "import json, os; open(f'env-{os.getpid()}.json', 'w').write(json.dumps(dict(os.environ)))"
    done = subprocess.run(
        [*mpirun, sys.executable, "-c", write],
        env=_pod_env(env),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    return [json.loads(path.read_text()) for path in sorted(tmp_path.glob("env-*.json"))]


def _probe_job(
    tmp_path: Path, runtimes: dict[str, dict[str, Any]]
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """The launcher of a job whose ``spec.pod.env`` sets ``BERTJOB_PROBE``: its command line, its
    environment (Trainer v2's), and the TrainJob trainer's variables as the kubelet resolves them."""
    job, launcher, env = _mpi_launcher(
        tmp_path, runtimes, pod={"env": [{"name": PROBE, "value": "forwarded"}]}
    )
    trainer = {var["name"]: var["value"] for var in job["spec"]["trainer"]["env"] if "value" in var}
    # The downward API's values, which the kubelet would put in (Open MPI stops forwarding at the
    # first listed variable missing from mpirun's environment).
    trainer.update(BERTJOB_NAME="demo", BERTJOB_NAMESPACE="default")
    assert PROBE in trainer["OMPI_MCA_mca_base_env_list"].split(";")
    return launcher, env, trainer


def test_open_mpi_forwards_the_trainjob_list_to_ranks_started_over_ssh(
    tmp_path: Path, runtimes: dict[str, dict[str, Any]]
) -> None:
    """With the TrainJob trainer's variables in the launcher's environment, mpirun gives the ranks
    (started over ssh, in a clean environment) those ``OMPI_MCA_mca_base_env_list`` names, and
    not the launcher's others."""
    _mpi_or_skip()
    launcher, env, trainer = _probe_job(tmp_path, runtimes)
    ranks = _ranks_env(tmp_path, launcher, {**env, **trainer, "BERTJOB_UNLISTED": "kept back"})
    assert sorted(rank["OMPI_COMM_WORLD_RANK"] for rank in ranks) == ["0", "1"]
    for rank in ranks:
        assert rank.get(PROBE) == "forwarded"
        assert (rank.get("BERTJOB_NAME"), rank.get("BERTJOB_NAMESPACE")) == ("demo", "default")
        assert "BERTJOB_UNLISTED" not in rank


def test_trainjob_mpi_ranks_get_the_job_variables(
    tmp_path: Path, runtimes: dict[str, dict[str, Any]]
) -> None:
    """The launcher's environment as Trainer v2 gives it (the runtime's, and the operator's runtime
    patch of the launcher container, which Trainer v2 gives no trainer env): the ranks see
    ``spec.pod.env``."""
    _mpi_or_skip()
    launcher, env, _ = _probe_job(tmp_path, runtimes)
    ranks = _ranks_env(tmp_path, launcher, env)
    assert len(ranks) == 2
    assert all(rank.get(PROBE) == "forwarded" for rank in ranks)
