"""``bertjob``: validate, render or run BertPretrainJob files, with kubectl's ways of naming them.

``validate`` and ``render`` take files as ``kubectl apply`` does (``-f FILE|DIR|-``, repeatable,
``-R`` for subdirectories, or files named without ``-f``), each a stream of documents; ``run``
takes one job file. Files are read as kubectl reads them (:mod:`bertjob_api.jobfile`), so what
passes here is what the cluster receives. A stream may hold objects of other kinds beside the jobs,
as a ``kubectl kustomize`` output does (a Namespace, a PersistentVolumeClaim): they are skipped
silently, as kubectl skips what it does not act on (``-v`` notes each on standard error); an input
with no BertPretrainJob at all is refused. A ``kind: List`` (``kubectl get -o yaml``) is read as its
items, and a live object's ``status`` is left out, as the webhook leaves it out. A job marked
``config.kubernetes.io/local-config: "true"`` (kustomize's mark of an object that never goes to a
cluster) is validated as ``run`` would take it, not as a cluster job.

Run as ``kubectl-bertjob`` (kubectl's plugin lookup), the usage and examples say ``kubectl bertjob``.

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
import re
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertjob_api.contract import LOCAL_COMMAND, TRAINER_MODULE
from bertjob_api.jobfile import (
    JOB_KIND,
    STDIN,
    STDIN_NAME,
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
from bertjob_api.validation import checked, warnings

PROG = "bertjob"
# kubectl runs a plugin as the executable kubectl-NAME (argv[0] its path) and users type "kubectl NAME".
PLUGIN_EXECUTABLE = "kubectl-bertjob"
PLUGIN_PROG = "kubectl bertjob"
# kustomize's annotation for an object that is configuration for local tools and never sent to a
# cluster (kustomize build drops it); here it marks a job for `bertjob run` on this machine.
LOCAL_CONFIG = "config.kubernetes.io/local-config"
# The extra that holds the trainer's dependencies (pyproject.toml), and how to install it.
TRAINER_EXTRA = "trainer"
INSTALL_TRAINER = (
    "pip install 'bertjob[trainer]' (from a checkout: pip install '.[trainer]', or "
    "pipx install --force '.[trainer]' where pipx installed bertjob)"
)
_SHOWN_MISSING = 5

DESCRIPTION = """\
Check, render and run BertPretrainJob files on this machine, with the checks the operator makes
before it creates anything."""

# Help texts name the command as {prog}: bertjob, or kubectl bertjob when run as kubectl's plugin.
EPILOG = """\
examples:
  {prog} validate examples/bert-large-1x8xa100.yaml
  kubectl kustomize examples/gitops/jobs | {prog} validate -f -
  {prog} render -n research -f examples/bert-base-8xa100.yaml
  {prog} run examples/bert-tiny-local.yaml

Run '{prog} COMMAND --help' for a command's options."""

INPUTS = """\
Files are named as for kubectl apply: -f FILE, -f DIR (its *.yaml, *.yml and *.json files in
sorted order; with -R its subdirectories' too) or -f - (standard input), as often as needed, or
as arguments without -f. Each file is a stream of YAML documents separated by '---' (or JSON);
a document is named FILE when it is its file's only one, else FILE#N (N counting from 1; standard
input is named stdin). A kind: List (kubectl get -o yaml) counts as its items, named FILE#N items[I]
(I from 0); a live object's status is ignored. Objects of other kinds (a Namespace, a Kustomization)
are skipped, silently unless -v; one of apiVersion bertjob.dev/* is checked as a job whatever its
kind. A document that is not a file's only one, or comes from standard input, is also named by its
job's namespace/name (its name alone where it names no namespace and -n none)."""

VALIDATE = f"""\
Check each BertPretrainJob as the operator would before creating anything: the fields, the
checks across them, that every path it writes lies on one of its volumes, and that each object
it renders fits what the API server stores (1 MiB; this renders the job, with kustomize or
kubectl as render does). One line per job on standard output; each invalid job's problems on
standard error, field path first, and each warning about a valid job, as the webhook gives it
to kubectl apply ('warning: JOB: FIELD: ...'; the exit status stays 0). A job annotated
config.kubernetes.io/local-config: "true" (kustomize's mark of an object never sent to a
cluster) is checked as run would take it, relative paths allowed, and not rendered;
examples/bert-tiny-local.yaml is one.

{INPUTS}

Exit status: 0 when every job is valid; 2 when a job is invalid, an input is missing or
unreadable, or the inputs hold no BertPretrainJob; 1 when kustomize fails."""

