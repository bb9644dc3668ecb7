"""Which launcher started this process, and its place among the job's processes.

Every launcher the Kubeflow jobs use (a TrainJob's runtimes run the same two) describes the world
in its own environment variables:

- ``torchrun`` (PyTorchJob): ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, and
  ``TORCHELASTIC_RUN_ID`` for the rendezvous it ran;
- ``horovodrun`` (MPIJob, ``spec.mpi.command: horovodrun``; Gloo controller): ``HOROVOD_RANK``,
  ``HOROVOD_SIZE``, ``HOROVOD_LOCAL_RANK``, ``HOROVOD_LOCAL_SIZE`` (where Horovod has MPI,
  horovodrun starts the ranks with mpirun, and they say mpirun);
- ``mpirun`` (MPIJob, Open MPI): ``OMPI_COMM_WORLD_RANK``, ``..._SIZE``, ``..._LOCAL_RANK``,
  ``..._LOCAL_SIZE``; Intel MPI and MPICH: ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``,
  ``MPI_LOCALNRANKS``.

torchrun's ranks talk through ``torch.distributed`` (DDP); mpirun's and horovodrun's through
Horovod, which finds its peers itself, so an MPIJob needs no rank wrapper or ``MASTER_ADDR``.
With DeepSpeed (``spec.distributed.deepspeed``) every launcher's ranks talk through
``torch.distributed``: under mpirun the rank and world still come from Open MPI's variables here,
and the rendezvous address from ``MASTER_ADDR``/``MASTER_PORT``, which the MPIJob's mpirun sets
(:mod:`bertpretrain.runtime.parallel.deepspeed`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

LaunchedBy = Literal["torchrun", "horovodrun", "mpirun", "env", "single"]

# (launcher, variable that marks it, then its rank, size, local rank and local size variables).
_LAUNCHERS: tuple[tuple[LaunchedBy, str, tuple[str, str, str, str]], ...] = (
    (
        "horovodrun",
        "HOROVOD_RANK",
        ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
    ),
    (
        "mpirun",
        "OMPI_COMM_WORLD_RANK",
        (
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ),
    ),
    ("mpirun", "PMI_RANK", ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")),
    ("torchrun", "TORCHELASTIC_RUN_ID", ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")),
    ("env", "RANK", ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")),
)


@dataclass(frozen=True)
class World:
    """This process's place in the job.

    ``launched_by``: ``torchrun``, ``horovodrun``, ``mpirun``, ``env`` (``RANK``/``WORLD_SIZE``
    set by hand, as a test or a custom launcher does) or ``single`` (a lone process). ``rank`` is
    0 to ``world_size - 1`` over all nodes; ``local_rank`` 0 to ``local_world_size - 1`` on this
    node (it picks the GPU or HPU).
    """

    launched_by: LaunchedBy
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @property
    def uses_horovod(self) -> bool:
        """Whether the ranks talk through Horovod (started by mpirun or horovodrun)."""
        return self.launched_by in ("horovodrun", "mpirun")

    @property
    def distributed(self) -> bool:
        """Whether more than one process trains."""
        return self.world_size > 1

    def describe(self, deepspeed: bool = False) -> str:
        """One line for the log: launcher, rank, sizes, and the library the collectives go through
        (``deepspeed``: the job uses DeepSpeed, whose ranks talk through torch.distributed under
        every launcher)."""
        if self.launched_by == "single":
            return "world: a single process (no launcher variables)"
        if deepspeed:
            library = "torch.distributed (DeepSpeed)"
        else:
            library = "Horovod" if self.uses_horovod else "torch.distributed"
        return (
            f"world: started by {self.launched_by}, rank {self.rank} of {self.world_size} "
            f"(local rank {self.local_rank} of {self.local_world_size}), collectives through {library}"
        )


def detect_world(environ: Mapping[str, str] | None = None) -> World:
    """Read the launcher's variables from ``environ`` (default ``os.environ``).

    The first launcher (in the module's order) whose marking variable is set wins: horovodrun's
    ``HOROVOD_RANK`` before mpirun's, because horovodrun may itself start the ranks with mpirun.
    A missing local rank defaults to 0 and a missing local size to the world size (one node).

    Raises:
        ValueError: a variable that is not an integer, a missing size, or a rank outside its
            size; the message names the variable.
    """
    env = os.environ if environ is None else environ
    for launched_by, marker, names in _LAUNCHERS:
        if marker in env:
            return _read(launched_by, env, *names)
    return World("single", 0, 1, 0, 1)


def _read(
    launched_by: LaunchedBy, env: Mapping[str, str], rank: str, size: str, local_rank: str, local_size: str
) -> World:
    if size not in env:
        raise ValueError(f"{launched_by}: {rank} is set but {size} is not")
    values = {name: env.get(name) for name in (rank, size, local_rank, local_size)}
    defaults = {local_rank: "0", local_size: env[size]}
    numbers: dict[str, int] = {}
    for name, value in values.items():
        text = value if value is not None else defaults[name]
        try:
            numbers[name] = int(text)
        except ValueError:
            raise ValueError(f"{launched_by}: {name}={text!r} is not an integer") from None
    for index, bound in ((rank, size), (local_rank, local_size)):
        if not 0 <= numbers[index] < numbers[bound]:
            raise ValueError(
                f"{launched_by}: {index}={numbers[index]} is outside 0..{bound}-1 ({numbers[bound]})"
            )
    return World(launched_by, numbers[rank], numbers[size], numbers[local_rank], numbers[local_size])
