"""What a re-run of the data stage reuses: only what the same inputs made, never a failed run's
leftovers; and the data workers die with the process that started them."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import yaml

from bertjob_api.spec import SourceSpec
from bertjob_testing.jobs import valid_job, with_value
from bertpretrain.data.format.shards import read_shard
from bertpretrain.data.prepare.corpus import splitting
from bertpretrain.data.prepare.corpus.pydocs import BUILTIN_PYTHON_DOCS
from bertpretrain.data.prepare.corpus.sources import read_source
from bertpretrain.data.prepare.stage import prepare
from bertpretrain.run import main as bertpretrain_main
from tests.bertpretrain.data.prepare.test_prepare import make_spec, modified_times

UNK = 1


def write_corpus(path: Path, first: int, count: int) -> Path:
    """Documents ``first`` to ``first + count`` of the built-in text, in BERT's format.

    Each document is a module's docstrings, so two ranges share no document."""
    builtin = read_source(SourceSpec(path=BUILTIN_PYTHON_DOCS), collections.Counter())
    documents = [splitting.sentences(d) for d in islice(builtin, first, first + count)]
    path.write_text("\n\n".join("\n".join(d) for d in documents) + "\n", encoding="utf-8")
    return path


def shard_tokens(directory: Path) -> np.ndarray:
    """Every real token of a dataset's training shards (padding left out)."""
    arrays = [read_shard(path) for path in sorted(directory.glob("shard_*.hdf5"))]
    return np.concatenate([a["input_ids"][a["input_mask"] > 0] for a in arrays])


