"""Where a fine-tuning task's examples are: the files its spec names, or a builtin task's.

Apart from :mod:`bertpretrain.finetune.stage`, which reads them, so that the results
(:mod:`bertpretrain.finetune.results`), which record them, need not import the stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bertjob_api.plan import Plan
from bertjob_api.spec import FinetuneTaskSpec
from bertpretrain.finetune.builtin import builtin_files


@dataclass(frozen=True)
class TaskFiles:
    """Where a task's examples are: its ``train`` and ``validation`` files and their format."""

    train: Path
    validation: Path
    format: str


def task_files(task: FinetuneTaskSpec, plan: Plan) -> TaskFiles:
    """The task's files as the spec names them; a builtin task's are written (by the caller of
    :func:`bertpretrain.finetune.stage.write_builtin`) under
    ``<checkpoint.path>/finetune/<task>/``."""
    if task.builtin is not None:
        return TaskFiles(*builtin_files(plan.paths.finetune / task.name), "tsv")
    assert task.train is not None and task.validation is not None  # the spec checks it
    return TaskFiles(Path(task.train), Path(task.validation), task.format)
