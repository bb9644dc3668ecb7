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
