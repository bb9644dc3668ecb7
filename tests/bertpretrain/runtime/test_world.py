"""Which launcher started the process: torchrun, horovodrun, mpirun (Open MPI, Intel MPI), or none."""

from __future__ import annotations

import pytest

from bertpretrain.runtime.world import World, detect_world

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "job",
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
}
OPEN_MPI = {
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}
HOROVODRUN = {"HOROVOD_RANK": "2", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "2"}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, World("single", 0, 1, 0, 1)),
        (TORCHRUN, World("torchrun", 5, 8, 1, 4)),
        (OPEN_MPI, World("mpirun", 3, 4, 1, 2)),
        (
            {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
            World("mpirun", 1, 2, 1, 2),
        ),
        (HOROVODRUN, World("horovodrun", 2, 4, 0, 2)),
        # horovodrun over mpirun: both sets; Horovod's names the launcher the user chose.
        ({**OPEN_MPI, **HOROVODRUN}, World("horovodrun", 2, 4, 0, 2)),
        # RANK and WORLD_SIZE by hand; one node unless said otherwise.
        ({"RANK": "1", "WORLD_SIZE": "2"}, World("env", 1, 2, 0, 2)),
    ],
    ids=["single", "torchrun", "open-mpi", "intel-mpi", "horovodrun", "horovodrun-over-mpirun", "env"],
)
def test_detect_world(environ: dict[str, str], expected: World) -> None:
    assert detect_world(environ) == expected


def test_uses_horovod_only_under_mpi_launchers() -> None:
    assert detect_world(OPEN_MPI).uses_horovod and detect_world(HOROVODRUN).uses_horovod
    assert not detect_world(TORCHRUN).uses_horovod and not detect_world({}).uses_horovod


def test_description_names_launcher_rank_and_library() -> None:
    assert detect_world(TORCHRUN).describe() == (
        "world: started by torchrun, rank 5 of 8 (local rank 1 of 4), collectives through torch.distributed"
    )
    assert "started by mpirun, rank 3 of 4" in detect_world(OPEN_MPI).describe()
    assert detect_world(OPEN_MPI).describe().endswith("through Horovod")
    # DeepSpeed's ranks join torch.distributed under mpirun too.
    assert detect_world(OPEN_MPI).describe(deepspeed=True).endswith("through torch.distributed (DeepSpeed)")
    assert detect_world({}).describe() == "world: a single process (no launcher variables)"


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"RANK": "8", "WORLD_SIZE": "8"}, r"env: RANK=8 is outside 0\.\.WORLD_SIZE-1 \(8\)"),
        ({**TORCHRUN, "LOCAL_RANK": "4"}, r"torchrun: LOCAL_RANK=4 is outside 0\.\.LOCAL_WORLD_SIZE-1 \(4\)"),
        (
            {**OPEN_MPI, "OMPI_COMM_WORLD_SIZE": "four"},
            r"mpirun: OMPI_COMM_WORLD_SIZE='four' is not an integer",
        ),
        ({"HOROVOD_RANK": "0"}, r"horovodrun: HOROVOD_RANK is set but HOROVOD_SIZE is not"),
    ],
)
def test_bad_variables_are_named(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        detect_world(environ)
