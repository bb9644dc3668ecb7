"""tests/kubeflow_env.py: what the Kubeflow operators give the pods of rendered children, and what
torchrun makes of it."""

from __future__ import annotations

from typing import Any

import pytest

from bertjob.launchers.mpijob import TRAINER_COMMAND
from bertjob.render import render
from bertjob_api.spec import parse_job
from bertjob_testing.jobs import valid_job, with_value
from tests.kubeflow_env import (
    mpijob_discover_hosts,
    mpijob_hostfile,
    mpijob_launcher_command,
    pytorchjob_pod_command,
    pytorchjob_pod_env,
)

# torchrun run by bertpretrain.launch, which passes a rank's exit code through.
LAUNCHER = ["python", "-m", "bertpretrain.launch"]
TORCHRUN = [*LAUNCHER, "--module", "bertpretrain", "run", "--config", "/etc/bertjob/job.yaml"]


def _child(nodes: int, processes: int, **changes: Any) -> dict[str, Any]:
    document = valid_job()
    for field, value in {
        "spec.topology": {"nodes": nodes, "processesPerNode": processes},
        "spec.phases.0.globalBatchSize": 96,
        "spec.phases.1.globalBatchSize": 48,
        "spec.pod": {"env": [{"name": "OMP_NUM_THREADS", "value": "4"}]},
        **{f"spec.{name}": value for name, value in changes.items()},
    }.items():
        document = with_value(document, field, value)
    return render(parse_job(document))[-1]


ELASTIC = {"minNodes": 1, "maxNodes": 4, "maxRestarts": 5}


def test_a_single_node_master_gets_the_whole_world() -> None:
    child = _child(1, 2)

    env = pytorchjob_pod_env(child, "Master", 0)

    assert env == {
        "OMP_NUM_THREADS": "4",
        "PYTHONUNBUFFERED": "0",
        "MASTER_PORT": "23456",
        "PET_MASTER_PORT": "23456",
        "MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_ADDR": "127.0.0.1",
        "WORLD_SIZE": "2",
        "RANK": "0",
        "PET_NPROC_PER_NODE": "2",
        "PET_NODE_RANK": "0",
        "PET_NNODES": "1",
    }  # BERTJOB_NAME and BERTJOB_NAMESPACE come from the downward API (valueFrom): left out
    assert pytorchjob_pod_command(child, "Master") == TORCHRUN


