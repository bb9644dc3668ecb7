"""DeepSpeed ZeRO on CPU with 2 processes under torchrun, in one run of
tests/bertpretrain/runtime/deepspeed_worker.py (DeepSpeed's import and set-up are slow):

- ZeRO-1, ZeRO-2 and ZeRO-3, with AdamW and with LAMB, reach the parameters that 1 process reaches with
  2 gradient accumulation steps (fp32; LAMB's clipping and trust ratios over the shards are those
  of whole tensors), and every rank holds the same parameters; so do 2 ranks with 2 accumulation
  steps each (DeepSpeed's own accumulation) against 1 process with 4;
- a run checkpointed through the trainer's checkpoint functions (every rank's optimizer shard in
  rank 0's file) and rebuilt from the file in a fresh engine ends bitwise where the uninterrupted
  run ended (ZeRO-2 and ZeRO-3); under ZeRO-3 the file holds the whole weights, and evaluation
  with a different number of held-out batches per rank gives 1 process's result;
- the file refuses to load into a world of another size, naming both sizes.

The first run on a machine compiles DeepSpeed's shared-memory all-reduce for CPU (a few minutes
on 2 cores; then cached under ``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (the 'deepspeed' extra)")

WORKER = Path(__file__).with_name("deepspeed_worker.py")
ROOT = Path(__file__).parents[3]
# <optimizer>-<ZeRO stage>[x<accumulation steps>]; the reference runs each with twice the steps.
CASES = ["lamb-2", "adamw-1", "lamb-1", "adamw-2", "lamb-2x2", "adamw-1x2", "lamb-3", "adamw-3"]
RESUMED = ["lamb-2", "lamb-3"]
# As tests/bertpretrain/runtime/test_data_parallel.py: fp32 sums in another order.
TOLERANCE = 1e-5


def _run(command: list[str], out: Path, accumulation_steps: int, cases: list[str]) -> str:
    out.mkdir()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "DS_ACCELERATOR": "cpu",
        # The worker imports tests and bertjob_testing (testing/, which the package does not install).
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "testing")]),
        "TORCH_EXTENSIONS_DIR": str(out.parent / "torch_extensions"),
    }
    result = subprocess.run(
        [*command, str(WORKER), str(out), str(accumulation_steps), *cases],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    output = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0, output
    return output


def _weights(out: Path, case: str, rank: int) -> dict[str, torch.Tensor]:
    weights: dict[str, torch.Tensor] = torch.load(out / f"{case}-rank{rank}.pt")
    return weights


def _largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[name] - b[name]).abs().max()) for name in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The reference (1 process, 2 accumulation steps) and the DeepSpeed run (2 processes)."""
    one = tmp_path_factory.mktemp("one") / "out"
    _run([sys.executable], one, 2, ["lamb-1", "adamw-1", "lamb-1x2", "adamw-1x2"])
    two = tmp_path_factory.mktemp("two") / "out"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    _run(torchrun, two, 1, [item for case in CASES for item in (case, "resume")[: 1 + (case in RESUMED)]])
    return one, two


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_zero_matches_one_process_with_accumulation(runs: tuple[Path, Path], case: str) -> None:
    one, two = runs
    assert "DeepSpeed 0." in (two / "world0.txt").read_text()
    optimizer, stage = case.split("-")
    factor = stage.partition("x")[2]
    reference = _weights(one, f"{optimizer}-1" + (f"x{factor}" if factor else ""), 0)
    ranks = [_weights(two, case, rank) for rank in range(2)]
    assert _largest_difference(ranks[0], ranks[1]) == 0.0
    difference = _largest_difference(reference, ranks[0])
    print(f"{case}: largest difference from 1 process {difference:.2e}")  # shown with pytest -s
    assert difference < TOLERANCE
    # The tolerance tells runs apart: the two optimizers' parameters differ far beyond it.
    assert _largest_difference(_weights(one, "adamw-1", 0), _weights(one, "lamb-1", 0)) > 100 * TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("case", RESUMED)
def test_zero_checkpoint_resumes_bitwise(runs: tuple[Path, Path], case: str) -> None:
    _, two = runs
    for rank in range(2):
        assert _largest_difference(_weights(two, case, rank), _weights(two, f"resumed-{case}", rank)) == 0.0


@pytest.mark.slow
def test_zero3_checkpoint_holds_whole_weights(runs: tuple[Path, Path]) -> None:
    """Under ZeRO-3 each rank holds a slice of each parameter; the checkpoint (what export and
    phase 2 read) holds them whole, and the parameter count is the whole model's."""
    from bertpretrain.runtime.sharding import parameter_count
    from bertpretrain.training.checkpoint import load_model_weights
    from tests.bertpretrain.runtime.deepspeed_worker import model

    _, two = runs
    fresh = model()
    load_model_weights(two / "checkpoints-lamb-3" / "phase1" / "step_000002.pt", fresh)
    trained = _weights(two, "lamb-3", 0)
    assert all(fresh.state_dict()[name].shape == tensor.shape for name, tensor in trained.items())
    for rank in range(2):
        assert int((two / f"parameters-lamb-3-rank{rank}.txt").read_text()) == parameter_count(fresh)


@pytest.mark.slow
def test_zero3_evaluation_with_unequal_batches_per_rank(runs: tuple[Path, Path]) -> None:
    """Rank 0 evaluates three held-out batches and rank 1 none (a ZeRO-3 forward on one rank
    alone would wait for the other): the result is 1 process's on the three."""
    one, two = runs
    reference = json.loads((one / "eval-lamb-1.json").read_text())
    sharded = json.loads((two / "eval-lamb-3.json").read_text())
    assert sharded["sequences"] == reference["sequences"] == 3 * 4
    for name in ("mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"):
        assert abs(sharded[name] - reference[name]) < TOLERANCE, name


@pytest.mark.slow
def test_zero_checkpoint_refuses_another_world_size(runs: tuple[Path, Path]) -> None:
    _, two = runs
    for rank in range(2):
        message = (two / f"other-world-rank{rank}.txt").read_text()
        assert "sharded over 3 ranks, but 2 train now; resume with 3 ranks" in message


def test_mpirun_without_a_rendezvous_address_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under mpirun, DeepSpeed's ranks meet through torch.distributed: without MASTER_ADDR and
    MASTER_PORT (the MPIJob's mpirun forwards them) the trainer says so; with them, the world
    from Open MPI's variables is handed on in torchrun's names."""
    from bertpretrain.runtime.parallel.deepspeed import _launcher_variables
    from bertpretrain.runtime.world import World

    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        # Set first, so that monkeypatch removes again what _launcher_variables writes: a RANK left
        # behind makes every later test in this process a rank of a torch.distributed world.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    world = World("mpirun", rank=1, world_size=4, local_rank=1, local_world_size=2)
    with pytest.raises(RuntimeError, match="needs MASTER_ADDR and MASTER_PORT"):
        _launcher_variables(world)
    monkeypatch.setenv("MASTER_ADDR", "demo-worker-0.demo.default.svc")
    monkeypatch.setenv("MASTER_PORT", "29500")
    _launcher_variables(world)
    assert [os.environ[name] for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")] == [
        "1",
        "4",
        "1",
        "2",
    ]


@pytest.mark.slow
def test_zero_builds_no_cpp_extension(runs: tuple[Path, Path]) -> None:
    """DeepSpeed would compile its CPU shared-memory all-reduce (inference only) at the first start,
    for minutes and with a compiler the image lacks; the trainer turns it off."""
    for out in runs:
        assert not (out.parent / "torch_extensions").exists()
