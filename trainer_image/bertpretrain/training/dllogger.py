"""NVIDIA DLLogger's log file, written by us, so that parsers of NVIDIA's and Habana's BERT logs read ours.

``logging.format: dllogger`` makes the training log ``<logging.path>/dllogger.json`` in the format
of DLLogger's ``JSONStreamBackend`` (github.com/NVIDIA/dllogger, ``dllogger/logger.py``), which
NVIDIA DeepLearningExamples' ``PyTorch/LanguageModeling/BERT/run_pretraining.py`` and Habana
Model-References' ``PyTorch/nlp/bert/run_pretraining.py`` write (``--json-summary``, default
``results/dllogger.json``). Each line is ``DLLL `` followed by one JSON object:

    DLLL {"timestamp": "1763800000.1", "datetime": "2026-11-22 10:00:00.100000",
          "elapsedtime": "12.5", "type": "LOG", "step": [1, 200], "data": {"average_loss": 7.1, ...}}
    DLLL {"timestamp": "...", "elapsedtime": "...", "datetime": "...", "type": "METADATA",
          "metric": "e2e_train_time", "metadata": {"unit": "s"}}

As DLLogger writes them: ``timestamp`` (POSIX seconds) and ``elapsedtime`` (seconds since the log
was opened) are strings, ``datetime`` is ``str()`` of the local time; keys in DLLogger's order.
Unlike DLLogger, a non-finite value is written as ``null`` (strict JSON), and lines are flushed at
once (a killed run leaves whole lines) and appended to (a resumed run continues the file).

``step`` and ``data`` carry run_pretraining.py's names:

- ``"PARAMETER"``: the job's description, with NVIDIA's ``learning_rate`` and
  ``batch_size_per_gpu`` (our micro-batch) among our own names;
- ``[phase, optimizer step]``: ``average_loss`` (mean training loss since the last line),
  ``step_loss`` (the last step's), ``learning_rate``, then our other figures
  (``mlm_loss``, ``mlm_accuracy``, ``sequences_per_second`` ...); NVIDIA's first element is the
  epoch, of a run that trains one phase: both are (outer counter, optimizer step), so a parser
  taking ``step[-1]`` as the step reads ours. Held-out evaluations carry their figures prefixed
  with ``eval_`` (``eval_loss``, ``eval_mlm_accuracy``, as NVIDIA's MLPerf BERT prints them);
- ``[]``: at the end of each phase, ``e2e_train_time`` (s, since the log was opened),
  ``training_sequences_per_second``, ``final_loss`` and ``raw_train_time`` (s, the optimizer
  steps alone), with the METADATA units run_pretraining.py declares.

No maintained DLLogger is on PyPI (``dllogger`` is not there; ``nvidia-dllogger`` is a
placeholder that refuses to install and points to NVIDIA's own index), so the format is written
here, from the source named above.
"""

from __future__ import annotations

import datetime
import json
import math
import time
from pathlib import Path
from typing import IO, Any

from bertpretrain.common.jsonable import finite

DLLOGGER_FILE = "dllogger.json"
PREFIX = "DLLL "
# run_pretraining.py's dllogger.metadata(...) calls: the units of its summary figures.
UNITS: dict[str, str | None] = {
    "e2e_train_time": "s",
    "training_sequences_per_second": "sequences/s",
    "final_loss": None,
    "raw_train_time": "s",
}


class DLLoggerFile:
    """Appends DLLogger lines to ``path`` (created with its parents); its METADATA lines (units)
    first. ``started`` is the ``time.perf_counter()`` that ``elapsedtime`` counts from (default:
    now).

    Raises:
        OSError: the file cannot be created or written.
    """

    def __init__(self, path: Path, started: float | None = None):
        self.started = time.perf_counter() if started is None else started
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = path.open("a", encoding="utf-8")
        for metric, unit in UNITS.items():
            self.metadata(metric, {"unit": unit})

    def _times(self) -> dict[str, str]:
        now = time.time()
        return {
            "timestamp": str(now),
            "datetime": str(datetime.datetime.fromtimestamp(now)),
            "elapsedtime": str(time.perf_counter() - self.started),
        }

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            raise ValueError("the DLLogger file is closed")
        self._file.write(PREFIX + json.dumps(finite(record), default=str) + "\n")
        self._file.flush()

    def metadata(self, metric: str, metadata: dict[str, Any]) -> None:
        """A METADATA line: ``metadata`` (``{"unit": ...}``) of the figure ``metric``."""
        times = self._times()
        self._write(
            {
                "timestamp": times["timestamp"],
                "elapsedtime": times["elapsedtime"],
                "datetime": times["datetime"],
                "type": "METADATA",
                "metric": metric,
                "metadata": metadata,
            }
        )

    def log(self, step: str | list[int], data: dict[str, Any]) -> None:
        """A LOG line of ``data`` at ``step`` (``"PARAMETER"``, ``[phase, step]`` or ``[]``)."""
        self._write({**self._times(), "type": "LOG", "step": step, "data": data})

    def close(self) -> None:
        """Close the file (further writes raise ValueError)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def parameter_data(description: dict[str, Any]) -> dict[str, Any]:
    """A phase's description (``bertpretrain.training.phase``) with run_pretraining.py's names of
    what it logs as PARAMETER (``learning_rate``, ``batch_size_per_gpu``) added."""
    data = dict(description)
    if "micro_batch_size" in description:
        data["batch_size_per_gpu"] = description["micro_batch_size"]
    return data


def train_data(values: dict[str, float], step_loss: float | None) -> dict[str, Any]:
    """A training line's figures: run_pretraining.py's ``average_loss``, ``step_loss`` and
    ``learning_rate`` first, then our other figures under our names."""
    data: dict[str, Any] = {"average_loss": values.get("loss"), "step_loss": step_loss}
    data["learning_rate"] = values.get("learning_rate")
    return data | {name: value for name, value in values.items() if name not in ("loss", "learning_rate")}


def eval_data(values: dict[str, float]) -> dict[str, Any]:
    """A held-out evaluation's figures, each prefixed ``eval_`` (``eval_loss``, ``eval_mlm_accuracy``)."""
    return {f"eval_{name}": value for name, value in values.items()}


def summary_data(
    e2e_seconds: float, train_seconds: float, sequences: float, final_loss: float
) -> dict[str, Any]:
    """run_pretraining.py's closing figures: ``e2e_train_time`` (``e2e_seconds``, since the log
    was opened), ``training_sequences_per_second`` (``sequences`` trained over ``train_seconds``
    of optimizer steps), ``final_loss`` and ``raw_train_time`` (``train_seconds``)."""
    return {
        "e2e_train_time": e2e_seconds,
        "training_sequences_per_second": sequences / train_seconds if train_seconds > 0 else math.nan,
        "final_loss": final_loss,
        "raw_train_time": train_seconds,
    }
