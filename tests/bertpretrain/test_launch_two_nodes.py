"""Two "nodes" on 127.0.0.1: two ``python -m bertpretrain.launch`` (``--nnodes 2``, one or two
ranks each, torchrun's static rendezvous on rank 0's node, gloo), training a small real job. When one node's
rank stops (a full volume, SIGTERM to its launcher, SIGKILL, frozen past the collective timeout,
or its whole pod lost with the rendezvous store), every process exits with a retryable code (Kubeflow's
``restartPolicy: ExitCode`` restarts the job), the node of the cause reports the cause, and a rank
that merely lost its peer says so in its last log line.

Each rank's output goes to its own files (torchrun's ``--log-dir`` and ``--redirects 3``), so that
its last line can be read apart from the launcher's; each rank's exit code is in its launcher's
summary of the failures.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bertjob_api.contract import EXIT_DISK_FULL, EXIT_PEER_LOST, EXIT_PREEMPTED, RETRYABLE_EXIT_CODES
from bertjob_testing.jobs import small_training_job, with_value

pytestmark = pytest.mark.slow

NODES = 2
LOST_PEER_END = "): exit 201, retryable; the first cause is in another rank's log"
# One failure in torch's summary (ChildFailedError), which the launcher prints.
FAILURE = re.compile(r"rank +: (\d+) \(local_rank: \d+\)\n +exitcode +: (-?\d+) ")


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs at ``tmp_path/volume`` (skipped where this process may not mount one): a
    bert-tiny checkpoint (about 4.6 MiB) does not fit."""
    point = tmp_path / "volume"
    point.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", str(point)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if mount.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({mount.stderr.strip()})")
    yield point
    if subprocess.run(["umount", str(point)], capture_output=True, check=False).returncode:
        subprocess.run(["umount", "--lazy", str(point)], check=True)


def _job(tmp_path: Path, checkpoints: Path, steps: int, processes: int = 1, timeout: int = 600) -> Path:
    """A one-phase job of ``steps`` steps on two nodes of ``processes`` ranks, checkpointing every
    10 steps to ``checkpoints``; a collective fails after waiting ``timeout`` seconds for a rank."""
    document = small_training_job(tmp_path, processes=processes)
    document = with_value(document, "spec.topology", {"nodes": NODES, "processesPerNode": processes})
    document = with_value(document, "spec.phases", [{**document["spec"]["phases"][0], "steps": steps}])
    document = with_value(document, "spec.checkpoint.path", str(checkpoints))
    document = with_value(document, "spec.logging.tensorboard", False)
    document = with_value(document, "spec.distributed", {"timeoutSeconds": timeout})
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(document))
    return job


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Node:
    """One node's launcher, started as a PyTorchJob's pod runs it (in a session of its own, as a
    pod's processes are apart), its output in ``out.txt``. ``rendezvous``: torchrun's options for
    it, by default the static one on rank 0's node (``--node-rank``, ``--master-port``)."""

    def __init__(
        self,
        tmp_path: Path,
        job: Path,
        index: int,
        port: int,
        processes: int,
        rendezvous: list[str] | None = None,
    ):
        self.processes = processes
        self.directory = tmp_path / f"node{index}"
        self.directory.mkdir()
        self.output = self.directory / "out.txt"
        if rendezvous is None:
            rendezvous = ["--node-rank", str(index), "--master-addr", "127.0.0.1", "--master-port", str(port)]
        command = [
            sys.executable, "-m", "bertpretrain.launch", "--nnodes", str(NODES), *rendezvous,
            "--nproc-per-node", str(processes), "--log-dir", str(self.directory / "logs"), "--redirects", "3",
            "--module", "bertpretrain", "run", "--config", str(job),
        ]  # fmt: skip
        with self.output.open("w") as output:
            self.process = subprocess.Popen(
                command, cwd=tmp_path, stdout=output, stderr=subprocess.STDOUT,
                env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True,
            )  # fmt: skip

    def wait(self) -> int:
        """The launcher's exit code, once it exited (at most 120 s)."""
        return self.process.wait(timeout=120)

    def log(self) -> str:
        return self.output.read_text()

    def last_line(self) -> str:
        """The launcher's own last line."""
        return self.log().splitlines()[-1]

    def rank_last_line(self, stream: str, local_rank: int = 0) -> str:
        """The last line that this node's rank ``local_rank`` wrote to ``stream`` (stdout or stderr)."""
        [path] = (self.directory / "logs").glob(f"*/attempt_0/{local_rank}/{stream}.log")
        lines = path.read_text().splitlines()
        return lines[-1] if lines else ""

    def rank_codes(self) -> dict[int, int]:
        """Each failed rank's exit code, by global rank, as a shell reports it (128 + N for a rank
        killed by signal N), from the launcher's summary."""
        codes = {int(rank): int(code) for rank, code in FAILURE.findall(self.log())}
        return {rank: 128 - code if code < 0 else code for rank, code in codes.items()}

    def rank_pid(self) -> int:
        """The process id of this node's rank (the agent's one child)."""
        pid = self.process.pid
        [child] = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return int(child)

    def kill_pod(self) -> None:
        """SIGKILL to the launcher and its ranks at once, as when a node is lost with its pod."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.kill_pod()


@pytest.fixture
def nodes() -> Iterator[list[Node]]:
    """The launchers a test starts (:func:`_launch` adds them), killed if still running at its end."""
    started: list[Node] = []
    yield started
    for node in started:
        node.stop()


def _launch(tmp_path: Path, job: Path, nodes: list[Node], processes: int = 1) -> tuple[Node, Node]:
    """Both nodes' launchers of ``job``, ``processes`` ranks each, added to ``nodes``."""
    port = _free_port()
    nodes.extend(Node(tmp_path, job, rank, port, processes) for rank in range(NODES))
    return nodes[0], nodes[1]


