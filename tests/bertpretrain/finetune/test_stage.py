"""The fine-tuning stage end to end on a tiny model: ``python -m bertpretrain finetune`` on files the
tests write, its metrics checked against values the tests compute from the predictions files, the
seeds mode on 2 ranks under torchrun, and bad input (exit 1, naming the file and the row, the
export untouched)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import string
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn

from bertjob_api.contract import FINETUNE_DIR, FINETUNE_RESULTS
from bertjob_api.defaults import with_defaults
from bertjob_api.plan import Plan
from bertjob_api.spec import parse_job
from bertpretrain.finetune import train as finetune_train
from bertpretrain.finetune.stage import finetune_config
from bertpretrain.model.bert import BertForPreTraining
from bertpretrain.model.config import BertConfig
from bertpretrain.model.huggingface import save_hf
from bertpretrain.run import main as bertpretrain_main
from tests.bertpretrain.conftest import TINY_MODEL

pytestmark = pytest.mark.usefixtures("one_thread")

NOUNS = ["cat", "dog", "mat"]
FILLER = ["the", "a", "sat", "on", "was", "here", "is"]


def _sentence(rng: torch.Generator, noun: str) -> str:
    words = [FILLER[int(i)] for i in torch.randint(len(FILLER), (5,), generator=rng)]
    words.insert(int(torch.randint(6, (1,), generator=rng)), noun)
    return " ".join(words)


def _write_classification(directory: Path, rows: int, seed: int) -> Path:
    """A TSV whose label says which noun the sentence holds: learnable from one token."""
    rng = torch.Generator().manual_seed(seed)
    lines = ["sentence\tlabel"]
    for index in range(rows):
        noun = NOUNS[index % 2]
        lines.append(f"{_sentence(rng, noun)}\t{'animal-' + noun}")
    path = directory / f"split{seed}.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _write_squad(directory: Path, questions: int, seed: int) -> Path:
    """SQuAD v2.0 JSON: 'what is here' in a context naming one noun; every fifth has no answer."""
    rng = torch.Generator().manual_seed(seed)
    paragraphs = []
    for index in range(questions):
        noun = NOUNS[index % 3]
        words = [FILLER[int(i)] for i in torch.randint(len(FILLER), (6,), generator=rng)]
        if index % 5 == 4:
            context = " ".join(words)
            qa = {"id": f"q{seed}-{index}", "question": "what is here", "answers": [], "is_impossible": True}
        else:
            context = " ".join([*words[:3], noun, *words[3:]])
            start = len(" ".join(words[:3])) + 1
            qa = {
                "id": f"q{seed}-{index}",
                "question": "what is here",
                "answers": [{"text": noun, "answer_start": start}],
                "is_impossible": False,
            }
        paragraphs.append({"context": context, "qas": [qa]})
    path = directory / f"squad{seed}.json"
    path.write_text(json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": paragraphs}]}))
    return path


@pytest.fixture
def export(tmp_path: Path, vocab_dir: Path, tiny_config: BertConfig) -> Path:
    """A Hugging Face export of a randomly initialised tiny BERT, with the fixtures' vocabulary."""
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config)
    return save_hf(model.state_dict(), tiny_config, vocab_dir, tmp_path / "export", lowercase=True)


