"""``bertjob``: validate, render or run BertPretrainJob files, with kubectl's ways of naming them.

``validate`` and ``render`` take files as ``kubectl apply`` does (``-f FILE|DIR|-``, repeatable,
``-R`` for subdirectories, or files named without ``-f``), each a stream of documents; ``run``
takes one job file. Files are read as kubectl reads them (:mod:`bertjob_api.jobfile`), so what
passes here is what the cluster receives. A stream may hold objects of other kinds beside the jobs,
as a ``kubectl kustomize`` output does (a Namespace, a PersistentVolumeClaim): they are skipped
silently, as kubectl skips what it does not act on (``-v`` notes each on standard error); an input
with no BertPretrainJob at all is refused. A ``kind: List`` (``kubectl get -o yaml``) is read as its
items, and a live object's ``status`` is left out, as the webhook leaves it out.

``run`` starts the trainer's entry point (``python -m bertpretrain local``) as a process of its
own, without importing the trainer: the operator's package never imports the trainer's.

Exit codes: 0 success; 2 an input that is missing, unreadable or holds an invalid job (every
document is still checked and reported), or a usage error; 1 any other failure (``run``: the
trainer's own exit code, see :func:`bertpretrain.run.main`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from bertjob_api.contract import LOCAL_COMMAND, TRAINER_MODULE
from bertjob_api.jobfile import (
    JOB_KIND,
    STDIN,
    Document,
    JobFileError,
    dump_all,
    input_files,
    load_job,
    other_kind,
    read_documents,
    without_status,
)
from bertjob_api.spec import BertPretrainJob, SpecError, parse_job
from bertjob_api.validation import checked

PROG = "bertjob"

DESCRIPTION = """\
Check, render and run BertPretrainJob files on this machine, with the checks the operator makes
before it creates anything."""

EPILOG = """\
examples:
  bertjob validate examples/bert-large-1x8xa100.yaml
  kubectl kustomize examples/gitops/jobs | bertjob validate -f -
  bertjob render -n research -f examples/bert-base-8xa100.yaml
  bertjob run examples/bert-tiny-local.yaml

Run 'bertjob COMMAND --help' for a command's options."""

INPUTS = """\
Files are named as for kubectl apply: -f FILE, -f DIR (its *.yaml, *.yml and *.json files in
sorted order; with -R its subdirectories' too) or -f - (standard input), as often as needed, or
as arguments without -f. Each file is a stream of YAML documents separated by '---' (or JSON);
a document is named FILE when it is its file's only one, else FILE#N (N counting from 1; standard
input is named stdin). A kind: List (kubectl get -o yaml) counts as its items, named FILE#N items[I]
(I from 0); a live object's status is ignored. Objects of other kinds (a Namespace, a Kustomization)
are skipped, silently unless -v; one of apiVersion bertjob.dev/* is checked as a job whatever its
kind."""

VALIDATE = f"""\
Check each BertPretrainJob as the operator would before creating anything: the fields, the
checks across them, that every path it writes lies on one of its volumes, and that each object
it renders fits what the API server stores (1 MiB; this renders the job, with kustomize or
kubectl as render does). One line per job on standard output; each invalid job's problems on
standard error, field path first.

{INPUTS}

Exit status: 0 when every job is valid; 2 when a job is invalid, an input is missing or
unreadable, or the inputs hold no BertPretrainJob; 1 when kustomize fails."""

VALIDATE_EXAMPLES = """\
examples:
  bertjob validate examples/bert-large-1x8xa100.yaml
  bertjob validate -f examples/bert-base-8xa100.yaml -f examples/bert-large-gaudi.yaml
  bertjob validate -f examples/gitops/jobs             # skips its Namespace, claim and Kustomization
  kubectl kustomize examples/gitops/jobs | bertjob validate -f -
  kubectl get bertpretrainjobs -o yaml | bertjob validate -f -"""

