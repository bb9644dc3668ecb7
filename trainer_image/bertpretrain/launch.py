"""``python -m bertpretrain.launch [torchrun options] --module bertpretrain run --config FILE``:
torchrun that exits with its ranks' exit code.

torchrun (``torch.distributed.run``) exits 1 whenever a rank fails, and when it is stopped by a
signal, so Kubeflow's ``restartPolicy: ExitCode`` would read a preemption (the trainer's 143) or a
full volume (200) as a permanent failure. This is torchrun itself, the same parser (options and
``PET_*`` variables alike) and the same agent, with only its exit status changed:

- a rank failed: the exit code of this node's first *real* cause. torch's agent records the
  ranks that had exited when it noticed the first failure, then stops the others (SIGTERM) and
  records them too; the timestamps are whole seconds, and a tie goes to the failure recorded
  first (as ``get_first_failure``). A rank whose collective failed because another rank is gone
  exits ``EXIT_PEER_LOST`` (201, :class:`bertpretrain.common.peers.PeerLostError`); a rank that
  the agent stopped, or that stopped with a checkpoint on another rank's SIGTERM (the loop's vote),
  exits 143 (or is killed by SIGTERM: 143 too). Neither is this node's own cause, which wins when
  there is one: the earliest failure whose code is neither (200, 1, a signal's 128 + N such as
  137); else the earliest 201 (the cause is on another node: it lost its peer); else the earliest
  143 (a preemption, every rank stopped after a checkpoint); see :func:`first_cause`. The own
  cause is among the recorded failures even when a rank of this node lost it as a peer: after
  its own failure the trainer leaves its process group by exiting (:mod:`bertpretrain.run`), so
  the rank's connections close only once its process has ended, and the agent sees it at the
  latest in the same poll as the ranks that lost it;
- the agent received signal N (SIGTERM when the pod is deleted): 128 + N, once it has stopped the
  ranks with the same signal (they save a checkpoint first) or its shutdown timeout ran out;
- the agent itself lost the other nodes: a rendezvous error (``RendezvousError`` and its kinds:
  closed, timed out, connection lost, a bad state) or a ``DistNetworkError``/``DistStoreError``
  of the rendezvous store, which the first node's agent serves and which is gone with it. The
  cause is another node's (its pod was deleted, or its rank failed and its agent left): 201,
  retryable, not the 1 of an uncaught exception. A rendezvous that times out because a node
  never came (not scheduled, or a wrong address) is retried the same way, within the job's
  ``backoffLimit``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from torch.distributed import DistNetworkError, DistStoreError
from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure, record
from torch.distributed.elastic.rendezvous import RendezvousError

from bertjob_api.contract import EXIT_PEER_LOST, EXIT_PREEMPTED


def _code(failure: ProcessFailure) -> int:
    """A rank's exit code as a shell reports it: 128 + N for a rank killed by signal N (torch
    reports -N)."""
    return 128 - failure.exitcode if failure.exitcode < 0 else failure.exitcode


def _kind(code: int) -> int:
    """How much a rank's exit ``code`` says about the cause: 0 this rank's own failure, 1 it lost
    a peer (the cause is elsewhere), 2 it was stopped by SIGTERM (the agent, or the loop's vote)."""
    if code == EXIT_PEER_LOST:
        return 1
    return 2 if code == EXIT_PREEMPTED else 0


def first_cause(error: ChildFailedError) -> tuple[int, ProcessFailure]:
    """The global rank and failure that stand for ``error``: the earliest (timestamp in whole
    seconds; a tie goes to the failure recorded first) of this rank's own failures, else of the
    lost peers (exit ``EXIT_PEER_LOST``), else of the ranks stopped by SIGTERM (exit 143, or
    killed by it)."""
    order = {rank: index for index, rank in enumerate(error.failures)}
    failures = error.failures
    rank = min(failures, key=lambda r: (_kind(_code(failures[r])), failures[r].timestamp, order[r]))
    return rank, failures[rank]


def exit_code(error: ChildFailedError) -> int:
    """The exit code that stands for ``error``: its :func:`first_cause`'s, 128 + N for a rank
    killed by signal N."""
    return _code(first_cause(error)[1])


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` as torchrun does, run it, and return 0 when every rank succeeded, else
    :func:`exit_code` of the failure, 128 + the signal that stopped the agent, or
    ``EXIT_PEER_LOST`` when the agent lost the rendezvous of the other nodes."""
    args = torchrun.parse_args(None if argv is None else list(argv))
    try:
        # As torchrun's main: the root cause's error file becomes this process's, if it has one.
        record(torchrun.run)(args)
    except ChildFailedError as error:
        rank, failure = first_cause(error)
        code = _code(failure)
        if code == EXIT_PEER_LOST:
            cause = f"rank {rank} lost a peer: the first cause is on another node"
        else:
            cause = f"rank {rank}'s, the first cause"
            lost = [str(r) for r, f in error.failures.items() if _code(f) == EXIT_PEER_LOST]
            if lost:
                cause += f" ({'ranks' if len(lost) > 1 else 'rank'} {', '.join(lost)} lost it as a peer)"
        print(f"{error}\nbertpretrain.launch: exit {code}, {cause}", file=sys.stderr)
        return code
    except SignalException as stop:
        code = 128 + int(stop.sigval)
        print(f"bertpretrain.launch: exit {code}, {stop.sigval.name} stopped the ranks", file=sys.stderr)
        return code
    except (RendezvousError, DistNetworkError, DistStoreError) as error:
        print(
            f"bertpretrain.launch: exit {EXIT_PEER_LOST}, lost the other nodes' rendezvous "
            f"({type(error).__name__}: {error}): the first cause is on another node",
            file=sys.stderr,
        )
        return EXIT_PEER_LOST
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
