"""Fine-tuning results: every run's metrics -> a task's summary (median and best over seeds, for
the pretrained and the random-weights runs) -> ``finetune.json``, log lines and ``status.results``.

``finetune.json`` (under ``<checkpoint.path>/finetune/``, written whole after each task, to a
temporary name then renamed; each run's predictions beside it, in ``<task>/predictions/``) is
``{"tasks": [summary, ...]}``; each summary holds the task's
settings, its files, the weights it started from, each run (``init``, ``seed``, ``metrics``,
``steps``, ``seconds``, ``final_loss``) and, by init, each metric's ``median``, ``best``, ``mean``
and ``std`` over the seeds. Classification metrics are fractions (0-1), SQuAD's percentages
(0-100), as GLUE's and SQuAD's scripts print them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertjob_api.contract import FINETUNE_RESULTS, RESULTS_FIELD
from bertjob_api.files import write_atomically
from bertjob_api.spec import FinetuneTaskSpec
from bertpretrain.common.jsonable import finite
from bertpretrain.finetune.metrics import summarise
from bertpretrain.finetune.task_files import TaskFiles
from bertpretrain.training.progress import StatusReporter

if TYPE_CHECKING:
    from bertpretrain.finetune.train import RunResult


def task_summary(
    task: FinetuneTaskSpec, runs: Sequence[RunResult], files: TaskFiles, source: Path
) -> dict[str, Any]:
    """One task's entry of ``finetune.json`` (see the module docstring), from its runs."""
    by_init: dict[str, dict[str, dict[str, float]]] = {}
    for init in dict.fromkeys(run.init for run in runs):
        by_init[init] = summarise([run.metrics for run in runs if run.init == init])
    return {
        "task": task.name,
        "type": task.type,
        "metrics": list(task.metrics or ()),
        "train": str(files.train),
        "validation": str(files.validation),
        "init_from": str(source),
        "seeds": task.seeds,
        "parallelism": task.parallelism,
        "settings": task.model_dump(
            mode="json",
            by_alias=True,
            include={
                "epochs",
                "learning_rate",
                "global_batch_size",
                "max_seq_length",
                "warmup_proportion",
                "weight_decay",
                "dropout",
            },
        ),
        "runs": [{key: value for key, value in asdict(run).items() if key != "predictions"} for run in runs],
        "summary": by_init,
    }


def _value(task_type: str, value: float) -> str:
    # SQuAD's metrics are percentages, classification's fractions.
    return f"{value:.2f}" if task_type == "squad" else f"{value:.4f}"


def describe(summary: dict[str, Any]) -> list[str]:
    """Log lines: each run's metrics, then per init each metric's median and best over seeds."""
    lines = []
    name, kind = summary["task"], summary["type"]
    for run in summary["runs"]:
        figures = " ".join(f"{metric} {_value(kind, v)}" for metric, v in run["metrics"].items())
        lines.append(
            f"finetune {name} {run['init']} seed {run['seed']}: {figures} "
            f"({run['steps']} steps in {run['seconds']:.1f} s)"
        )
    for init, metrics in summary["summary"].items():
        figures = ", ".join(
            f"{metric} {_value(kind, s['median'])} (best {_value(kind, s['best'])})"
            for metric, s in metrics.items()
        )
        lines.append(f"finetune {name} {init}: median of {summary['seeds']} seed(s): {figures}")
    return lines


def compare(summaries: Sequence[dict[str, Any]]) -> list[str]:
    """One line per task and metric: its median from the pretrained weights, beside the median from
    random weights where the task has a baseline; e.g. ``mrpc accuracy: pretrained 0.8412, random
    init 0.6838 (median of 3 seeds)``."""
    lines = []
    names = {"pretrained": "pretrained", "random": "random init"}
    for summary in summaries:
        seeds, kind = summary["seeds"], summary["type"]
        for metric in summary["metrics"]:
            figures = ", ".join(
                f"{names[init]} {_value(kind, metrics[metric]['median'])}"
                for init, metrics in summary["summary"].items()
            )
            lines.append(f"{summary['task']} {metric}: {figures} (median of {seeds} seed{'s' * (seeds > 1)})")
    return lines


def status_entry(summary: dict[str, Any]) -> dict[str, Any]:
    """The task's ``status.results`` entry (:class:`bertjob_api.crd.TaskResult`): the headline
    metric (the task's first) of the pretrained runs, with the baseline's when there is one."""
    metric = summary["metrics"][0]
    pretrained = summary["summary"]["pretrained"]
    entry: dict[str, Any] = {
        "task": summary["task"],
        "metric": metric,
        "median": round(pretrained[metric]["median"], 6),
        "best": round(pretrained[metric]["best"], 6),
        "seeds": summary["seeds"],
        "metrics": {name: round(values["median"], 6) for name, values in pretrained.items()},
    }
    kind = summary["type"]
    text = f"{summary['task']} {metric} {_value(kind, entry['median'])}"
    if summary["seeds"] > 1:
        text += f" (median of {summary['seeds']})"
    random = summary["summary"].get("random")
    if random is not None:
        entry["baseline"] = round(random[metric]["median"], 6)
        text += f", random init {_value(kind, entry['baseline'])}"
    entry["summary"] = text
    return entry


def write(directory: Path, summaries: Sequence[dict[str, Any]]) -> Path:
    """Write ``directory/finetune.json`` with every task's summary so far (atomically).

    Raises:
        bertjob_api.files.DiskFullError: it does not fit.
    """
    path = directory / FINETUNE_RESULTS
    _write_json(path, finite({"tasks": list(summaries)}))
    return path


def _write_json(path: Path, value: Any) -> None:
    data = json.dumps(value, indent=1, ensure_ascii=False, allow_nan=False).encode() + b"\n"
    write_atomically(path, lambda file: file.write(data), len(data))


def predictions_path(directory: Path, init: str, seed: int) -> Path:
    """Where a run's predictions go: ``<task directory>/predictions/<init>-seed<seed>.json``."""
    return directory / "predictions" / f"{init}-seed{seed}.json"


def write_predictions(directory: Path, runs: Sequence[RunResult]) -> None:
    """Write each run's predictions on the validation file (:func:`predictions_path`): for
    classification a list of ``{"row", "prediction"}`` (the validation file's row, the label
    predicted), for SQuAD ``{id: answer text}`` as the official evaluation script reads them.

    Raises:
        bertjob_api.files.DiskFullError: they do not fit.
    """
    for run in runs:
        _write_json(predictions_path(directory, run.init, run.seed), run.predictions)


def report(summaries: Sequence[dict[str, Any]]) -> bool:
    """Report ``status.results`` of the job this pod runs to the operator (a no-op outside a
    cluster): one entry per task so far. Returns whether the request was sent and accepted."""
    reporter = StatusReporter.from_environment(total_steps=1)
    if reporter is None:
        return False
    return reporter.send_status({RESULTS_FIELD: [status_entry(summary) for summary in summaries]})
