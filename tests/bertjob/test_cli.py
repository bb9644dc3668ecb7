"""The ``bertjob`` CLI: validate, render and run job files, with the exit codes and messages users see."""

import importlib.metadata
import importlib.util
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

import bertjob.cli
from bertjob.cli import main
from bertjob_api.jobfile import dump, dump_all, read_documents
from bertjob_api.validation import KUEUE_TRAINJOB_UNTESTED
from bertjob_testing.jobs import EXAMPLES, REPO, valid_job, with_value


def _write(tmp_path, document):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_validate_accepts_a_valid_job(tmp_path, capsys):
    assert main(["validate", str(_write(tmp_path, valid_job()))]) == 0
    assert "valid BertPretrainJob 'demo'" in capsys.readouterr().out


def test_validate_refuses_each_bad_field_by_name(tmp_path, capsys):
    document = with_value(valid_job(), "spec.topology.nodes", "2")
    document = with_value(document, "spec.phases.0.batchSize", 64)
    assert main(["validate", str(_write(tmp_path, document))]) == 2
    err = capsys.readouterr().err
    assert "spec.topology.nodes: Input should be a valid integer" in err
    assert "spec.phases[0].batchSize: unknown field" in err


def test_validate_refuses_an_inconsistent_job(tmp_path, capsys):
    document = with_value(valid_job(), "spec.topology.processesPerNode", 3)
    assert main(["validate", str(_write(tmp_path, document))]) == 2
    assert "spec.phases[0].globalBatchSize: 64 is not divisible by world size 3" in capsys.readouterr().err


LOCAL_EXAMPLE = EXAMPLES / "bert-tiny-local.yaml"
LOCAL_MARK = "config.kubernetes.io/local-config"


def _unmarked_local_example() -> dict:
    """The demo's job without its local-config mark: a job meant for a cluster."""
    document = yaml.safe_load(LOCAL_EXAMPLE.read_text(encoding="utf-8"))
    assert document["metadata"].pop("annotations") == {LOCAL_MARK: "true"}
    return document


def test_validate_checks_as_the_operator_would(tmp_path, capsys):
    # The demo writes under the working directory, which a pod has no volume for.
    assert main(["validate", str(_write(tmp_path, _unmarked_local_example()))]) == 2
    assert "spec.data.shards: runs/bert-tiny-local/data must be an absolute path" in capsys.readouterr().err


