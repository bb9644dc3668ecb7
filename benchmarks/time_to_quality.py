"""Time to quality: how many training seconds our modern recipe needs to reach the held-out MLM
accuracy our classic recipe reaches in its full budget, with a confidence interval; the Hugging
Face peer under the same budget mechanism; one fine-tuning protocol for every model; an ablation of
the modern recipe's ingredients. The code is in the package ``ttq`` beside this file.

    python benchmarks/time_to_quality.py --size tiny                       # CI's: 4 min on 2 quiet cores
    python benchmarks/time_to_quality.py --size demo --out runs/ttq-demo   # about 2 hours
    python benchmarks/time_to_quality.py --size demo --plan                # the plan and its estimate only
    python benchmarks/time_to_quality.py --size base --device cuda         # bert-base, one GPU

**Replicates.** Replicate r runs under seed 12345 + r (``spec.seed``: the corpus's held-out split,
the data's draws, every initialisation, the fine-tuning's seeds): its own data directory, its own
held-out sets, so its runs are paired; the statistics resample replicates, then held-out documents
(each row traced to its document: ``ttq.heldout.row_documents``).

**The held-out sets** (``ttq.heldout``): the data stage holds out ``Size.heldout_fraction`` of the
documents and makes their rows in one pass (no dupe factor: each row a distinct segment), in two
formats from the same documents: *singles* ``[CLS] A [SEP]`` (an ``mlm`` data prep) and *pairs*
``[CLS] A [SEP] B [SEP]`` with segment ids 1 on B (an ``mlm-nsp`` data prep, the classic recipe's
own), both masked once at 15%. Every table reports both; the counts (rows, distinct segments,
masked positions, rows with a segment B) are printed per replicate and kept in each run's record.
At the demo size at least 2,000 distinct segments per format (60% of python-docs' documents held
out: that is what it takes on a 1.8 MB corpus).

**Our runs** (``ttq.jobs``, ``ttq.settings.RECIPES``), each a ``python -m bertpretrain run`` of its
own job with its own ``spec.budget`` (so its schedule ends at its end); its seconds are its
``budget.json``'s ``finished_seconds`` (the clock's, calibration and every re-fit included):

- the curves: ``classic`` and ``modern`` at each of ``Size.fractions`` of the classic's budget (the
  demo: 20, 53, 80, 160 s) in each of ``Size.replicates`` replicates; the full-budget runs are
  fine-tuned;
- the ablation (``Size.ablation_replicates`` replicates at ``Size.ablation_fraction`` of the
  budget): classic (LAMB); ``modern``, the recipe kept (issue 38's: MLM only, 30% static masking,
  one-cycle, no dropout, with LAMB at its swept learning rate, half the classic's global batch and
  a batch ramp over 30% of the steps); then each ingredient measured on its own: added to
  ``modern``, AdamW beta2 0.98 at its swept learning rate, masking 30%->15% (dynamic masks,
  ``finalMaskedLmProb``); taken from it, the batch ramp (``no-ramp``) and the half batch
  (``full-batch``: the classic's). Each row's difference from the row it changes, paired by
  replicate, with a 90% t interval. Padding-free rows (``packing: spfhp``) were a row until they
  had tied three times (``benchmarks/RESULTS.md``);
- each optimizer's learning rate is swept once, in replicate 0 at the full budget: LAMB's
  (``Size.lamb_lrs``) on ``modern``, each point fine-tuned so the chosen one is that replicate's
  full-budget run; AdamW's (``Size.adamw_lrs``) on the AdamW row; each chosen by the MLM accuracy
  of the last quarter of each run's logged training batches (never the held-out sets).

**The peer** (``ttq.peer``): ``transformers.Trainer`` with ``BertForMaskedLM`` on the singles
dataset's training rows, its settings swept once (replicate 0) over learning rate x (beta2,
masking) with MosaicBERT's point (AdamW, beta2 0.98, 30% masking) among them, chosen on a
validation split of its own training rows; the same budget mechanism as ours (calibration, fitted
and re-fitted step count, schedule to its end); on CUDA compiled with one loader worker, as ours.
It trains in every replicate of the curves, at the full budget.

**Fine-tuning**, one protocol for every model (``ttq.jobs.finetune_task``): the builtin task
``python-docs-modules``, dropout 0.1, 3 seeds, their median; ours in their own job, the peer's and a
random initialisation's (replicate 0, the no-pretraining reference) by ``python -m bertpretrain
finetune`` with ``initFrom``: the task is the same but for ``initFrom``.

**Statistics** (``benchmarks/quality_stats.py``): the time-to-target ratio per held-out set,
modern's seconds to reach classic's full-budget accuracy interpolated on its curve / classic's
seconds, median over replicates, 90% interval from a two-stage paired bootstrap (replicates, then
held-out documents), and the replicates it would take for a width under 0.15; paired t intervals for the
fine-tuned and ablation differences.

**Resuming.** Every finished run's record is written to ``<out>/runs/<key>.json`` (temporary name,
then renamed), its key made of everything that decides it (``ttq.store``); a rerun reuses each one,
saying so in a line, and trains only what is missing, so an interrupted benchmark loses no finished
run (an unfinished one starts again). A reused run may have been made when the machine ran at
another speed: each record holds the machine's speed as the run ended
(``ttq.runner.machine_gflops``), and the tables give it per recipe, with a warning where the
recipes' medians are more than 10% apart and a Kruskal-Wallis test over the runs' figures puts that
beyond the probe's own spread from run to run (p < 0.05), or where some runs have none. Output:
``<out>/time_to_quality.json`` (settings, choices, summary; the runs' per-row scores stay in
``runs/``), ``time_to_quality.md`` (the tables) and ``time_to_quality.svg`` (accuracy against
seconds, one line per replicate and recipe). Work files (shards, checkpoints, exports, logs) are
under ``<out>/work``: a run's are deleted once its record is written, and the rest at the end,
unless ``--keep`` or a step failed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:  # the package ttq beside this file
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from ttq import report
from ttq.runner import Benchmark, BenchmarkError, estimate_seconds, plan, say
from ttq.settings import HEADLINE, RECIPES, REPO, SIZES, Size

RESULTS_FILE = "time_to_quality.json"
TABLE_FILE = "time_to_quality.md"
PLOT_FILE = "time_to_quality.svg"


def parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Size]:
    """The command line and the size it asks for (with its overrides)."""
    parser = argparse.ArgumentParser(
        prog="time_to_quality.py",
        description="Seconds our modern recipe needs to reach our classic recipe's held-out MLM accuracy, "
        "with its interval; the Hugging Face peer; one fine-tuning protocol; the modern recipe's ablation.",
    )
    parser.add_argument("--size", choices=list(SIZES), default="tiny", help="default tiny (CI's)")
    parser.add_argument(
        "--budget", type=float, help="the classic's full budget in seconds (default: the size's)"
    )
    parser.add_argument(
        "--replicates", type=int, help="replicates of the curves, the peer and the fine-tuning"
    )
    parser.add_argument("--ablation-replicates", type=int, help="replicates of the ablation (0: none)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="default cpu")
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "runs" / "time-to-quality",
        help=f"where runs/, {RESULTS_FILE}, {TABLE_FILE}, {PLOT_FILE} and work/ go",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work files (shards, exports, logs)")
    parser.add_argument(
        "--plan", action="store_true", help="print the plan and its estimated time, run nothing"
    )
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    overrides: dict[str, Any] = {}
    if args.budget is not None:
        overrides["budget"] = args.budget
    if args.replicates is not None:
        overrides["replicates"] = args.replicates
    if args.ablation_replicates is not None:
        overrides["ablation_replicates"] = args.ablation_replicates
    size = replace(size, **overrides)
    try:
        size.check()
    except ValueError as error:
        parser.error(f"--size {args.size} with these overrides: {error}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    return args, size


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; returns 0, or 1 when a step failed (its log's end is printed)."""
    args, size = parse(argv)
    out: Path = args.out.resolve()
    planned = plan(size, size.replicates, size.ablation_replicates)
    estimate = estimate_seconds(size, planned, max(size.replicates, size.ablation_replicates))
    budgets = ", ".join(f"{size.seconds(f)}" for f in size.fractions)
    say(
        f"plan: {len(planned)} runs ({sum(p.kind == 'ours' for p in planned)} ours, "
        f"{sum(p.kind.startswith('peer') for p in planned)} of the peer, "
        f"{sum(p.finetune_seeds > 0 for p in planned)} fine-tuned), budgets {budgets} s, "
        f"{size.replicates} replicates of the curves and {size.ablation_replicates} of the ablation; "
        f"about {estimate / 60:.0f} min on this machine from scratch "
        f"({len(list((out / 'runs').glob('*.json')))} runs already in {out / 'runs'})"
    )
    if args.plan:
        return 0
    bench = Benchmark(args.size, size, args.device, out, keep=args.keep)
    started = time.perf_counter()
    try:
        results = benchmark(bench)
    except BenchmarkError as error:
        print(
            f"time_to_quality: {error}\n(the work files are kept in {bench.work})",
            file=sys.stderr,
            flush=True,
        )
        return 1
    if not args.keep:
        shutil.rmtree(bench.work, ignore_errors=True)
    results["seconds"] = time.perf_counter() - started
    results["estimated_seconds"] = estimate
    lines = report.tables(results)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (
        (RESULTS_FILE, json.dumps(results, indent=1) + "\n"),
        (TABLE_FILE, "\n".join(lines) + "\n"),
        (
            PLOT_FILE,
            report.svg(
                bench.records, size, size.replicates, f"time to quality, {args.size}: held-out MLM accuracy"
            ),
        ),
    ):
        temporary = out / f".{name}.tmp"
        temporary.write_text(text)
        temporary.replace(out / name)
    print("\n" + "\n".join(lines), flush=True)
    say(
        f"{bench.trained} runs trained, {bench.reused} reused; {results['seconds']:.0f} s in all "
        f"(estimated {estimate:.0f} s from scratch); {out / RESULTS_FILE}, {out / TABLE_FILE}, "
        f"{out / PLOT_FILE}"
    )
    return 0


