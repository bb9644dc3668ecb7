"""The Xeon trainer image running the rendered Kubeflow pods' own commands, as the image's user.

tests/bertpretrain/runtime/test_kubeflow_pods.py runs the same commands from the source tree; here they run
inside the built image (``buildah run``: the image's user, PATH and environment, the host's
network), with the environment the Kubeflow operators give the pods (:mod:`kubeflow_env`) and a
host directory at each of the pod's volume mounts: the job file at /etc/bertjob/job.yaml
(read-only, as its ConfigMap), the job's own volume where its corpus, shards and checkpoints are.

- PyTorchJob: the Master pod's torchrun with two ranks trains a tiny job to a Hugging Face export,
  and writes nothing in the container's root filesystem outside the pod's volumes.
- MPIJob: the Launcher's horovodrun over mpi-operator's hostfile with every slot on localhost (the
  Workers' volumes mounted in the same container, since their ranks run there).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from bertjob.render import render
from bertjob_api.spec import parse_job
from bertjob_testing.jobs import small_training_job
from bertjob_testing.kube_emulator import free_port
from tests.images.buildah_images import (
    BUILD_TIMEOUT_S,
    Buildah,
    Built,
    Container,
    Mount,
    snapshot,
    volume_dir,
    written_outside,
)
from tests.kubeflow_env import (
    MPI_HOSTFILE,
    mpijob_discover_hosts,
    mpijob_hostfile,
    mpijob_launcher_command,
    pytorchjob_pod_command,
    pytorchjob_pod_env,
)

# The first test waits for the session's image builds.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(BUILD_TIMEOUT_S + 600)]

JOB_FILE = "/etc/bertjob/job.yaml"
# The job's own volume (spec.volumes), mounted from the host directory that holds its corpus.
WORK_VOLUME = "work"
TRAIN_TIMEOUT_S = 300
# Two ranks on two cores: one thread each, as the source-tree pod tests run them.
THREADS = {"OMP_NUM_THREADS": "1"}


def _job(work: Path, **spec: Any) -> tuple[dict[str, Any], str]:
    """A tiny CPU job whose corpus, shards and checkpoints are in ``work``, the job's own volume;
    its rendered child and its job file."""
    document = small_training_job(work)
    document["spec"]["volumes"] = [{"name": WORK_VOLUME, "mountPath": str(work)}]
    document["spec"].update(spec)
    rendered = render(parse_job(document))
    return rendered[-1], rendered[0]["data"]["job.yaml"]


def _pod_mounts(pod: dict[str, Any], container: dict[str, Any], job_file: str, root: Path) -> list[Mount]:
    """A host directory for each volume the container mounts: the job's ConfigMap holding its job
    file, the job's own volume (:data:`WORK_VOLUME`), whose directory already holds the corpus, and
    for every other volume (dshm, tmp, data) a fresh directory under ``root`` anyone may write, as
    the kubelet makes an emptyDir; never the host's own /tmp or /dev/shm."""
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = []
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            config = volume_dir(root / mount["name"])
            (config / Path(JOB_FILE).name).write_text(job_file)
            source = config
        elif mount["name"] == WORK_VOLUME:
            source = volume_dir(Path(mount["mountPath"]))
        else:
            source = volume_dir(root / mount["name"])
        mounts.append(Mount(source, mount["mountPath"], read_only=bool(mount.get("readOnly"))))
    assert JOB_FILE.startswith(next(m.target for m in mounts if m.read_only) + "/"), mounts
    return mounts


