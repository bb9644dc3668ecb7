"""An MPIJob Launcher preempted mid-phase keeps its work: the rendered Launcher line (mpirun under
``bertpretrain.mpilaunch``, each rank's trainer under ``--rank``) with 2 ranks of the real trainer,
started on another address through the ssh stand-in as on Worker pods, gets SIGTERM after the first
checkpoint; every rank checkpoints and exits 143, the Launcher exits 143; started again, the job
resumes from that checkpoint and ends bit-exact with a run that was never interrupted. The same
SIGTERM stops every rank with 143 under the MPIJob's horovodrun (over MPI) and the launcher of the
chart's MPI TrainingRuntime."""

from __future__ import annotations

import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from bertjob_testing.jobs import small_training_job
from bertpretrain.mpilaunch import SIGKILL_TIMEOUT_ENV, report_line
from tests.bertpretrain.runtime.test_kubeflow_pods import Pods, _in_pod, _job, _pod_env
from tests.bertpretrain.runtime.test_trainjob_pods import (  # noqa: F401 (runtimes: a fixture)
    NODE_HOST,
    SSH_STAND_IN,
    _mpi_launcher,
    runtimes,
)
from tests.kubeflow_env import mpijob_discover_hosts, mpijob_hostfile, mpijob_launcher_command

pytestmark = pytest.mark.slow

PHASE_1_STEPS, EVERY_STEPS = 60, 10


def _mpi_or_skip() -> None:
    hvd = pytest.importorskip("horovod.torch", reason="horovod is not installed (make test builds it)")
    if shutil.which("mpirun") is None or not hvd.mpi_built():
        pytest.skip("Open MPI is not installed, or horovod was built without MPI")


def _launcher(tmp_path: Path) -> tuple[list[str], dict[str, str], Path]:
    """The Launcher's command and environment of a 2 x 1 MPIJob (mpirun), and its checkpoints."""
    checkpoints = tmp_path / "checkpoints"
    job, config = _job(
        tmp_path,
        launcher="mpijob",
        mpi={"command": "mpirun"},
        topology={"nodes": 2, "processesPerNode": 1},
        **_long_phases(tmp_path),
    )
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"{NODE_HOST} slots=2\n")
    ssh = tmp_path / "ssh"
    ssh.write_text(SSH_STAND_IN)
    ssh.chmod(0o755)
    env = {
        "BERTJOB_NAME": "demo",
        "BERTJOB_NAMESPACE": "default",
        "OMPI_MCA_plm_rsh_agent": str(ssh),
        # mpirun stops the ranks still running 2 x 3 s after the first one exits (default 10 s).
        SIGKILL_TIMEOUT_ENV: "3",
    }
    return _in_pod(mpijob_launcher_command(job, str(hostfile)), config), _pod_env(env), checkpoints


def _long_phases(tmp_path: Path) -> dict[str, Any]:
    """Spec fields: a first phase of :data:`PHASE_1_STEPS` steps, a checkpoint every
    :data:`EVERY_STEPS`, one thread per rank."""
    document = small_training_job(tmp_path)
    phases = document["spec"]["phases"]
    phases[0]["steps"] = PHASE_1_STEPS
    return {
        "phases": phases,
        "checkpoint": {"path": str(tmp_path / "checkpoints"), "everySteps": EVERY_STEPS, "keep": 10},
        # One thread in every rank (forwarded by mpirun -x): the same sums in every run.
        "pod": {"env": [{"name": "OMP_NUM_THREADS", "value": "1"}]},
    }


def _sigterm_after_first_checkpoint(
    pods: Pods, command: list[str], env: dict[str, str], checkpoints: Path, launcher_code: int = 143
) -> tuple[int, str, int]:
    """Start the Launcher, SIGTERM it once the first checkpoint is written; its exit code, the
    pods' output, and the step after which every rank stopped. ``launcher_code``: what mpirun or
    horovodrun itself exits with."""
    try:
        launcher = pods.start("launcher", command, env)
        first = checkpoints / "phase1" / f"step_{EVERY_STEPS:06d}.pt"
        deadline = time.monotonic() + 180
        while not first.exists():
            assert launcher.poll() is None and time.monotonic() < deadline, pods.output()[-4000:]
            time.sleep(0.02)
        launcher.send_signal(signal.SIGTERM)
        [code] = pods.wait(timeout=120)
    finally:
        pods.stop()
    output = pods.output()
    assert code == 143, output[-4000:]
    for rank in range(2):
        assert report_line(rank, 143) in output, output[-4000:]
    # mpirun (under horovodrun, the shell it runs mpirun in) lived to pass the ranks' code on.
    assert re.search(rf"mpilaunch: (mpirun|horovodrun) exited with {launcher_code},", output), output[-4000:]
    # Every rank stops after the same step (they agree on it), and rank 0 saved it.
    [stopped] = set(re.findall(r"stopped after step (\d+)", output)) or {"0"}
    assert EVERY_STEPS <= int(stopped) < PHASE_1_STEPS, output[-4000:]
    assert (checkpoints / "phase1" / f"step_{int(stopped):06d}.pt").exists()
    return code, output, int(stopped)


