"""``bertjob``: validate, render, or run a BertPretrainJob file.

    bertjob validate job.yaml   check the file as the operator would (volumes and paths included)
    bertjob render job.yaml     print the manifests the operator would create
    bertjob run job.yaml        run the whole job here, without a cluster

The file is read as kubectl reads it (:mod:`bertjob_api.jobfile`), so what passes here is what the
cluster receives. ``run`` starts the trainer's entry point (``python -m bertpretrain local``) as a
process of its own, without importing the trainer: the operator's package never imports the
trainer's. Exit codes: 0 success, 2 an invalid job file, 1 any other failure (``run``: the
trainer's own exit code, see :func:`bertpretrain.run.main`).
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import subprocess
import sys
from collections.abc import Sequence

from bertjob_api.contract import LOCAL_COMMAND, TRAINER_MODULE
from bertjob_api.jobfile import dump_all, load_job
from bertjob_api.spec import BertPretrainJob, SpecError
from bertjob_api.validation import checked, cluster_job


def _validate(job: BertPretrainJob, source: str) -> int:
    spec = cluster_job(job, source).spec
    print(f"{source}: valid BertPretrainJob {job.metadata.name!r}, world size {spec.topology.world_size}")
    return 0


def _render(job: BertPretrainJob, source: str) -> int:
    from bertjob.render import RenderError, render

    try:
        manifests = render(job)
    except RenderError as error:
        print(f"bertjob render: {error}", file=sys.stderr)
        return 1
    # Quoted so that kubectl reads back each string as a string (go-yaml reads y as true).
    sys.stdout.write(dump_all(manifests))
    return 0


def _run(job: BertPretrainJob, source: str) -> int:
    if importlib.util.find_spec(TRAINER_MODULE) is None:
        print(
            f"bertjob run needs the trainer (pip install '.[trainer]'): No module named {TRAINER_MODULE!r}",
            file=sys.stderr,
        )
        return 1
    # Checked here as the trainer will check it, so that an invalid file exits 2 (SpecError, in
    # main) before a trainer, and torch, starts.
    checked(job.spec, source, "training")
    # The same interpreter, so the same environment; the trainer prints to this process's stdout.
    return run_trainer([sys.executable, "-m", TRAINER_MODULE, LOCAL_COMMAND, "--config", source])


def run_trainer(command: Sequence[str]) -> int:
    """Run ``command`` (the trainer) to its end and return its exit code, passing on a SIGTERM
    sent to this process, so that the trainer checkpoints and exits 143 as it does in a pod
    rather than running on without a parent. Ctrl-C reaches the trainer by itself (one process
    group), and this process waits for it to stop."""
    with subprocess.Popen(command) as process:
        previous = signal.signal(signal.SIGTERM, lambda signum, _frame: process.send_signal(signum))
        try:
            while True:
                try:
                    return process.wait()
                except KeyboardInterrupt:
                    continue
        finally:
            signal.signal(signal.SIGTERM, previous)


COMMANDS = {"validate": _validate, "render": _render, "run": _run}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (without the program name), run the command, return the exit code."""
    parser = argparse.ArgumentParser(prog="bertjob", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("job_file", help="a BertPretrainJob manifest (YAML or JSON, one document)")
    args = parser.parse_args(argv)
    try:
        job = load_job(args.job_file)
        return COMMANDS[args.command](job, args.job_file)
    except SpecError as error:
        print(error, file=sys.stderr)
        return 2


def entrypoint() -> None:
    """Console-script entry point."""
    sys.exit(main())
