"""The error of a rank whose peer is gone, kept apart from torch so that the entry point
(:mod:`bertpretrain.run`) names it without importing torch; the collectives raise it
(:mod:`bertpretrain.runtime.parallel.peers`)."""

from __future__ import annotations

import re

# gloo prefixes its messages with the C++ source file and line, e.g.
# "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] ": no use in a log line.
_SOURCE_PREFIX = re.compile(r"^\[[^\]\s]+:\d+\]\s*")


class PeerLostError(RuntimeError):
    """A collective of this rank failed because another rank of the world is gone: its connection
    closed or reset, or the collective timed out waiting for it
    (:func:`bertpretrain.runtime.parallel.peers.is_peer_lost` tells it from this rank's own
    failures). This rank was well; the first cause is in another rank's log. The entry point exits
    :data:`bertjob_api.contract.EXIT_PEER_LOST` (201), which Kubeflow's ``restartPolicy: ExitCode``
    retries.

    Attributes:
        rank: this process's global rank.
        collective: what it was doing, e.g. ``"all_reduce"`` or ``"joining the process group"``.
        detail: the first sentence of the communication library's message, without its source
            prefix.
    """

    def __init__(self, rank: int, collective: str, cause: BaseException):
        self.rank = rank
        self.collective = collective
        lines = str(cause).strip().splitlines() or [type(cause).__name__]
        # The first sentence: gloo goes on with advice to read the remote worker's log.
        self.detail = _SOURCE_PREFIX.sub("", lines[0]).strip().split(". ")[0]
        super().__init__(f"rank {rank}: lost a peer in {collective} ({self.detail})")