def _job(tmp_path: Path, export: Path, tasks: list[dict[str, Any]], processes: int = 1) -> Path:
    document = {
        "apiVersion": "bertjob.dev/v1alpha1",
        "kind": "BertPretrainJob",
        "metadata": {"name": "ft"},
        "spec": {
            "image": "bertjob/trainer:test",
            "accelerator": "xeon-cpu",
            "precision": "fp32",
            "topology": {"nodes": 1, "processesPerNode": processes},
            "model": {"preset": "bert-tiny", **TINY_MODEL},
            "data": {"sources": [{"path": "unused"}], "shards": str(tmp_path / "data")},
            "phases": [
                {
                    "maxSeqLength": 32,
                    "maxPredictionsPerSeq": 5,
                    "globalBatchSize": 8,
                    "learningRate": 1e-3,
                    "steps": 1,
                }
            ],
            "checkpoint": {"path": str(tmp_path / "checkpoints")},
            "export": {"path": str(export)},
            "logging": {"everySteps": 5},
            "seed": 7,
            "finetune": tasks,
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


# A small classification task that 2 ranks fine-tune in seconds (48 training rows, 18 validation).
TWO_RANK_TASK = {
    "type": "classification",
    "epochs": 2,
    "learningRate": 3e-3,
    "globalBatchSize": 8,
    "maxSeqLength": 16,
}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m"]


def _launch(launcher: list[str], job: Path) -> str:
    """``python -m bertpretrain finetune`` under ``launcher`` (which ends where the module name goes);
    returns its output, after checking that it succeeded."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [*launcher, "bertpretrain", "finetune", "--config", str(job)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


def _results(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "checkpoints" / FINETUNE_DIR / FINETUNE_RESULTS).read_text())


def _predictions(tmp_path: Path, task: str, init: str, seed: int) -> Any:
    path = tmp_path / "checkpoints" / FINETUNE_DIR / task / "predictions" / f"{init}-seed{seed}.json"
    return json.loads(path.read_text())


def _gold_labels(path: Path) -> dict[int, str]:
    lines = path.read_text().splitlines()
    return {number: line.split("\t")[1] for number, line in enumerate(lines, start=1) if number > 1}


def test_classification_learns_the_task_and_its_metrics_match_its_predictions(
    tmp_path: Path, export: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    train = _write_classification(tmp_path, 96, seed=1)
    validation = _write_classification(tmp_path, 40, seed=2)
    task = {
        "name": "nouns",
        "type": "classification",
        "train": str(train),
        "validation": str(validation),
        "metrics": ["accuracy", "f1", "mcc"],
        "epochs": 15,
        "learningRate": 3e-3,
        "globalBatchSize": 16,
        "maxSeqLength": 16,
        "baseline": True,
    }
    assert bertpretrain_main(["finetune", "--config", str(_job(tmp_path, export, [task]))]) == 0
    output = capfd.readouterr().out
    progress = r"finetune nouns pretrained seed 7 epoch 15/15 step 90/90 loss [\d.]+ lr"
    assert re.search(progress, output), output

    [summary] = _results(tmp_path)["tasks"]
    # What a reader needs to compare fine-tuning protocols, the dropout among it.
    assert summary["settings"] == {
        "epochs": 15, "learningRate": 3e-3, "globalBatchSize": 16, "maxSeqLength": 16,
        "warmupProportion": 0.1, "weightDecay": 0.01, "dropout": 0.1,
    }  # fmt: skip
    assert [(run["init"], run["seed"], run["steps"]) for run in summary["runs"]] == [
        ("pretrained", 7, 90),
        ("random", 7, 90),
    ]
    gold = _gold_labels(validation)
    for run in summary["runs"]:
        predicted = {
            item["row"]: item["prediction"] for item in _predictions(tmp_path, "nouns", run["init"], 7)
        }
        assert predicted.keys() == gold.keys()
        # Accuracy, F1 of the second label (animal-dog, the positive class) and MCC, by hand.
        positive = "animal-dog"
        counts = Counter((gold[row] == positive, predicted[row] == positive) for row in gold)
        tp, fp, fn, tn = counts[True, True], counts[False, True], counts[True, False], counts[False, False]
        accuracy = (tp + tn) / len(gold)
        f1 = 2 * tp / (2 * tp + fp + fn)
        denominator = ((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)) ** 0.5
        mcc = (tp * tn - fp * fn) / denominator if denominator else 0.0
        assert run["metrics"] == pytest.approx({"accuracy": accuracy, "f1": f1, "mcc": mcc})
        # One token decides the label: a few epochs learn it.
        assert accuracy >= 0.9, run
    assert summary["summary"]["pretrained"]["accuracy"]["median"] == summary["runs"][0]["metrics"]["accuracy"]
    assert "nouns accuracy: pretrained" in output and "random init" in output


def _normalize(text: str) -> str:
    text = "".join(character for character in text.lower() if character not in string.punctuation)
    return " ".join(word for word in text.split() if word not in ("a", "an", "the"))


def test_squad_metrics_match_its_predictions_and_seeds_give_median_and_best(
    tmp_path: Path, export: Path
) -> None:
    train = _write_squad(tmp_path, 64, seed=1)
    validation = _write_squad(tmp_path, 20, seed=2)
    task = {
        "name": "qa",
        "type": "squad",
        "train": str(train),
        "validation": str(validation),
        "epochs": 2,
        "learningRate": 3e-3,
        "globalBatchSize": 16,
        "maxSeqLength": 24,
        "maxQueryLength": 8,
        "docStride": 4,
        "seeds": 3,
    }
    assert bertpretrain_main(["finetune", "--config", str(_job(tmp_path, export, [task]))]) == 0
    [summary] = _results(tmp_path)["tasks"]
    assert [run["seed"] for run in summary["runs"]] == [7, 8, 9]
    questions = [
        qa
        for item in json.loads(validation.read_text())["data"]
        for p in item["paragraphs"]
        for qa in p["qas"]
    ]
    exact = []
    for run in summary["runs"]:
        answers = _predictions(tmp_path, "qa", "pretrained", run["seed"])
        assert answers.keys() == {qa["id"] for qa in questions}
        # The gold answer of an impossible question is "", and EM compares normalised texts.
        scores = [
            100.0
            * (_normalize(answers[qa["id"]]) == _normalize(qa["answers"][0]["text"] if qa["answers"] else ""))
            for qa in questions
        ]
        assert run["metrics"]["exact_match"] == pytest.approx(sum(scores) / len(scores))
        assert run["metrics"]["exact_match"] <= run["metrics"]["f1"] <= 100
        exact.append(run["metrics"]["exact_match"])
    figures = summary["summary"]["pretrained"]["exact_match"]
    assert figures["median"] == pytest.approx(sorted(exact)[1])
    assert figures["best"] == pytest.approx(max(exact))


def test_a_label_outside_the_set_exits_1_naming_file_and_row_and_leaves_the_export(
    tmp_path: Path, export: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    train = _write_classification(tmp_path, 32, seed=1)
    validation = _write_classification(tmp_path, 8, seed=2)
    lines = validation.read_text().splitlines()
    lines[5] = lines[5].split("\t")[0] + "\tanimal-cow"
    validation.write_text("\n".join(lines) + "\n")
    before = {path: path.stat().st_mtime_ns for path in export.iterdir()}
    task = {"name": "nouns", "type": "classification", "train": str(train), "validation": str(validation)}
    assert bertpretrain_main(["finetune", "--config", str(_job(tmp_path, export, [task]))]) == 1
    error = capfd.readouterr().err
    assert f"{validation}: row 6:" in error and "animal-cow" in error, error
    assert {path: path.stat().st_mtime_ns for path in export.iterdir()} == before
    assert not (tmp_path / "checkpoints" / FINETUNE_DIR / FINETUNE_RESULTS).exists()


def test_a_missing_file_stops_the_job_before_training(
    tmp_path: Path, export: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    train = _write_classification(tmp_path, 32, seed=1)
    missing = tmp_path / "dev.tsv"
    task = {"name": "nouns", "type": "classification", "train": str(train), "validation": str(missing)}
    assert bertpretrain_main(["run", "--config", str(_job(tmp_path, export, [task]))]) == 1
    assert str(missing) in capfd.readouterr().err
    assert not list((tmp_path / "checkpoints").rglob("*.pt"))  # no phase ran


# The real one, which a test's spy wraps (a second spy would otherwise wrap the first).
BUILD_MODEL = finetune_train.build_model


def _with_pretraining_dropout(job: Path, dropout: float) -> Path:
    """``job`` with ``dropout`` as pretraining's hidden and attention-probability dropout."""
    document = yaml.safe_load(job.read_text())
    document["spec"]["model"].update(hiddenDropoutProb=dropout, attentionProbsDropoutProb=dropout)
    job.write_text(yaml.safe_dump(document))
    return job


def _fine_tuned(
    tmp_path: Path, export: Path, monkeypatch: pytest.MonkeyPatch, pretraining: float, **fields: Any
) -> list[tuple[str, BertConfig, set[float], set[float]]]:
    """Fine-tune a small task with a random-weights baseline in a job whose pretraining dropout is
    ``pretraining``; returns, for each model the runs built, its init, the config it was built
    with, and the dropout probabilities its modules apply (``nn.Dropout`` layers: hidden and the
    classification head's; the attention modules' ``dropout_p``)."""
    built: list[tuple[str, BertConfig, set[float], set[float]]] = []

    def spy(task: Any, config: BertConfig, num_labels: int | None, source: Path | None) -> nn.Module:
        model = BUILD_MODEL(task, config, num_labels, source)
        hidden = {module.p for module in model.modules() if isinstance(module, nn.Dropout)}
        attention = {module.dropout_p for module in model.modules() if hasattr(module, "dropout_p")}
        built.append(("random" if source is None else "pretrained", config, hidden, attention))
        return model

    monkeypatch.setattr(finetune_train, "build_model", spy)
    tmp_path.mkdir(exist_ok=True)
    task = {
        "name": "nouns",
        "type": "classification",
        "train": str(_write_classification(tmp_path, 16, seed=1)),
        "validation": str(_write_classification(tmp_path, 8, seed=2)),
        "epochs": 1,
        "globalBatchSize": 8,
        "maxSeqLength": 16,
        "baseline": True,
        **fields,
    }
    job = _with_pretraining_dropout(_job(tmp_path, export, [task]), pretraining)
    assert bertpretrain_main(["finetune", "--config", str(job)]) == 0
    assert [init for init, *_ in built] == ["pretrained", "random"]
    return built


@pytest.mark.parametrize(("fields", "expected"), [({}, 0.1), ({"dropout": 0.25}, 0.25)])
def test_fine_tuning_uses_the_tasks_dropout_when_pretraining_has_none(
    tmp_path: Path,
    export: Path,
    monkeypatch: pytest.MonkeyPatch,
    fields: dict[str, Any],
    expected: float,
) -> None:
    for _, config, hidden, attention in _fine_tuned(tmp_path, export, monkeypatch, 0.0, **fields):
        assert (config.hidden_dropout_prob, config.attention_probs_dropout_prob) == (expected, expected)
        assert (hidden, attention) == ({expected}, {expected})


def test_jobs_differing_only_in_pretraining_dropout_fine_tune_alike(
    tmp_path: Path, export: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modern = _fine_tuned(tmp_path / "modern", export, monkeypatch, 0.0)
    classic = _fine_tuned(tmp_path / "classic", export, monkeypatch, 0.1)
    assert modern == classic
    # The jobs do differ, in pretraining, and fine-tuning leaves that as the job says.
    jobs = [tmp_path / name / "job.yaml" for name in ("modern", "classic")]
    plans = [Plan.resolve(with_defaults(parse_job(yaml.safe_load(job.read_text())).spec)) for job in jobs]
    assert [plan.model.hidden_dropout_prob for plan in plans] == [0.0, 0.1]
    tasks = [plan.spec.finetune[0] for plan in plans]
    assert finetune_config(tasks[0], plans[0], 30) == finetune_config(tasks[1], plans[1], 30)
    assert [plan.model.attention_probs_dropout_prob for plan in plans] == [0.0, 0.1]


@pytest.mark.slow
def test_two_ranks_run_seeds_apart_or_one_run_data_parallel(tmp_path: Path, export: Path) -> None:
    train = _write_classification(tmp_path, 48, seed=1)
    validation = _write_classification(tmp_path, 18, seed=2)
    common = {**TWO_RANK_TASK, "train": str(train), "validation": str(validation)}
    tasks = [
        {"name": "apart", **common, "seeds": 2, "parallelism": "seeds"},
        {"name": "together", **common, "parallelism": "data"},
    ]
    output = _launch(TORCHRUN, _job(tmp_path, export, tasks, processes=2))
    # Seeds apart: rank 0 trained seed 7, rank 1 seed 8, each alone (8 rows a step, 6 steps an epoch).
    assert "rank 0 finetune apart pretrained seed 7 epoch 2/2 step 12/12" in output, output[-4000:]
    assert "rank 1 finetune apart pretrained seed 8 epoch 2/2 step 12/12" in output, output[-4000:]
    # Data-parallel: one run over both ranks (4 rows each a step), which rank 0 reports.
    assert "finetune together pretrained seed 7 epoch 2/2 step 12/12" in output, output[-4000:]
    assert "rank 1 finetune together" not in output and "finetune together pretrained seed 8" not in output
    apart, together = _results(tmp_path)["tasks"]
    assert [(run["seed"], run["steps"]) for run in apart["runs"]] == [(7, 12), (8, 12)]
    accuracies = {run["seed"]: run["metrics"]["accuracy"] for run in apart["runs"]}
    figures = apart["summary"]["pretrained"]["accuracy"]
    assert figures["median"] == pytest.approx((accuracies[7] + accuracies[8]) / 2)
    assert figures["best"] == max(accuracies.values())
    assert [run["seed"] for run in together["runs"]] == [7]
    gold = _gold_labels(validation)
    for task, seed, run in [
        ("apart", 7, apart["runs"][0]),
        ("apart", 8, apart["runs"][1]),
        ("together", 7, together["runs"][0]),
    ]:
        predicted = {
            item["row"]: item["prediction"] for item in _predictions(tmp_path, task, "pretrained", seed)
        }
        # Every validation row once, whichever rank predicted it (the data-parallel run splits them).
        assert sorted(predicted) == sorted(gold)
        assert run["metrics"]["accuracy"] == pytest.approx(
            sum(predicted[row] == gold[row] for row in gold) / len(gold)
        )


def _engines() -> dict[str, tuple[list[str], dict[str, Any]]]:
    """Each data-parallel engine on 2 CPU processes: its launcher and the spec.distributed it needs."""
    engines: dict[str, tuple[list[str], dict[str, Any]]] = {"ddp": (TORCHRUN, {})}
    if importlib.util.find_spec("deepspeed") is not None:
        engines["deepspeed-zero3"] = (TORCHRUN, {"deepspeed": {"zeroStage": 3}})
    if importlib.util.find_spec("horovod") is not None:
        horovodrun = str(Path(sys.executable).with_name("horovodrun"))
        engines["horovod"] = (
            [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-m"],
            {},
        )
    return engines


@pytest.mark.slow
def test_data_parallel_engines_fine_tune_alike(tmp_path: Path, export: Path) -> None:
    """DDP, DeepSpeed ZeRO-3 and Horovod (those installed) run the same data-parallel fine-tuning:
    the same losses, and every validation row predicted once (under ZeRO-3 each forward is a
    collective, so a rank short of a batch repeats one)."""
    train = _write_classification(tmp_path, 48, seed=1)
    validation = _write_classification(tmp_path, 18, seed=2)
    gold = _gold_labels(validation)
    losses = {}
    for name, (launcher, distributed) in _engines().items():
        task = {**TWO_RANK_TASK, "name": name, "train": str(train), "validation": str(validation)}
        job = _job(tmp_path, export, [task], processes=2)
        document = yaml.safe_load(job.read_text())
        document["spec"]["distributed"] = distributed
        job.write_text(yaml.safe_dump(document))
        output = _launch(launcher, job)
        losses[name] = [
            float(v) for v in re.findall(rf"finetune {name} pretrained seed 7 .* loss ([\d.]+)", output)
        ]
        assert len(losses[name]) == 3, output[-4000:]  # steps 5, 10 and 12 of 12
        [summary] = _results(tmp_path)["tasks"]
        predicted = {
            item["row"]: item["prediction"] for item in _predictions(tmp_path, name, "pretrained", 7)
        }
        assert sorted(predicted) == sorted(gold)
        accuracy = sum(predicted[row] == gold[row] for row in gold) / len(gold)
        assert summary["runs"][0]["metrics"]["accuracy"] == pytest.approx(accuracy)
    assert len(losses) >= 2, "only DDP is installed"
    for name, values in losses.items():
        assert values == pytest.approx(losses["ddp"], abs=2e-3), (name, losses)
