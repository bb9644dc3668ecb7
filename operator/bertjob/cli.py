"""``bertjob``: validate, render, or run a BertPretrainJob file.

    bertjob validate job.yaml   check the file as the operator would (volumes and paths included)
    bertjob render job.yaml     print the manifests the operator would create
    bertjob run job.yaml        run the whole job here, without a cluster

The file is read as kubectl reads it (:mod:`bertjob_api.jobfile`), so what passes here is what the
cluster receives. Exit codes: 0 success, 2 an invalid job file, 1 any other failure.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from bertjob_api.jobfile import dump_all, load_job
from bertjob_api.spec import BertPretrainJob, SpecError
from bertjob_api.validation import cluster_job


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
    try:
        from bertpretrain.run import run_local
    except ImportError as error:
        print(f"bertjob run needs the trainer (pip install '.[trainer]'): {error}", file=sys.stderr)
        return 1
    return run_local(job, source)


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
