"""``python -m bertpretrain run|local|prepare|export|finetune --config FILE``: the trainer's entry point.

The one command dispatcher: it parses the command line, reads and checks the job file, resolves
the plan once (for the world the launcher started, or the topology's for the stages that do not
train), joins the process group once where the command trains, calls the stages of
:mod:`bertpretrain.pipeline`, and turns what they raise into the exit codes of
:mod:`bertjob_api.contract`. ``prepare`` runs the data stage alone, without torch; the other
commands import the training stack only when they run: torch, the model and the loop take seconds
and hundreds of MB to import, which a data-preparation Job does not need.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bertjob_api.contract import (
    EXIT_DISK_FULL,
    EXIT_FAILURE,
    EXIT_INVALID_JOB,
    EXIT_PEER_LOST,
    EXIT_SUCCESS,
    FINETUNE_COMMAND,
    FINETUNE_RESULTS,
    LOCAL_COMMAND,
    PREPARE_COMMAND,
    RUN_COMMAND,
)
from bertjob_api.files import DiskFullError, format_size, free_bytes, is_disk_full
from bertjob_api.jobfile import load_job
from bertjob_api.plan import Paths, Plan
from bertjob_api.spec import BertPretrainJob, JobSpec, SpecError
from bertjob_api.validation import Purpose, checked
from bertpretrain.common.files import check_writable
from bertpretrain.common.peers import PeerLostError
from bertpretrain.data.prepare.stage import prepare
from bertpretrain.runtime.world import World, detect_world
from bertpretrain.training.errors import DivergenceError
from bertpretrain.training.preemption import Preempted, StopSignals

if TYPE_CHECKING:
    from bertpretrain.runtime.parallel import DataParallel

EXPORT_COMMAND = "export"
# What each command checks the spec for (bertjob_api.validation.checked).
_PURPOSES: dict[str, Purpose] = {
    RUN_COMMAND: "training",
    LOCAL_COMMAND: "training",
    PREPARE_COMMAND: "no-training",
    EXPORT_COMMAND: "no-training",
    FINETUNE_COMMAND: "no-training",
}
# The commands whose plan is for the world the launcher started; the others' is for the topology's.
_TRAINING_COMMANDS = (RUN_COMMAND, LOCAL_COMMAND, FINETUNE_COMMAND)
# A sentence whose answer the standard library's documentation teaches well.
DEMO_SENTENCE = "the [MASK] statement exits a function and gives a value back to the caller."


@dataclass(frozen=True)
class Invocation:
    """One command, its checked job and its plan, resolved once by :func:`main`."""

    job: BertPretrainJob
    plan: Plan
    world: World | None  # the world the launcher started; None for prepare and export
    checkpoint: str | None  # export: --checkpoint
    out: str | None  # export: --out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bertpretrain run|local|prepare|export|finetune --config FILE``: the trainer's entry point.

    ``run``: the whole job; every rank started by torchrun, mpirun or horovodrun runs this; rank 0
    first prints the plan, then every rank which launcher started it and its rank. ``local``: the
    whole job in this process, then a fill-mask demonstration with the export (what ``bertjob
    run`` starts). ``prepare``: the data stage
    alone (vocabulary and shards), in this process and its workers. ``export``: a checkpoint
    (``--checkpoint``, default the newest) to Hugging Face format (``--out``, default
    ``spec.export.path``). ``finetune``: the tasks of ``spec.finetune`` alone, on the export or
    each task's ``initFrom`` (``run`` and ``local`` end with them).

    Returns the exit code: 0 done (also when SIGTERM came once training was done: the export is
    finished first); 1 bad input (data, checkpoint, vocabulary, a fine-tuning file, an output
    directory that cannot be written; the message names the file or field) or a diverged loss, which
    a restart would not mend; 2 an invalid job file; 128 + the signal number (143 for SIGTERM) when
    a signal stopped training after a checkpoint; ``EXIT_DISK_FULL`` (200) when a volume is
    full or over its quota (the message names the file, the free space and the size needed; the
    partial file is removed); ``EXIT_PEER_LOST`` (201) when a collective failed because another
    rank is gone (:class:`bertpretrain.common.peers.PeerLostError`; the first cause is in that
    rank's log); the names are :mod:`bertjob_api.contract`'s. Kubeflow's
    ``restartPolicy: ExitCode`` retries the last three (128-255), and the data Job's
    ``podFailurePolicy`` fails only on 1 and 2.
    """
    parser = argparse.ArgumentParser(prog="bertpretrain", description="Run a BertPretrainJob's trainer.")
    parser.add_argument("command", choices=list(_PURPOSES))
    parser.add_argument("--config", required=True, help="the job file, mounted from its ConfigMap")
    parser.add_argument("--checkpoint", help="export: this checkpoint file (default: the newest)")
    parser.add_argument("--out", help="export: this directory (default: spec.export.path)")
    args = parser.parse_args(argv)
    try:
        job = load_job(args.config)
        spec = checked(job.spec, args.config, _PURPOSES[args.command])
    except SpecError as error:
        print(error, file=sys.stderr)
        return EXIT_INVALID_JOB
    try:
        if args.command == FINETUNE_COMMAND and not spec.finetune:
            print("bertpretrain finetune: the job has no spec.finetune tasks", file=sys.stderr)
            return EXIT_FAILURE
        world = detect_world() if args.command in _TRAINING_COMMANDS else None
        plan = Plan.resolve(spec, world.world_size if world else None)
        return _COMMANDS[args.command](Invocation(job, plan, world, args.checkpoint, args.out))
    except OSError as error:
        if is_disk_full(error):  # a volume can be grown, or files removed: retryable
            print(f"bertpretrain {args.command}: {_disk_full_message(error, spec)}", file=sys.stderr)
            return EXIT_DISK_FULL
        print(f"bertpretrain {args.command}: {error}", file=sys.stderr)
        return EXIT_FAILURE
    except PeerLostError as error:  # the cause is another rank's: retryable, and said so last
        # The launcher's agent stops the other ranks of its node with SIGTERM once one fails: this
        # rank is on its way out with its code, which a death by that signal would hide.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(
            f"bertpretrain {args.command}: {error}: exit {EXIT_PEER_LOST}, retryable; "
            "the first cause is in another rank's log",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_PEER_LOST
    except (ValueError, DivergenceError) as error:
        # ShardError and CheckpointError are ValueErrors; each message names its file. A diverged
        # loss would diverge again from the same checkpoint.
        print(f"bertpretrain {args.command}: {error}", file=sys.stderr)
        return EXIT_FAILURE


