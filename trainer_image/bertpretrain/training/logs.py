"""The training log: JSON lines in the manner of NVIDIA's DLLogger, and TensorBoard scalars.

``<logging.path>/train.jsonl`` gets one JSON object per line, flushed at once so that a killed
process leaves only whole lines:

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
"""

from __future__ import annotations

import datetime
import json
import math
import time
from pathlib import Path
from typing import Any, Literal

from bertpretrain.training.progress import StatusReporter

Split = Literal["train", "eval"]
LOG_FILE = "train.jsonl"


class TrainingLog:
    """Appends to ``directory/train.jsonl``, with ``tensorboard`` writes event files, and with
    a ``status`` reporter sends the training values to the job's status.

    A log made with ``directory=None`` (every rank but 0) writes nothing.

    Raises:
        OSError: the directory cannot be created or written.
    """

    def __init__(
        self, directory: Path | None, tensorboard: bool = True, status: StatusReporter | None = None
    ):
        self.started = time.perf_counter()
        self._file = None
        self._writer: Any = None
        self._status = status
        if directory is None:
            return
        directory.mkdir(parents=True, exist_ok=True)
        self._file = (directory / LOG_FILE).open("a", encoding="utf-8")
        if tensorboard:
            # Imported here: it takes about a second, and only rank 0 writes.
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(directory / "tensorboard"))

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
        self._write("PARAMETER", "PARAMETER", data)

    def log(self, phase: int, step: int, split: Split, values: dict[str, float]) -> None:
        """Record ``values`` of phase ``phase`` (counted from 1) after optimizer step ``step``."""
        self._write("LOG", [phase, step], {"split": split, **values})
        if self._status is not None and split == "train":
            self._status.report(phase, step, values)
        if self._writer is not None:
            for name, value in values.items():
                if math.isfinite(value):
                    self._writer.add_scalar(f"phase{phase}/{split}/{name}", value, step)

    def close(self) -> None:
        """Flush and close the files."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
