"""The ``bertjob`` CLI: validate, render and run a job file, with the exit codes and messages users see."""

import importlib.util
import resource
import signal
import subprocess
import sys

import pytest
import yaml

import bertjob.cli
from bertjob.cli import main
from bertjob_testing.jobs import EXAMPLES, valid_job, with_value


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


def test_validate_checks_as_the_operator_would(capsys):
    # The demo writes under the working directory, which a pod has no volume for.
    assert main(["validate", str(EXAMPLES / "bert-tiny-local.yaml")]) == 2
    assert "spec.data.shards: runs/bert-tiny-local/data must be an absolute path" in capsys.readouterr().err


def test_render_and_validate_cover_the_trainjob_launcher(tmp_path, capsys):
    document = with_value(valid_job(), "spec.launcher", "trainjob")
    assert main(["render", str(_write(tmp_path, document))]) == 0
    rendered = [obj for obj in yaml.safe_load_all(capsys.readouterr().out) if obj]
    assert rendered[-1]["kind"] == "TrainJob"
    assert rendered[-1]["spec"]["runtimeRef"]["name"] == "bertjob-torch"

    document = with_value(document, "spec.runPolicy", {"backoffLimit": 3})
    assert main(["validate", str(_write(tmp_path, document))]) == 2
    assert "spec.runPolicy.backoffLimit: a TrainJob has none" in capsys.readouterr().err


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


def test_run_needs_the_trainer(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        bertjob.cli.importlib.util, "find_spec", lambda name: None if name == "bertpretrain" else real(name)
    )
    monkeypatch.setattr(bertjob.cli, "run_trainer", lambda *_: pytest.fail("trainer started"))
    assert main(["run", str(_write(tmp_path, valid_job()))]) == 1
    assert capsys.readouterr().err == (
        "bertjob run needs the trainer (pip install '.[trainer]'): No module named 'bertpretrain'\n"
    )


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