RENDER = f"""\
Print the objects the operator would create for each BertPretrainJob: its ConfigMap (the job
file as a block), ServiceAccount, Role and RoleBinding, the data-preparation Job if enabled, and
the launcher's child (PyTorchJob, MPIJob or TrainJob). Nothing is printed unless every job is
valid.

{INPUTS}

Exit status: 0 when rendered; 2 as for validate; 1 when kustomize fails."""

RENDER_EXAMPLES = """\
examples:
  bertjob render examples/bert-large-1x8xa100.yaml
  bertjob render -n research -f examples/bert-base-8xa100.yaml | kubectl apply --dry-run=client -f -
  bertjob render -o json -f examples/bert-base-trainjob.yaml"""

RUN = """\
Run the whole job on this machine, without a cluster: data preparation, every phase, the export
and any fine-tuning, then a fill-mask demonstration. Needs the trainer (pip install
'.[trainer]'). Relative paths in the job are relative to the working directory. SIGTERM makes
the trainer checkpoint and exit 143, as in a pod.

Exit status: the trainer's (0 done, 2 an invalid job file, 143 stopped by SIGTERM)."""

RUN_EXAMPLES = """\
examples:
  bertjob run examples/bert-tiny-local.yaml"""


@dataclass(frozen=True)
class Job:
    """A BertPretrainJob read from an input: ``source`` names its document (:class:`Document`)."""

    source: str
    job: BertPretrainJob


class Report:
    """What the command has said so far: whether any input was refused, and how many jobs it read."""

    def __init__(self) -> None:
        self.refused = False
        self.jobs = 0

    def refuse(self, error: SpecError) -> None:
        """Print ``error`` (its source first) on standard error and remember that an input was refused."""
        print(error, file=sys.stderr)
        self.refused = True


def _jobs(args: argparse.Namespace, report: Report) -> Iterator[Job]:
    """Every BertPretrainJob of the command's inputs, parsed, in order; refused inputs and documents
    go to ``report``, documents of other kinds are skipped (with a note under ``-v``)."""
    try:
        files = input_files([*args.files, *(args.filename or [])], recursive=args.recursive)
    except JobFileError as error:
        report.refuse(error)
        return
    if not files:
        report.refuse(JobFileError(PROG, "no input: name a file, a directory, or -f - for standard input"))
        return
    for name in files:
        try:
            documents = read_documents(name, sys.stdin.buffer if name == STDIN else None)
        except SpecError as error:
            report.refuse(error)
            continue
        for document in documents:
            job = _job(document, args, report)
            if job is not None:
                report.jobs += 1
                yield job


def _job(document: Document, args: argparse.Namespace, report: Report) -> Job | None:
    if document.error is not None:
        report.refuse(document.error)
        return None
    other = other_kind(document.value)
    if other is not None:
        if args.verbose:
            print(f"{document.source}: {other}, skipped", file=sys.stderr)
        return None
    try:
        value = without_status(_in_namespace(document, args.namespace))
        return Job(document.source, parse_job(value, document.source))
    except SpecError as error:
        report.refuse(error)
        return None


def _in_namespace(document: Document, namespace: str | None) -> Any:
    """The document with ``metadata.namespace`` set to ``namespace`` where it has none, as
    ``kubectl apply -n`` sets it.

    Raises:
        SpecError: the document names another namespace (kubectl refuses it too).
    """
    value = document.value
    metadata = value.get("metadata") if isinstance(value, dict) else None
    if namespace is None or not isinstance(metadata, dict):
        return value
    current = metadata.get("namespace")
    if current is None:
        return {**value, "metadata": {**metadata, "namespace": namespace}}
    if current != namespace:
        message = f"{current!r} is not the namespace -n names ({namespace!r}); kubectl refuses it too"
        raise SpecError(document.source, [("metadata.namespace", message)])
    return value


def _none_found(args: argparse.Namespace, report: Report) -> int:
    """The exit code once the inputs are read: 2 if any was refused or none held a job."""
    if not report.refused and report.jobs == 0:
        names = ", ".join([*args.files, *(args.filename or [])])
        print(f"{PROG} {args.command}: no {JOB_KIND} in {names}", file=sys.stderr)
        report.refused = True
    return 2 if report.refused else 0


