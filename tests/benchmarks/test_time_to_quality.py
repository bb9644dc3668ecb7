"""benchmarks/time_to_quality.py (and its package ``ttq``): one whole run at the tiny size as CI
runs it (the curves at 3 budgets, the peer's sweep and run, the fine-tuning, the ablation: 218 s
on 2 quiet cores, 6-10 minutes while other work shared them), a second invocation that reuses
every run, and the parts alone: the demo's held-out sets, our job documents (which the job API
must accept), the one fine-tuning protocol, the run store, the statistics on made-up records, the
plan, the peer's budget and masking, the per-row scoring."""

from __future__ import annotations

import importlib
import itertools
import json
import math
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import asdict, replace
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from scipy import stats

from bertjob_api.spec import parse_job
from bertjob_api.validation import checked

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
whole_run = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def ttq() -> ModuleType:
    """The benchmark's command as a module."""
    return importlib.import_module("time_to_quality")


@pytest.fixture(scope="module")
def parts() -> SimpleNamespace:
    """The package's modules."""
    names = ("settings", "jobs", "heldout", "store", "peer", "runner", "report")
    return SimpleNamespace(**{name: importlib.import_module(f"ttq.{name}") for name in names})


def _invoke(ttq: ModuleType, argv: list[str], capture: Path) -> tuple[int, str]:
    with capture.open("w") as stdout, pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stdout", stdout)
        code = ttq.main(argv)
    output = capture.read_text()
    print(output)  # shown by pytest when a test fails, and by -s
    return code, output