def _pods(tmp_path: Path, name: str) -> Pods:
    """Pods whose logs go to their own directory (``<name>-logs``)."""
    logs = tmp_path / f"{name}-logs"
    logs.mkdir(exist_ok=True)
    return Pods(logs)


def _run(tmp_path: Path, name: str, command: list[str], env: dict[str, str]) -> tuple[int, str]:
    pods = _pods(tmp_path, name)
    try:
        pods.start("launcher", command, env)
        [code] = pods.wait(timeout=240)
    finally:
        pods.stop()
    return code, pods.output()


def _weights(checkpoints: Path) -> dict[str, Any]:
    return {
        "export": load_file(checkpoints / "hf" / "model.safetensors"),
        "phase 1": torch.load(checkpoints / "phase1" / f"step_{PHASE_1_STEPS:06d}.pt", weights_only=True)[
            "model"
        ],
    }


def test_a_preempted_mpijob_checkpoints_on_every_rank_and_resumes_bit_exact(tmp_path: Path) -> None:
    """The job run through once, its checkpoints kept aside; then run again from nothing, SIGTERMed
    after its first checkpoint, and started again."""
    _mpi_or_skip()
    command, env, checkpoints = _launcher(tmp_path)
    code, output = _run(tmp_path, "reference", command, env)
    assert code == 0, output[-4000:]
    reference = checkpoints.rename(tmp_path / "reference")

    _, _, stopped = _sigterm_after_first_checkpoint(_pods(tmp_path, "preempted"), command, env, checkpoints)

    code, output = _run(tmp_path, "resumed", command, env)
    assert code == 0, output[-4000:]
    assert f"at step {stopped}" in output, output[-4000:]
    for part, tensors in _weights(checkpoints).items():
        expected = _weights(reference)[part]
        assert tensors.keys() == expected.keys()
        for name, tensor in tensors.items():
            assert torch.equal(tensor, expected[name]), f"{part}: {name}"


def test_sigterm_stops_every_rank_of_an_mpijob_under_horovodrun(tmp_path: Path) -> None:
    """horovodrun over MPI (the ranks on localhost: horovodrun reaches other hosts by its own ssh)."""
    _mpi_or_skip()
    job, config = _job(
        tmp_path,
        launcher="mpijob",
        mpi={"command": "horovodrun"},
        topology={"nodes": 2, "processesPerNode": 1},
        **_long_phases(tmp_path),
    )
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(mpijob_hostfile(job))
    command = _in_pod(mpijob_launcher_command(job, str(hostfile)), config)
    assert "horovodrun" in command
    env = _pod_env({"BERTJOB_NAME": "demo", "BERTJOB_NAMESPACE": "default", SIGKILL_TIMEOUT_ENV: "3"})
    _sigterm_after_first_checkpoint(_pods(tmp_path, "launcher"), command, env, tmp_path / "checkpoints")


def test_sigterm_stops_every_rank_of_the_trainjob_mpi_runtimes_launcher(
    tmp_path: Path,
    runtimes: dict[str, dict[str, Any]],  # noqa: F811 (the fixture imported above)
) -> None:
    """The launcher line of the chart's bertjob-mpi ClusterTrainingRuntime, as helm renders it."""
    _mpi_or_skip()
    _, command, env = _mpi_launcher(tmp_path, runtimes, **_long_phases(tmp_path))
    assert command[:4] == ["python", "-m", "bertpretrain.mpilaunch", "--"]
    env = _pod_env({**env, SIGKILL_TIMEOUT_ENV: "3"})
    _sigterm_after_first_checkpoint(_pods(tmp_path, "launcher"), command, env, tmp_path / "checkpoints")


def test_sigterm_stops_every_rank_of_an_elastic_mpijob(tmp_path: Path) -> None:
    """Elastic horovodrun (Gloo) passes the SIGTERM on itself, and exits 0 or 1 whatever the ranks
    did: the Launcher still exits 143."""
    _mpi_or_skip()
    job, config = _job(
        tmp_path,
        launcher="mpijob",
        mpi={"command": "horovodrun"},
        topology={"nodes": 2, "processesPerNode": 1},
        elastic={"minNodes": 1, "maxNodes": 2, "maxRestarts": 3},
        **_long_phases(tmp_path),
    )
    discover = tmp_path / "discover_hosts.sh"
    discover.write_text(mpijob_discover_hosts(job))
    discover.chmod(0o755)
    command = _in_pod(mpijob_launcher_command(job, str(tmp_path / "hostfile"), str(discover)), config)
    assert "--host-discovery-script" in command
    env = _pod_env({"BERTJOB_NAME": "demo", "BERTJOB_NAMESPACE": "default"})
    checkpoints = tmp_path / "checkpoints"
    _sigterm_after_first_checkpoint(_pods(tmp_path, "launcher"), command, env, checkpoints, launcher_code=1)
