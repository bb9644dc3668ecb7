"""``python -m bertpretrain run|local|prepare|export|finetune --config FILE``: the trainer's entry point.

It reads and checks the job file, then runs the command: ``prepare`` (the data stage) here, the
others through :mod:`bertpretrain.job`, imported only then: torch, the model and the training loop
take seconds and hundreds of MB to import, which a data-preparation Job does not need.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bertjob_api.contract import FINETUNE_COMMAND, LOCAL_COMMAND, PREPARE_COMMAND, RUN_COMMAND
from bertjob_api.spec import JobSpec, SpecError, load_job
from bertjob_api.validation import Purpose, checked
from bertpretrain.common.files import (
    DISK_FULL_EXIT_CODE,
    DiskFullError,
    format_size,
    free_bytes,
    is_disk_full,
)
from bertpretrain.data.prepare.stage import prepare

# What each command checks the spec for (bertjob_api.validation.checked).
_PURPOSES: dict[str, Purpose] = {
    RUN_COMMAND: "training",
    LOCAL_COMMAND: "training",
    PREPARE_COMMAND: "no-training",
    "export": "no-training",
    FINETUNE_COMMAND: "no-training",
}


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
    a signal stopped training after a checkpoint; ``DISK_FULL_EXIT_CODE`` (200) when a volume is
    full or over its quota (the message names the file, the free space and the size needed; the
    partial file is removed). Kubeflow's ``restartPolicy: ExitCode`` retries the last two (128-255),
    and the data Job's ``podFailurePolicy`` fails only on 1 and 2.
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
        return 2
    try:
        if args.command == PREPARE_COMMAND:
            prepare(spec)
            return 0
        from bertpretrain import job as stages  # torch and the training stack, only now

        return stages.command(args.command, job, spec, args.checkpoint, args.out)
    except OSError as error:
        if is_disk_full(error):  # a volume can be grown, or files removed: retryable
            print(f"bertpretrain {args.command}: {_disk_full_message(error, spec)}", file=sys.stderr)
            return DISK_FULL_EXIT_CODE
        print(f"bertpretrain {args.command}: {error}", file=sys.stderr)
        return 1
    except ValueError as error:
        # ShardError and CheckpointError are ValueErrors; each message names its file.
        print(f"bertpretrain {args.command}: {error}", file=sys.stderr)
        return 1


def _disk_full_message(error: OSError, spec: JobSpec) -> str:
    """``error``; unless it names its file, with the free space of each output directory."""
    if isinstance(error, DiskFullError):
        return str(error)
    free = ", ".join(f"{field} {path}: {format_size(free_bytes(path))}" for field, path in outputs(spec))
    return f"{error} (free space: {free})"


def outputs(spec: JobSpec) -> list[tuple[str, Path]]:
    """Each directory the job writes, with its field: the data, the checkpoints, the log and the
    export (the last two when set; ``with_defaults`` sets both)."""
    fields: list[tuple[str, str | None]] = [
        ("spec.data.shards", spec.data.shards),
        ("spec.checkpoint.path", spec.checkpoint.path),
        ("spec.logging.path", spec.logging.path),
        ("spec.export.path", spec.export.path),
    ]
    return [(field, Path(path)) for field, path in fields if path]
