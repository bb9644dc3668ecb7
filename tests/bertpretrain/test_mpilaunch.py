"""bertpretrain.mpilaunch: the exit-code rule, and the wrappers around Open MPI's real mpirun (ranks
started through an ssh stand-in, as on a Worker pod) with stand-in ranks whose codes a test picks."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertpretrain import mpilaunch
from bertpretrain.mpilaunch import exit_code
from tests.bertpretrain.runtime.test_trainjob_pods import NODE_HOST, SSH_STAND_IN

# (launcher's code, (rank, code) reports in order, signal received, expected)
CASES = [
    (0, [(0, 0), (1, 0)], None, 0),
    (0, [(1, 137), (1, 0), (0, 0)], None, 0),  # elastic Horovod mended a failure
    (200, [(1, 200), (0, 143)], None, 200),
    (201, [(0, 201), (1, 200)], None, 200),  # a lost peer never hides the cause
    (201, [(0, 201), (1, 201)], None, 201),
    (1, [(0, 143), (1, 143)], signal.SIGTERM, 143),  # mpirun after SIGTERM, gloo always: 0 or 1
    (0, [(1, 201), (0, 143)], signal.SIGTERM, 143),
    (1, [(0, 143), (1, 200)], None, 143),  # the first real cause
    (0, [(0, 0), (1, 0)], signal.SIGTERM, 0),  # the work was done
    (1, [], signal.SIGTERM, 143),  # stopped before any rank ended
    (1, [], signal.SIGINT, 130),
    (1, [], None, 1),  # mpirun could not start the ranks
    (1, [(0, 143), (0, 200), (1, 0)], None, 200),  # a rank's last report counts
    (1, [(0, 201), (1, 200), (0, 143)], None, 200),  # ... in the order of the last reports
]


@pytest.mark.parametrize(("launcher", "reports", "received", "expected"), CASES)
def test_the_exit_code_is_the_first_real_cause(
    launcher: int, reports: list[tuple[int, int]], received: int | None, expected: int
) -> None:
    assert exit_code(launcher, reports, received) == expected


def test_a_report_line_reads_back_through_mpiruns_tags() -> None:
    line = f"[1,3]<stderr>:{mpilaunch.report_line(3, 200)}[1,3]<stderr>:\n".encode()
    found = mpilaunch.REPORT.search(line)
    assert found is not None and (int(found[1]), int(found[2])) == (3, 200)


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert mpilaunch.main(["--rank", "--"]) == 2
    assert "no command given" in capsys.readouterr().err


# A rank that says it started, then exits RANK<r>_CODE after RANK<r>_DELAY seconds, or, given a
# SIGTERM first, exits 143 after CHECKPOINT seconds (the trainer's checkpoint).
RANK = """
import os, signal, sys, time
rank = os.environ["OMPI_COMM_WORLD_RANK"]
def stop(number, frame):
    print(f"rank {rank} got SIGTERM", flush=True)
    time.sleep(float(os.environ.get("CHECKPOINT", "0.5")))
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
print(f"rank {rank} started", flush=True)
time.sleep(float(os.environ.get(f"RANK{rank}_DELAY", "60")))
sys.exit(int(os.environ.get(f"RANK{rank}_CODE", "0")))
"""


def _mpi_or_skip() -> None:
    if shutil.which("mpirun") is None:
        pytest.skip("Open MPI's mpirun is not installed")


def _start(tmp_path: Path, codes: dict[str, str]) -> tuple[subprocess.Popen[str], Path]:
    """The Launcher's line as rendered (wrapper, mpirun, wrapper per rank) over 2 slots of a host
    reached through the ssh stand-in, running :data:`RANK`; ``codes`` go to the ranks."""
    ssh = tmp_path / "ssh"
    ssh.write_text(SSH_STAND_IN)
    ssh.chmod(0o755)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"{NODE_HOST} slots=2\n")
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    python = sys.executable
    forwarded = [arg for name in codes for arg in ("-x", name)]
    command = [
        *[python, "-m", "bertpretrain.mpilaunch", "--"],
        *["mpirun", "-np", "2", "--hostfile", str(hostfile), "-x", "PYTHONPATH", *forwarded],
        *[python, "-m", "bertpretrain.mpilaunch", "--rank", "--", python, str(script)],
    ]
    env = {
        **os.environ,
        **codes,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "OMPI_MCA_plm_rsh_agent": str(ssh),
        # mpirun's wait between SIGCONT, SIGTERM and SIGKILL: short here, the ranks save nothing.
        mpilaunch.SIGKILL_TIMEOUT_ENV: "2",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }
    log = tmp_path / "launcher.log"
    with log.open("w") as out:
        launcher = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
    return launcher, log


def _wait_for(log: Path, text: str, launcher: subprocess.Popen[str], count: int = 1) -> None:
    deadline = time.monotonic() + 60
    while log.read_text().count(text) < count:
        assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)


def _finish(launcher: subprocess.Popen[str], log: Path) -> tuple[int, str]:
    try:
        code = launcher.wait(60)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    return code, log.read_text()


def test_sigterm_reaches_every_rank_and_the_launcher_exits_143(tmp_path: Path) -> None:
    """The ranks take 3 s to checkpoint: longer than mpirun's own SIGTERM path would give them
    (SIGCONT, 2 s, SIGTERM, 2 s, SIGKILL), which would kill them before they report."""
    _mpi_or_skip()
    launcher, log = _start(tmp_path, {"CHECKPOINT": "3"})
    _wait_for(log, "started", launcher, count=2)
    launcher.send_signal(signal.SIGTERM)
    code, output = _finish(launcher, log)
    assert code == 143, output
    for rank in (0, 1):
        assert f"rank {rank} got SIGTERM" in output, output
        assert mpilaunch.report_line(rank, 143) in output, output


def test_a_rank_that_exits_200_makes_the_launcher_exit_200(tmp_path: Path) -> None:
    """Rank 1 exits 200 (a full volume); rank 0, stopped by mpirun, 143: mpirun and the Launcher
    both say 200."""
    _mpi_or_skip()
    launcher, log = _start(tmp_path, {"RANK1_CODE": "200", "RANK1_DELAY": "0.5"})
    code, output = _finish(launcher, log)
    assert code == 200, output
    assert mpilaunch.report_line(1, 200) in output, output


def test_a_lost_peer_does_not_hide_the_cause(tmp_path: Path) -> None:
    """Rank 0 exits 201 first (it lost a peer), then rank 1 200: mpirun says the first, 201; the
    Launcher the cause, 200."""
    _mpi_or_skip()
    # Rank 1 ends before mpirun, which stops the job on rank 0's 201, sends it SIGTERM (2 s).
    codes = {"RANK0_CODE": "201", "RANK0_DELAY": "0.2", "RANK1_CODE": "200", "RANK1_DELAY": "1"}
    launcher, log = _start(tmp_path, codes)
    code, output = _finish(launcher, log)
    assert "exited with 201" in output and "Exit code:    201" in output, output
    assert code == 200, output


# sshd as a Worker's first process: a session running one rank (a shell, the rank wrapper, the rank
# stand-in, as orted would start it), kept after the session ends; SIGTERM ends the listener at
# once, its sessions going on.
SSHD = """
import os, signal, subprocess, sys
signal.signal(signal.SIGTERM, lambda number, frame: os._exit(0))
python, script = sys.argv[1:]
subprocess.Popen(["/bin/sh", "-c", f"{python} -m bertpretrain.mpilaunch --rank -- {python} {script}"])
while True:
    signal.pause()