def _run(call: Invocation) -> int:
    """``run``: the whole job on every rank the launcher started."""
    from bertpretrain import pipeline  # torch and the training stack, only now

    plan, world = call.plan, call.world
    assert world is not None
    is_main = world.rank == 0
    if is_main:
        print(f"bertpretrain: plan: {plan.describe()}", flush=True)
    deepspeed = plan.spec.distributed.deepspeed is not None and world.distributed
    print(f"bertpretrain: {world.describe(deepspeed=deepspeed)}", flush=True)
    if is_main:
        print(f"bertpretrain: {describe(call.job, plan)}", flush=True)
    finishing = StopSignals()
    try:
        pipeline.check(plan)
        with _joined(plan) as parallel:
            done = pipeline.run_job(plan, parallel, finishing)
        if is_main:
            print(f"bertpretrain: exported {done.export_dir} in {done.seconds:.0f} s", flush=True)
        if finishing.received is not None:
            name = signal.Signals(finishing.received).name
            work = "the export is complete" if is_main else "this rank's work is done"
            print(f"bertpretrain: {name} received once the training was done; {work}, exit 0", flush=True)
        return EXIT_SUCCESS
    except Preempted as stop:
        print(f"bertpretrain: {stop}; exit {stop.exit_code} so that the pod is restarted", flush=True)
        return stop.exit_code
    finally:
        finishing.restore()


def _local(call: Invocation) -> int:
    """``local`` (what ``bertjob run`` starts): the whole job on this machine, then a fill-mask
    demonstration. Returns 0, or 128 + the signal number when a signal stopped training after a
    checkpoint (run it again to resume)."""
    from bertpretrain import pipeline  # torch and the training stack, only now
    from bertpretrain.finetune.results import compare
    from bertpretrain.model.huggingface import fill_mask

    plan = call.plan
    print(f"bertjob: running {describe(call.job, plan)}", flush=True)
    print(f"bertpretrain: plan: {plan.describe()}", flush=True)
    try:
        pipeline.check(plan)
        with _joined(plan) as parallel:
            outputs = pipeline.run_job(plan, parallel)
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
    return EXIT_SUCCESS