def test_workers_rank_after_the_master() -> None:
    child = _child(3, 2)

    master = pytorchjob_pod_env(child, "Master", 0, master_addr="10.0.0.1", master_port=29555)
    second = pytorchjob_pod_env(child, "Worker", 1, master_addr="10.0.0.1", master_port=29555)

    assert [env["PET_NODE_RANK"] for env in (master, second)] == ["0", "2"]
    assert [env["RANK"] for env in (master, second)] == ["0", "2"]
    for env in (master, second):
        assert (env["WORLD_SIZE"], env["PET_NNODES"], env["PET_NPROC_PER_NODE"]) == ("6", "3", "2")
        assert (env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"]) == ("10.0.0.1", "29555")
        assert "PET_RDZV_ENDPOINT" not in env
    assert pytorchjob_pod_command(child, "Worker") == TORCHRUN


def test_an_elastic_job_is_workers_meeting_at_a_rendezvous() -> None:
    child = _child(2, 2, elastic=ELASTIC)

    assert set(child["spec"]["pytorchReplicaSpecs"]) == {"Worker"}
    assert child["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    envs = [pytorchjob_pod_env(child, "Worker", index, master_port=29400) for index in (0, 1)]

    assert envs[0] == envs[1]
    env = envs[0]
    assert {name: env[name] for name in env if name.startswith("PET_")} == {
        "PET_NPROC_PER_NODE": "2",  # the container's own: the operator sets none without a Master
        "PET_RDZV_ENDPOINT": "127.0.0.1:29400",
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ID": "demo",
        "PET_NNODES": "1:4",
        "PET_MAX_RESTARTS": "5",
    }
    assert not {"MASTER_ADDR", "RANK", "WORLD_SIZE"} & set(env)
    assert pytorchjob_pod_env(child, "Worker", 0)["PET_RDZV_ENDPOINT"] == "127.0.0.1:23456"
    assert pytorchjob_pod_command(child, "Worker") == TORCHRUN


def _torchrun(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], command: list[str]) -> Any:
    """What torchrun's own parser, which bertpretrain.launch runs, reads from ``env`` and
    ``command`` (its options default to the PET_* variables present when the parser is built)."""
    run = pytest.importorskip("torch.distributed.run")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert command[: len(LAUNCHER)] == LAUNCHER
    return run.get_args_parser().parse_args(command[len(LAUNCHER) :])


def test_torchrun_reads_a_fixed_world_from_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    child = _child(3, 2)

    args = _torchrun(
        monkeypatch, pytorchjob_pod_env(child, "Worker", 0), pytorchjob_pod_command(child, "Worker")
    )

    assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("3", "2", 1)
    assert (args.master_addr, args.master_port, args.rdzv_backend) == ("127.0.0.1", 23456, "static")
    assert (args.module, args.training_script) == (True, "bertpretrain")


def test_torchrun_reads_an_elastic_world_from_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    child = _child(2, 2, elastic=ELASTIC)

    args = _torchrun(
        monkeypatch, pytorchjob_pod_env(child, "Worker", 1), pytorchjob_pod_command(child, "Worker")
    )

    assert (args.nnodes, args.nproc_per_node, args.max_restarts) == ("1:4", "2", 5)
    assert (args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id) == ("c10d", "127.0.0.1:23456", "demo")


def test_the_mpi_hostfile_puts_every_slot_on_one_host() -> None:
    child = _child(2, 3, launcher="mpijob", accelerator="xeon-cpu", phases=_phases(6))

    assert mpijob_hostfile(child) == "localhost slots=6\n"
    assert mpijob_hostfile(child, host="node-a") == "node-a slots=6\n"


def _phases(world: int) -> list[dict[str, Any]]:
    phases = valid_job()["spec"]["phases"]
    return [{**phase, "globalBatchSize": 16 * world} for phase in phases]


def test_the_mpirun_line_runs_the_trainer_directly() -> None:
    child = _child(2, 2, launcher="mpijob", accelerator="habana-hpu")

    command = mpijob_launcher_command(child, "/tmp/hostfile")

    assert command[:5] == ["mpirun", "-np", "4", "--hostfile", "/tmp/hostfile"]
    forwarded = [command[i + 1] for i, arg in enumerate(command) if arg == "-x"]
    assert forwarded == ["BERTJOB_NAME", "BERTJOB_NAMESPACE", "PT_HPU_LAZY_MODE", "OMP_NUM_THREADS"]
    assert command[-len(TRAINER_COMMAND) :] == TRAINER_COMMAND
    assert command[5 + 2 * len(forwarded) :] == TRAINER_COMMAND


def test_the_horovodrun_line_reads_the_same_hostfile() -> None:
    child = _child(2, 2, launcher="mpijob", mpi={"command": "horovodrun"})

    assert mpijob_launcher_command(child, "/tmp/h") == [
        "horovodrun",
        "-np",
        "4",
        "--hostfile",
        "/tmp/h",
        *TRAINER_COMMAND,
    ]


def test_elastic_horovod_discovers_its_hosts() -> None:
    child = _child(2, 2, launcher="mpijob", mpi={"command": "horovodrun"}, elastic=ELASTIC)

    command = mpijob_launcher_command(child, "/tmp/h", discover_hosts="/tmp/discover.sh")

    assert command == [
        "horovodrun",
        "-np",
        "4",
        "--min-np",
        "2",
        "--max-np",
        "8",
        "--slots-per-host",
        "2",
        "--reset-limit",
        "5",
        "--blacklist-cooldown-range",
        "30",
        "300",
        "--host-discovery-script",
        "/tmp/discover.sh",
        *TRAINER_COMMAND,
    ]
    assert child["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    assert mpijob_discover_hosts(child) == "#!/bin/sh\necho localhost:2\necho 127.0.0.1:2\n"
    with pytest.raises(ValueError, match="2 Workers, but only 1 host names"):
        mpijob_discover_hosts(child, hosts=("localhost",))