def lines(output: str, prefix: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(f"data: {prefix}")]


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An uncased vocabulary of 1000 tokens trained on the first 60 documents."""
    root = tmp_path_factory.mktemp("vocab")
    text = write_corpus(root / "corpus.txt", 0, 60)
    return str(prepare(make_spec(root / "out", [{"path": str(text)}])).vocab_dir / "vocab.txt")


def test_vocabulary_is_remade_when_the_job_asks_for_another(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = write_corpus(tmp_path / "small.txt", 0, 30)
    other = write_corpus(tmp_path / "other.txt", 30, 60)
    assert (
        prepare(make_spec(tmp_path / "out", [{"path": str(small)}], vocab={"trainSize": 120})).vocab_size
        == 120
    )
    capsys.readouterr()
    data = prepare(make_spec(tmp_path / "out", [{"path": str(other)}], vocab={"trainSize": 400}))
    assert data.vocab_size == 400
    [line] = lines(capsys.readouterr().out, "vocabulary: rebuilding")
    assert "train_size changed (120 -> 400)" in line and f"{small} removed" in line, line


def test_an_edited_corpus_file_remakes_what_was_made_from_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = write_corpus(tmp_path / "corpus.txt", 0, 20)
    spec = make_spec(tmp_path / "out", [{"path": str(text)}])
    prepare(spec)
    capsys.readouterr()
    again = prepare(spec)
    output = capsys.readouterr().out
    assert lines(output, "vocabulary: reusing") and lines(output, f"{again.phase_dirs[0]}: reusing"), output

    write_corpus(text, 20, 40)
    edited = prepare(spec)
    output = capsys.readouterr().out
    for stage in ("vocabulary", "documents", str(edited.phase_dirs[0])):
        [line] = lines(output, f"{stage}: rebuilding")
        assert f"the corpus changed (size/mtime of {text})" in line, line
    made = json.loads((edited.phase_dirs[0] / "metadata.json").read_text())
    assert made["documents"] == 40


def test_a_file_added_to_a_directory_source_is_read(
    tmp_path: Path, vocab_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "corpus").mkdir()
    write_corpus(tmp_path / "corpus" / "a.txt", 0, 10)
    spec = make_spec(tmp_path / "out", [{"path": str(tmp_path / "corpus")}], vocab={"file": vocab_file})
    directory = prepare(spec).phase_dirs[0]
    assert json.loads((directory / "metadata.json").read_text())["documents"] == 10
    added = write_corpus(tmp_path / "corpus" / "b.txt", 10, 15)
    capsys.readouterr()
    prepare(spec)
    [line] = lines(capsys.readouterr().out, "documents: rebuilding")
    assert f"the corpus changed ({added} added)" in line, line
    assert json.loads((directory / "metadata.json").read_text())["documents"] == 25


def test_lowercase_changed_with_the_same_vocabulary_file_retokenizes(tmp_path: Path, vocab_file: str) -> None:
    # The uncased vocabulary has no capitalised words: cased text gives many more [UNK].
    text = write_corpus(tmp_path / "corpus.txt", 0, 20)
    uncased = prepare(make_spec(tmp_path / "out", [{"path": str(text)}], vocab={"file": vocab_file}))
    unknown_uncased = int((shard_tokens(uncased.phase_dirs[0]) == UNK).sum())
    cased = prepare(
        make_spec(tmp_path / "out", [{"path": str(text)}], vocab={"file": vocab_file}, lowercase=False)
    )
    assert (shard_tokens(cased.phase_dirs[0]) == UNK).sum() > 2 * unknown_uncased + 100


# shard_format: recorded since shards have checksums; heldout_dupe_factor: since held-out shards
# take one pass (before, each held-out segment was there dupe_factor times).
@pytest.mark.parametrize("field", ["shard_format", "heldout_dupe_factor"])
def test_shards_of_an_older_format_are_remade(
    tmp_path: Path, vocab_file: str, capsys: pytest.CaptureFixture[str], field: str
) -> None:
    text = write_corpus(tmp_path / "corpus.txt", 0, 10)
    spec = make_spec(tmp_path / "out", [{"path": str(text)}], vocab={"file": vocab_file})
    directory = prepare(spec).phase_dirs[0]
    documents_before = modified_times(tmp_path / "out" / "documents")
    shards_before = modified_times(directory)
    # As a version that did not record the field recorded them.
    for name in ("metadata.json", "parameters.json"):
        recorded = json.loads((directory / name).read_text())
        recorded.get("parameters", recorded).pop(field)
        (directory / name).write_text(json.dumps(recorded))
    capsys.readouterr()
    prepare(spec)
    [line] = lines(capsys.readouterr().out, f"{directory}: rebuilding")
    assert f"{field} changed (None -> " in line, line
    after = modified_times(directory)
    assert all(after[name] != shards_before[name] for name in after if name.endswith(".hdf5"))
    assert modified_times(tmp_path / "out" / "documents") == documents_before


@pytest.mark.parametrize("vocabulary", ["trained", "file"])
def test_a_run_on_an_empty_corpus_leaves_nothing_to_reuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], vocabulary: str, vocab_file: str
) -> None:
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n", encoding="utf-8")
    vocab = {"trainSize": 200} if vocabulary == "trained" else {"file": vocab_file}
    job = with_value(valid_job(), "spec.data", {
        "sources": [{"path": str(text)}], "shards": str(tmp_path / "out"), "vocab": vocab,
        "numShards": 2, "dupeFactor": 1, "workers": 1,
    })  # fmt: skip
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(with_value(job, "spec.phases", job["spec"]["phases"][:1])))
    for _ in range(2):
        assert bertpretrain_main(["prepare", "--config", str(job_file)]) == 1
        assert "data.sources: no document with any text was found" in capsys.readouterr().err

    write_corpus(text, 0, 20)
    assert bertpretrain_main(["prepare", "--config", str(job_file)]) == 0
    vocabulary = (tmp_path / "out" / "vocab" / "vocab.txt").read_text().split()
    assert len(vocabulary) > 100
    tokens = shard_tokens(tmp_path / "out" / "seq_len_128_max_pred_20")
    assert len(tokens) > 1000 and (tokens == UNK).mean() < 0.01


def test_a_dataset_without_training_instances_is_refused(tmp_path: Path, vocab_file: str) -> None:
    text = write_corpus(tmp_path / "corpus.txt", 0, 1)
    spec = make_spec(
        tmp_path / "out", [{"path": str(text)}], vocab={"file": vocab_file}, heldoutFraction=0.99
    )
    for _ in range(2):
        with pytest.raises(ValueError, match=r"seq_len_128_max_pred_20: no training instance .* held out"):
            prepare(spec)


# Orphaned workers ------------------------------------------------------------------------------


def _process_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, start time, state) of every process, from /proc."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # the name, in parentheses, may hold spaces
        table[int(entry.name)] = (int(fields[1]), fields[19], fields[0])
    return table


def _descendants(pid: int) -> dict[int, str]:
    """pid -> start time of every process below ``pid``."""
    table = _process_table()
    found: dict[int, str] = {}
    parents = [pid]
    while parents:
        parent = parents.pop()
        for child, (ppid, started, _) in table.items():
            if ppid == parent and child not in found:
                found[child] = started
                parents.append(child)
    return found


def _alive(processes: dict[int, str]) -> list[int]:
    """Those of ``processes`` (pid -> start time) still running: not gone, not a zombie, not a new
    process under a reused pid."""
    table = _process_table()
    return [
        pid
        for pid, started in processes.items()
        if pid in table and table[pid][1] == started and table[pid][2] not in ("Z", "X")
    ]


@pytest.mark.slow
def test_workers_die_with_the_main_process(tmp_path: Path, vocab_file: str) -> None:
    data = {
        "sources": [{"path": BUILTIN_PYTHON_DOCS}], "shards": str(tmp_path / "out"),
        "vocab": {"file": vocab_file}, "numShards": 12, "dupeFactor": 5, "workers": 2,
    }  # fmt: skip
    job = with_value(valid_job(), "spec.data", data)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(with_value(job, "spec.phases", job["spec"]["phases"][:1])))
    dataset = tmp_path / "out" / "seq_len_128_max_pred_20"
    main = subprocess.Popen(
        [sys.executable, "-m", "bertpretrain", "prepare", "--config", str(job_file)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    workers: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 240
        while not list(dataset.glob("shard_*.hdf5")) and main.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = _descendants(main.pid)
        assert main.poll() is None and len(workers) >= 2, "prepare ended before its second shard"
        main.send_signal(signal.SIGKILL)
        main.wait()
        shards = sorted(p.name for p in dataset.glob("shard_*.hdf5"))
        assert len(shards) < 12
        deadline = time.monotonic() + 10
        while _alive(workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(workers), [Path(f"/proc/{p}/cmdline").read_bytes() for p in _alive(workers)]
        time.sleep(2)
        assert sorted(p.name for p in dataset.glob("shard_*.hdf5")) == shards
    finally:
        for pid in _alive(workers):
            os.kill(pid, signal.SIGKILL)
        if main.poll() is None:
            main.kill()
            main.wait()