def _prepare(call: Invocation) -> int:
    """``prepare``: the data stage alone, in this process and its workers."""
    prepare(call.plan.spec)
    return EXIT_SUCCESS


def _export(call: Invocation) -> int:
    """``export``: a checkpoint (the newest by default) to Hugging Face format, on one process."""
    from bertpretrain.training.export import export, newest_checkpoint

    plan = call.plan
    target = Path(call.out) if call.out else plan.paths.export
    check_writable("--out" if call.out else "spec.export.path", target, parent=True)
    source = Path(call.checkpoint) if call.checkpoint else newest_checkpoint(plan)
    if source is None:
        print(f"bertpretrain export: no checkpoint under {plan.spec.checkpoint.path}", file=sys.stderr)
        return EXIT_FAILURE
    export(plan, source, target)
    print(f"bertpretrain: exported {source} to {target}", flush=True)
    return EXIT_SUCCESS


def _finetune(call: Invocation) -> int:
    """``finetune``: the tasks of ``spec.finetune`` alone, on the job's export (or each task's
    ``initFrom``), under whichever launcher started this process."""
    from bertpretrain.finetune.results import compare
    from bertpretrain.finetune.stage import check_files, finetune

    plan, world = call.plan, call.world
    assert world is not None
    check_files(plan)
    export_dir = plan.paths.export if plan.paths.export.is_dir() else None
    with _joined(plan) as parallel:
        summaries = finetune(plan, parallel, export_dir)
    if world.rank == 0:
        for line in compare(summaries):
            print(f"bertpretrain: {line}", flush=True)
    return EXIT_SUCCESS


_COMMANDS: dict[str, Callable[[Invocation], int]] = {
    RUN_COMMAND: _run,
    LOCAL_COMMAND: _local,
    PREPARE_COMMAND: _prepare,
    EXPORT_COMMAND: _export,
    FINETUNE_COMMAND: _finetune,
}


@contextlib.contextmanager
def _joined(plan: Plan) -> Iterator[DataParallel]:
    """The job's process group, joined once for the command and left at its end, also after a
    preemption or a lost peer; after this rank's own failure it is left by the process's exit."""
    from bertpretrain.runtime.parallel.joining import join  # torch, only now

    spec = plan.spec
    parallel = join(spec.accelerator, spec.tf32, spec.distributed)
    try:
        yield parallel
    except (Preempted, PeerLostError):
        # A preemption stops every rank together. After a lost peer a collective failed with work
        # in flight: unless the group is destroyed first, gloo's threads may abort the
        # interpreter's exit (SIGABRT: 134 instead of 201, in 2 exits of 22 here).
        parallel.close()
        raise
    # Not closed after this rank's own failure (a full volume): its connections then close with
    # its process, so that it is gone before its peers see them closed and exit 201, and its
    # launcher sees its code first (bertpretrain.launch).
    parallel.close()


def describe(job: BertPretrainJob, plan: Plan) -> str:
    """One line naming the job, its model, phases, optimizer, precision, accelerator and world size."""
    spec, dims = plan.spec, plan.model
    phases = ", ".join(
        f"phase {i + 1}: seq {p.max_seq_length} x {p.steps or 'budgeted'} steps of {p.global_batch_size}"
        for i, p in enumerate(spec.phases)
    )
    if spec.budget is not None:
        phases += f" (budget {spec.budget.time})"
    return (
        f"BertPretrainJob {job.metadata.name!r}: {spec.model.preset} ({dims.num_hidden_layers} layers, "
        f"hidden {dims.hidden_size}), {phases}; {spec.optimizer.name}, {spec.precision}, "
        f"{spec.accelerator}, world size {spec.topology.world_size}"
    )


def _disk_full_message(error: OSError, spec: JobSpec) -> str:
    """``error``; unless it names its file, with the free space of each output directory."""
    if isinstance(error, DiskFullError):
        return str(error)
    outputs = Paths.of(spec).outputs()
    free = ", ".join(f"{field} {path}: {format_size(free_bytes(path))}" for field, path in outputs)
    return f"{error} (free space: {free})"
