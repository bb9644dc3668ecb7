"""The job's stages as plain functions: check -> data -> phase 1 -> phase 2 -> export -> fine-tuning.

:mod:`bertpretrain.run`, the one command dispatcher, reads and checks the job file, resolves the
plan once (:class:`bertjob_api.plan.Plan`: batch split, model dimensions, every path) for the world
it detects, joins the process group once (:func:`bertpretrain.runtime.parallel.joining.join`) and calls
these functions with both; nothing here parses a command line, resolves a plan for the first time
or joins a group. Phase 2 starts from phase 1's final checkpoint with a fresh optimizer and
schedule, as NVIDIA's ``run_pretraining.py --phase2`` does; both phases run in the same child job
(see docs/design.md).

Before any work, every output directory of the job is tried for writing (naming the field of a
bad one), and rank 0 removes the temporaries that killed writers left in the checkpoint
directories and beside the export (:mod:`bertpretrain.common.files`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertjob_api.plan import Plan
from bertpretrain.common.files import check_writable
from bertpretrain.data.format.prepared import PreparedData
from bertpretrain.data.load.loader import verify_phases
from bertpretrain.data.prepare.stage import prepare
from bertpretrain.finetune.stage import check_files, finetune
from bertpretrain.model.huggingface import clean_staging
from bertpretrain.runtime.parallel import DataParallel
from bertpretrain.training.checkpoint import clean_temporaries
from bertpretrain.training.export import export
from bertpretrain.training.phase import Phase
from bertpretrain.training.preemption import StopSignals


@dataclass(frozen=True)
class JobOutputs:
    """Where a finished job put its results."""

    data: PreparedData
    checkpoints: list[Path]  # the final checkpoint of each phase, in order
    export_dir: Path
    seconds: float
    finetune: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # each task's summary


def check(plan: Plan) -> None:
    """Before any work: try each output directory for writing, making it if missing (for the
    export, its parent, where a new export directory is made), and read every fine-tuning task's
    files.

    Raises:
        PermissionError: ``"<field> <path>: cannot write there (<reason>)"``.
        bertjob_api.files.DiskFullError: not even an empty file fits.
        bertpretrain.finetune.errors.TaskDataError: a fine-tuning file is missing or bad (naming the
            file and the row).
    """
    for field, path in plan.paths.outputs():
        check_writable(field, path, parent=field == "spec.export.path")
    check_files(plan)


def run_job(plan: Plan, parallel: DataParallel, finishing: StopSignals | None = None) -> JobOutputs:
    """Run every stage of a job as ``plan`` says (a plan of a spec that passed
    :func:`bertjob_api.validation.checked`, for the world that ``parallel`` joined, after
    :func:`check`): data, phases, export, then the fine-tuning tasks of ``spec.finetune`` on the
    export (every rank).

    ``finishing``: signals to install once this rank's training is done, so that a SIGTERM from
    then on (the pod deleted as the job ends) does not stop the export; the caller restores them.

    Raises:
        FileNotFoundError, ValueError: bad corpus, vocabulary, shards or checkpoint (the message
            names the file).
        bertjob_api.files.DiskFullError: a checkpoint or the export does not fit.
        bertpretrain.training.errors.DivergenceError: the loss diverged.
        bertpretrain.training.preemption.Preempted: SIGTERM stopped training after a checkpoint.
    """
    started = time.perf_counter()
    if parallel.world.rank == 0:
        device = parallel.device
        placement = f", {device.placement}" if device.placement else ""
        print(f"bertpretrain: {parallel.description} on {device.device}{placement}", flush=True)
        remove_stale_temporaries(plan)
    data, checkpoints = parallel.run(lambda: _prepare_and_train(plan, parallel))
    if finishing is not None:
        finishing.install()
    export_dir = plan.paths.export
    if parallel.world.rank == 0:
        export(plan, checkpoints[-1])
    # Fine-tuning writes only below <checkpoint.path>/finetune: a bad task file leaves the
    # checkpoints and the export as they are.
    results = finetune(plan, parallel, export_dir)
    return JobOutputs(data, checkpoints, export_dir, time.perf_counter() - started, results)


def remove_stale_temporaries(plan: Plan) -> None:
    """Rank 0, at the start: remove what writers killed halfway left (a SIGKILL after the grace
    period, an OOM kill), which would otherwise pile up on the volume."""
    removed = [path for directory in plan.paths.phase_checkpoints for path in clean_temporaries(directory)]
    for path in removed + clean_staging(plan.paths.export):
        print(f"bertpretrain: removed {path}, left by a writer that was stopped", flush=True)


def prepare_data(plan: Plan, parallel: DataParallel) -> PreparedData:
    """Prepare the data once: rank 0 does the work, the others receive its result; then every
    rank checks every phase's shards (collective), before step 1.

    Concurrent preparations into one directory would collide, and each would train its own
    vocabulary (tokenizers' WordPiece trainer is not deterministic, huggingface/tokenizers#1794).

    Raises:
        FileNotFoundError, ValueError: a bad corpus, vocabulary or shard (naming the file).
    """
    world = parallel.world
    result = parallel.broadcast_object(prepare(plan.spec) if world.rank == 0 else None)
    assert isinstance(result, PreparedData)
    gather = parallel.gather_object
    phases, rank = plan.spec.phases, world.rank
    nsp = plan.spec.objective == "mlm-nsp"
    verify_phases(
        phases,
        result.phase_dirs,
        result.vocab_size,
        rank,
        world.world_size,
        gather,
        next_sentence_prediction=nsp,
    )
    return result


def train(plan: Plan, parallel: DataParallel, data: PreparedData) -> list[Path]:
    """Each phase in turn, phase 2 from phase 1's final checkpoint; returns each phase's final
    checkpoint. Raises what :meth:`bertpretrain.training.phase.Phase.train` raises."""
    checkpoints: list[Path] = []
    for phase in plan.phases:
        init_from = checkpoints[-1] if checkpoints else None
        checkpoints.append(Phase(plan, phase.index, data, parallel, init_from).train())
    return checkpoints


def _prepare_and_train(plan: Plan, parallel: DataParallel) -> tuple[PreparedData, list[Path]]:
    """The data, then each phase. Run again from the start after an elastic reset, it finds the
    data made and resumes from checkpoints, with the plan for the world it now has."""
    world = parallel.world
    if world.world_size != plan.world_size:
        plan = plan.for_world(world.world_size)
        if world.rank == 0:
            print(f"bertpretrain: plan for the new world: {plan.describe()}", flush=True)
    data = prepare_data(plan, parallel)
    return data, train(plan, parallel, data)