VALIDATE_EXAMPLES = """\
examples:
  {prog} validate examples/bert-large-1x8xa100.yaml
  {prog} validate -f examples/bert-base-8xa100.yaml -f examples/bert-large-gaudi.yaml
  {prog} validate -R -f examples/                    # every example; the local one as run takes it
  {prog} validate -f examples/gitops/jobs             # skips its Namespace, claim and Kustomization
  kubectl kustomize examples/gitops/jobs | {prog} validate -f -
  kubectl get bertpretrainjobs -o yaml | {prog} validate -f -"""

RENDER = f"""\
Print the objects the operator would create for each BertPretrainJob: its ConfigMap (the job
file as a block), the data-preparation Job if enabled, and the launcher's child (PyTorchJob,
MPIJob or TrainJob). Nothing is printed unless every job is valid; a job marked
config.kubernetes.io/local-config is refused (it is for run, not a cluster).

{INPUTS}

Exit status: 0 when rendered; 2 as for validate; 1 when kustomize fails."""

RENDER_EXAMPLES = """\
examples:
  {prog} render examples/bert-large-1x8xa100.yaml
  {prog} render -n research -f examples/bert-base-8xa100.yaml | kubectl apply --dry-run=client -f -
  {prog} render -o json -f examples/bert-base-trainjob.yaml"""

RUN = """\
Run the whole job on this machine, without a cluster: data preparation, every phase, the export
and any fine-tuning, then a fill-mask demonstration. Needs the trainer's dependencies, the extra
'trainer' (pip install 'bertjob[trainer]', or pip install '.[trainer]' in a checkout); without
them it says what is missing and exits 1. Relative paths in the job are relative to the working
directory. SIGTERM makes the trainer checkpoint and exit 143, as in a pod.

Exit status: the trainer's (0 done, 2 an invalid job file, 143 stopped by SIGTERM); 1 without the
trainer."""

RUN_EXAMPLES = """\
examples:
  {prog} run examples/bert-tiny-local.yaml"""


@dataclass(frozen=True)
class Job:
    """A BertPretrainJob read from an input: ``source`` names its document (:class:`Document`,
    with the job's namespace/name where the document's name alone does not find it); ``local``
    says that it is marked :data:`LOCAL_CONFIG`, a job for ``bertjob run`` only."""

    source: str
    job: BertPretrainJob
    local: bool = False


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
        shown = STDIN_NAME if name == STDIN else name
        for document in documents:
            job = _job(document, shown, args, report)
            if job is not None:
                report.jobs += 1
                yield job


def _job(document: Document, file: str, args: argparse.Namespace, report: Report) -> Job | None:
    """The job of ``document``, read from the input named ``file``, or ``None`` where it is of
    another kind or refused (then reported)."""
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
        source = _named(document.source, value, alone=document.source == file and file != STDIN_NAME)
        return Job(source, parse_job(value, source), local=_annotation(value, LOCAL_CONFIG) == "true")
    except SpecError as error:
        report.refuse(error)
        return None


def _named(source: str, value: Any, *, alone: bool) -> str:
    """``source``, followed by the job's ``(namespace/name)`` unless the document is ``alone`` in
    a file (its path finds it): a document among several, or on standard input (``kubectl get -o
    yaml``'s objects), is found by its name. The namespace is the one the document or ``-n``
    gives; without one, the name alone (the cluster's context would choose it). A name or
    namespace that is not a short printable string is left out: the problems list says why."""
    metadata = value.get("metadata") if isinstance(value, dict) else None
    if alone or not isinstance(metadata, dict):
        return source
    name, namespace = metadata.get("name"), metadata.get("namespace")
    if not _shown(name):
        return source
    return f"{source} ({namespace}/{name})" if _shown(namespace) else f"{source} ({name})"


def _shown(text: Any) -> bool:
    # 253: the longest name Kubernetes stores (a DNS subdomain).
    return isinstance(text, str) and 0 < len(text) <= 253 and text.isprintable()


def _annotation(value: Any, key: str) -> Any:
    """The annotation ``key`` of the document ``value``, ``None`` where it has none."""
    metadata = value.get("metadata") if isinstance(value, dict) else None
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    return annotations.get(key) if isinstance(annotations, dict) else None


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
            if found.local:
                # Never sent to a cluster: checked as `bertjob run` checks it before it trains.
                spec = checked(found.job.spec, found.source, "training")
            else:
                spec = rendered(found.job, found.source).job.spec
        except SpecError as error:
            report.refuse(error)
            continue
        except RenderError as error:
            print(f"{PROG} validate: {found.source}: {error}", file=sys.stderr)
            return 1
        name, size = found.job.metadata.name, spec.topology.world_size
        where = f" for {PROG} run ({LOCAL_CONFIG})" if found.local else ""
        print(f"{found.source}: valid {JOB_KIND} {name!r}{where}, world size {size}")
        # What a cluster may do with a valid job (the webhook returns the same to kubectl apply);
        # a local job meets no cluster.
        for path, message in [] if found.local else warnings(spec):
            print(f"warning: {found.source}: {path}: {message}", file=sys.stderr)
    return _none_found(args, report)


