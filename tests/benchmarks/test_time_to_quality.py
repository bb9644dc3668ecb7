"""benchmarks/time_to_quality.py on CPU at its tiny size, as CI runs it (a few seconds of training per
run, about 2-3 minutes in all on 2 cores): the table's rows and numbers, the peer's sweep, the JSON
output; and its parts alone: the held-out accuracy, the peer's unmasked rows, the train.jsonl reader
and our job documents, which the job API must accept."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from bertjob_api.spec import parse_job
from bertjob_api.validation import checked

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
BUDGET = 4  # seconds of training per run
# The whole run: about 2 minutes on a quiet 2-core machine, 5 when other work shares it.
whole_run = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def ttq() -> ModuleType:
    """The benchmark as a module."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("time_to_quality")


@pytest.fixture(scope="module")
def tiny_run(ttq: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One whole run at the tiny size, its work files kept: its stdout, the JSON it wrote and its
    output directory."""
    out = tmp_path_factory.mktemp("time-to-quality")
    capture = out / "stdout.txt"
    argv = ["--size", "tiny", "--budget", str(BUDGET), "--seeds", "1", "--out", str(out), "--keep"]
    with capture.open("w") as stdout, pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stdout", stdout)
        code = ttq.main(argv)
    output = capture.read_text()
    print(output)  # shown by pytest when a test fails, and by -s
    assert code == 0, output
    return {"out": out, "stdout": output, "results": json.loads((out / ttq.RESULTS_FILE).read_text())}


def _tables(output: str) -> list[list[dict[str, str]]]:
    """Each Markdown table in ``output``: its rows, by column."""
    tables: list[list[list[str]]] = []
    previous_was_row = False
    for line in output.splitlines():
        is_row = line.startswith("| ")
        if is_row and not line.startswith("| ---"):
            if not previous_was_row:
                tables.append([])
            tables[-1].append([cell.strip() for cell in line.strip().strip("|").split("|")])
        previous_was_row = is_row
    found = []
    for header, *rows in tables:
        assert all(len(row) == len(header) for row in rows), rows
        found.append([dict(zip(header, row, strict=True)) for row in rows])
    return found


@pytest.mark.slow
@whole_run
def test_the_table_has_a_row_per_run_and_accuracies_in_0_1(
    ttq: ModuleType, tiny_run: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    with capsys.disabled():  # the table in the test log, as CI runs it
        table = (tiny_run["out"] / ttq.TABLE_FILE).read_text()
        print(f"\nbenchmarks/time_to_quality.py --size tiny --budget {BUDGET} --seeds 1:\n{table}")
    runs, ratios, per_seed = _tables(tiny_run["stdout"])
    assert [row["run"] for row in runs] == ["classic", "modern", "modern-half", "hf-peer"]
    assert list(runs[0]) == list(ttq.COLUMNS) and {row["seeds"] for row in runs} == {"1"}
    results = tiny_run["results"]
    # One replicate: its own rows are the medians'.
    assert [(row["seed"], row["run"]) for row in per_seed] == [(str(ttq.SEED), row["run"]) for row in runs]
    for median, own in zip(runs, per_seed, strict=True):
        assert [median[key] for key in ttq.SEED_COLUMNS[2:]] == [own[key] for key in ttq.SEED_COLUMNS[2:]]
    for row in runs:
        for column in ("held-out MLM acc", "fine-tuned acc"):
            assert 0 <= float(row[column]) <= 1, row
        steps, sequences, seconds = int(row["steps"]), int(row["sequences"]), float(row["seconds"])
        assert steps >= 1 and sequences == steps * ttq.SIZES["tiny"].global_batch, row
        assert seconds > 0, row
        run = results["runs"][row["run"]]  # the JSON says the same
        assert float(row["held-out MLM acc"]) == pytest.approx(run["heldout_mlm_accuracy"], abs=5e-5)
        assert float(row["fine-tuned acc"]) == pytest.approx(run["finetune"]["median"], abs=5e-5)
        assert run["finetune"]["seeds"] == 1
    assert "AdamW" in runs[3]["recipe"] and "one-cycle" in runs[1]["recipe"] and "poly" in runs[0]["recipe"]
    assert runs[2]["recipe"] == runs[1]["recipe"] + ", 0.5 x budget"
    assert [row["ratio"] for row in ratios] == [
        "modern/classic", "modern-half/classic", "classic/hf-peer", "modern/hf-peer"
    ]  # fmt: skip
    for row in ratios:
        top, bottom = (results["runs"][name] for name in row["ratio"].split("/"))
        assert float(row["sequences"]) == pytest.approx(top["sequences"] / bottom["sequences"], abs=0.006)
        if bottom["heldout_mlm_accuracy"] > 0:
            expected = top["heldout_mlm_accuracy"] / bottom["heldout_mlm_accuracy"]
            assert float(row["held-out MLM acc"]) == pytest.approx(expected, abs=0.006)
        else:
            assert row["held-out MLM acc"] == "n/a"
    assert "Fine-tuned from random weights (no pretraining), for reference:" in tiny_run["stdout"]
    verdicts = {True: "met", False: "not met", None: "not measured"}
    half_time = verdicts[results["targets"]["half_time"]]
    assert f"reaches classic's held-out MLM accuracy: {half_time};" in tiny_run["stdout"]
    assert (tiny_run["out"] / ttq.TABLE_FILE).read_text().startswith("| run | recipe |")


@pytest.mark.slow
@whole_run
def test_the_peer_sweeps_3_learning_rates_keeps_the_best(ttq: ModuleType, tiny_run: dict[str, Any]) -> None:
    results = tiny_run["results"]
    peer, swept = results["replicates"][0]["runs"]["hf-peer"], results["peer_sweep"]
    sweep = swept["points"]
    assert [point["learning_rate"] for point in sweep] == list(ttq.SIZES["tiny"].sweep)
    for point in sweep:
        assert 0 <= point["heldout_mlm_accuracy"] <= 1 and point["steps"] >= 1, point
    best = max(sweep, key=lambda point: point["heldout_mlm_accuracy"])
    assert peer["learning_rate"] == swept["learning_rate"] == best["learning_rate"]
    assert f"AdamW {best['learning_rate']:g} (swept)" in peer["recipe"]
    assert swept["calibration"]["steps"] == ttq.SIZES["tiny"].calibration_steps
    # Stopped by the budget or at the schedule's end, which the calibration sized to the budget.
    assert peer["stopped_by_budget"] or peer["steps"] == peer["max_steps"]
    assert peer["random_init_finetune"]["seeds"] == 1


@pytest.mark.slow
@whole_run
def test_the_json_records_the_settings(ttq: ModuleType, tiny_run: dict[str, Any]) -> None:
    results = tiny_run["results"]
    assert (results["size"], results["device"], results["budget_seconds"]) == ("tiny", "cpu", BUDGET)
    assert (results["seeds"], results["peer_seeds"]) == (1, 1)
    (record,) = results["replicates"]
    evaluation = record["evaluation"]
    assert (
        record["seed"] == ttq.SEED
        and Path(evaluation["files"][0]).parent.parent.parent.name == f"seed-{ttq.SEED}"
    )
    assert evaluation["sequences"] > 100 and evaluation["predictions"] > 10 * evaluation["sequences"]
    assert all(Path(name).name.startswith("heldout_") for name in evaluation["files"])
    for name, seconds in (("classic", BUDGET), ("modern", BUDGET), ("modern-half", BUDGET // 2)):
        run = record["runs"][name]
        calibration = run["calibration"]
        # Our runs carry the budget; the trainer fixed their steps from its own calibration.
        assert run["job"]["budget"] == {"time": f"{seconds}s"} and "steps" not in run["job"]["phases"][0]
        assert run["job"]["seed"] == ttq.SEED
        assert run["steps"] == calibration["steps"] >= 1 and calibration["step_seconds"] > 0
    assert set(results["ratios"]) == {
        "modern/classic",
        "modern-half/classic",
        "classic/hf-peer",
        "modern/hf-peer",
    }


def _labelled_accuracy(export: str, dataset: Path) -> tuple[float, int]:
    """Held-out MLM accuracy computed another way: ``BertForMaskedLM`` itself, labels spread over
    the sequence (-100 elsewhere, as transformers' MLM labels) and compared with each token's
    argmax. Returns (accuracy, positions counted)."""
    from transformers import BertForMaskedLM

    model = BertForMaskedLM.from_pretrained(export).eval()
    correct = total = 0
    for file in sorted(dataset.glob("heldout_*.hdf5")):
        with h5py.File(file, "r") as shard:
            arrays = {name: shard[name][:].astype(np.int64) for name in shard}
        labels = np.full(arrays["input_ids"].shape, -100)
        rows, slots = np.nonzero(arrays["masked_lm_positions"])
        labels[rows, arrays["masked_lm_positions"][rows, slots]] = arrays["masked_lm_ids"][rows, slots]
        for start in range(0, len(labels), 100):
            part = slice(start, start + 100)
            with torch.no_grad():
                logits = model(
                    input_ids=torch.from_numpy(arrays["input_ids"][part]),
                    attention_mask=torch.from_numpy(arrays["input_mask"][part]),
                    token_type_ids=torch.from_numpy(arrays["segment_ids"][part]),
                ).logits
            wanted = labels[part] != -100
            correct += int((logits.argmax(-1).numpy()[wanted] == labels[part][wanted]).sum())
            total += int(wanted.sum())
    return correct / total, total


@pytest.mark.slow
@whole_run
def test_each_accuracy_is_the_same_computed_another_way(ttq: ModuleType, tiny_run: dict[str, Any]) -> None:
    (record,) = tiny_run["results"]["replicates"]
    dataset = Path(record["evaluation"]["files"][0]).parent
    for name in ttq.RUNS:
        accuracy, positions = _labelled_accuracy(record["runs"][name]["export"], dataset)
        assert positions == record["evaluation"]["predictions"]
        assert record["runs"][name]["heldout_mlm_accuracy"] == pytest.approx(accuracy, abs=1e-3), name


def _run(accuracy: float, steps: int, seconds: float, finetuned: float | None) -> dict[str, Any]:
    return {
        "recipe": "a recipe", "heldout_mlm_accuracy": accuracy, "steps": steps, "sequences": 32 * steps,
        "seconds": seconds, "finetune": None if finetuned is None else {"median": finetuned, "seeds": 1},
    }  # fmt: skip


def _record(seed: int, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"seed": seed, "evaluation": {"sequences": 10, "predictions": 150}, "runs": runs}


def _fake_results(ttq: ModuleType) -> dict[str, Any]:
    """What :func:`benchmark` returns, made up, two replicates: the peer only in the first and not
    fine-tuned there, classic over its budget in the second."""
    replicates = [
        _record(1, {"classic": _run(0.2, 10, 4.0, 0.5), "modern": _run(0.3, 20, 4.1, 0.5),
                    "modern-half": _run(0.1, 9, 2.0, 0.4), "hf-peer": _run(0.0, 5, 4.2, None)}),
        _record(2, {"classic": _run(0.4, 12, 9.0, 0.5), "modern": _run(0.5, 22, 4.0, 0.5),
                    "modern-half": _run(0.3, 11, 2.1, 0.6)}),
    ]  # fmt: skip
    runs = ttq.medians(replicates)
    return {"replicates": replicates, "runs": runs, "ratios": ttq.ratios(runs), "targets": ttq.targets(runs),
            "budget_seconds": 4.0, "device": "cpu", "size": "tiny", "preset": "bert-tiny",
            "peer_sweep": {"points": [{"learning_rate": 0.1, "heldout_mlm_accuracy": 0.0}],
                           "seconds_each": 1}}  # fmt: skip


def test_medians_take_each_run_over_the_replicates_that_have_it(ttq: ModuleType) -> None:
    runs = _fake_results(ttq)["runs"]
    assert list(runs) == ["classic", "modern", "modern-half", "hf-peer"]
    assert [runs[name]["seeds"] for name in runs] == [2, 2, 2, 1]
    assert runs["classic"]["heldout_mlm_accuracy"] == pytest.approx(0.3)
    assert runs["modern-half"]["finetune"] == {"median": pytest.approx(0.5), "seeds": 2}
    # Steps and sequences of one run (the lower median), so that sequences = steps x batch.
    assert (runs["modern"]["steps"], runs["modern"]["sequences"]) == (20, 640)
    assert runs["classic"]["seconds"] == pytest.approx(6.5)
    assert runs["hf-peer"]["finetune"] is None


@pytest.mark.parametrize(
    ("half", "modern_finetuned", "peer", "expected"),
    [
        (0.31, 0.6, 0.1, {"half_time": True, "finetune_kept": True, "beat_peer": True}),
        (0.29, 0.6, 0.1, {"half_time": False, "finetune_kept": True, "beat_peer": True}),
        (0.31, 0.4, 0.1, {"half_time": True, "finetune_kept": False, "beat_peer": True}),
        (0.31, 0.6, 0.35, {"half_time": True, "finetune_kept": True, "beat_peer": False}),
        (0.31, 0.6, None, {"half_time": True, "finetune_kept": True, "beat_peer": None}),
    ],
)
def test_targets_compare_the_medians(
    ttq: ModuleType, half: float, modern_finetuned: float, peer: float | None, expected: dict[str, Any]
) -> None:
    runs = {"classic": _run(0.3, 10, 4, 0.5), "modern": _run(0.4, 10, 4, modern_finetuned),
            "modern-half": _run(half, 5, 2, 0.5)}  # fmt: skip
    if peer is not None:
        runs["hf-peer"] = _run(peer, 5, 4, 0.3)
    assert ttq.targets(runs) == expected


def test_main_writes_the_table_and_removes_the_work_files_unless_kept_or_failed(
    ttq: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def benchmark(size: Any, args: Any, budget: float, work: Path) -> dict[str, Any]:
        (work / "data").mkdir(parents=True)
        return _fake_results(ttq)

    monkeypatch.setattr(ttq, "benchmark", benchmark)
    assert ttq.main(["--out", str(tmp_path)]) == 0
    assert not (tmp_path / "work").exists()
    output = capsys.readouterr().out
    runs, ratios, per_seed = _tables(output)
    assert [row["fine-tuned acc"] for row in runs] == ["0.5000", "0.5000", "0.5000", "not measured"]
    assert [row["held-out MLM acc"] for row in runs] == ["0.3000", "0.4000", "0.2000", "0.0000"]
    assert [(row["ratio"], row["held-out MLM acc"], row["fine-tuned acc"]) for row in ratios] == [
        ("modern/classic", "1.33", "1.00"),
        ("modern-half/classic", "0.67", "1.00"),
        ("classic/hf-peer", "n/a", "n/a"),
        ("modern/hf-peer", "n/a", "n/a"),
    ]
    assert [(row["seed"], row["run"]) for row in per_seed] == [
        ("1", "classic"), ("1", "modern"), ("1", "modern-half"), ("1", "hf-peer"),
        ("2", "classic"), ("2", "modern"), ("2", "modern-half"),
    ]  # fmt: skip
    assert "accuracy: not met; modern's fine-tuned score not below classic's: met; classic and modern " \
        "both beat the peer: not measured." in output  # fmt: skip
    table = (tmp_path / ttq.TABLE_FILE).read_text()
    assert "classic (seed 2) trained 9.0 s against a budget of 4 s" in table
    assert "classic (seed 1) trained" not in table and "modern-half (seed 1) trained" not in table
    assert json.loads((tmp_path / ttq.RESULTS_FILE).read_text())["runs"]["modern"]["steps"] == 20

    assert ttq.main(["--out", str(tmp_path), "--keep"]) == 0
    assert (tmp_path / "work" / "data").is_dir()
    capsys.readouterr()

    def failing(size: Any, args: Any, budget: float, work: Path) -> dict[str, Any]:
        raise ttq.BenchmarkError("modern: exit 1 after 3 s")

    monkeypatch.setattr(ttq, "benchmark", failing)
    assert ttq.main(["--out", str(tmp_path)]) == 1
    assert (tmp_path / "work" / "data").is_dir()  # kept for its logs
    assert "time_to_quality: modern: exit 1 after 3 s" in capsys.readouterr().err


# The parts alone ---------------------------------------------------------------------------------


class _Predicts:
    """A masked-LM stand-in whose logits put token ``want[row, position]`` first, ``row`` being
    the row's first input id."""

    def __init__(self, want: np.ndarray, vocab: int):
        self.want, self.vocab = want, vocab
        self.evaluated = False

    def eval(self) -> None:
        self.evaluated = True

    def __call__(self, input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
        logits = torch.zeros(*input_ids.shape, self.vocab)
        logits.scatter_(2, torch.from_numpy(self.want[input_ids[:, 0].numpy()]).unsqueeze(-1), 1.0)
        return SimpleNamespace(logits=logits)


def test_mlm_accuracy_counts_the_masked_positions_and_ignores_padded_slots(ttq: ModuleType) -> None:
    rows, length, vocab = 3, 8, 10
    positions = np.array([[1, 3, 0], [2, 0, 0], [4, 5, 6]])  # 0: a padded slot
    labels = np.array([[7, 8, 9], [5, 9, 9], [1, 2, 3]])
    want = np.zeros((rows, length), np.int64)
    want[0, 1], want[0, 3] = 7, 1  # right, wrong
    want[1, 2] = 5  # right
    want[2, 4], want[2, 5], want[2, 6] = 1, 2, 0  # right, right, wrong
    want[0, 0] = want[1, 0] = 9  # the padded slots' labels at position 0: not counted
    heldout = ttq.HeldOut(
        np.arange(rows)[:, None].repeat(length, axis=1), np.ones((rows, length), np.int64),
        np.zeros((rows, length), np.int64), positions, labels, ("x",),
    )  # fmt: skip
    model = _Predicts(want, vocab)
    assert ttq.mlm_accuracy(model, heldout, "cpu", batch_size=2) == pytest.approx(4 / 6)
    assert model.evaluated
    assert heldout.predictions == 6


def test_the_peer_trains_on_the_shards_tokens_masks_undone(ttq: ModuleType, tmp_path: Path) -> None:
    # [CLS]=2 [SEP]=3 [MASK]=4 [PAD]=0; row 0 is "2 10 4 12 3" with 11 masked at position 2, row 1
    # "2 4 21 3" with 20 masked at position 1 and a random replacement (5 for 22) at position 2.
    ids = np.array([[2, 10, 4, 12, 3, 0], [2, 4, 5, 3, 0, 0]], np.int32)
    with h5py.File(tmp_path / "shard_00000.hdf5", "w") as shard:
        shard["input_ids"] = ids
        shard["input_mask"] = (ids != 0).astype(np.int32)
        shard["masked_lm_positions"] = np.array([[2, 0], [1, 2]], np.int32)
        shard["masked_lm_ids"] = np.array([[11, 0], [20, 22]], np.int32)
    with h5py.File(tmp_path / "heldout_00000.hdf5", "w") as shard:  # not training data
        shard["input_ids"] = np.full((1, 6), 99, np.int32)
    rows = ttq.UnmaskedRows(tmp_path, special_ids=[0, 2, 3])
    assert len(rows) == 2
    assert rows[0] == {"input_ids": [2, 10, 11, 12, 3], "special_tokens_mask": [1, 0, 0, 0, 1]}
    assert rows[1] == {"input_ids": [2, 20, 22, 3], "special_tokens_mask": [1, 0, 0, 1]}


def test_read_train_log_takes_the_phase_start_and_the_intervals_after_the_first(
    ttq: ModuleType, tmp_path: Path
) -> None:
    def record(kind: str, elapsed: float, step: Any, data: dict[str, Any]) -> str:
        return json.dumps({"type": kind, "elapsedtime": elapsed, "step": step, "data": data})

    log = tmp_path / "train.jsonl"
    log.write_text("\n".join([
        record("PARAMETER", 1.0, "PARAMETER", {"phase": 1}),
        record("LOG", 5.0, [1, 2], {"split": "train", "sequences": 64.0}),  # the start's slow steps
        record("LOG", 6.0, [1, 4], {"split": "train", "sequences": 64.0}),
        record("LOG", 6.5, [1, 4], {"split": "eval", "sequences": 500.0}),
        record("LOG", 7.0, [1, 6], {"split": "train", "sequences": 64.0}),
    ]) + "\n")  # fmt: skip
    assert ttq.read_train_log(log) == ttq.TrainLog(steps=6, sequences=192, seconds=6.0, steps_per_second=2.0)


@pytest.mark.parametrize("size", ["tiny", "demo", "base"])
def test_our_jobs_are_valid_and_share_the_data_but_masking(
    ttq: ModuleType, size: str, tmp_path: Path
) -> None:
    chosen = ttq.SIZES[size]
    device = "cuda" if size == "base" else "cpu"
    shared = ttq.shared_data_job(chosen, device, tmp_path, 7)
    documents = {name: ttq.our_job(name, chosen, device, tmp_path, budget=5.5, seed=7) for name in ttq.OURS}
    peer = ttq.peer_finetune_job(chosen, device, tmp_path, tmp_path / "hf-peer" / "hf", seed=7)
    for document in (shared, *documents.values(), peer):
        job = parse_job(document)
        checked(job.spec, "<time_to_quality>", "training")
    classic, modern = documents["classic"]["spec"], documents["modern"]["spec"]
    without_masking = [
        {key: value for key, value in spec["data"].items() if key != "maskedLmProb"}
        for spec in (shared["spec"], classic, modern)
    ]
    assert without_masking[0] == without_masking[1] == without_masking[2]
    assert [spec["data"]["maskedLmProb"] for spec in (shared["spec"], classic, modern)] == [0.15, 0.15, 0.3]
    # Three datasets in one directory: the shared set's, classic's and modern's names differ.
    predictions = [spec["phases"][0]["maxPredictionsPerSeq"] for spec in (shared["spec"], classic, modern)]
    assert len(set(predictions)) == 3
    objectives = [spec["objective"] for spec in (shared["spec"], classic, modern)]
    assert objectives == ["mlm", "mlm-nsp", "mlm"]
    assert modern["model"]["hiddenDropoutProb"] == modern["model"]["attentionProbsDropoutProb"] == 0
    assert (modern["optimizer"]["schedule"], modern["optimizer"]["maxGradNorm"]) == ("one-cycle", 0.5)
    assert classic["budget"] == modern["budget"] == {"time": "6s"}
    assert "steps" not in classic["phases"][0] and "steps" not in modern["phases"][0]
    half = documents["modern-half"]["spec"]
    assert half["budget"] == {"time": "3s"}
    assert {**half, "budget": None, "checkpoint": None} == {**modern, "budget": None, "checkpoint": None}
    assert classic["finetune"][0]["seeds"] == 1 and "initFrom" not in classic["finetune"][0]
    assert {spec["seed"] for spec in (shared["spec"], classic, modern, half, peer["spec"])} == {7}
    task = peer["spec"]["finetune"][0]
    assert task["initFrom"] == str(tmp_path / "hf-peer" / "hf") and task["baseline"] is True