def _validate(args: argparse.Namespace) -> int:
    # Rendered as the operator renders it, so that an object too large to store is refused too.
    from bertjob.render import RenderError, rendered

    report = Report()
    for found in _jobs(args, report):
        try:
            spec = rendered(found.job, found.source).job.spec
        except SpecError as error:
            report.refuse(error)
            continue
        except RenderError as error:
            print(f"{PROG} validate: {found.source}: {error}", file=sys.stderr)
            return 1
        name, size = found.job.metadata.name, spec.topology.world_size
        print(f"{found.source}: valid {JOB_KIND} {name!r}, world size {size}")
    return _none_found(args, report)


def _render(args: argparse.Namespace) -> int:
    from bertjob.render import RenderError, render

    report = Report()
    manifests: list[dict[str, Any]] = []
    for found in _jobs(args, report):
        try:
            manifests.extend(render(found.job))
        except SpecError as error:
            # render() names the job namespace/name; the document's name finds the file.
            report.refuse(SpecError(found.source, error.problems))
        except RenderError as error:
            print(f"{PROG} render: {found.source}: {error}", file=sys.stderr)
            return 1
    code = _none_found(args, report)
    if code:
        return code
    if args.output == "json":
        # As kubectl -o json writes several objects: one List, which kubectl apply -f takes.
        sys.stdout.write(
            json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}, indent=2) + "\n"
        )
    else:
        # Quoted so that kubectl reads back each string as a string (go-yaml reads y as true).
        sys.stdout.write(dump_all(manifests))
    return 0


def _run(args: argparse.Namespace) -> int:
    names = [*args.files, *(args.filename or [])]
    if len(names) != 1 or names[0] == STDIN:
        print(
            f"{PROG} run: name one job file (not a directory, not -): the trainer reads it by its path",
            file=sys.stderr,
        )
        return 2
    source = names[0]
    job = load_job(source)
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


def _version() -> str:
    try:
        return importlib.metadata.version(PROG)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _inputs(parser: argparse.ArgumentParser, *, several: bool = True) -> None:
    parser.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="a job file, as with -f" if not several else "files, directories or -, as with -f",
    )
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        metavar="FILE|DIR|-" if several else "FILE",
        help="a file, a directory or - for standard input; repeatable"
        if several
        else "the job file (one document)",
    )
    if several:
        parser.add_argument(
            "-R", "--recursive", action="store_true", help="take the files of -f DIR's subdirectories too"
        )
        parser.add_argument(
            "-n",
            "--namespace",
            help="the namespace of jobs that name none; one that names another is refused",
        )
        parser.add_argument(
            "-v", "--verbose", action="store_true", help="note each object of another kind that is skipped"
        )


def parser() -> argparse.ArgumentParser:
    """The command line: ``bertjob [--version] {validate,render,run} ...``, each command with its
    own ``--help`` (description, options, examples)."""
    formatter = argparse.RawDescriptionHelpFormatter
    top = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, epilog=EPILOG, formatter_class=formatter
    )
    top.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    commands = top.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, handler, summary, description, examples in (
        ("validate", _validate, "check job files as the operator would", VALIDATE, VALIDATE_EXAMPLES),
        ("render", _render, "print the objects the operator would create", RENDER, RENDER_EXAMPLES),
        ("run", _run, "run a whole job on this machine, without a cluster", RUN, RUN_EXAMPLES),
    ):
        command = commands.add_parser(
            name, help=summary, description=description, epilog=examples, formatter_class=formatter
        )
        _inputs(command, several=name != "run")
        if name == "render":
            command.add_argument(
                "-o",
                "--output",
                choices=("yaml", "json"),
                default="yaml",
                help="yaml (default) or json (a v1 List)",
            )
        command.set_defaults(handler=handler)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (without the program name), run the command, return the exit code."""
    args = parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except SpecError as error:
        print(error, file=sys.stderr)
        return 2


def entrypoint() -> None:
    """Console-script entry point."""
    sys.exit(main())