def benchmark(bench: Benchmark) -> dict[str, Any]:
    """Every run, replicate by replicate (the sweeps first, in replicate 0); returns the results:
    settings, choices, the evaluation sets' counts and :func:`ttq.report.summarize`'s summary."""
    size = bench.size
    first = bench.replicate(0)
    swept = bench.sweep_ours(first)
    lrs = {optimizer: lr for optimizer, (lr, _) in swept.items()}
    choices: dict[str, Any] = {f"{optimizer}_lr": lr for optimizer, lr in lrs.items()}
    for optimizer, (_, points) in swept.items():
        choices[f"{optimizer}_sweep"] = [
            {"learning_rate": p["learning_rate"], "progressive_mlm_accuracy": p["progressive_mlm_accuracy"]}
            for p in points
        ]
    peer_best: dict[str, Any] | None = None
    evaluation = {}
    reps = [first] + [bench.replicate(i) for i in range(1, max(size.replicates, size.ablation_replicates))]
    for index, rep in enumerate(reps):
        if index < size.replicates:
            for name in HEADLINE:
                for fraction in size.fractions:
                    recipe = RECIPES[name]
                    bench.ours(rep, recipe, fraction, lr=lrs.get(recipe.optimizer), finetune=fraction == 1)
            if peer_best is None:
                peer_best, points = bench.sweep_peer(rep)
                choices["peer"] = {**peer_best["settings"], "config": peer_best["config"]}
                choices["peer_sweep"] = [
                    {
                        "config": p["config"],
                        "learning_rate": p["settings"]["learning_rate"],
                        "validation_mlm_accuracy": p["validation_mlm_accuracy"],
                        "seconds": p["run"]["seconds"],
                    }
                    for p in points
                ]
            bench.run_peer(rep, peer_best)
            if index == 0:
                bench.random_init(rep)
        if index < size.ablation_replicates:
            for recipe in RECIPES.values():
                bench.ours(rep, recipe, size.ablation_fraction, lr=lrs.get(recipe.optimizer), finetune=False)
        records = [r for r in bench.records if r.get("replicate") == index and r.get("evaluation")]
        if records:
            evaluation[str(rep.seed)] = records[0]["evaluation"]
    # The curves' replicates' held-out rows traced to their documents, the units the ratio's
    # bootstrap draws (their data made again where a rerun reused every run).
    documents = {}
    for index, rep in enumerate(reps[: size.replicates]):
        bench.prepare(rep)
        assert rep.documents is not None and rep.evaluation is not None
        documents[index] = rep.documents
        evaluation[str(rep.seed)] = rep.evaluation
    summary = report.summarize(bench.records, size, size.replicates, size.ablation_replicates, documents)
    return {
        "size": bench.size_name,
        "device": bench.device,
        "settings": asdict(size),
        "choices": choices,
        "evaluation": evaluation,
        "summary": summary,
        "runs": [
            {key: value for key, value in record.items() if key not in ("scores", "settings")}
            for record in bench.records
        ],
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
