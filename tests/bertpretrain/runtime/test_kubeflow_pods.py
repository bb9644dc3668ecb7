"""The rendered Kubeflow jobs' own commands, run on this machine with exactly the environment the
Kubeflow operators give their pods (:mod:`kubeflow_env`), every pod on 127.0.0.1:

- PyTorchJob: one pod running two ranks, and a Master and a Worker pod with one rank each;
- MPIJob: the Launcher's horovodrun (or mpirun) over a hostfile of localhost slots;
- elastic PyTorchJob: a rank killed mid-run is restarted, and the job resumes from its last
  checkpoint; without elasticity the job fails fast and says which rank died;
- DeepSpeed ZeRO: a PyTorchJob pod of 2 ranks (ZeRO-2, LAMB) that resumes bitwise, and the MPIJob
  Launcher's mpirun (ZeRO-1, AdamW) with the rendezvous address the launcher forwards.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bertjob.render import render
from bertjob_api.spec import parse_job
from bertjob_testing.jobs import small_training_job
from tests.kubeflow_env import (
    mpijob_discover_hosts,
    mpijob_hostfile,
    mpijob_launcher_command,
    pytorchjob_pod_command,
    pytorchjob_pod_env,
)

CONFIG_IN_POD = "/etc/bertjob/job.yaml"
# A rank that dies must end the whole non-elastic job within this many seconds.
FAIL_FAST_SECONDS = 60

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _job(tmp_path: Path, **spec: Any) -> tuple[dict[str, Any], Path]:
    """Render a small CPU job with ``spec`` fields; returns its child and the job file a pod
    would find at /etc/bertjob/job.yaml."""
    document = small_training_job(tmp_path)
    # In a pod, tmp_path would be a volume: the job writes its shards and checkpoints there.
    document["spec"]["volumes"] = [{"name": "work", "mountPath": str(tmp_path)}]
    document["spec"].update(spec)
    rendered = render(parse_job(document))
    config = tmp_path / "job.yaml"
    config.write_text(rendered[0]["data"]["job.yaml"])
    return rendered[-1], config


# The pods run as uid 10001; Open MPI refuses root (a CI container's user) unless told.
MPIRUN_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def _pod_env(variables: dict[str, str]) -> dict[str, str]:
    # The image's PATH finds torchrun, horovodrun and python: here, this interpreter's.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return {**os.environ, "PATH": path, "OMP_NUM_THREADS": "1", **MPIRUN_AS_ROOT, **variables}


def _in_pod(command: list[str], config: Path) -> list[str]:
    return [str(config) if arg == CONFIG_IN_POD else arg for arg in command]


class Pods:
    """Processes standing for pods, each in its own session so that a test can stop it whole."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.processes: list[subprocess.Popen[str]] = []

    def start(self, name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
        log = (self.tmp_path / f"{name}.log").open("w")
        process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        self.processes.append(process)
        return process

    def wait(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        return [process.wait(max(deadline - time.monotonic(), 0.1)) for process in self.processes]

    def output(self) -> str:
        return "".join(path.read_text() for path in sorted(self.tmp_path.glob("*.log")))

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[Pods]:
    started = Pods(tmp_path)
    yield started
    started.stop()


def _pytorchjob_pods(pods: Pods, job: dict[str, Any], config: Path) -> None:
    """Start every pod of the PyTorchJob ``job`` (Master and Workers), its rendezvous on a free port."""
    port = _free_port()
    for replica_type, replica in job["spec"]["pytorchReplicaSpecs"].items():
        for index in range(int(replica.get("replicas", 1))):
            env = pytorchjob_pod_env(job, replica_type, index, master_port=port)
            command = _in_pod(pytorchjob_pod_command(job, replica_type), config)
            pods.start(f"{replica_type.lower()}-{index}", command, _pod_env(env))


def _mlm_losses(output: str) -> list[float]:
    return [float(v) for v in re.findall(r"phase 1/2 step \d+/\d+ .*?\(mlm ([\d.]+)", output)]


@pytest.mark.parametrize(
    ("nodes", "processes", "replicas"),
    [(1, 2, ["Master"]), (2, 1, ["Master", "Worker"])],
    ids=["one-pod-two-processes", "master-and-worker"],
)
def test_pytorchjob_pods_train_together(
    tmp_path: Path, pods: Pods, nodes: int, processes: int, replicas: list[str]
) -> None:
    job, config = _job(tmp_path, topology={"nodes": nodes, "processesPerNode": processes})
    assert sorted(job["spec"]["pytorchReplicaSpecs"]) == replicas
    _pytorchjob_pods(pods, job, config)
    codes = pods.wait(timeout=300)
    output = pods.output()
    assert codes == [0] * nodes, output[-4000:]
    assert "world: started by torchrun, rank 0 of 2" in output
    assert "world: started by torchrun, rank 1 of 2" in output
    losses = _mlm_losses(output)
    assert len(losses) == 6 and losses[-1] < losses[0], output
    assert (tmp_path / "checkpoints" / "phase2" / "step_000004.pt").exists()
    assert (tmp_path / "checkpoints" / "hf" / "model.safetensors").exists()


def _mpijob_launcher(pods: Pods, tmp_path: Path, command: str) -> None:
    job, config = _job(
        tmp_path, launcher="mpijob", topology={"nodes": 2, "processesPerNode": 1}, mpi={"command": command}
    )
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(mpijob_hostfile(job))
    launcher = _in_pod(mpijob_launcher_command(job, str(hostfile)), config)
    assert launcher[4:6] == [command, "-np"] and launcher[6] == "2"
    pods.start("launcher", launcher, _pod_env({"BERTJOB_NAME": "demo", "BERTJOB_NAMESPACE": "default"}))


@pytest.mark.parametrize("command", ["horovodrun", "mpirun"])
def test_mpijob_launcher_trains_over_the_hostfile(tmp_path: Path, pods: Pods, command: str) -> None:
    hvd = pytest.importorskip("horovod.torch", reason="horovod is not installed (make test builds it)")
    if command == "mpirun" and (shutil.which("mpirun") is None or not hvd.mpi_built()):
        pytest.skip("Open MPI is not installed, or horovod was built without MPI")
    _mpijob_launcher(pods, tmp_path, command)
    codes = pods.wait(timeout=300)
    output = pods.output()
    assert codes == [0], output[-4000:]
    # horovodrun starts its ranks through mpirun when Horovod has MPI, else itself (Gloo).
    launchers = "mpirun" if command == "mpirun" else "horovodrun|mpirun"
    for rank in range(2):
        assert re.search(rf"world: started by ({launchers}), rank {rank} of 2", output), output[-4000:]
    assert "Horovod 0.28.1" in output
    losses = _mlm_losses(output)
    assert len(losses) == 6 and losses[-1] < losses[0], output
    assert (tmp_path / "checkpoints" / "hf" / "model.safetensors").exists()


def _trainers(pid: int) -> list[int]:
    """The trainer processes (``bertpretrain run``) among the descendants of ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError):
            continue
    descendants, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - descendants
        descendants |= frontier
    found = []
    for child in sorted(descendants):
        try:
            command = (Path("/proc") / str(child) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"bertpretrain" in command and b"run" in command:
            found.append(child)
    return found


def _long_phase(tmp_path: Path) -> dict[str, Any]:
    """Spec fields for a job whose first phase runs long enough to be interrupted after its
    first checkpoint (step 20)."""
    document = small_training_job(tmp_path)
    phases = document["spec"]["phases"]
    phases[0]["steps"] = 300
    return {
        "phases": phases,
        "checkpoint": {**document["spec"]["checkpoint"], "everySteps": 20},
        "distributed": {"timeoutSeconds": 30},
    }


def _kill_a_rank_after_first_checkpoint(pods: Pods, tmp_path: Path) -> float:
    """SIGKILL one trainer process under the last pod's launcher (torchrun, horovodrun) once step
    20 is saved; returns the time of the kill."""
    first = tmp_path / "checkpoints" / "phase1" / "step_000020.pt"
    agent = pods.processes[-1]
    deadline = time.monotonic() + 240
    while not first.exists():
        assert time.monotonic() < deadline and agent.poll() is None, pods.output()[-4000:]
        time.sleep(0.05)
    os.kill(_trainers(agent.pid)[-1], signal.SIGKILL)
    return time.monotonic()


def test_elastic_pytorchjob_restarts_a_killed_rank_and_resumes(tmp_path: Path, pods: Pods) -> None:
    job, config = _job(
        tmp_path,
        topology={"nodes": 2, "processesPerNode": 1},
        elastic={"minNodes": 1, "maxNodes": 2, "maxRestarts": 1},
        **_long_phase(tmp_path),
    )
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Worker"]
    _pytorchjob_pods(pods, job, config)
    _kill_a_rank_after_first_checkpoint(pods, tmp_path)
    codes = pods.wait(timeout=300)
    output = pods.output()
    assert codes == [0, 0], output[-4000:]
    resumed = re.findall(r"from \S+/phase1/step_(\d+)\.pt at step (\d+)", output)
    assert resumed and int(resumed[0][1]) >= 20, output[-4000:]
    assert "phase 1/2 step 300/300" in output
    assert (tmp_path / "checkpoints" / "hf" / "model.safetensors").exists()


def test_elastic_mpijob_resets_after_a_rank_dies_and_resumes(tmp_path: Path, pods: Pods) -> None:
    pytest.importorskip("horovod.torch", reason="horovod is not installed (make test builds it)")
    job, config = _job(
        tmp_path,
        launcher="mpijob",
        mpi={"command": "horovodrun"},
        topology={"nodes": 2, "processesPerNode": 1},
        elastic={"minNodes": 1, "maxNodes": 2, "maxRestarts": 3},
        **_long_phase(tmp_path),
    )
    discover = tmp_path / "discover_hosts.sh"
    discover.write_text(mpijob_discover_hosts(job))
    discover.chmod(0o755)
    launcher = _in_pod(mpijob_launcher_command(job, str(tmp_path / "hostfile"), str(discover)), config)
    pods.start("launcher", launcher, _pod_env({}))
    _kill_a_rank_after_first_checkpoint(pods, tmp_path)
    codes = pods.wait(timeout=300)
    output = pods.output()
    assert codes == [0], output[-4000:]
    resumed = re.findall(r"from \S+/phase1/step_(\d+)\.pt at step (\d+)", output)
    assert resumed and int(resumed[0][1]) >= 20, output[-4000:]
    assert "phase 1/2 step 300/300" in output


def test_pytorchjob_without_elasticity_fails_fast_when_a_rank_dies(tmp_path: Path, pods: Pods) -> None:
    job, config = _job(tmp_path, topology={"nodes": 2, "processesPerNode": 1}, **_long_phase(tmp_path))
    _pytorchjob_pods(pods, job, config)
    killed = _kill_a_rank_after_first_checkpoint(pods, tmp_path)
    codes = pods.wait(timeout=FAIL_FAST_SECONDS)
    assert time.monotonic() - killed < FAIL_FAST_SECONDS
    output = pods.output()
    assert all(code != 0 for code in codes), output[-4000:]
    # torchrun's summary names the rank that died and how.
    assert re.search(r"Signal 9 \(SIGKILL\) received by PID \d+", output), output[-4000:]
    assert not (tmp_path / "checkpoints" / "phase1" / "step_000300.pt").exists()


def _checkpoint_equal(a: Path, b: Path) -> None:
    """The model weights and every rank's ZeRO optimizer shard of two checkpoints are bitwise equal."""
    import torch

    first, second = (torch.load(path, weights_only=True) for path in (a, b))
    for name, tensor in first["model"].items():
        assert torch.equal(tensor, second["model"][name]), name
    shards = [checkpoint["optimizer"]["zero"]["ranks"] for checkpoint in (first, second)]
    assert len(shards[0]) == len(shards[1]) == 2
    for mine, theirs in zip(*shards, strict=True):
        for ours, other in zip(mine["fp32"], theirs["fp32"], strict=True):
            assert torch.equal(ours, other)
        for key, state in mine["optimizer"]["state"].items():
            for name, value in state.items():
                assert torch.equal(value, theirs["optimizer"]["state"][key][name]), (key, name)


def test_pytorchjob_pod_trains_with_deepspeed_and_resumes_bitwise(tmp_path: Path, pods: Pods) -> None:
    """One PyTorchJob pod of 2 ranks with ZeRO-2 and LAMB trains both phases and exports; then,
    its last phase-1 checkpoint and everything after it removed, the job run again resumes from
    step 20 and writes a step-30 checkpoint bitwise equal to the first run's."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (the 'deepspeed' extra)")
    job, config = _job(
        tmp_path,
        topology={"nodes": 1, "processesPerNode": 2},
        distributed={"deepspeed": {"zeroStage": 2}},
    )
    _pytorchjob_pods(pods, job, config)
    codes = pods.wait(timeout=300)
    output = pods.output()
    assert codes == [0], output[-4000:]
    assert re.search(r"DeepSpeed \d+\.\d+\.\d+ ZeRO stage 2", output), output[-4000:]
    assert len(_mlm_losses(output)) == 6
    checkpoints = tmp_path / "checkpoints"
    assert (checkpoints / "hf" / "model.safetensors").exists()

    first = tmp_path / "first_step_000030.pt"
    shutil.move(checkpoints / "phase1" / "step_000030.pt", first)
    shutil.rmtree(checkpoints / "phase2")
    shutil.rmtree(checkpoints / "hf")
    for log in tmp_path.glob("*.log"):
        log.unlink()
    rerun = Pods(tmp_path)
    try:
        _pytorchjob_pods(rerun, job, config)
        codes = rerun.wait(timeout=300)
    finally:
        rerun.stop()
    output = rerun.output()
    assert codes == [0], output[-4000:]
    assert "at step 20" in output, output[-4000:]
    _checkpoint_equal(first, checkpoints / "phase1" / "step_000030.pt")
    assert (checkpoints / "hf" / "model.safetensors").exists()


def test_mpijob_mpirun_trains_with_deepspeed(tmp_path: Path, pods: Pods) -> None:
    """The MPIJob Launcher's mpirun with DeepSpeed ZeRO-1 and AdamW: the ranks take their world
    from Open MPI and meet at the MASTER_ADDR/MASTER_PORT mpirun gives them (the first Worker's
    name in a real job; 127.0.0.1 here, as the hostfile's Workers are)."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (the 'deepspeed' extra)")
    if shutil.which("mpirun") is None:
        pytest.skip("Open MPI is not installed")
    job, config = _job(
        tmp_path,
        launcher="mpijob",
        topology={"nodes": 2, "processesPerNode": 1},
        mpi={"command": "mpirun"},
        optimizer={"name": "adamw"},
        distributed={"deepspeed": {"zeroStage": 1}},
    )
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(mpijob_hostfile(job))
    launcher = _in_pod(mpijob_launcher_command(job, str(hostfile)), config)
    assert "MASTER_ADDR=demo-worker-0.demo.default.svc" in launcher
    local = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    launcher = [
        f"{name}={local[name]}" if "=" in arg and (name := arg.split("=", 1)[0]) in local else arg
        for arg in launcher
    ]
    pods.start("launcher", launcher, _pod_env({"BERTJOB_NAME": "demo", "BERTJOB_NAMESPACE": "default"}))
    codes = pods.wait(timeout=300)
    output = pods.output()
    assert codes == [0], output[-4000:]
    for rank in range(2):
        assert f"world: started by mpirun, rank {rank} of 2" in output, output[-4000:]
    assert re.search(r"DeepSpeed \d+\.\d+\.\d+ ZeRO stage 1", output), output[-4000:]
    losses = _mlm_losses(output)
    assert len(losses) == 6 and losses[-1] < losses[0], output
    assert (tmp_path / "checkpoints" / "hf" / "model.safetensors").exists()
