"""``python -m bertpretrain.launch``, the PyTorchJob pods' torchrun: a rank's exit code, and a signal
to the launcher, reach the pod's exit status (plain torchrun makes every failure 1).

The launcher runs as in a Kubeflow pod: its topology only from the PET_* variables the training
operator sets, and ``--module`` as in the rendered command. Its two ranks are a small module that
needs no torch, so that each run takes a couple of seconds.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from torch.distributed import DistNetworkError, DistStoreError
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.elastic.rendezvous import RendezvousClosedError, RendezvousTimeoutError

import bertpretrain.launch
from bertjob_api.contract import EXIT_PEER_LOST

LAUNCHER = [sys.executable, "-m", "bertpretrain.launch"]

# A rank: writes ready.<rank> and waits for the others; then rank <failing> exits <code> (a negative
# code kills it with that signal) and the others wait, but with <failing> -1 every rank exits 0, and
# with -2 every rank waits. A waiting rank exits 143 on SIGTERM, as the trainer does after its
# checkpoint, and writes term.<rank> first.
RANK = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path

    out, failing, code = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    rank = int(os.environ["RANK"])

    def stop(signum, frame):
        (out / f"term.{rank}").write_text("")
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    (out / f"ready.{rank}").write_text("")
    while len(list(out.glob("ready.*"))) < int(os.environ["WORLD_SIZE"]):
        time.sleep(0.05)
    if rank == failing:
        if code < 0:
            os.kill(os.getpid(), -code)
        sys.exit(code)
    if failing != -1:
        time.sleep(60)
    """
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(tmp_path: Path, failing: int, code: int) -> subprocess.Popen[str]:
    """The launcher with 2 ranks of :data:`RANK` on one node, configured as a Master pod is."""
    (tmp_path / "rank_module.py").write_text(RANK)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "PET_NNODES": "1",
        "PET_NPROC_PER_NODE": "2",
        "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(_free_port()),
        "OMP_NUM_THREADS": "1",
    }
    command = [*LAUNCHER, "--module", "rank_module", str(tmp_path), str(failing), str(code)]
    return subprocess.Popen(
        command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.mark.parametrize(
    ("failing", "code", "expected"),
    [
        (-1, 0, 0),  # both ranks done
        (1, 200, 200),  # a full volume: retryable
        (0, 143, 143),  # a checkpoint after SIGTERM: retryable
        (1, 1, 1),  # bad input: permanent, not the other rank's 143 after the agent stops it
        (1, -signal.SIGKILL, 128 + signal.SIGKILL),  # killed (the OOM killer): as a shell reports it
    ],
)
def test_a_ranks_exit_code_is_the_launchers(tmp_path: Path, failing: int, code: int, expected: int) -> None:
    launcher = _start(tmp_path, failing, code)
    output, _ = launcher.communicate(timeout=120)

    assert launcher.returncode == expected, output[-3000:]
    if failing >= 0:  # the rank left running was stopped with SIGTERM, not waited for
        assert (tmp_path / f"term.{1 - failing}").exists(), output[-3000:]


def test_sigterm_to_the_launcher_stops_the_ranks_and_exits_143(tmp_path: Path) -> None:
    launcher = _start(tmp_path, failing=-2, code=0)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("ready.*"))) < 2:
        assert time.monotonic() < deadline and launcher.poll() is None, launcher.communicate()[0][-3000:]
        time.sleep(0.05)
    launcher.send_signal(signal.SIGTERM)
    output, _ = launcher.communicate(timeout=120)

    assert launcher.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert {path.name for path in tmp_path.glob("term.*")} == {"term.0", "term.1"}, output[-3000:]


def _failures(*failures: tuple[int, int, float]) -> ChildFailedError:
    """A ChildFailedError of (global rank, exit code, timestamp in seconds) failures, recorded in
    that order (as the agent records them, by local rank)."""
    recorded: dict[int, ProcessFailure] = {}
    for local_rank, (rank, code, timestamp) in enumerate(failures):
        failure = ProcessFailure(local_rank=local_rank, pid=1000 + rank, exitcode=code, error_file="<N/A>")
        failure.timestamp = int(timestamp)
        recorded[rank] = failure
    return ChildFailedError("bertpretrain", recorded)


LOST = EXIT_PEER_LOST


@pytest.mark.parametrize(
    ("failures", "expected"),
    [
        # A rank that lost its peer on this node failed before the rank that exited 200 was seen.
        ([(2, LOST, 10), (3, 200, 11)], (3, 200)),
        ([(2, LOST, 10), (3, 1, 12)], (3, 1)),  # a permanent failure stays permanent
        ([(2, LOST, 10), (3, -signal.SIGKILL, 12)], (3, 128 + signal.SIGKILL)),  # the OOM killer
        ([(2, 1, 12), (3, 200, 11), (4, LOST, 9)], (3, 200)),  # the earliest own cause
        ([(3, 200, 11), (2, 1, 11)], (3, 200)),  # a tie goes to the failure recorded first
        ([(2, 1, 11), (3, 200, 11)], (2, 1)),
        # The ranks the agent stopped after the first failure (143, or killed by SIGTERM) come last.
        ([(0, 200, 10), (1, 143, 10)], (0, 200)),
        ([(2, LOST, 10), (3, -signal.SIGTERM, 10)], (2, LOST)),
        ([(2, LOST, 10), (3, 143, 10)], (2, LOST)),
        ([(2, 143, 10), (3, 1, 11)], (3, 1)),
        ([(2, LOST, 11), (3, LOST, 10)], (3, LOST)),  # every rank lost a peer: the cause is elsewhere
        ([(0, 143, 10), (1, 143, 10)], (0, 143)),  # every rank stopped after a checkpoint
    ],
)
def test_the_first_real_cause_wins_over_the_ranks_that_lost_it(
    failures: list[tuple[int, int, float]], expected: tuple[int, int]
) -> None:
    error = _failures(*failures)
    rank, _ = bertpretrain.launch.first_cause(error)
    assert (rank, bertpretrain.launch.exit_code(error)) == expected


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (_failures((0, LOST, 10), (1, 200, 11)), 200),
        (SignalException("stopped", signal.SIGTERM), 128 + signal.SIGTERM),
        # The agent's own errors when the other nodes' agents are gone: not an uncaught 1.
        (RendezvousClosedError(), LOST),
        (RendezvousTimeoutError("the rendezvous timed out"), LOST),
        (DistNetworkError("failed to recv, got 0 bytes"), LOST),
        (DistStoreError("Timed out after 900 seconds waiting for clients. 1/2 clients joined."), LOST),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
def test_the_launchers_exit_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], raised: Exception, expected: int
) -> None:
    def run(args: object) -> None:
        raise raised

    monkeypatch.setattr(bertpretrain.launch.torchrun, "run", run)
    assert bertpretrain.launch.main(["--nproc-per-node", "2", "--module", "anything"]) == expected
    # The launcher's last line, the one a pod's log ends with, says why.
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"bertpretrain.launch: exit {expected}, ")


def test_an_error_of_the_agent_itself_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(args: object) -> None:
        raise ValueError("bad --rdzv-conf")  # a configuration error: permanent, as torchrun has it

    monkeypatch.setattr(bertpretrain.launch.torchrun, "run", run)
    with pytest.raises(ValueError, match="bad --rdzv-conf"):
        bertpretrain.launch.main(["--nproc-per-node", "2", "--module", "anything"])