def _render(args: argparse.Namespace) -> int:
    from bertjob.render import RenderError, render

    report = Report()
    manifests: list[dict[str, Any]] = []
    for found in _jobs(args, report):
        if found.local:
            # Refused by name rather than by its relative paths: validate calls it valid.
            problem = f"{LOCAL_CONFIG}: a job for {PROG} run, which no cluster receives; nothing to render"
            report.refuse(SpecError(found.source, [("metadata.annotations", problem)]))
            continue
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
    missing = missing_trainer()
    if missing:
        shown = ", ".join(missing[:_SHOWN_MISSING])
        if len(missing) > _SHOWN_MISSING:
            shown += f" and {len(missing) - _SHOWN_MISSING} more"
        print(
            f"{PROG} run needs the trainer, the extra '{TRAINER_EXTRA}', which is not installed here "
            f"(missing: {shown}); install it: {INSTALL_TRAINER}",
            file=sys.stderr,
        )
        return 1
    # Checked here as the trainer will check it, so that an invalid file exits 2 (SpecError, in
    # main) before a trainer, and torch, starts.
    checked(job.spec, source, "training")
    # The same interpreter, so the same environment; the trainer prints to this process's stdout.
    return run_trainer([sys.executable, "-m", TRAINER_MODULE, LOCAL_COMMAND, "--config", source])


def missing_trainer() -> list[str]:
    """What ``bertjob run`` lacks to start the trainer: the trainer's package (``bertpretrain``)
    if it cannot be found, and each distribution of the extra :data:`TRAINER_EXTRA` that is not
    installed (by the installed ``bertjob``'s metadata: ``pip install .`` installs none of
    them), in the metadata's order. Empty where all are there; versions are not compared.
    Without ``bertjob``'s metadata (a checkout on ``PYTHONPATH``) only the package is looked for."""
    missing = [TRAINER_MODULE] if importlib.util.find_spec(TRAINER_MODULE) is None else []
    try:
        requirements = importlib.metadata.requires(PROG) or []
    except importlib.metadata.PackageNotFoundError:
        return missing
    extra = re.compile(rf"""extra\s*==\s*["']{TRAINER_EXTRA}["']""")
    for requirement in requirements:
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        if name is None or not extra.search(requirement):
            continue
        try:
            importlib.metadata.distribution(name[0])
        except importlib.metadata.PackageNotFoundError:
            missing.append(name[0])
    return missing


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


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command line: ``bertjob [--version] {validate,render,run} ...``, each command with its
    own ``--help`` (description, options, examples), where usage and examples name the command
    ``prog`` (``kubectl bertjob`` for the plugin)."""
    formatter = argparse.RawDescriptionHelpFormatter

    def named(text: str) -> str:
        return text.replace("{prog}", prog)

    top = argparse.ArgumentParser(
        prog=prog, description=DESCRIPTION, epilog=named(EPILOG), formatter_class=formatter
    )
    top.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    commands = top.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, handler, summary, description, examples in (
        ("validate", _validate, "check job files as the operator would", VALIDATE, VALIDATE_EXAMPLES),
        ("render", _render, "print the objects the operator would create", RENDER, RENDER_EXAMPLES),
        ("run", _run, "run a whole job on this machine, without a cluster", RUN, RUN_EXAMPLES),
    ):
        command = commands.add_parser(
            name, help=summary, description=description, epilog=named(examples), formatter_class=formatter
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


def prog_name(executable: str) -> str:
    """How the user typed the command whose executable (``argv[0]``) is ``executable``:
    :data:`PLUGIN_PROG` for kubectl's plugin (``kubectl-bertjob``, ``.exe`` on Windows), else
    :data:`PROG`."""
    return PLUGIN_PROG if Path(executable).stem == PLUGIN_EXECUTABLE else PROG


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Parse ``argv`` (without the program name), run the command, return the exit code; usage
    and help name the command ``prog``."""
    args = parser(prog).parse_args(argv)
    try:
        return int(args.handler(args))
    except SpecError as error:
        print(error, file=sys.stderr)
        return 2


def entrypoint() -> None:
    """Console-script entry point of ``bertjob`` and ``kubectl-bertjob``."""
    sys.exit(main(prog=prog_name(sys.argv[0])))