"""
# The rank stand-in's checkpoint: a file written after CHECKPOINT seconds.
CHECKPOINTING_RANK = RANK.replace(
    "    sys.exit(143)",
    "    open(os.environ['MARKER'], 'w').close()\n    sys.exit(143)",
)


def test_a_worker_stops_sshd_only_once_its_ranks_have_checkpointed(tmp_path: Path) -> None:
    """SIGTERM to the Worker's wrapper reaches the rank below sshd, and sshd (whose end would end
    the pod's every process) is stopped once the rank has written its checkpoint and exited."""
    sshd, script, marker = tmp_path / "sshd.py", tmp_path / "rank.py", tmp_path / "checkpointed"
    sshd.write_text(SSHD)
    script.write_text(CHECKPOINTING_RANK)
    python = sys.executable
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "OMPI_COMM_WORLD_RANK": "0",
        "CHECKPOINT": "2",
        "MARKER": str(marker),
    }
    log = tmp_path / "worker.log"
    command = [
        python,
        "-m",
        "bertpretrain.mpilaunch",
        "--worker",
        "--",
        python,
        str(sshd),
        python,
        str(script),
    ]
    with log.open("w") as out:
        worker = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait_for(log, "rank 0 started", worker)  # type: ignore[arg-type]
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(60)
        checkpointed = marker.exists()
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
    output = log.read_text()
    assert code == 143, output
    assert "rank 0 got SIGTERM" in output, output
    assert checkpointed, output
    assert mpilaunch.report_line(0, 143) in output, output
