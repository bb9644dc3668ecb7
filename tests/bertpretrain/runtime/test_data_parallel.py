"""Data parallelism on CPU with 2 processes: DDP under torchrun and Horovod under horovodrun (and
mpirun when Open MPI is installed) reach the parameters that 1 process reaches with 2 gradient
accumulation steps, and gradient compression is applied where asked for."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("data_parallel_worker.py")
STEPS, MICRO_BATCH = 4, 4
# fp32 sums in another order; LAMB's update divides by the second moment's root, which
# magnifies a last-bit difference where a gradient is tiny.
TOLERANCE = 1e-5


def _horovod_runner(controller: str) -> list[str]:
    hvd = pytest.importorskip("horovod.torch", reason="horovod is not installed (make test builds it)")
    if controller == "mpi":
        if shutil.which("mpirun") is None or not hvd.mpi_built():
            pytest.skip("Open MPI is not installed, or horovod was built without MPI")
        return [
            "mpirun",
            "-np",
            "2",
            "--oversubscribe",
            "-x",
            "PATH",
            "-x",
            "PYTHONPATH",
            "-x",
            "OMP_NUM_THREADS",
        ]
    return [str(Path(sys.executable).with_name("horovodrun")), "-np", "2", "-H", "localhost:2", "--gloo"]


LAUNCHERS = {
    "torchrun": lambda: [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"],
    "horovodrun": lambda: _horovod_runner("gloo"),
    "mpirun": lambda: _horovod_runner("mpi"),
}


def _run(
    command: list[str], out: Path, accumulation_steps: int, compression: str = "none"
) -> list[dict[str, torch.Tensor]]:
    out.mkdir()
    arguments = [str(WORKER), str(out), str(accumulation_steps), str(STEPS), str(MICRO_BATCH), compression]
    if command[0] != sys.executable:
        arguments.insert(0, sys.executable)
    # Open MPI refuses root (a CI container's user) unless told.
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }
    result = subprocess.run(
        [*command, *arguments], capture_output=True, text=True, timeout=300, env=env, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = sorted(out.glob("rank*.pt"))
    return [torch.load(path) for path in ranks]


def _largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[name] - b[name]).abs().max()) for name in a)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """1 process, 2 accumulation steps of MICRO_BATCH."""
    (weights,) = _run([sys.executable], tmp_path_factory.mktemp("one") / "out", accumulation_steps=2)
    return weights


@pytest.mark.slow
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_two_processes_equal_one_with_accumulation(
    launcher: str, one_process: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    ranks = _run(LAUNCHERS[launcher](), tmp_path / "out", accumulation_steps=1)
    assert len(ranks) == 2
    # The ranks start from different random weights; rank 0's are broadcast to both.
    assert _largest_difference(ranks[0], ranks[1]) == 0.0
    assert _largest_difference(ranks[0], one_process) <= TOLERANCE
    worlds = sorted(path.read_text() for path in (tmp_path / "out").glob("world*.txt"))
    assert worlds[0].startswith(f"world: started by {launcher}, rank 0 of 2")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "horovodrun"])
def test_fp16_gradient_compression_is_applied(
    launcher: str, one_process: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    ranks = _run(LAUNCHERS[launcher](), tmp_path / "out", accumulation_steps=1, compression="fp16")
    assert _largest_difference(ranks[0], ranks[1]) == 0.0
    # fp16 gradients round the update a little: not exact, but still the same training.
    assert 0.0 < _largest_difference(ranks[0], one_process) < 1e-2
    assert "fp16 gradient compression" in (tmp_path / "out" / "world0.txt").read_text()
