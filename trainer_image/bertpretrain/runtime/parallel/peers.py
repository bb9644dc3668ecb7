"""Telling a lost peer from this rank's own failure, in the errors a collective raises.

When a rank exits (a full volume: 200; preempted: 143; a bug: 1), every other rank of the world
fails in its next collective: gloo raises ``RuntimeError("... Connection closed by peer ...")``
at once, as the kernel closes a dead process's sockets; a peer that vanished with its node
(no socket closed) shows as the collective's timeout (``spec.distributed.timeoutSeconds``). Those
ranks did nothing wrong, and must not exit 1 (permanent under Kubeflow's ``restartPolicy:
ExitCode``): :func:`collective` turns these errors into :class:`PeerLostError`, which the entry
point exits 201 for. Only errors raised inside a collective are looked at, and only those whose
type or message says the peer or the connection is gone: a collective's own misuse (tensor sizes
that differ between ranks), an out-of-memory error or a CUDA fault on this rank stay what they
are.

The NCCL messages below are NCCL's and ``ProcessGroupNCCL``'s (``ncclRemoteError``: "remote
process exited or there was a network error"; the watchdog's "Watchdog caught collective operation
timeout"); they were not run here (CPU only). Under NCCL's default
``TORCH_NCCL_ASYNC_ERROR_HANDLING=3`` the watchdog ends the process itself on such an error
(SIGABRT: exit 134, which Kubeflow retries as any 128-255) before Python sees it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.distributed as dist

from bertpretrain.common.peers import PeerLostError

# Lower-case fragments of the messages that mean "the other end is gone", from gloo's TCP
# transport (pair.cc, unbound_buffer.cc), the TCPStore client, and NCCL/ProcessGroupNCCL.
PEER_LOST_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "timed out waiting",  # gloo: "Timed out waiting 600000ms for recv operation to complete"
    "socket timeout",
    "application timeout caused pair closure",
    "remote process exited",  # NCCL's ncclRemoteError
    "ncclremoteerror",
    "collective operation timeout",  # ProcessGroupNCCL's watchdog
)


def is_peer_lost(error: BaseException) -> bool:
    """Whether ``error``, raised inside a collective or while joining the process group, means
    that another rank is gone rather than that this rank failed.

    True for ``torch.distributed.DistNetworkError`` and ``DistStoreError`` (the rendezvous store,
    which rank 0's node serves, is unreachable, or a rank never arrived in it), and for a
    ``RuntimeError`` (``DistBackendError`` included) whose message names a closed or reset
    connection or a timed-out wait (:data:`PEER_LOST_MARKERS`). Anything else is this rank's own.
    """
    if isinstance(error, dist.DistNetworkError | dist.DistStoreError):
        return True
    if not isinstance(error, RuntimeError):
        return False
    message = str(error).lower()
    return any(marker in message for marker in PEER_LOST_MARKERS)


@contextlib.contextmanager
def collective(name: str, rank: int) -> Iterator[None]:
    """Around one collective (or anything that communicates, e.g. DDP's backward pass) of global
    rank ``rank``: a lost peer (:func:`is_peer_lost`) raises :class:`PeerLostError` naming
    ``name``, chained to the library's error; every other error passes unchanged.
    """
    try:
        yield
    except RuntimeError as error:
        if isinstance(error, PeerLostError) or not is_peer_lost(error):
            raise
        raise PeerLostError(rank, name, error) from error