@pytest.fixture(scope="module")
def tiny_run(ttq: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One whole run at the tiny size with its work files kept: stdout, the JSON, the records."""
    out = tmp_path_factory.mktemp("time-to-quality")
    code, output = _invoke(ttq, ["--size", "tiny", "--out", str(out), "--keep"], out / "stdout.txt")
    assert code == 0, output
    records = [json.loads(path.read_text()) for path in sorted((out / "runs").glob("*.json"))]
    return {
        "out": out,
        "stdout": output,
        "results": json.loads((out / ttq.RESULTS_FILE).read_text()),
        "records": records,
    }


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
    return [[dict(zip(header, row, strict=True)) for row in rows] for header, *rows in tables]


def _kind(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] == kind]


@pytest.mark.slow
@whole_run
def test_the_curves_and_the_ratio(
    ttq: ModuleType, parts: SimpleNamespace, tiny_run: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    table = (tiny_run["out"] / ttq.TABLE_FILE).read_text()
    with capsys.disabled():  # the tables in the test log, as CI runs it
        print(f"\nbenchmarks/time_to_quality.py --size tiny:\n{table}")
    curves, ratios, *_ = _tables(table)
    size = parts.settings.SIZES["tiny"]
    budgets = [size.seconds(f) for f in size.fractions]
    assert [(row["recipe"], row["budget"]) for row in curves] == [
        (recipe, f"{parts.settings.fraction_label(f)} ({b} s)")
        for recipe in ("classic", "modern")
        for f, b in zip(size.fractions, budgets, strict=True)
    ] + [("hf-peer", f"1 ({budgets[-1]} s)")]
    for row in curves:
        assert 0 <= float(row["singles acc"]) <= 1 and 0 <= float(row["pairs acc"]) <= 1, row
    # Each point's seconds are its run's budget.json finished_seconds (the clock's, not the budget).
    for record in _kind(tiny_run["records"], "ours"):
        run_dir = next(
            (tiny_run["out"] / "work" / f"seed-{record['seed']}").glob(
                f"{record['recipe']}-{record['budget_seconds']}s*"
            )
        )
        finished = json.loads((run_dir / "checkpoints" / "phase1" / "budget.json").read_text())
        assert record["seconds"] == finished["finished_seconds"] > 0, record["key"]
    summary = tiny_run["results"]["summary"]
    if summary["ratio_left_out"]:
        # A busy machine: a run ended far enough off its budget that a larger budget trained fewer
        # seconds; the replicate is left out of the ratio, and the table says so.
        (left,) = summary["ratio_left_out"]
        assert any(b <= a for s in left["seconds"].values() for a, b in itertools.pairwise(s))
        assert "Replicate 0 left out of the ratio" in table and ratios == []
    else:
        assert [row["held-out set"] for row in ratios] == ["singles", "pairs"]
        ratio = summary["ratio"]["singles"]
        assert ratio["replicates"] == 1 and ratio["low"] is None  # one replicate: no interval
        assert ratios[0]["90% interval"] == "n/a (one replicate)"
    assert set(summary["targets"]) == {"third_of_the_time", "finetune_kept", "beat_peer", "within_budget"}
    plot = ElementTree.parse(tiny_run["out"] / ttq.PLOT_FILE).getroot()
    assert plot.tag.endswith("svg") and len(plot.findall(".//{http://www.w3.org/2000/svg}polyline")) == 4
    assert "runs trained, 0 reused" in tiny_run["stdout"]


@pytest.mark.slow
@whole_run
def test_a_second_invocation_reuses_every_run(
    ttq: ModuleType, tiny_run: dict[str, Any], tmp_path: Path
) -> None:
    out = tiny_run["out"]
    before = sorted(path.name for path in (out / "runs").glob("*.json"))
    code, output = _invoke(ttq, ["--size", "tiny", "--out", str(out), "--keep"], tmp_path / "stdout.txt")
    assert code == 0, output
    assert sorted(path.name for path in (out / "runs").glob("*.json")) == before
    reused = [line for line in output.splitlines() if "finished before, reusing runs/" in line]
    assert len(reused) == len(before), output
    assert f"0 runs trained, {len(before)} reused" in output
    again = json.loads((out / ttq.RESULTS_FILE).read_text())
    assert again["summary"] == tiny_run["results"]["summary"]


@pytest.mark.slow
@whole_run
def test_the_held_out_sets_hold_both_formats_one_pass(tiny_run: dict[str, Any]) -> None:
    (evaluation,) = tiny_run["results"]["evaluation"].values()
    singles, pairs = evaluation["singles"], evaluation["pairs"]
    assert singles["rows_with_segment_b"] == 0 and pairs["rows_with_segment_b"] == pairs["rows"] > 100
    for counts in (singles, pairs):  # one pass: (nearly) every row a distinct segment
        assert counts["distinct_segments"] >= 0.98 * counts["rows"] and counts["predictions"] > counts["rows"]
    for record in _kind(tiny_run["records"], "ours"):
        assert set(record["accuracy"]) == {"singles", "pairs"}
        assert len(record["scores"]["singles"]["correct"]) == singles["rows"]
    for form, counts in (("singles", singles), ("pairs", pairs)):  # rows traced to their documents
        assert (
            1 < counts["documents"] < counts["rows"]
            and counts["rows_without_document"] <= 0.03 * counts["rows"]
        )
        # The ratio's bootstrap draws documents, and each untraced row as a unit of its own.
        ratio = tiny_run["results"]["summary"]["ratio"].get(form)
        if ratio is not None:
            assert ratio["units"] == "documents"
            assert ratio["units_per_replicate"] == [counts["documents"] + counts["rows_without_document"]]


@pytest.mark.slow
@whole_run
def test_every_model_is_fine_tuned_by_one_protocol(parts: SimpleNamespace, tiny_run: dict[str, Any]) -> None:
    finetuned = [r for r in tiny_run["records"] if r.get("finetune")]
    names = sorted(r["recipe"] for r in finetuned)
    assert names == ["classic", "hf-peer", "modern", "random-init"]
    tasks = [{k: v for k, v in r["finetune"]["task"].items() if k != "initFrom"} for r in finetuned]
    assert all(task == tasks[0] for task in tasks) and tasks[0]["dropout"] == 0.1 and tasks[0]["seeds"] == 3
    # What the fine-tuning itself recorded it ran with, and its seeds.
    assert all(r["finetune"]["settings"] == finetuned[0]["finetune"]["settings"] for r in finetuned)
    assert all(len(r["finetune"]["values"]) == parts.settings.FINETUNE_SEEDS for r in finetuned)
    assert {"initFrom" in r["finetune"]["task"] for r in finetuned if r["kind"] != "ours"} == {True}


@pytest.mark.slow
@whole_run
def test_the_peer_swept_with_mosaicbert_and_chose_on_its_validation_split(
    parts: SimpleNamespace, tiny_run: dict[str, Any]
) -> None:
    sweep = _kind(tiny_run["records"], "peer-sweep")
    assert {r["config"] for r in sweep} == {c.name for c in parts.settings.PEER_CONFIGS}
    assert "scores" not in sweep[0]  # never scored on the held-out sets
    (final,) = _kind(tiny_run["records"], "peer")
    # The final run's point scored best (points on the unigram plateau can tie).
    point = (final["config"], final["learning_rate"])
    (chosen,) = [r for r in sweep if (r["config"], r["settings"]["learning_rate"]) == point]
    assert chosen["validation_mlm_accuracy"] == max(r["validation_mlm_accuracy"] for r in sweep)
    counts = final["peer_data"]
    assert counts["validation"] + counts["train"] == counts["distinct"]
    run = final["run"]  # the budget mechanism: fitted, re-fitted, run to its fitted count
    assert run["fits"] and run["steps"] == run["fits"][-1]["steps"] and run["calibration_steps"] == 4


@pytest.mark.slow
@whole_run
def test_the_ablation_has_every_row_and_the_shared_runs_once(
    ttq: ModuleType, tiny_run: dict[str, Any]
) -> None:
    rows = tiny_run["results"]["summary"]["ablation"]["rows"]
    assert [row["recipe"] for row in rows] == [
        "classic",
        "modern",
        "adamw",
        "schedule",
        "no-ramp",
        "full-batch",
    ]
    assert rows[0]["difference"] == {} and set(rows[1]["difference"]) == {"singles", "pairs"}
    keys = [r["key"] for r in tiny_run["records"]]
    assert len(keys) == len(set(keys))
    # Each record says how fast the machine was as the run ended, and the tables say it per recipe.
    assert all(r["machine_gflops"] > 0 for r in tiny_run["records"])
    assert "Machine speed as each run ended" in (tiny_run["out"] / ttq.TABLE_FILE).read_text()


@pytest.mark.slow
@whole_run
def test_each_optimizer_has_its_own_sweep_and_its_rows_use_its_choice(
    parts: SimpleNamespace, tiny_run: dict[str, Any]
) -> None:
    size, recipes = parts.settings.SIZES["tiny"], parts.settings.RECIPES
    choices = tiny_run["results"]["choices"]
    assert choices["lamb_lr"] in size.lamb_lrs and choices["adamw_lr"] in size.adamw_lrs
    full = size.seconds(1.0)
    for record in _kind(tiny_run["records"], "ours"):
        recipe = recipes[record["recipe"]]
        swept = record["budget_seconds"] == full and record["recipe"] in parts.settings.SWEPT
        if recipe.name == "classic":
            assert record["learning_rate"] == size.classic_lr
        elif not swept:  # the curves and the ablation: the choice for the recipe's optimizer
            assert record["learning_rate"] == choices[f"{recipe.optimizer}_lr"], record["key"]
        # Only the headline's sweep points are fine-tuned (one of them is its curve's run).
        assert (record["finetune"] is not None) == (
            record["budget_seconds"] == full and recipe.name in parts.settings.HEADLINE
        ), record["key"]
    ours = _kind(tiny_run["records"], "ours")
    adamw = [r for r in ours if r["recipe"] == "adamw" and r["budget_seconds"] == full]
    assert sorted(r["learning_rate"] for r in adamw) == sorted(size.adamw_lrs)


def _labelled_accuracy(export: Path, dataset: Path) -> tuple[float, int]:
    """Held-out MLM accuracy computed another way: ``BertForMaskedLM`` itself, labels spread over
    the sequence (-100 elsewhere, as transformers' MLM labels) and each token's argmax."""
    from transformers import BertForMaskedLM

    model = BertForMaskedLM.from_pretrained(str(export)).eval()
    correct = total = 0
    for file in sorted(dataset.glob("heldout_*.hdf5")):
        with h5py.File(file, "r") as shard:
            arrays = {name: shard[name][:].astype(np.int64) for name in shard}
        labels = np.full(arrays["input_ids"].shape, -100)
        rows, slots = np.nonzero(arrays["masked_lm_positions"])
        labels[rows, arrays["masked_lm_positions"][rows, slots]] = arrays["masked_lm_ids"][rows, slots]
        with torch.no_grad():
            logits = model(
                input_ids=torch.from_numpy(arrays["input_ids"]),
                attention_mask=torch.from_numpy(arrays["input_mask"]),
                token_type_ids=torch.from_numpy(arrays["segment_ids"]),
            ).logits
        wanted = labels != -100
        correct += int((logits.argmax(-1).numpy()[wanted] == labels[wanted]).sum())
        total += int(wanted.sum())
    return correct / total, total


@pytest.mark.slow
@whole_run
def test_each_accuracy_is_the_same_computed_another_way(tiny_run: dict[str, Any]) -> None:
    (peer,) = _kind(tiny_run["records"], "peer")
    data = tiny_run["out"] / "work" / f"seed-{peer['seed']}" / "data"
    export = tiny_run["out"] / "work" / f"seed-{peer['seed']}" / "hf-peer" / "hf"
    for form, dataset in (("singles", "seq_len_128_max_pred_19"), ("pairs", "seq_len_128_max_pred_20")):
        accuracy, positions = _labelled_accuracy(export, data / dataset)
        assert positions == sum(peer["scores"][form]["total"])
        assert peer["accuracy"][form] == pytest.approx(accuracy, abs=1e-6)


# The parts alone ------------------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_the_demo_held_out_sets_have_2000_distinct_segments_in_both_formats(
    parts: SimpleNamespace, tmp_path: Path
) -> None:
    size = parts.settings.SIZES["demo"]
    bench = parts.runner.Benchmark("demo", size, "cpu", tmp_path)
    sets = bench.prepare(bench.replicate(0))
    singles, pairs = sets["singles"], sets["pairs"]
    assert singles.distinct_segments() >= parts.settings.MIN_HELDOUT_SEGMENTS
    assert pairs.distinct_segments() >= parts.settings.MIN_HELDOUT_SEGMENTS
    assert not singles.has_segment_b() and pairs.has_segment_b()
    assert (pairs.segment_ids == 1).any(axis=1).all()  # every pair row has a segment B
    assert (singles.positions != 0).sum() == singles.predictions > 10 * singles.rows


def test_a_batch_divisor_that_leaves_a_ramp_nothing_to_grow_is_refused(parts: SimpleNamespace) -> None:
    settings = parts.settings
    demo = settings.SIZES["demo"]  # 64 sequences a step, micro-batches of 16
    assert settings.MODERN.global_batch(demo) == 32 and settings.CLASSIC.global_batch(demo) == 64
    assert replace(settings.MODERN, batch_divisor=4, batch_ramp=None).global_batch(demo) == 16
    with pytest.raises(ValueError, match=r"batch_divisor 4 leaves a global batch of 16, .* at least 32"):
        replace(settings.MODERN, batch_divisor=4).global_batch(demo)
    with pytest.raises(ValueError, match=r"batch_divisor 3 leaves a global batch of 21\.3333"):
        replace(settings.MODERN, batch_divisor=3).global_batch(demo)
    # The size's check refuses it before any run: modern's half of 64 is one micro-batch of 32.
    with pytest.raises(ValueError, match=r"recipe modern: batch_divisor 2 leaves a global batch of 32"):
        replace(demo, micro_batch=32).check()


@pytest.mark.parametrize("size", ["tiny", "demo", "base"])
def test_our_jobs_are_valid_and_each_ablation_row_adds_one_ingredient(
    parts: SimpleNamespace, size: str, tmp_path: Path
) -> None:
    settings, jobs = parts.settings, parts.jobs
    chosen = settings.SIZES[size]
    device = "cuda" if size == "base" else "cpu"
    documents = {
        name: jobs.our_job(
            recipe,
            chosen,
            device,
            tmp_path,
            tmp_path / name,
            budget=12,
            seed=7,
            learning_rate=recipe.learning_rate(chosen, 1e-3),
            finetune=True,
        )
        for name, recipe in settings.RECIPES.items()
    }
    shared = [jobs.singles_job(chosen, device, tmp_path, 7), jobs.pairs_job(chosen, device, tmp_path, 7)]
    finetune = jobs.finetune_job(chosen, device, tmp_path, tmp_path / "peer", tmp_path / "peer" / "hf", 7)
    for document in (*documents.values(), *shared, finetune):
        checked(parse_job(document).spec, "<time_to_quality>", "training")
    spec = {name: document["spec"] for name, document in documents.items()}
    assert spec["classic"]["data"] == shared[1]["spec"]["data"]  # classic trains on the pair set's data
    assert spec["classic"]["budget"] == {"time": "12s"} and "steps" not in spec["classic"]["phases"][0]

    def changed(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> set[str]:
        keys = set(a) | set(b)
        found = set()
        for key in keys:
            x, y = a.get(key), b.get(key)
            if isinstance(x, dict) and isinstance(y, dict):
                found |= changed(x, y, f"{prefix}{key}.")
            elif isinstance(x, list) and isinstance(y, list) and x and isinstance(x[0], dict):
                found |= changed(x[0], y[0], f"{prefix}{key}.")
            elif x != y:
                found.add(prefix + key)
        return found

    paths = {"checkpoint.path", "metadata.name"}
    assert changed(spec["schedule"], spec["modern"]) - paths == {"data.masking", "data.finalMaskedLmProb"}
    assert changed(spec["no-ramp"], spec["modern"]) - paths == {"phases.batchRampProportion"}
    assert spec["modern"]["phases"][0]["batchRampProportion"] == 0.3
    assert changed(spec["full-batch"], spec["modern"]) - paths == {"phases.globalBatchSize"}
    full, half = (spec[name]["phases"][0]["globalBatchSize"] for name in ("full-batch", "modern"))
    assert (full, half) == (chosen.global_batch, chosen.global_batch // 2)
    assert spec["classic"]["phases"][0]["globalBatchSize"] == chosen.global_batch
    # The same swept rate given to both: the AdamW row differs from modern by its optimizer alone.
    assert changed(spec["adamw"], spec["modern"]) - paths == {"optimizer.name", "optimizer.beta2"}
    assert spec["modern"]["optimizer"]["name"] == "lamb" and spec["adamw"]["optimizer"]["beta2"] == 0.98
    assert spec["schedule"]["data"]["finalMaskedLmProb"] == 0.15
    # Each dataset setting has its own dataset directory name, so no two jobs rebuild each other's.
    names = {
        (
            s["phases"][0]["maxPredictionsPerSeq"],
            s["data"]["masking"],
            s["data"]["packing"],
            s["data"]["dupeFactor"],
            s["objective"],
        )
        for s in (*spec.values(), *(d["spec"] for d in shared))
    }
    directories = {(p, m, k) for p, m, k, _, _ in names}
    assert len(directories) == len(names)


def test_the_fine_tuning_jobs_are_identical_but_for_init_from(parts: SimpleNamespace, tmp_path: Path) -> None:
    settings, jobs = parts.settings, parts.jobs
    size = settings.SIZES["demo"]
    tasks = [
        jobs.our_job(
            recipe,
            size,
            "cpu",
            tmp_path,
            tmp_path / name,
            budget=60,
            seed=3,
            learning_rate=recipe.learning_rate(size, 1e-3),
            finetune=True,
        )["spec"]["finetune"]
        for name, recipe in settings.RECIPES.items()
    ]
    peer = jobs.finetune_job(size, "cpu", tmp_path, tmp_path / "peer", tmp_path / "hf", 3)["spec"]
    assert peer["finetune"][0].pop("initFrom") == str(tmp_path / "hf")
    assert all(task == peer["finetune"] for task in tasks)
    assert peer["finetune"][0]["dropout"] == 0.1 and peer["finetune"][0]["seeds"] == 3
    # ... and so are the fine-tuning's inputs besides the task: the seed, the device, the precision.
    ours = jobs.our_job(
        settings.CLASSIC,
        size,
        "cpu",
        tmp_path,
        tmp_path / "c",
        budget=60,
        seed=3,
        learning_rate=0.01,
        finetune=True,
    )["spec"]
    for field in ("seed", "precision", "accelerator", "topology"):
        assert ours[field] == peer[field], field


def test_a_run_key_depends_on_its_content_not_on_the_output_directory(
    parts: SimpleNamespace, tmp_path: Path
) -> None:
    store_module, jobs, settings = parts.store, parts.jobs, parts.settings
    size = settings.SIZES["tiny"]

    def key(work: Path, budget: int = 4, lr: float = 0.01) -> str:
        spec = jobs.our_job(
            settings.CLASSIC,
            size,
            "cpu",
            work / "seed-1",
            work / "seed-1" / "c",
            budget=budget,
            seed=1,
            learning_rate=lr,
            finetune=False,
        )["spec"]
        return store_module.run_key(
            "ours", "classic", 1, budget, "tiny", store_module.without_paths(spec, work)
        )

    assert key(tmp_path / "a") == key(tmp_path / "b")
    assert key(tmp_path / "a") != key(tmp_path / "a", budget=5) != key(tmp_path / "a", lr=0.02)
    assert key(tmp_path / "a").startswith("classic-1-4s-")
    store = store_module.RunStore(tmp_path / "runs")
    assert store.get("x") is None
    store.put({"key": "x", "value": 1})
    assert store.get("x") == {"key": "x", "value": 1} and not list((tmp_path / "runs").glob(".*"))
    store.path("y").write_text(json.dumps({"key": "x"}))
    with pytest.raises(ValueError, match="not the record of run y"):
        store.get("y")


def _record(
    recipe: str,
    replicate: int,
    budget: int,
    seconds: float,
    accuracy: float,
    rows: int = 40,
    finetuned: float | None = None,
    kind: str = "ours",
) -> dict[str, Any]:
    """A made-up run: ``rows`` held-out rows of 10 predictions each, ``accuracy`` of them right
    (to 1 / (10 x rows)), spread as evenly as rows allow."""
    whole, extra = divmod(round(accuracy * 10 * rows), rows)
    correct = [whole + 1] * extra + [whole] * (rows - extra)
    accuracy = sum(correct) / (10 * rows)
    score = {"accuracy": accuracy, "correct": correct, "total": [10] * rows}
    return {
        "key": f"{recipe}-{replicate}-{budget}",
        "kind": kind,
        "recipe": recipe,
        "replicate": replicate,
        "seed": 100 + replicate,
        "budget_seconds": budget,
        "seconds": seconds,
        "steps": budget,
        "description": recipe,
        "accuracy": {"singles": accuracy, "pairs": accuracy},
        "scores": {"singles": score, "pairs": score},
        "finetune": None if finetuned is None else {"median": finetuned},
    }


def _curves(shift: float, replicates: int, jitter: float = 0.0) -> list[dict[str, Any]]:
    """Classic at 10, 20, 40, 80 s climbing 0.1 per doubling from 0.2; modern reaching each of its
    accuracies ``shift`` times as fast (modern at t scores what classic scores at t / shift)."""
    records = []
    for replicate in range(replicates):
        for budget in (10, 20, 40, 80):
            level = 0.2 + 0.1 * math.log2(budget / 10)
            noise = jitter * (replicate - (replicates - 1) / 2)
            records.append(_record("classic", replicate, budget, budget, level))
            modern = 0.2 + 0.1 * math.log2(budget * shift / 10) + noise
            records.append(_record("modern", replicate, budget, budget, min(modern, 1.0)))
    return records


def test_the_summary_finds_the_ratio_of_made_up_curves_and_its_interval(parts: SimpleNamespace) -> None:
    settings, report = parts.settings, parts.report
    size = settings.Size(
        **{**settings.SIZES["tiny"].__dict__, "budget": 80.0, "fractions": (1 / 8, 1 / 4, 1 / 2, 1.0)}
    )
    # Modern scores at t what classic scores at 2t: classic's 80 s accuracy (0.5) at 40 s, ratio 0.5.
    one = report.summarize(_curves(2.0, 1), size, 1, 0)["ratio"]["singles"]
    assert one["estimate"] == pytest.approx(0.5) and one["low"] is None and one["replicates_needed"] is None
    # Four times as fast: 20 s, 0.25; three replicates give an interval around it.
    three = report.summarize(_curves(4.0, 3, jitter=0.02), size, 3, 0)["ratio"]["singles"]
    assert three["estimate"] == pytest.approx(0.25, abs=0.02)
    assert three["low"] <= three["estimate"] <= three["high"] and three["replicates"] == 3
    assert three["replicates_needed"] >= 2
    lines = report.tables({"summary": report.summarize(_curves(4.0, 3, 0.02), size, 3, 0), "choices": {}})
    ratio_rows = _tables("\n".join(lines))[1]
    assert ratio_rows[0]["ratio"] == f"{three['estimate']:.3f}" and ratio_rows[0]["90% interval"].startswith(
        "["
    )


def test_the_sides_table_gives_each_side_its_global_batch(parts: SimpleNamespace) -> None:
    settings, report = parts.settings, parts.report
    demo = settings.SIZES["demo"]
    summary = report.summarize(_curves(2.0, 1), demo, 1, 0)
    text = "\n".join(report.tables({"summary": summary, "choices": {}, "settings": asdict(demo)}))
    assert "| global batch (sequences a step) | 64 | 32, ramped from 16 | 64 |" in text
    # Results without the size's settings (older ones) have no such row.
    assert "global batch" not in "\n".join(report.tables({"summary": summary, "choices": {}}))


def test_the_ratio_resamples_documents_when_rows_are_traced_to_them(parts: SimpleNamespace) -> None:
    settings, report = parts.settings, parts.report
    size = settings.Size(
        **{**settings.SIZES["tiny"].__dict__, "budget": 80.0, "fractions": (1 / 8, 1 / 4, 1 / 2, 1.0)}
    )
    records = _curves(4.0, 3, jitter=0.02)
    by_rows = report.summarize(records, size, 3, 0)["ratio"]["singles"]
    # 40 rows in 8 documents of 5 rows, and one row no document was found for (its own unit).
    rows = np.repeat(np.arange(8), 5)
    rows[7] = -1
    documents = {i: {"singles": rows, "pairs": rows} for i in range(3)}
    by_documents = report.summarize(records, size, 3, 0, documents)["ratio"]["singles"]
    assert (by_rows["units"], by_documents["units"]) == ("rows", "documents")
    assert by_rows["units_per_replicate"] == [40] * 3 and by_documents["units_per_replicate"] == [9] * 3
    assert by_documents["estimate"] == pytest.approx(by_rows["estimate"])  # sums do not change
    table = "\n".join(
        report.tables({"summary": report.summarize(records, size, 3, 0, documents), "choices": {}})
    )
    assert "held-out documents" in table and "singles: 9, 9, 9 documents" in table


def _piece(path: Path, documents: list[list[list[int]]], heldout: list[bool]) -> None:
    """A data stage's piece of ``documents`` (of sentences of token ids) as ``save_piece`` writes it."""
    sentences = [sentence for document in documents for sentence in document]
    np.savez(
        path,
        tokens=np.asarray([t for sentence in sentences for t in sentence], np.int32),
        sentence_starts=np.cumsum([0] + [len(s) for s in sentences]).astype(np.int64),
        document_starts=np.cumsum([0] + [len(d) for d in documents]).astype(np.int64),
        text_bytes=np.ones(len(documents), np.int64),
        heldout=np.asarray(heldout),
    )


def test_held_out_rows_are_traced_to_the_documents_they_were_cut_from(
    parts: SimpleNamespace, tmp_path: Path
) -> None:
    heldout = parts.heldout
    rng = np.random.default_rng(0)
    words = lambda n: rng.integers(100, 8000, n).tolist()  # noqa: E731
    documents = [[words(30), words(25)] for _ in range(6)]
    _piece(tmp_path / "piece_000000.npz", documents[:3], [True, False, True])
    _piece(tmp_path / "piece_000001.npz", documents[3:], [True, True, False])
    found = heldout.heldout_documents(tmp_path)  # documents 0, 2, 3, 4 of the six
    tokens = [list(itertools.chain(*documents[i])) for i in (0, 2, 3, 4)]
    assert [d.tolist() for d in found] == tokens
    cls, sep, mask = 2, 3, 4
    # (segment A, segment B): truncated at either end, a random next segment B longer than A from
    # another document, and a segment too short to vote.
    cuts = [
        (tokens[1][3:40], []),
        (tokens[0][10:55], []),
        (tokens[3][:12], tokens[2][5:60]),
        (tokens[2][:3], []),
    ]
    length, predictions = 128, 6
    ids = np.zeros((len(cuts), length), np.int64)
    segment_ids, input_mask = np.zeros_like(ids), np.zeros_like(ids)
    positions, labels = (
        np.zeros((len(cuts), predictions), np.int64),
        np.zeros((len(cuts), predictions), np.int64),
    )
    for row, (a, b) in enumerate(cuts):
        tokens_row = [cls, *a, sep] + ([*b, sep] if b else [])
        ids[row, : len(tokens_row)] = tokens_row
        input_mask[row, : len(tokens_row)] = 1
        segment_ids[row, len(a) + 2 : len(tokens_row)] = 1
        masked = [1, 3, 5][: len(a)]
        positions[row, : len(masked)] = masked
        labels[row, : len(masked)] = ids[row, masked]
        ids[row, masked] = mask
    rows = heldout.EvalSet(ids, input_mask, segment_ids, positions, labels, ("made up",))
    traced = heldout.row_documents(rows, found)
    assert traced.tolist() == [1, 0, 3, -1]
    assert heldout.by_document([5, 6, 7, 8], np.asarray([1, 0, 1, -1])).tolist() == [6, 12, 8]
    with pytest.raises(ValueError, match="3 row values for 4 rows"):
        heldout.by_document([1, 2, 3], traced)


def test_the_tables_say_when_recipes_ran_at_different_machine_speeds(parts: SimpleNamespace) -> None:
    settings, report = parts.settings, parts.report
    size = settings.Size(
        **{**settings.SIZES["tiny"].__dict__, "budget": 80.0, "fractions": (1 / 8, 1 / 4, 1 / 2, 1.0)}
    )
    records = _curves(2.0, 2)
    for record in records:
        record["machine_gflops"] = 40.0 if record["recipe"] == "classic" else 30.0
    summary = report.summarize(records, size, 2, 0)
    assert summary["machine"] == {
        "medians": {"classic": 40.0, "modern": 30.0},
        "missing": 0,
        "spread": pytest.approx(1 / 3),
        "p_value": pytest.approx(stats.kruskal([40.0] * 8, [30.0] * 8).pvalue),
    }
    assert summary["machine"]["p_value"] < 0.001
    text = "\n".join(report.tables({"summary": summary, "choices": {}}))
    assert "GFLOP/s, median over a recipe's timed runs): classic 40.0, modern 30.0." in text
    assert "33% apart (Kruskal-Wallis p = " in text and "their seconds do not compare" in text
    # As far apart in medians, but each recipe's runs as spread as the probe is from run to run
    # (the fourth demo run: 139 to 336 within one recipe): no warning, and the test's p is said.
    noisy = {"classic": [20.0, 40.0, 60.0, 45.0], "modern": [25.0, 30.0, 55.0, 28.0]}
    for record in records:
        record["machine_gflops"] = noisy[record["recipe"]][(10, 20, 40, 80).index(record["budget_seconds"])]
    summary = report.summarize(records, size, 2, 0)
    assert summary["machine"]["spread"] > report.MACHINE_SPREAD
    assert summary["machine"]["p_value"] > report.MACHINE_P
    text = "\n".join(report.tables({"summary": summary, "choices": {}}))
    assert "do not compare" not in text and "within the probe's spread from run to run" in text
    # Within 10% of each other: no warning; a run without the figure is counted and said.
    for record in records:
        record["machine_gflops"] = 40.0 if record["recipe"] == "classic" else 37.0
    del records[0]["machine_gflops"]
    text = "\n".join(report.tables({"summary": report.summarize(records, size, 2, 0), "choices": {}}))
    assert "do not compare" not in text and "1 runs have no figure" in text


def test_the_summary_pairs_fine_tuning_and_ablation_by_replicate(parts: SimpleNamespace) -> None:
    settings, report = parts.settings, parts.report
    size = settings.Size(
        **{
            **settings.SIZES["tiny"].__dict__,
            "budget": 80.0,
            "fractions": (1 / 8, 1 / 4, 1 / 2, 1.0),
            "ablation_fraction": 1 / 4,
        }
    )
    records = _curves(2.0, 2)
    for record in records:
        if record["budget_seconds"] == 80:
            record["finetune"] = {
                "median": {"classic": 0.6, "modern": 0.7}[record["recipe"]] + record["replicate"] / 10
            }
    records += [_record("hf-peer", 1, 80, 80, 0.1, finetuned=0.5, kind="peer")]  # replicate 0 has no peer
    for name, accuracy in (("adamw", 0.25), ("full-batch", 0.41), ("schedule", 0.33), ("no-ramp", 0.3)):
        records += [_record(name, i, 20, 20, accuracy + i / 100) for i in range(2)]
    summary = report.summarize(records, size, 2, 2)
    finetune = summary["finetune"]
    assert finetune["differences"]["modern - classic"]["estimate"] == pytest.approx(0.1)
    assert finetune["differences"]["classic - hf-peer"]["replicates"] == 1  # paired: replicate 1 only
    assert finetune["differences"]["classic - hf-peer"]["estimate"] == pytest.approx(0.2)
    rows = {row["recipe"]: row for row in summary["ablation"]["rows"]}
    # Modern scored 0.4 at 20 s in both replicates (the curves'); full-batch 0.41 and 0.42.
    assert rows["full-batch"]["difference"]["singles"]["estimate"] == pytest.approx(0.015)
    assert rows["schedule"]["base"] == "modern" and rows["no-ramp"]["base"] == "modern"
    assert summary["targets"]["finetune_kept"] is True and summary["targets"]["beat_peer"] is True


def test_the_plan_counts_each_run_once_and_fits_the_demo_in_two_hours(parts: SimpleNamespace) -> None:
    runner, settings = parts.runner, parts.settings
    demo = settings.SIZES["demo"]
    planned = runner.plan(demo, demo.replicates, demo.ablation_replicates)
    ours = [p for p in planned if p.kind == "ours"]
    # Curves: 2 recipes x 4 budgets x 4 replicates; ablation: 6 rows x 4 replicates less the 2 rows per
    # curve replicate they share; our sweeps at the full budget: LAMB's 2 points, one of them the
    # modern curve's, and AdamW's 2.
    assert (len(demo.lamb_lrs), len(demo.adamw_lrs)) == (2, 2)
    assert len(ours) == 32 + (24 - 8) + 1 + 2
    assert sum(p.kind == "peer-sweep" for p in planned) == len(demo.peer_lrs) * len(settings.PEER_CONFIGS)
    # Fine-tuned: the curves' full budgets, the peer's, the random initialisation, LAMB's other point.
    assert sum(p.finetune_seeds for p in planned) == 3 * (2 * 4 + 4 + 1 + 1)
    assert runner.estimate_seconds(demo, planned, 4) < 2 * 3600


def test_the_peer_budget_is_ours_refits_without_a_jump_and_ends_at_zero(parts: SimpleNamespace) -> None:
    now = [10.0]
    plan = parts.peer.BudgetPlan.fitted(100.0, 10.0, 1.0, 3, clock=lambda: now[0])
    assert plan.steps == 90  # 90 s left at 1 s a step
    assert plan.factor(0) == 0 and plan.factor(9) == pytest.approx(1.0)
    plan.clock.start(10.0)
    # Every step takes 2 s: the first re-fit, when 25% of the budget has passed (after step 8, 26 s),
    # fits 37 more steps in the 74 s left, and the line bends where the old one was.
    done, bends = 0, []
    while done < plan.steps:
        done += 1
        now[0] += 2.0
        before = (len(plan.fits), plan.progress(done + 1))
        plan.step_ended(done)
        if len(plan.fits) > before[0] and plan.steps != plan.fits[-2]["steps"]:
            bends.append((done, plan.steps))
            assert plan.progress(done + 1) == pytest.approx(before[1])
    assert bends[0] == (8, 45) and plan.fits[0]["steps"] == 90
    assert (done, now[0]) == (45, 100.0) and plan.factor(done) == 0.0 and plan.progress(done) == 1.0


def test_the_peer_validation_rows_are_masked_as_bert_does(parts: SimpleNamespace) -> None:
    rng = np.random.default_rng(0)
    special = np.array([0, 2, 3])
    rows = [
        np.concatenate([[2], rng.integers(10, 100, size=n), [3]]) for n in rng.integers(20, 120, size=400)
    ]
    masked = parts.peer.mask_rows(rows, special, mask_id=4, vocab_size=100, seed=1)
    counts = (masked.positions != 0).sum(axis=1)
    assert (counts == [min(19, max(1, round(len(r) * 0.15))) for r in rows]).all()
    assert (masked.unmasked()[:, :5] == np.stack([r[:5] for r in rows])).all()
    picked = masked.input_ids[np.arange(len(rows))[:, None], masked.positions][masked.positions != 0]
    assert 0.75 < (picked == 4).mean() < 0.85  # 80% [MASK]
    assert not np.isin(masked.labels[masked.positions != 0], special).any()


class _Predicts:
    """A masked-LM stand-in whose logits put token ``want[row, position]`` first, ``row`` being the
    row's first input id."""

    def __init__(self, want: np.ndarray, vocab: int):
        self.want, self.vocab = want, vocab

    def eval(self) -> None:
        pass

    def __call__(self, input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
        logits = torch.zeros(*input_ids.shape, self.vocab)
        logits.scatter_(2, torch.from_numpy(self.want[input_ids[:, 0].numpy()]).unsqueeze(-1), 1.0)
        return SimpleNamespace(logits=logits)


def test_scoring_counts_each_rows_masked_positions(parts: SimpleNamespace) -> None:
    rows, length, vocab = 3, 8, 10
    positions = np.array([[1, 3, 0], [2, 0, 0], [4, 5, 6]])  # 0: an empty slot
    labels = np.array([[7, 8, 9], [5, 9, 9], [1, 2, 3]])
    want = np.zeros((rows, length), np.int64)
    want[0, 1], want[0, 3] = 7, 1  # right, wrong
    want[1, 2] = 5  # right
    want[2, 4], want[2, 5], want[2, 6] = 1, 2, 0  # right, right, wrong
    want[0, 0] = want[1, 0] = 9  # the empty slots' labels at position 0: not counted
    rows_set = parts.heldout.EvalSet(
        np.arange(rows)[:, None].repeat(length, axis=1),
        np.ones((rows, length), np.int64),
        np.zeros((rows, length), np.int64),
        positions,
        labels,
        ("x",),
    )
    correct, total = parts.heldout.score_rows(_Predicts(want, vocab), rows_set, "cpu", batch_size=2)
    assert correct.tolist() == [1, 1, 2] and total.tolist() == [2, 1, 3]


def test_read_train_log_scores_the_last_quarter_of_the_training_batches(
    parts: SimpleNamespace, tmp_path: Path
) -> None:
    def record(step: int, accuracy: float, split: str = "train") -> str:
        data = {"split": split, "sequences": 64.0, "mlm_accuracy": accuracy}
        return json.dumps({"type": "LOG", "elapsedtime": step, "step": [1, step], "data": data})

    log = tmp_path / "train.jsonl"
    lines = [json.dumps({"type": "PARAMETER", "elapsedtime": 0, "step": "PARAMETER", "data": {}})]
    lines += [record(step, step / 100) for step in (10, 20, 30, 40)] + [record(40, 0.9, "eval")]
    log.write_text("\n".join(lines) + "\n")
    found = parts.runner.read_train_log(log)
    assert (found.steps, found.sequences) == (40, 256)
    assert found.progressive_mlm_accuracy == pytest.approx(0.4)  # step 40 only: the last quarter is > 30