def _run(
    container: Container, command: Sequence[str], env: dict[str, str], mounts: list[Mount], log: Path
) -> int:
    """Run ``command`` in the container to its end; its exit status (output in ``log``).

    Raises:
        subprocess.TimeoutExpired: it ran over TRAIN_TIMEOUT_S seconds (it is killed first).
    """
    with log.open("w") as output:
        process = subprocess.Popen(
            container.run_argv(command, env, mounts),
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            return process.wait(TRAIN_TIMEOUT_S)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _mlm_losses(output: str) -> list[float]:
    return [float(v) for v in re.findall(r"phase 1/2 step \d+/\d+ .*?\(mlm ([\d.]+)", output)]


def _image_uid(buildah: Buildah, image: str) -> int:
    uid = int(buildah.config(image)["User"].split(":")[0])
    assert uid != 0
    return uid


def test_the_trainer_image_holds_the_api_the_trainer_and_deepspeed_not_the_operator(
    xeon_image: Built, buildah: Buildah
) -> None:
    probe = (
        "import importlib.util as u; "
        "print([u.find_spec(p) is not None for p in ('bertjob_api', 'bertpretrain', 'deepspeed', 'bertjob')])"
    )
    with buildah.container(xeon_image.name) as container:
        result = subprocess.run(
            container.run_argv(["python", "-c", probe], {}, []), capture_output=True, text=True, timeout=120
        )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[-2] == "[True, True, True, False]", result.stdout


def test_pytorchjob_master_pod_trains_to_an_export_writing_only_its_volumes(
    xeon_image: Built, buildah: Buildah, tmp_path: Path
) -> None:
    work = volume_dir(tmp_path / "work")
    job, job_file = _job(work, topology={"nodes": 1, "processesPerNode": 2})
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    [pytorch] = master["containers"]
    mounts = _pod_mounts(master, pytorch, job_file, tmp_path / "volumes")
    command = pytorchjob_pod_command(job, "Master")
    assert JOB_FILE in command
    env = {**pytorchjob_pod_env(job, "Master", 0, master_port=free_port()), **THREADS}

    with buildah.container(xeon_image.name) as container:
        before = snapshot(container.rootfs())
        code = _run(container, command, env, mounts, tmp_path / "master-0.log")
        after = snapshot(container.rootfs())

    output = (tmp_path / "master-0.log").read_text()
    assert code == 0, output[-4000:]
    for rank in range(2):
        assert f"world: started by torchrun, rank {rank} of 2" in output, output[-4000:]
    losses = _mlm_losses(output)
    assert len(losses) == 6 and losses[-1] < losses[0], output[-4000:]
    export = work / "checkpoints" / "hf" / "model.safetensors"
    assert export.is_file(), output[-4000:]
    # Written by the image's non-root user.
    assert export.stat().st_uid == _image_uid(buildah, xeon_image.name)
    # torchrun's agent writes /tmp/torchelastic_*, which lies on the pod's tmp volume.
    assert any(mount.target == "/tmp" for mount in mounts)
    outside = written_outside(before, after, mounts)
    assert outside == [], "written outside the pod's volumes:\n" + "\n".join(outside)


def test_mpijob_launcher_trains_over_the_hostfile_with_horovod(
    xeon_image: Built, buildah: Buildah, tmp_path: Path
) -> None:
    work = volume_dir(tmp_path / "work")
    job, job_file = _job(
        work, launcher="mpijob", topology={"nodes": 2, "processesPerNode": 1}, mpi={"command": "horovodrun"}
    )
    replicas = job["spec"]["mpiReplicaSpecs"]
    worker = replicas["Worker"]["template"]["spec"]
    mounts = _pod_mounts(worker, worker["containers"][0], job_file, tmp_path / "volumes")
    # mpi-operator's ConfigMap at /etc/mpi, every slot on this host.
    etc_mpi = volume_dir(tmp_path / "volumes" / "mpi-job-config")
    (etc_mpi / Path(MPI_HOSTFILE).name).write_text(mpijob_hostfile(job))
    (etc_mpi / "discover_hosts.sh").write_text(mpijob_discover_hosts(job))
    mounts.append(Mount(etc_mpi, str(Path(MPI_HOSTFILE).parent), read_only=True))
    command = mpijob_launcher_command(job, MPI_HOSTFILE)
    assert command[4:7] == ["horovodrun", "-np", "2"]
    # BERTJOB_NAME and BERTJOB_NAMESPACE come from the downward API in a pod.
    env = {"BERTJOB_NAME": "demo", "BERTJOB_NAMESPACE": "default", **THREADS}

    with buildah.container(xeon_image.name) as container:
        code = _run(container, command, env, mounts, tmp_path / "launcher.log")

    output = (tmp_path / "launcher.log").read_text()
    assert code == 0, output[-4000:]
    # horovodrun starts its ranks through mpirun when Horovod has MPI, as the image's has.
    for rank in range(2):
        assert re.search(rf"world: started by (horovodrun|mpirun), rank {rank} of 2", output), output[-4000:]
    assert "Horovod 0.28.1" in output
    losses = _mlm_losses(output)
    assert len(losses) == 6 and losses[-1] < losses[0], output[-4000:]
    export = work / "checkpoints" / "hf" / "model.safetensors"
    assert export.is_file() and export.stat().st_uid == _image_uid(buildah, xeon_image.name)
