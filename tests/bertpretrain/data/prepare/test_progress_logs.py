"""The data stage's progress as a pod's log shows it: ``python -m bertpretrain prepare`` with its
standard streams sent to files (lines, no carriage return), to a terminal (tqdm's bars) and with
``TQDM_DISABLE=1`` (neither). tqdm reads its variables when imported, hence a process per case."""

from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest
import yaml

from bertjob_testing.jobs import small_training_job

# The job's three loops (bertpretrain.data.prepare.stage, .pieces, .make_shards), as lines.
VOCABULARY = re.compile(r"^data: vocabulary: [\d,]+ documents, [\d,.]+ documents/s, [\d.]+ s$", re.MULTILINE)
DOCUMENTS = re.compile(r"^data: documents: [\d.]+ KiB, [\d.]+ [KM]iB/s, [\d.]+ s$", re.MULTILINE)
SHARDS = re.compile(
    r"^data: seq_len_(64|128)_max_pred_\d+: (\d) of 2 shards \(\d+%\), [\d.]+ shards/s, [\d.]+ s",
    re.MULTILINE,
)
ANY_PROGRESS = re.compile(r"/s, [\d.]+ s")


def prepare(tmp_path: Path, stderr: int | None = None, **env: str) -> tuple[int, str, str]:
    """Run the data stage of a small job with stdout (and, unless ``stderr`` is given, stderr) to
    files; its exit code and both files' text."""
    tmp_path.mkdir(exist_ok=True)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(small_training_job(tmp_path, processes=1)))
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TQDM_")}
    out_file, err_file = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out_file.open("wb") as out, err_file.open("wb") as err:
        code = subprocess.run(
            [sys.executable, "-m", "bertpretrain", "prepare", "--config", str(job_file)],
            stdout=out, stderr=err if stderr is None else stderr, env={**environment, **env}, timeout=300,
        ).returncode  # fmt: skip
    return code, out_file.read_text(encoding="utf-8"), err_file.read_text(encoding="utf-8")


@pytest.mark.slow
def test_without_a_terminal_progress_is_lines_without_carriage_returns(tmp_path: Path) -> None:
    code, out, err = prepare(tmp_path / "every-update", TQDM_MININTERVAL="0")
    assert code == 0, out + err
    assert "\r" not in out and "\r" not in err, repr(out + err)
    assert err == ""
    # Every update, at interval 0: all 40 documents one by one, and both shards of each phase.
    assert [m.group(0).split(":")[2].split(",")[0] for m in VOCABULARY.finditer(out)] == [
        f" {n} documents" for n in range(1, 41)
    ]
    assert len(DOCUMENTS.findall(out)) == 1, out  # one piece
    assert SHARDS.findall(out) == [("64", "1"), ("64", "2"), ("128", "1"), ("128", "2")], out
    assert "MB [" not in out and "MMB" not in out

    # At the default of 30 s, this stage of about a second gives each loop its final line alone.
    code, out, err = prepare(tmp_path / "default")
    assert code == 0 and "\r" not in out + err and err == "", out + err
    assert [m.group(0).split(",")[0] for m in VOCABULARY.finditer(out)] == ["data: vocabulary: 40 documents"]
    assert len(DOCUMENTS.findall(out)) == 1
    assert SHARDS.findall(out) == [("64", "2"), ("128", "2")], out


@pytest.mark.slow
def test_with_a_terminal_the_bars_are_drawn_as_before(tmp_path: Path) -> None:
    primary, secondary = os.openpty()
    # tqdm sizes its bar by the terminal: 100 columns, 24 rows (a new pty says 0 x 0).
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    drawn: list[bytes] = []

    def read_terminal() -> None:
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: every holder of the terminal's other end has closed it
                return
            if not chunk:
                return
            drawn.append(chunk)

    reader = threading.Thread(target=read_terminal)
    reader.start()
    try:
        code, out, _ = prepare(tmp_path, stderr=secondary)
    finally:
        os.close(secondary)
        reader.join(timeout=60)
        os.close(primary)
    terminal = b"".join(drawn).decode("utf-8")
    assert code == 0, out + terminal
    assert re.search(r"\rdata: vocabulary: 40documents \[", terminal), terminal
    assert re.search(r"\rdata: documents: 19\dkB \[", terminal), terminal  # tqdm's decimal kB, not "kMB"
    assert re.search(r"\rdata: seq_len_64_max_pred_10: 100%\|█+\| 2/2 \[", terminal), terminal
    assert not ANY_PROGRESS.search(out), out  # no lines beside the bars
    assert "data: vocabulary: trained in" in out


@pytest.mark.slow
def test_tqdm_disable_turns_off_bars_and_lines(tmp_path: Path) -> None:
    code, out, err = prepare(tmp_path, TQDM_DISABLE="1", TQDM_MININTERVAL="0")
    assert code == 0, out + err
    assert not ANY_PROGRESS.search(out) and err == "", out + err
    assert "data: vocabulary: trained in" in out  # the stage's own report stays
