"""The training log: JSON lines in the manner of NVIDIA's DLLogger (or its own), TensorBoard scalars.

With ``logging.format: jsonl`` (the default), ``<logging.path>/train.jsonl`` gets one JSON object
per line, flushed at once so that a killed process leaves only whole lines:

    {"timestamp": 1763800000.1, "datetime": "2026-11-22T10:00:00.100000+00:00", "elapsedtime": 12.5,
     "type": "LOG", "step": [1, 200], "data": {"split": "train", "loss": 7.1, ...}}

``type`` is ``PARAMETER`` for the job's description (``step`` ``"PARAMETER"``, as DLLogger
writes it), ``LOG`` for metrics with ``step`` ``[phase, optimizer step]``; ``elapsedtime`` is
seconds since this process opened the log. A resumed run appends: a step logged twice (after the
last checkpoint of a killed run, then again) is read by its last line. Unlike DLLogger's
``DLLL `` prefix, lines hold JSON alone, so ``jq`` and ``pandas.read_json(lines=True)`` read them.
TensorBoard (``<logging.path>/tensorboard``) gets each ``LOG`` value as the scalar
``phase<n>/<split>/<name>`` at the optimizer step, and in a cluster the job's
``status.progress`` gets the training values (:mod:`bertpretrain.training.progress`).

With ``logging.format: dllogger``, ``<logging.path>/dllogger.json`` gets DLLogger's own lines
instead, with the field names of NVIDIA's and Habana's BERT scripts, and a summary at the end of
each phase (:mod:`bertpretrain.training.dllogger`); TensorBoard and the status are the same.
"""

from __future__ import annotations

import datetime
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from bertpretrain.training import dllogger
from bertpretrain.training.progress import StatusReporter

if TYPE_CHECKING:
    from bertpretrain.training.tensorboard import ScalarWriter

Split = Literal["train", "eval"]
Format = Literal["jsonl", "dllogger"]
LOG_FILE = "train.jsonl"
LOG_FILES: dict[str, str] = {"jsonl": LOG_FILE, "dllogger": dllogger.DLLOGGER_FILE}


class TrainingLog:
    """Appends to ``directory/train.jsonl`` (``format`` ``jsonl``) or ``directory/dllogger.json``
    (``dllogger``), with ``tensorboard`` writes event files, and with a ``status`` reporter sends
    the training values to the job's status.

    A log made with ``directory=None`` (every rank but 0) writes nothing.

    Raises:
        OSError: the directory cannot be created or written (a full volume:
            :class:`bertjob_api.files.DiskFullError` where the writer knows the file, as TensorBoard's
            does).
        ValueError: an unknown ``format``.
    """

    def __init__(
        self,
        directory: Path | None,
        tensorboard: bool = True,
        status: StatusReporter | None = None,
        format: Format = "jsonl",
    ):
        if format not in LOG_FILES:
            raise ValueError(f"logging.format {format!r}: expected one of {', '.join(LOG_FILES)}")
        self.started = time.perf_counter()
        self._file = None
        self._dllogger: dllogger.DLLoggerFile | None = None
        self._tensorboard: ScalarWriter | None = None
        self._status = status
        if directory is None:
            return
        directory.mkdir(parents=True, exist_ok=True)
        if format == "dllogger":
            self._dllogger = dllogger.DLLoggerFile(directory / dllogger.DLLOGGER_FILE, self.started)
        else:
            self._file = (directory / LOG_FILE).open("a", encoding="utf-8")
        if tensorboard:
            # Imported here: TensorBoard's protobufs take a while, and only rank 0 writes.
            from bertpretrain.training.tensorboard import ScalarWriter

            self._tensorboard = ScalarWriter(directory / "tensorboard")

    def _write(self, kind: str, step: Any, data: dict[str, Any]) -> None:
        if self._file is None:
            return
        now = time.time()
        record = {
            "timestamp": now,
            "datetime": datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat(),
            "elapsedtime": time.perf_counter() - self.started,
            "type": kind,
            "step": step,
            "data": data,
        }
        # NaN is not JSON: a diverged value is written as null.
        self._file.write(json.dumps(record, default=str).replace("NaN", "null") + "\n")
        self._file.flush()

    def parameters(self, data: dict[str, Any]) -> None:
        """Record the job's description (model, batch sizes, precision ...) once per phase."""
        if self._dllogger is not None:
            self._dllogger.log("PARAMETER", dllogger.parameter_data(data))
        self._write("PARAMETER", "PARAMETER", data)

    def total_steps(self, steps: int) -> None:
        """The phase now has ``steps`` optimizer steps (a budget's re-fit): the status reports them."""
        if self._status is not None:
            self._status.total_steps = steps

    def log(
        self, phase: int, step: int, split: Split, values: dict[str, float], step_loss: float | None = None
    ) -> None:
        """Record ``values`` of phase ``phase`` (counted from 1) after optimizer step ``step``;
        ``step_loss``, the loss of that step alone, goes to the ``dllogger`` format only (NVIDIA's
        ``step_loss``)."""
        if self._dllogger is not None:
            data = dllogger.train_data(values, step_loss) if split == "train" else dllogger.eval_data(values)
            self._dllogger.log([phase, step], data)
        self._write("LOG", [phase, step], {"split": split, **values})
        if self._status is not None and split == "train":
            self._status.report(phase, step, values)
        if self._tensorboard is not None:
            finite = {
                f"phase{phase}/{split}/{name}": value
                for name, value in values.items()
                if math.isfinite(value)
            }
            self._tensorboard.add_scalars(step, finite)

    def summary(self, train_seconds: float, sequences: float, final_loss: float) -> None:
        """Record the end of a phase: ``sequences`` trained in ``train_seconds`` of optimizer
        steps, the last loss logged; in the ``dllogger`` format only, as run_pretraining.py's
        closing line (:func:`bertpretrain.training.dllogger.summary_data`; the ``jsonl`` format
        has these figures in its lines already)."""
        if self._dllogger is not None:
            e2e = time.perf_counter() - self.started
            self._dllogger.log([], dllogger.summary_data(e2e, train_seconds, sequences, final_loss))

    def close(self) -> None:
        """Flush and close the files."""
        if self._dllogger is not None:
            self._dllogger.close()
            self._dllogger = None
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
