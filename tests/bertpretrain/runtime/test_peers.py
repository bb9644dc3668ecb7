"""Telling a lost peer from this rank's own failure (:mod:`bertpretrain.runtime.parallel.peers`),
and the entry point's exit code for it. The messages are the libraries' own: gloo's as torch
2.13's raise them here when a peer's process exits or stops answering (the two-node tests in
``tests/bertpretrain/test_launch_two_nodes.py`` raise them for real), NCCL's as NCCL and
``ProcessGroupNCCL`` word them (not run here: no GPU)."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
import yaml

import bertpretrain.pipeline
import bertpretrain.run
from bertjob_api.contract import EXIT_PEER_LOST, RETRYABLE_EXIT_CODES
from bertjob_testing.jobs import small_training_job
from bertpretrain.common.peers import PeerLostError
from bertpretrain.runtime.parallel.peers import collective, is_peer_lost

GLOO_CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:2952. This is typically caused by a remote worker crashing. Check the logs of the "
    "remote worker before reporting an error. GLHF!"
)
GLOO_TIMEOUT = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
    "waiting 600000ms for recv operation to complete"
)

LOST = [
    RuntimeError(GLOO_CLOSED),
    RuntimeError(GLOO_TIMEOUT),
    RuntimeError(
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Application timeout caused pair closure"
    ),
    RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection reset by peer"),
    RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:420] writev [127.0.0.1]:5: Broken pipe"),
    dist.DistNetworkError("failed to recv, got 0 bytes"),  # the store's host is gone
    dist.DistStoreError("Timed out after 601 seconds waiting for clients. 1/2 clients joined."),
    dist.DistBackendError(
        "NCCL error in: ProcessGroupNCCL.cpp:2035, remote process exited or there was a network error, "
        "NCCL version 2.27.3\nncclRemoteError: A call failed possibly due to a network error or a "
        "remote process exiting prematurely."
    ),
    dist.DistBackendError(
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, "
        "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out."
    ),
]
OWN = [
    # Tensors of other sizes on another rank: a bug, the same on every retry.
    RuntimeError("[../third_party/gloo/gloo/allreduce.cc:51] Mismatch in the sizes of tensors"),
    dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1970, invalid usage, ncclInvalidUsage"),
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("CUDA error: an illegal memory access was encountered"),
    ValueError("connection closed by peer"),  # not what a collective raises
    OSError(104, "Connection reset by peer"),  # e.g. the progress report's HTTP: not a collective
]


@pytest.mark.parametrize("error", LOST, ids=lambda error: str(error)[:40])
def test_a_closed_connection_or_a_timeout_is_a_lost_peer(error: BaseException) -> None:
    assert is_peer_lost(error)
    with pytest.raises(PeerLostError) as raised, collective("all_reduce", rank=3):
        raise error
    assert raised.value.__cause__ is error
    assert raised.value.rank == 3 and raised.value.collective == "all_reduce"


@pytest.mark.parametrize("error", OWN, ids=lambda error: str(error)[:40])
def test_this_ranks_own_failure_passes_unchanged(error: BaseException) -> None:
    assert not is_peer_lost(error)
    with pytest.raises(type(error)) as raised, collective("all_reduce", rank=0):
        raise error
    assert raised.value is error


def test_the_message_names_the_rank_the_collective_and_the_first_sentence_of_the_cause() -> None:
    with pytest.raises(PeerLostError) as raised, collective("barrier", rank=1):
        raise RuntimeError(GLOO_CLOSED)
    assert str(raised.value) == "rank 1: lost a peer in barrier (Connection closed by peer [127.0.0.1]:2952)"
    with pytest.raises(PeerLostError) as raised, collective("all_reduce", rank=0):
        raise RuntimeError(GLOO_TIMEOUT)
    assert str(raised.value) == (
        "rank 0: lost a peer in all_reduce (Timed out waiting 600000ms for recv operation to complete)"
    )


def test_a_lost_peer_exits_201_with_one_last_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(small_training_job(tmp_path, processes=1)))
    monkeypatch.setattr(bertpretrain.run, "_joined", lambda plan: contextlib.nullcontext())
    monkeypatch.setattr(bertpretrain.pipeline, "check", lambda plan: None)

    def lose_a_peer(*_: object) -> None:
        with collective("the backward pass (all_reduce of the gradients)", rank=1):
            raise RuntimeError(GLOO_CLOSED)

    monkeypatch.setattr(bertpretrain.pipeline, "run_job", lose_a_peer)
    stop = signal.getsignal(signal.SIGTERM)
    try:
        code = bertpretrain.run.main(["run", "--config", str(job_file)])
        # From now on the agent's SIGTERM (it stops the node's other ranks) cannot hide the code.
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, stop)
    assert code == EXIT_PEER_LOST and code in RETRYABLE_EXIT_CODES
    assert capsys.readouterr().err.splitlines()[-1] == (
        "bertpretrain run: rank 1: lost a peer in the backward pass (all_reduce of the gradients) "
        "(Connection closed by peer [127.0.0.1]:2952): exit 201, retryable; the first cause is in "
        "another rank's log"
    )


class _Group:
    """A joined process group that records whether it was left."""

    closed = False

    def close(self) -> None:
        self.closed = True


def test_the_process_group_is_left_by_exiting_after_this_ranks_own_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failing rank's connections must close with its process, not before: else the ranks of its
    node that lose it may exit 201 first, and the agent stops the failing rank before it exits
    with its own code (see bertpretrain.launch). A rank that lost its peer leaves the group."""
    import bertpretrain.runtime.parallel.joining

    plan: Any = SimpleNamespace(spec=SimpleNamespace(accelerator="xeon-cpu", tf32=False, distributed=None))
    groups: list[_Group] = []

    def join(*_: object) -> _Group:
        groups.append(_Group())
        return groups[-1]

    monkeypatch.setattr(bertpretrain.runtime.parallel.joining, "join", join)
    with bertpretrain.run._joined(plan):
        pass
    with pytest.raises(OSError), bertpretrain.run._joined(plan):
        raise OSError(28, "No space left on device")
    # A rank that lost its peer destroys the group: with a collective in flight, gloo's threads
    # may abort the interpreter's exit otherwise.
    with pytest.raises(PeerLostError), bertpretrain.run._joined(plan):
        raise PeerLostError(1, "all_reduce", RuntimeError(GLOO_CLOSED))
    assert [group.closed for group in groups] == [True, False, True]