def _await(path: Path, nodes: list[Node]) -> None:
    """Wait until ``path`` exists (a checkpoint: the ranks are training), both launchers running."""
    deadline = time.monotonic() + 90
    while not path.exists():
        for node in nodes:
            assert node.process.poll() is None, node.log()[-3000:]
        assert time.monotonic() < deadline, [node.log()[-2000:] for node in nodes]
        time.sleep(0.1)


def test_a_full_volume_on_one_node_is_retryable_on_both(
    tmp_path: Path, tmpfs: Path, nodes: list[Node]
) -> None:
    """Two ranks a node: rank 0 (node 0) writes the checkpoints, and the first, at step 10, does
    not fit. Rank 1 on node 0 loses it as a peer too (or its agent stops it first), and node 0
    still reports rank 0's 200."""
    job = _job(tmp_path, tmpfs / "checkpoints", steps=30, processes=2)
    first, second = _launch(tmp_path, job, nodes, processes=2)
    codes = [first.wait(), second.wait()]

    ranks = {**first.rank_codes(), **second.rank_codes()}
    assert codes == [EXIT_DISK_FULL, EXIT_PEER_LOST], [node.log()[-3000:] for node in nodes]
    # Each rank that lost rank 0 exits 201 itself, though its agent stops it with SIGTERM meanwhile.
    assert ranks == {0: EXIT_DISK_FULL, 1: EXIT_PEER_LOST, 2: EXIT_PEER_LOST, 3: EXIT_PEER_LOST}, ranks
    assert all(code in RETRYABLE_EXIT_CODES for code in ranks.values()), ranks
    assert first.rank_last_line("stderr").startswith(
        f"bertpretrain run: {tmpfs}/checkpoints/phase1/step_000010.pt: no space left on the device: "
    )
    assert first.last_line().startswith("bertpretrain.launch: exit 200, rank 0's, the first cause"), (
        first.log()
    )
    # Node 1's ranks went on to step 11 while rank 0 wrote, and lost it in the gradients' all-reduce.
    [named] = re.findall(
        r"exit 201, rank (\d+) lost a peer: the first cause is on another node$", second.log()
    )
    lost = second.rank_last_line("stderr", local_rank=int(named) - 2)
    assert lost.startswith(
        f"bertpretrain run: rank {named}: lost a peer in the backward pass (all_reduce of the gradients) "
        "(Connection closed by peer [127.0.0.1]:"
    ), lost
    assert lost.endswith(LOST_PEER_END), lost


def test_sigterm_to_one_nodes_launcher_stops_both_with_a_checkpoint(
    tmp_path: Path, nodes: list[Node]
) -> None:
    """The pod of node 1 deleted: its rank asks the others to stop at the next step (the loop's
    any-rank vote), rank 0 saves a checkpoint, and both ranks exit 143: no rank is lost."""
    checkpoints = tmp_path / "checkpoints"
    first, second = _launch(tmp_path, _job(tmp_path, checkpoints, steps=5000), nodes)
    _await(checkpoints / "phase1" / "step_000010.pt", nodes)
    second.process.send_signal(signal.SIGTERM)
    codes = [first.wait(), second.wait()]

    assert codes == [EXIT_PREEMPTED, EXIT_PREEMPTED], [node.log()[-3000:] for node in nodes]
    assert first.rank_codes() == {0: EXIT_PREEMPTED}, first.log()[-3000:]
    assert second.last_line() == "bertpretrain.launch: exit 143, SIGTERM stopped the ranks"
    assert first.last_line() == "bertpretrain.launch: exit 143, rank 0's, the first cause"
    for node in nodes:
        stopped = node.rank_last_line("stdout")
        assert stopped.startswith("bertpretrain: SIGTERM received: stopped after step "), stopped
        assert stopped.endswith("; exit 143 so that the pod is restarted"), stopped
    saved = sorted(path.name for path in (checkpoints / "phase1").glob("step_*.pt"))
    assert len(saved) == 2 and saved[0] == "step_000010.pt", saved  # and the one of the stop