def test_a_local_config_job_is_validated_as_run_takes_it(tmp_path, capsys):
    assert main(["validate", str(LOCAL_EXAMPLE)]) == 0
    assert capsys.readouterr().out == (
        f"{LOCAL_EXAMPLE}: valid BertPretrainJob 'bert-tiny-local' for bertjob run ({LOCAL_MARK}), "
        "world size 1\n"
    )
    # render, which writes what a cluster receives, refuses it by its mark.
    assert main(["render", str(LOCAL_EXAMPLE)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"{LOCAL_EXAMPLE}: invalid BertPretrainJob\n  metadata.annotations: {LOCAL_MARK}: a job for "
        "bertjob run, which no cluster receives; nothing to render\n"
    )
    # Marked local, it is still checked: what `bertjob run` would refuse is refused.
    marked = with_value(valid_job(), "metadata.annotations", {LOCAL_MARK: "true"})
    broken = with_value(marked, "spec.topology.processesPerNode", 3)
    assert main(["validate", str(_write(tmp_path, broken))]) == 2
    assert "globalBatchSize: 64 is not divisible by world size 3" in capsys.readouterr().err


def test_validate_r_on_examples_is_a_ci_gate():
    # What CI and a newcomer run on the whole examples tree (docs/design.md, "examples/ as a gate").
    result = subprocess.run(
        [sys.executable, "-m", "bertjob", "validate", "-R", "-f", "examples/"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    local = "examples/bert-tiny-local.yaml: valid BertPretrainJob 'bert-tiny-local' for bertjob run"
    assert local in result.stdout
    jobs = sorted(str(path.relative_to(REPO)) for path in EXAMPLES.glob("*.yaml"))
    for job in jobs:
        assert f"{job}: valid BertPretrainJob" in result.stdout
    # Valid, with a warning (Kueue and Trainer v2.3): stderr holds it, the exit code stays 0.
    warning = f"warning: examples/bert-base-trainjob.yaml: spec.queueName: {KUEUE_TRAINJOB_UNTESTED}\n"
    assert warning in result.stderr


def test_render_and_validate_cover_the_trainjob_launcher(tmp_path, capsys):
    document = with_value(valid_job(), "spec.launcher", "trainjob")
    assert main(["render", str(_write(tmp_path, document))]) == 0
    rendered = [obj for obj in yaml.safe_load_all(capsys.readouterr().out) if obj]
    assert rendered[-1]["kind"] == "TrainJob"
    assert rendered[-1]["spec"]["runtimeRef"]["name"] == "bertjob-torch"

    document = with_value(document, "spec.runPolicy", {"backoffLimit": 3})
    assert main(["validate", str(_write(tmp_path, document))]) == 2
    assert "spec.runPolicy.backoffLimit: a TrainJob has none" in capsys.readouterr().err


def test_validate_warns_of_a_queued_trainjob_on_stderr_and_exits_0(tmp_path, capsys):
    # Kueue v0.17 to v0.19 queue no Trainer v2.3 TrainJob: a warning (as the webhook gives
    # kubectl apply), not a refusal.
    queued = with_value(with_value(valid_job(), "spec.launcher", "trainjob"), "spec.queueName", "team-a")
    path = _write(tmp_path, queued)
    assert main(["validate", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{path}: valid BertPretrainJob 'demo', world size 1\n"
    assert captured.err == f"warning: {path}: spec.queueName: {KUEUE_TRAINJOB_UNTESTED}\n"


def test_a_warning_names_the_job_as_the_line_above_it(monkeypatch, capsys):
    # One line per warning, naming the document and its job as the job's own line does.
    queued = {"spec__launcher": "trainjob", "spec__queueName": "team-a"}
    stream = dump_all(
        [
            _job_object("demo", spec__queueName="team-a"),  # a queued PyTorchJob: no warning
            _job_object("queued", metadata__namespace="team", **queued),
        ]
    )
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stream.encode())))
    assert main(["validate", "-f", "-"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        "stdin#1 (demo): valid BertPretrainJob 'demo', world size 1",
        "stdin#2 (team/queued): valid BertPretrainJob 'queued', world size 1",
    ]
    assert captured.err.splitlines() == [
        f"warning: stdin#2 (team/queued): spec.queueName: {KUEUE_TRAINJOB_UNTESTED}"
    ]


HOLE = "__hole__"


def _job_text(dotted: str, raw_yaml: str) -> str:
    """The valid job as YAML text, with the field at ``dotted`` written as ``raw_yaml``."""
    return yaml.safe_dump(with_value(valid_job(), dotted, HOLE), sort_keys=False).replace(HOLE, raw_yaml)


def _write_text(tmp_path, text: str | bytes):
    path = tmp_path / "job.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def _alias_bomb() -> str:
    """A 'billion laughs' affinity: nine levels of nine aliases of the level before (9**9 strings)."""
    levels = ["&l0 [" + ", ".join(["lol"] * 9) + "]"]
    levels += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 9)]
    return "{" + ", ".join(f"l{i}: {level}" for i, level in enumerate(levels)) + "}"


HOSTILE = {
    "nan-in-env": _job_text("spec.pod", "{env: [{name: X, value: .nan}]}"),
    "inf-in-affinity": _job_text("spec.pod", "{affinity: {weight: -.inf}}"),
    "not-utf8": _job_text("spec.image", "caf\xe9").encode("latin-1"),
    "deep": _job_text("spec.pod", "{affinity: " + "[" * 500 + "]" * 500 + "}"),
    "self-alias": _job_text("spec.pod", "{affinity: &a {nodeAffinity: *a}}"),
    "alias-bomb": _job_text("spec.pod", "{affinity: " + _alias_bomb() + "}"),
    "duplicate-key": _job_text("spec.image", "a\n  image: b"),
}
HOSTILE_MESSAGES = {
    "nan-in-env": "spec.pod.env[0].value (line 27): .nan is not a number JSON can hold; kubectl refuses NaN",
    "inf-in-affinity": "spec.pod.affinity.weight (line 27): -.inf is not a number JSON can hold",
    "not-utf8": "line 6: not UTF-8 (byte 0xe9); save the file as UTF-8",
    "deep": "nested more than 100 levels deep",
    "self-alias": "spec.pod.affinity.nodeAffinity (line 27): an alias refers to a value that contains it",
    "alias-bomb": "excessive aliasing: the aliases expand to more than 100000 values",
    "duplicate-key": "spec.image (line 7): duplicate key 'image' (also at line 6)",
}


@pytest.mark.parametrize("command", ["validate", "render"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_file_ends_in_a_message_and_exit_2(tmp_path, capsys, case, command):
    assert main([command, str(_write_text(tmp_path, HOSTILE[case]))]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"{tmp_path / 'job.yaml'}: invalid BertPretrainJob\n")
    assert HOSTILE_MESSAGES[case] in captured.err
    assert "Traceback" not in captured.err


def _limit_memory() -> None:
    # The bomb once grew past 4 GB; a few hundred MB is many times what a job file needs.
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


MEMORY_LIMIT = 512 * 2**20


@pytest.mark.parametrize("command", ["validate", "render"])
@pytest.mark.parametrize("case", ["alias-bomb", "deep", "self-alias"])
def test_hostile_files_are_refused_in_bounded_time_and_memory(tmp_path, case, command):
    path = _write_text(tmp_path, HOSTILE[case])
    result = subprocess.run(
        [sys.executable, "-m", "bertjob", command, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limit_memory,
        check=False,
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert HOSTILE_MESSAGES[case] in result.stderr


@pytest.mark.parametrize(
    ("dotted", "raw", "message"),
    [
        # YAML 1.1 reads 4:16 as the base-60 integer 256; kubectl sends the string "4:16".
        ("spec.data.numShards", "4:16", "spec.data.numShards: Input should be a valid integer"),
        # kubectl cannot turn infinity into JSON.
        ("spec.phases.0.learningRate", ".inf", "spec.phases[0].learningRate (line 18): .inf is not a number"),
        # go-yaml reads y as true, where YAML 1.1 reads the string "y".
        ("spec.image", "y", "spec.image: Input should be a valid string"),
    ],
)
def test_validate_reads_the_file_as_kubectl_does(tmp_path, capsys, dotted, raw, message):
    assert main(["validate", str(_write_text(tmp_path, _job_text(dotted, raw)))]) == 2
    assert message in capsys.readouterr().err


def test_validate_accepts_what_yaml_1_1_would_misread(tmp_path, capsys):
    # YAML 1.1 reads 6e-3 as a string; go-yaml, and so kubectl, as the number 0.006.
    path = _write_text(tmp_path, _job_text("spec.phases.0.learningRate", "6e-3"))
    assert main(["validate", str(path)]) == 0
    assert "valid BertPretrainJob 'demo'" in capsys.readouterr().out


def test_render_quotes_strings_kubectl_would_read_as_another_type(tmp_path, capsys):
    env = "{env: [{name: A, value: 'y'}, {name: B, value: '1e3'}, {name: C, value: '0o17'}]}"
    assert main(["render", str(_write_text(tmp_path, _job_text("spec.pod", env)))]) == 0
    rendered = capsys.readouterr().out
    for value in ("y", "1e3", "0o17"):
        assert f"value: '{value}'" in rendered


def test_run_starts_the_trainer_as_a_process_and_returns_its_exit_code(tmp_path, monkeypatch):
    started = []

    def trainer(command):
        started.append(command)
        return 143

    monkeypatch.setattr(bertjob.cli, "run_trainer", trainer)
    path = _write(tmp_path, valid_job())
    assert main(["run", str(path)]) == 143
    assert started == [[sys.executable, "-m", "bertpretrain", "local", "--config", str(path)]]


def test_run_refuses_an_invalid_job_before_starting_the_trainer(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bertjob.cli, "run_trainer", lambda *_: pytest.fail("trainer started"))
    document = with_value(valid_job(), "spec.topology.processesPerNode", 3)
    assert main(["run", str(_write(tmp_path, document))]) == 2
    assert "spec.phases[0].globalBatchSize: 64 is not divisible by world size 3" in capsys.readouterr().err


INSTALL_HINT = (
    "install it: pip install 'bertjob[trainer]' (from a checkout: pip install '.[trainer]', or "
    "pipx install --force '.[trainer]' where pipx installed bertjob)\n"
)


def test_run_needs_the_trainer(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        bertjob.cli.importlib.util, "find_spec", lambda name: None if name == "bertpretrain" else real(name)
    )
    monkeypatch.setattr(bertjob.cli, "run_trainer", lambda *_: pytest.fail("trainer started"))
    assert main(["run", str(_write(tmp_path, valid_job()))]) == 1
    assert capsys.readouterr().err == (
        "bertjob run needs the trainer, the extra 'trainer', which is not installed here "
        "(missing: bertpretrain); " + INSTALL_HINT
    )


def test_run_without_the_trainer_extra_names_the_extra_and_how_to_install_it(tmp_path, monkeypatch, capsys):
    # `pip install .` without [trainer]: the trainer's package is there, tqdm (and torch...) not.
    real = importlib.metadata.distribution
    absent = {"tqdm", "torch"}

    def distribution(name):
        if name in absent:
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(bertjob.cli.importlib.metadata, "distribution", distribution)
    monkeypatch.setattr(bertjob.cli, "run_trainer", lambda *_: pytest.fail("trainer started"))
    assert main(["run", str(_write(tmp_path, valid_job()))]) == 1
    assert capsys.readouterr().err == (
        "bertjob run needs the trainer, the extra 'trainer', which is not installed here "
        "(missing: torch, tqdm); " + INSTALL_HINT
    )


def test_run_without_the_extra_in_a_process_of_its_own(tmp_path):
    # No monkeypatching: a bertjob distribution found first on the path whose trainer extra names
    # a distribution that is not installed, as `pip install .` leaves every one of them.
    info = tmp_path / "site" / "bertjob-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: bertjob\nVersion: 0.1.0\nProvides-Extra: trainer\n"
        'Requires-Dist: pyyaml>=6\nRequires-Dist: not-installed-tqdm>=4; extra == "trainer"\n'
    )
    job = _write(tmp_path, valid_job())
    result = subprocess.run(
        [sys.executable, "-m", "bertjob", "run", str(job)],
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
        cwd=tmp_path,  # not the checkout, whose bertjob.egg-info would be found first
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr == (
        "bertjob run needs the trainer, the extra 'trainer', which is not installed here "
        "(missing: not-installed-tqdm); " + INSTALL_HINT
    )
    assert "Traceback" not in result.stderr


def test_the_trainer_extra_is_read_from_the_installed_metadata():
    # Every distribution of pyproject.toml's extra, and nothing else, is looked for.
    requirements = importlib.metadata.requires("bertjob") or []
    trainer = [r for r in requirements if 'extra == "trainer"' in r]
    assert any(r.startswith("tqdm") for r in trainer) and any(r.startswith("torch") for r in trainer)
    assert bertjob.cli.missing_trainer() == []  # the dev environment has the extra


RUN_WITHOUT_A_TRAINER = """
import subprocess, sys
import bertjob.cli
bertjob.cli.run_trainer = lambda command: 0
assert bertjob.cli.main(["run", sys.argv[1]]) == 0
print(sorted(name for name in sys.modules if name.startswith(("bertpretrain", "torch"))))
"""


def test_run_imports_no_trainer_code(tmp_path):
    path = _write(tmp_path, valid_job())
    result = subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT_A_TRAINER, str(path)], capture_output=True, text=True, check=False
    )
    assert (result.returncode, result.stdout) == (0, "[]\n"), result.stderr


# A trainer that says it is ready, then exits as the trainer does on SIGTERM.
TRAINER_ON_SIGTERM = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("checkpoint", flush=True), sys.exit(143)))
print("ready", flush=True)
time.sleep(60)
sys.exit(0)
"""


def test_run_passes_sigterm_on_to_the_trainer_and_returns_its_exit_code():
    program = "import sys; from bertjob.cli import run_trainer; sys.exit(run_trainer(sys.argv[1:]))"
    cli = subprocess.Popen(
        [sys.executable, "-c", program, sys.executable, "-c", TRAINER_ON_SIGTERM],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert cli.stdout is not None and cli.stdout.readline() == "ready\n"
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=30) == 143
        assert cli.stdout.read() == "checkpoint\n"
    finally:
        cli.kill()


# ---- the command line as kubectl's: per-command help, --version, -f FILE|DIR|-, -n, -o ----


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["validate", "--help"],
            ["usage: bertjob validate", "Check each BertPretrainJob", "-f FILE|DIR|-", "-R,"],
        ),
        (
            ["render", "--help"],
            ["usage: bertjob render", "Print the objects the operator", "-n NAMESPACE", "{yaml,json}"],
        ),
        (
            ["run", "--help"],
            ["usage: bertjob run", "Run the whole job on this machine", "Exit status: the trainer's"],
        ),
        (["--help"], ["usage: bertjob", "validate", "render", "run", "bertjob COMMAND --help"]),
    ],
)
def test_each_command_has_its_own_help_in_plain_text(capsys, argv, expected):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out = capsys.readouterr().out
    assert exited.value.code == 0
    for text in expected:
        assert text in out
    command = argv[0] if argv[0] != "--help" else ""
    assert "examples:\n  bertjob " + (command or "validate") in out
    assert not any(markup in out for markup in ("``", ":func:", ":mod:", ":data:"))


def test_version_is_the_installed_package_s(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"bertjob {importlib.metadata.version('bertjob')}\n"


NAMESPACE = "apiVersion: v1\nkind: Namespace\nmetadata: {name: bert}\n"
CLAIM = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: bert-data}\n"


def _job(name: str, **changes) -> str:
    document = {**valid_job(), "metadata": {"name": name}}
    for dotted, value in changes.items():
        document = with_value(document, dotted.replace("__", "."), value)
    return dump(document)


def _live_list(*items: dict) -> str:
    """What ``kubectl get bertpretrainjobs -o yaml`` prints for ``items``: a v1 List of the objects
    as the API server holds them, server-set metadata and status included."""
    live = [
        {
            **item,
            "metadata": {
                **item["metadata"],
                "namespace": "default",
                "uid": "6f1c0d3e-4b7a-4c59-9a55-1d3f0e2b8c71",
                "resourceVersion": "4711",
                "generation": 1,
                "creationTimestamp": "2026-11-28T10:00:00Z",
            },
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "False", "reason": "Training"}],
                "progress": {"step": 10, "budgetLeftSeconds": 3600},
            },
        }
        for item in items
    ]
    return dump({"apiVersion": "v1", "kind": "List", "items": live, "metadata": {"resourceVersion": ""}})


def _job_object(name: str, **changes) -> dict:
    document = {**valid_job(), "metadata": {"name": name}}
    for dotted, value in changes.items():
        document = with_value(document, dotted.replace("__", "."), value)
    return document


BOMB = (
    "{l0: &l0 ["
    + ", ".join(["lol"] * 9)
    + "], "
    + ", ".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 9))
    + "}\n"
)

# Each case: files to write (name -> text), standard input, the arguments, the exit code, the
# lines on standard output, and texts standard error must hold (in this order).
INPUT_CASES = {
    "a file without -f, as before": (
        {"job.yaml": _job("demo")},
        None,
        ["validate", "job.yaml"],
        0,
        ["job.yaml: valid BertPretrainJob 'demo', world size 1"],
        [],
    ),
    "several -f": (
        {"a.yaml": _job("a"), "b.yaml": _job("b")},
        None,
        ["validate", "-f", "a.yaml", "-f", "b.yaml"],
        0,
        [
            "a.yaml: valid BertPretrainJob 'a', world size 1",
            "b.yaml: valid BertPretrainJob 'b', world size 1",
        ],
        [],
    ),
    "a directory, sorted, not its subdirectories, other kinds skipped silently": (
        {
            "d/b.yaml": _job("b"),
            "d/a.yml": _job("a"),
            "d/ns.yaml": NAMESPACE,
            "d/notes.txt": "x",
            "d/s/c.yaml": _job("c"),
        },
        None,
        ["validate", "-f", "d"],
        0,
        [
            "d/a.yml: valid BertPretrainJob 'a', world size 1",
            "d/b.yaml: valid BertPretrainJob 'b', world size 1",
        ],
        [],
    ),
    "a directory with -R": (
        {"d/b.yaml": _job("b"), "d/s/c.yaml": _job("c")},
        None,
        ["validate", "-R", "-f", "d"],
        0,
        [
            "d/b.yaml: valid BertPretrainJob 'b', world size 1",
            "d/s/c.yaml: valid BertPretrainJob 'c', world size 1",
        ],
        [],
    ),
    "a kustomize output on standard input, -v noting what is skipped": (
        {},
        NAMESPACE + "---\n" + CLAIM + "---\n" + _job("a") + "---\n" + _job("b"),
        ["validate", "-v", "-f", "-"],
        0,
        [
            "stdin#3 (a): valid BertPretrainJob 'a', world size 1",
            "stdin#4 (b): valid BertPretrainJob 'b', world size 1",
        ],
        [
            "stdin#1: not a BertPretrainJob (kind: Namespace), skipped",
            "stdin#2: not a BertPretrainJob (kind: PersistentVolumeClaim), skipped",
        ],
    ),
    "an invalid job among valid ones: each reported, exit 2": (
        {
            "jobs.yaml": _job("a")
            + "---\n"
            + _job("b", spec__topology__processesPerNode=3)
            + "---\n"
            + _job("c")
        },
        None,
        ["validate", "jobs.yaml"],
        2,
        [
            "jobs.yaml#1 (a): valid BertPretrainJob 'a', world size 1",
            "jobs.yaml#3 (c): valid BertPretrainJob 'c', world size 1",
        ],
        # Among several documents, named by the job too (no namespace: the context's would apply).
        ["jobs.yaml#2 (b): invalid BertPretrainJob\n", "globalBatchSize: 64 is not divisible by world size"],
    ),
    "a stream with -n: each job named namespace/name": (
        {},
        _job("a") + "---\n" + _job("b", spec__topology__processesPerNode=3),
        ["validate", "-n", "research", "-f", "-"],
        2,
        ["stdin#1 (research/a): valid BertPretrainJob 'a', world size 1"],
        ["stdin#2 (research/b): invalid BertPretrainJob\n", "not divisible by world size 3"],
    ),
    "a job on standard input alone: named namespace/name": (
        {},
        _job("b", metadata__namespace="team", spec__topology__processesPerNode=3),
        ["render", "-f", "-"],
        2,
        [],
        ["stdin (team/b): invalid BertPretrainJob\n", "not divisible by world size 3"],
    ),
    "a hostile document among valid ones": (
        {},
        _job("a") + "---\n" + _job("b").replace("spec:\n", "bomb: " + BOMB + "spec:\n", 1),
        ["validate", "-f", "-"],
        2,
        ["stdin#1 (a): valid BertPretrainJob 'a', world size 1"],
        ["stdin#2: invalid BertPretrainJob\n  line 32: excessive aliasing"],
    ),
    "a missing file": ({}, None, ["validate", "job.yaml"], 2, [], ["job.yaml: no such file or directory\n"]),
    "a file of another kind": (
        {"ns.yaml": NAMESPACE},
        None,
        ["validate", "ns.yaml"],
        2,
        [],
        ["bertjob validate: no BertPretrainJob in ns.yaml\n"],
    ),
    "kubectl get -o yaml: a List of live objects, status and server metadata included": (
        {},
        _live_list(_job_object("a"), _job_object("b")),
        ["validate", "-f", "-"],
        0,
        [
            "stdin#1 items[0] (default/a): valid BertPretrainJob 'a', world size 1",
            "stdin#1 items[1] (default/b): valid BertPretrainJob 'b', world size 1",
        ],
        [],
    ),
    "a List with one bad item: its place and the item named": (
        {
            "live.yaml": NAMESPACE
            + "---\n"
            + _live_list(_job_object("a"), _job_object("b", spec__topology__processesPerNode=3))
        },
        None,
        ["validate", "live.yaml"],
        2,
        ["live.yaml#2 items[0] (default/a): valid BertPretrainJob 'a', world size 1"],
        [
            "live.yaml#2 items[1] (default/b): invalid BertPretrainJob\n",
            "globalBatchSize: 64 is not divisible by world size 3",
        ],
    ),
    "a List whose items are not a list": (
        {"list.yaml": "apiVersion: v1\nkind: List\nitems: {a: 1}\n"},
        None,
        ["validate", "list.yaml"],
        2,
        [],
        ["list.yaml#1: invalid BertPretrainJob\n  items: a List's items must be a list, not an object"],
    ),
    "render: a List's items rendered": (
        {"live.yaml": _live_list(_job_object("a"))},
        None,
        ["render", "live.yaml"],
        0,
        None,
        [],
    ),
    "a misspelt kind of this API is refused by name, not skipped": (
        {"job.yaml": _job("a").replace("kind: BertPretrainJob", "kind: BertPretrainjob")},
        None,
        ["validate", "job.yaml"],
        2,
        [],
        ["job.yaml: invalid BertPretrainJob\n  kind: Input should be 'BertPretrainJob'"],
    ),
    "no input": (
        {},
        None,
        ["validate"],
        2,
        [],
        ["bertjob: no input: name a file, a directory, or -f - for standard input"],
    ),
    "render: another namespace than -n names": (
        {"job.yaml": _job("a", metadata__namespace="team")},
        None,
        ["render", "-n", "other", "job.yaml"],
        2,
        [],
        [
            "job.yaml: invalid BertPretrainJob\n",
            "metadata.namespace: 'team' is not the namespace -n names ('other')",
        ],
    ),
    "render: nothing printed unless every job is valid": (
        {"a.yaml": _job("a"), "b.yaml": _job("b", spec__topology__processesPerNode=3)},
        None,
        ["render", "a.yaml", "b.yaml"],
        2,
        [],
        ["b.yaml: invalid BertPretrainJob\n"],
    ),
    "run: one job file": (
        {"a.yaml": _job("a"), "b.yaml": _job("b")},
        None,
        ["run", "a.yaml", "b.yaml"],
        2,
        [],
        ["bertjob run: name one job file (not a directory, not -)"],
    ),
    "run: a file of another kind": (
        {"ns.yaml": NAMESPACE},
        None,
        ["run", "ns.yaml"],
        2,
        [],
        ["ns.yaml: not a BertPretrainJob (kind: Namespace)\n"],
    ),
}


@pytest.mark.parametrize("case", list(INPUT_CASES))
def test_inputs_are_named_and_reported_as_kubectl_names_them(tmp_path, monkeypatch, capsys, case):
    files, stdin, argv, code, out, err = INPUT_CASES[case]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bertjob.cli, "run_trainer", lambda *_: pytest.fail("trainer started"))
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    assert main(argv) == code
    captured = capsys.readouterr()
    if out is None:  # rendered objects: the job's own ConfigMap among them
        assert "kind: ConfigMap" in captured.out and "name: a" in captured.out
    else:
        assert captured.out.splitlines() == out
    if not err:
        assert captured.err == ""
    position = 0
    for text in err:
        position = captured.err.index(text, position)
    if "another kind" in case:
        # Named as such, not refused field by field.
        assert "Input should be" not in captured.err


def _rendered(capsys, argv):
    assert main(argv) == 0
    return capsys.readouterr().out


def test_render_sets_the_namespace_of_every_object_that_n_names(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(_job("demo"))
    objects = [
        obj for obj in yaml.safe_load_all(_rendered(capsys, ["render", "-n", "research", str(path)])) if obj
    ]
    assert {obj["metadata"]["namespace"] for obj in objects} == {"research"}
    configmap = yaml.safe_load(objects[0]["data"]["job.yaml"])
    assert configmap["metadata"]["namespace"] == "research"
    # Without -n, the namespace the API server would give: default.
    objects = [obj for obj in yaml.safe_load_all(_rendered(capsys, ["render", str(path)])) if obj]
    assert {obj["metadata"]["namespace"] for obj in objects} == {"default"}


def test_render_o_json_writes_the_yaml_objects_as_one_v1_list(tmp_path, capsys):
    path = tmp_path / "jobs.yaml"
    path.write_text(_job("a") + "---\n" + _job("b"))
    as_yaml = [obj for obj in yaml.safe_load_all(_rendered(capsys, ["render", str(path)])) if obj]
    as_json = json.loads(_rendered(capsys, ["render", "-o", "json", str(path)]))
    assert as_json == {"apiVersion": "v1", "kind": "List", "items": as_yaml}
    assert [obj["metadata"]["name"] for obj in as_yaml if obj["kind"] == "ConfigMap"] == ["a-job", "b-job"]


def test_render_writes_the_job_file_as_a_block_kubectl_reads_back(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(
        _job("demo", spec__pod={"env": [{"name": "A", "value": "y"}, {"name": "B", "value": "two\nlines"}]})
    )
    rendered = _rendered(capsys, ["render", str(path)])
    assert "\n  job.yaml: |\n    apiVersion: bertjob.dev/v1alpha1\n" in rendered
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "rendered.yaml").write_text(rendered)
    configmap = read_documents(str(tmp_path / "out" / "rendered.yaml"))[0].value
    job_file = configmap["data"]["job.yaml"]
    # Go's YAML (kustomize, inside kubectl) reads the stream and writes it back: the same file.
    (tmp_path / "out" / "kustomization.yaml").write_text("resources: [rendered.yaml]\n")
    built = subprocess.run(
        ["kubectl", "kustomize", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    (tmp_path / "built.yaml").write_text(built)
    again = [doc.value for doc in read_documents(str(tmp_path / "built.yaml")) if doc.kind == "ConfigMap"]
    assert again[0]["data"]["job.yaml"] == job_file
    assert yaml.safe_load(job_file)["spec"]["pod"]["env"][:2] == [
        {"name": "A", "value": "y"},
        {"name": "B", "value": "two\nlines"},
    ]


# Nine levels... five here: 9**5 strings, under MAX_VALUES in one job, over MAX_STREAM_VALUES in 20.
SMALL_BOMB = (
    "{l0: &l0 ["
    + ", ".join(["lol"] * 9)
    + "], "
    + ", ".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 5))
    + "}\n"
)


def test_a_stream_of_small_bombs_is_refused_in_bounded_time_and_memory(tmp_path):
    job = _job("a").replace("spec:\n", "bomb: " + SMALL_BOMB + "spec:\n", 1)
    result = subprocess.run(
        [sys.executable, "-m", "bertjob", "validate", "-f", "-"],
        input="---\n".join([job] * 40),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_memory,
        check=False,
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert "stdin: invalid BertPretrainJob\n  line " in result.stderr
    assert "values in all documents" in result.stderr


# ---- -R over symbolic links, as kubectl apply -R walks (Go's filepath.Walk follows none) ----

LOOPS = {
    # name -> (links to make: path -> target), the jobs -R must report, each once
    "one loop back to the top": ({"d/s/up": ".."}, ["d/a.yaml", "d/s/b.yaml"]),
    "two loops, each back to the top": ({"d/s/up": "..", "d/s/t/up": "../.."}, ["d/a.yaml", "d/s/b.yaml"]),
    "a link to a directory outside, and to a job file": (
        {"d/outside": "../elsewhere", "d/z-link.yaml": "../elsewhere/c.yaml"},
        ["d/a.yaml", "d/s/b.yaml", "d/z-link.yaml"],
    ),
}


@pytest.mark.parametrize("case", list(LOOPS))
def test_validate_r_follows_no_directory_link_and_reports_each_job_once(tmp_path, case):
    links, expected = LOOPS[case]
    for name, job in (("d/a.yaml", "a"), ("d/s/b.yaml", "b"), ("elsewhere/c.yaml", "c")):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(_job(job), encoding="utf-8")
    for link, target in links.items():
        (tmp_path / link).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, tmp_path / link)
    started = time.monotonic()
    # A subprocess with a timeout: a walk that loops fails here instead of hanging the suite.
    result = subprocess.run(
        [sys.executable, "-m", "bertjob", "validate", "-R", "-f", "d"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert [line.split(":")[0] for line in result.stdout.splitlines()] == expected
    assert time.monotonic() - started < 30


# ---- run as kubectl's plugin: kubectl-bertjob, typed as "kubectl bertjob" ----


@pytest.mark.parametrize(
    ("executable", "prog"),
    [
        ("/home/me/.local/bin/kubectl-bertjob", "kubectl bertjob"),
        ("kubectl-bertjob.exe", "kubectl bertjob"),
        ("/usr/bin/bertjob", "bertjob"),
    ],
)
def test_the_command_is_named_as_the_user_typed_it(executable, prog):
    assert bertjob.cli.prog_name(executable) == prog


def test_as_kubectl_s_plugin_usage_and_examples_say_kubectl_bertjob(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["/home/me/.local/bin/kubectl-bertjob", "validate", "--help"])
    with pytest.raises(SystemExit) as exited:
        bertjob.cli.entrypoint()
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: kubectl bertjob validate ")
    assert "examples:\n  kubectl bertjob validate " in out
    assert "| kubectl bertjob validate -f -" in out
    # A usage error names it so too.
    monkeypatch.setattr(sys, "argv", ["/home/me/.local/bin/kubectl-bertjob"])
    with pytest.raises(SystemExit) as exited:
        bertjob.cli.entrypoint()
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith("usage: kubectl bertjob [-h]")


def test_kubectl_runs_the_plugin_whose_help_says_kubectl_bertjob(tmp_path):
    script = os.path.join(os.path.dirname(sys.executable), "kubectl-bertjob")
    if not os.path.exists(script) or not shutil.which("kubectl"):
        pytest.skip("needs kubectl and this environment's kubectl-bertjob script")
    env = {**os.environ, "PATH": os.path.dirname(script) + os.pathsep + os.environ["PATH"]}
    result = subprocess.run(
        ["kubectl", "bertjob", "run", "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: kubectl bertjob run ")
    assert "  kubectl bertjob run examples/bert-tiny-local.yaml" in result.stdout
