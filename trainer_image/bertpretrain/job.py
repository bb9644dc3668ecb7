"""The whole job in one process group: prepare data -> phase 1 -> phase 2 -> export.

This is what every rank of the trainer container runs (``torchrun --module bertpretrain run
--config FILE`` in a PyTorchJob, ``mpirun ... python -m bertpretrain run --config FILE`` in an
MPIJob; :mod:`bertpretrain.runtime.world` tells which) and what ``bertjob run job.yaml`` runs on a
laptop (``python -m bertpretrain local --config FILE``, which it starts as a process of its own),
through :func:`bertpretrain.run.main`. Phase 2 starts from phase 1's final checkpoint with a fresh
optimizer and schedule, as NVIDIA's ``run_pretraining.py --phase2`` does; both phases run in the
same child job (see docs/design.md).

The spec and the world size detected are resolved once into a plan (:class:`bertjob_api.plan.Plan`:
batch split, model dimensions, paths), printed first, which the training loop reads.

Before any work, every output directory of the job is tried for writing (naming the field of a
bad one), and rank 0 removes the temporaries that killed writers left in the checkpoint
directories and beside the export (:mod:`bertpretrain.common.files`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertjob_api.contract import FINETUNE_COMMAND, FINETUNE_RESULTS, LOCAL_COMMAND
from bertjob_api.plan import Plan
from bertjob_api.spec import BertPretrainJob, JobSpec
from bertpretrain.common.files import check_writable
from bertpretrain.data.format.prepared import PreparedData
from bertpretrain.data.load.loader import verify_phases
from bertpretrain.data.prepare.stage import VOCAB_DIR, prepare
from bertpretrain.finetune.results import compare
from bertpretrain.finetune.stage import check_files, finetune
from bertpretrain.model.huggingface import clean_staging, fill_mask
from bertpretrain.run import outputs
from bertpretrain.runtime.parallel import DataParallel, join
from bertpretrain.runtime.world import detect_world
from bertpretrain.training.checkpoint import (
    clean_temporaries,
    export_hf,
    export_nvidia,
    latest,
    phase_dir,
)
from bertpretrain.training.phase import DivergenceError, Phase
from bertpretrain.training.preemption import Preempted, StopSignals

# A sentence whose answer the standard library's documentation teaches well.
DEMO_SENTENCE = "the [MASK] statement exits a function and gives a value back to the caller."
# Where spec.export.nvidia puts NVIDIA's files, below the export (the spec's field says so).
NVIDIA_EXPORT_DIR = "nvidia"


@dataclass(frozen=True)
class JobOutputs:
    """Where a finished job put its results."""

    data: PreparedData
    checkpoints: list[Path]  # the final checkpoint of each phase, in order
    export_dir: Path
    seconds: float
    finetune: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # each task's summary


def run_job(plan: Plan, finishing: StopSignals | None = None) -> JobOutputs:
    """Run every stage of a job as ``plan`` says (a plan of a spec that passed
    :func:`bertjob_api.validation.checked`, for the world size detected): data, phases, export,
    then the fine-tuning tasks of ``spec.finetune`` on the export (every rank).

    ``finishing``: signals to install once this rank's training is done, so that a SIGTERM from
    then on (the pod deleted as the job ends) does not stop the export; the caller restores them.

    Raises:
        PermissionError: an output directory cannot be written (naming its field), before any work.
        bertpretrain.finetune.errors.TaskDataError: a fine-tuning file is missing or bad (naming the
            file and the row), before any work.
        FileNotFoundError, ValueError: bad corpus, vocabulary, shards or checkpoint (the message
            names the file).
        bertpretrain.common.files.DiskFullError: a checkpoint or the export does not fit.
        bertpretrain.training.phase.DivergenceError: the loss diverged.
        bertpretrain.training.preemption.Preempted: SIGTERM stopped training after a checkpoint.
        RuntimeError: the requested accelerator is not available.
    """
    started = time.perf_counter()
    spec = plan.spec
    check_outputs(spec)
    check_files(plan)
    with contextlib.closing(join(spec.accelerator, spec.tf32, spec.distributed)) as parallel:
        if parallel.world.rank == 0:
            device = parallel.device
            placement = f", {device.placement}" if device.placement else ""
            print(f"bertpretrain: {parallel.description} on {device.device}{placement}", flush=True)
            _remove_stale_temporaries(plan)
        data, checkpoints = parallel.run(lambda: _prepare_and_train(plan, parallel))
        if finishing is not None:
            finishing.install()
        export_dir = plan.paths.export
        if parallel.world.rank == 0:
            export(spec, checkpoints[-1], data.vocab_dir, export_dir)
        # Fine-tuning writes only below <checkpoint.path>/finetune: a bad task file leaves the
        # checkpoints and the export as they are.
        results = finetune(plan, parallel, export_dir)
    return JobOutputs(data, checkpoints, export_dir, time.perf_counter() - started, results)


def export(spec: JobSpec, checkpoint: Path, vocab_dir: Path, out_dir: Path) -> None:
    """Export the model of ``checkpoint`` with the vocabulary of ``vocab_dir`` to ``out_dir`` as a
    Hugging Face model directory and, with ``spec.export.nvidia``, in NVIDIA DeepLearningExamples'
    format in ``out_dir/nvidia`` (written after the Hugging Face export, which replaces
    ``out_dir`` whole).

    Raises:
        See :func:`bertpretrain.training.checkpoint.export_hf` and
        :func:`bertpretrain.training.checkpoint.export_nvidia`.
    """
    export_hf(checkpoint, vocab_dir, out_dir, spec.data.lowercase)
    if spec.export.nvidia:
        export_nvidia(checkpoint, vocab_dir, out_dir / NVIDIA_EXPORT_DIR)


def check_outputs(spec: JobSpec) -> None:
    """Try each of :func:`outputs` for writing, making it if missing (for the export, its parent,
    where a new export directory is made).

    Raises:
        PermissionError: ``"<field> <path>: cannot write there (<reason>)"``.
        bertpretrain.common.files.DiskFullError: not even an empty file fits.
    """
    for field, path in outputs(spec):
        check_writable(field, path, parent=field == "spec.export.path")


def _remove_stale_temporaries(plan: Plan) -> None:
    """Rank 0, at the start: remove what writers killed halfway left (a SIGKILL after the grace
    period, an OOM kill), which would otherwise pile up on the volume."""
    root = plan.paths.checkpoints
    removed = [path for phase in plan.phases for path in clean_temporaries(phase_dir(root, phase.index))]
    for path in removed + clean_staging(plan.paths.export):
        print(f"bertpretrain: removed {path}, left by a writer that was stopped", flush=True)


def _prepare_and_train(plan: Plan, parallel: DataParallel) -> tuple[PreparedData, list[Path]]:
    """The data, its check (every phase's shards, before step 1), then each phase; returns the data
    and each phase's final checkpoint. Run again from the start after an elastic reset, it finds
    the data made and resumes from checkpoints, with the plan for the world it now has."""
    world = parallel.world
    if world.world_size != plan.world_size:
        plan = plan.for_world(world.world_size)
        if world.rank == 0:
            print(f"bertpretrain: plan for the new world: {plan.describe()}", flush=True)
    spec = plan.spec
    data = _prepare_on_rank_zero(spec, parallel)
    verify_phases(
        spec.phases, data.phase_dirs, data.vocab_size, world.rank, world.world_size, parallel.gather_object
    )
    checkpoints: list[Path] = []
    for phase in plan.phases:
        init_from = checkpoints[-1] if checkpoints else None
        checkpoints.append(Phase(plan, phase.index, data, parallel, init_from).train())
    return data, checkpoints


def _prepare_on_rank_zero(spec: JobSpec, parallel: DataParallel) -> PreparedData:
    """Prepare the data once: rank 0 does the work, the others receive its result.

    Concurrent preparations into one directory would collide, and each would train its own
    vocabulary (tokenizers' WordPiece trainer is not deterministic, huggingface/tokenizers#1794).
    """
    result = parallel.broadcast_object(prepare(spec) if parallel.world.rank == 0 else None)
    assert isinstance(result, PreparedData)
    return result


def _describe(job: BertPretrainJob, plan: Plan) -> str:
    spec, dims = plan.spec, plan.model
    phases = ", ".join(
        f"phase {i + 1}: seq {p.max_seq_length} x {p.steps} steps of {p.global_batch_size}"
        for i, p in enumerate(spec.phases)
    )
    return (
        f"BertPretrainJob {job.metadata.name!r}: {spec.model.preset} ({dims.num_hidden_layers} layers, "
        f"hidden {dims.hidden_size}), {phases}; {spec.optimizer.name}, {spec.precision}, "
        f"{spec.accelerator}, world size {spec.topology.world_size}"
    )


def _local(job: BertPretrainJob, spec: JobSpec) -> int:
    """``local`` (what ``bertjob run`` starts): the whole job on this machine, then a fill-mask
    demonstration. Returns the exit code: 0, or 128 + the signal number when a signal stopped
    training after a checkpoint (run it again to resume); raises what else :func:`run_job` raises."""
    plan = Plan.resolve(spec, detect_world().world_size)
    print(f"bertjob: running {_describe(job, plan)}", flush=True)
    print(f"bertpretrain: plan: {plan.describe()}", flush=True)
    try:
        outputs = run_job(plan)
    except Preempted as stop:
        print(f"bertjob: {stop}; exit {stop.exit_code}", flush=True)
        return stop.exit_code
    print("\nOutputs:")
    print(f"  vocabulary       {outputs.data.vocab_dir}")
    for index, directory in enumerate(outputs.data.phase_dirs):
        print(f"  phase {index + 1} shards   {directory}")
    for index, checkpoint in enumerate(outputs.checkpoints):
        print(f"  phase {index + 1} final    {checkpoint}")
    print(f"  Hugging Face     {outputs.export_dir}")
    print(f'\nfill-mask with the exported model (transformers pipeline): "{DEMO_SENTENCE}"')
    for token, score in fill_mask(outputs.export_dir, DEMO_SENTENCE):
        print(f"  {score:6.3f}  {token}")
    if outputs.finetune:
        print(f"\nFine-tuned ({plan.paths.finetune / FINETUNE_RESULTS}):")
        for line in compare(outputs.finetune):
            print(f"  {line}")
    print(f"\nbertjob: done in {outputs.seconds:.0f} s")
    return 0


def newest_checkpoint(spec: JobSpec) -> Path | None:
    """The newest checkpoint of the last phase that has one, or None before the first save."""
    root = Path(spec.checkpoint.path)
    for index in reversed(range(len(spec.phases))):
        found = latest(phase_dir(root, index))
        if found is not None:
            return found
    return None


def _export(spec: JobSpec, checkpoint: str | None, out: str | None) -> int:
    assert spec.export.path is not None
    target = Path(out or spec.export.path)
    check_writable("--out" if out else "spec.export.path", target, parent=True)
    source = Path(checkpoint) if checkpoint else newest_checkpoint(spec)
    if source is None:
        print(f"bertpretrain export: no checkpoint under {spec.checkpoint.path}", file=sys.stderr)
        return 1
    export(spec, source, Path(spec.data.shards) / VOCAB_DIR, target)
    print(f"bertpretrain: exported {source} to {target}", flush=True)
    return 0


def _train(job: BertPretrainJob, spec: JobSpec) -> int:
    world = detect_world()
    plan = Plan.resolve(spec, world.world_size)
    is_main = world.rank == 0
    if is_main:
        print(f"bertpretrain: plan: {plan.describe()}", flush=True)
    deepspeed = spec.distributed.deepspeed is not None and world.distributed
    print(f"bertpretrain: {world.describe(deepspeed=deepspeed)}", flush=True)
    if is_main:
        print(f"bertpretrain: {_describe(job, plan)}", flush=True)
    finishing = StopSignals()
    try:
        done = run_job(plan, finishing)
        if is_main:
            print(f"bertpretrain: exported {done.export_dir} in {done.seconds:.0f} s", flush=True)
        if finishing.received is not None:
            name = signal.Signals(finishing.received).name
            work = "the export is complete" if is_main else "this rank's work is done"
            print(f"bertpretrain: {name} received once the training was done; {work}, exit 0", flush=True)
        return 0
    except Preempted as stop:
        print(f"bertpretrain: {stop}; exit {stop.exit_code} so that the pod is restarted", flush=True)
        return stop.exit_code
    finally:
        finishing.restore()


def _finetune(spec: JobSpec) -> int:
    """``finetune``: the tasks of ``spec.finetune`` alone, on the job's export (or each task's
    ``initFrom``), under whichever launcher started this process."""
    if not spec.finetune:
        print("bertpretrain finetune: the job has no spec.finetune tasks", file=sys.stderr)
        return 1
    world = detect_world()
    plan = Plan.resolve(spec, world.world_size)
    check_files(plan)
    export_dir = plan.paths.export if plan.paths.export.is_dir() else None
    with contextlib.closing(join(spec.accelerator, spec.tf32, spec.distributed)) as parallel:
        summaries = finetune(plan, parallel, export_dir)
    if world.rank == 0:
        for line in compare(summaries):
            print(f"bertpretrain: {line}", flush=True)
    return 0


def command(name: str, job: BertPretrainJob, spec: JobSpec, checkpoint: str | None, out: str | None) -> int:
    """Run ``run``, ``local``, ``export`` or ``finetune`` (see :func:`bertpretrain.run.main`) for the checked
    ``spec`` of ``job``; returns the exit code, 1 for a diverged loss (a restart would not mend it).

    Raises:
        OSError, ValueError: as :func:`run_job` and the export raise them; the caller turns them
            into exit codes.
    """
    try:
        if name == "export":
            return _export(spec, checkpoint, out)
        if name == LOCAL_COMMAND:
            return _local(job, spec)
        if name == FINETUNE_COMMAND:
            return _finetune(spec)
        return _train(job, spec)
    except DivergenceError as error:
        print(f"bertpretrain {name}: {error}", file=sys.stderr)
        return 1