def test_a_rank_killed_on_one_node_is_a_lost_peer_on_the_other(tmp_path: Path, nodes: list[Node]) -> None:
    """Node 1's rank gone without a word (SIGKILL: the grace period over, or the OOM killer): node
    1 reports the signal (137, which the ExitCode policy also retries), node 0's rank lost its
    peer."""
    checkpoints = tmp_path / "checkpoints"
    first, second = _launch(tmp_path, _job(tmp_path, checkpoints, steps=5000), nodes)
    _await(checkpoints / "phase1" / "step_000010.pt", nodes)
    os.kill(second.rank_pid(), signal.SIGKILL)
    codes = [first.wait(), second.wait()]

    assert codes == [EXIT_PEER_LOST, 128 + signal.SIGKILL], [node.log()[-3000:] for node in nodes]
    assert second.last_line() == "bertpretrain.launch: exit 137, rank 1's, the first cause"
    lost = first.rank_last_line("stderr")
    assert lost.startswith("bertpretrain run: rank 0: lost a peer in "), lost
    assert lost.endswith(LOST_PEER_END), lost
    assert (
        first.last_line()
        == "bertpretrain.launch: exit 201, rank 0 lost a peer: the first cause is on another node"
    )


def test_a_peer_that_stops_answering_is_lost_after_the_collective_timeout(
    tmp_path: Path, nodes: list[Node]
) -> None:
    """Node 1's rank frozen (SIGSTOP: as a node that vanished, its connections left open): rank 0
    waits ``spec.distributed.timeoutSeconds`` (10 s, the least allowed) in the collective, then
    exits 201. Let go again, rank 1 finds rank 0 gone and exits 201 too: both nodes retryable."""
    checkpoints = tmp_path / "checkpoints"
    first, second = _launch(tmp_path, _job(tmp_path, checkpoints, steps=5000, timeout=10), nodes)
    _await(checkpoints / "phase1" / "step_000010.pt", nodes)
    frozen = second.rank_pid()
    os.kill(frozen, signal.SIGSTOP)
    try:
        assert first.wait() == EXIT_PEER_LOST, first.log()[-3000:]
    finally:
        os.kill(frozen, signal.SIGCONT)
    assert second.wait() == EXIT_PEER_LOST, second.log()[-3000:]

    lost = first.rank_last_line("stderr")
    assert lost.startswith("bertpretrain run: rank 0: lost a peer in "), lost
    # gloo's words for its timeout, by where rank 0 waited (an all_reduce, DDP's backward pass).
    timed_out = (
        r"\((Timed out waiting 10000ms for \w+ operation to complete"
        r"|Application timeout caused pair closure)\)"
    )
    assert re.search(timed_out, lost) and lost.endswith(LOST_PEER_END), lost
    lost = second.rank_last_line("stderr")
    assert lost.startswith("bertpretrain run: rank 1: lost a peer in ") and lost.endswith(LOST_PEER_END), lost


def _listening(port: int, node: Node) -> None:
    """Wait until something listens on ``port`` of 127.0.0.1, ``node`` running."""
    deadline = time.monotonic() + 60
    while True:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert node.process.poll() is None and time.monotonic() < deadline, node.log()[-3000:]
        time.sleep(0.1)


def test_the_rendezvous_store_lost_with_its_node_is_a_lost_peer(tmp_path: Path, nodes: list[Node]) -> None:
    """Elastic (c10d) rendezvous: node 0's agent serves the store; its pod killed whole (SIGKILL to
    the launcher and its rank), node 1's agent loses the rendezvous (or its rank loses its peer,
    whichever notices first) and exits 201, not torchrun's 1 for an uncaught error."""
    checkpoints, port = tmp_path / "checkpoints", _free_port()
    job = _job(tmp_path, checkpoints, steps=5000)
    elastic = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes"]
    nodes.append(Node(tmp_path, job, 0, port, 1, elastic))
    _listening(port, nodes[0])  # node 0's agent serves the store: it started first
    nodes.append(Node(tmp_path, job, 1, port, 1, elastic))
    first, second = nodes
    _await(checkpoints / "phase1" / "step_000010.pt", nodes)
    first.kill_pod()

    assert second.wait() == EXIT_PEER_LOST, second.log()[-3000:]
    assert re.match(
        r"bertpretrain\.launch: exit 201, (lost the other nodes' rendezvous \(Rendezvous\w*Error: "
        r"|rank \d lost a peer: the first cause is on another node$)",
        second.last_line(),
    ), second.log()[-3000:]
