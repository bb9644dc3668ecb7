"""From the runs' records to the results: the curves, the time-to-target ratio with its interval
(``quality_stats``), the fine-tuned comparisons, the ablation, the targets, the Markdown tables and
an SVG plot of accuracy against training seconds."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np
import quality_stats as qs

from ttq.heldout import FORMATS, by_document
from ttq.settings import (
    ABLATION,
    DUPE_FACTOR,
    HEADLINE,
    RECIPES,
    TARGET_HIGH,
    TARGET_RATIO,
    TARGET_WIDTH,
    Recipe,
    Size,
    fraction_label,
)

BUDGET_TOLERANCE = 0.02  # the issue's: every run ends within 2% of its budget
MACHINE_SPREAD = 0.10  # recipes whose runs' machine speeds differ by more: their seconds do not compare
# ... when that difference is also beyond the probe's own spread from run to run: the fourth demo
# run's probe read 139 to 336 GFLOP/s within one recipe and budget, more than the recipes' medians
# differed, so a difference of medians alone warned about noise.
MACHINE_P = 0.05


def _ours(
    records: Sequence[dict[str, Any]], recipe: str, budget: int, replicate: int
) -> dict[str, Any] | None:
    for record in records:
        if (
            record.get("kind"),
            record.get("recipe"),
            record.get("budget_seconds"),
            record.get("replicate"),
        ) == ("ours" if recipe != "hf-peer" else "peer", recipe, budget, replicate):
            return record
    return None


def curve(
    records: Sequence[dict[str, Any]],
    recipe: str,
    replicate: int,
    budgets: Sequence[int],
    form: str,
    documents: np.ndarray | None = None,
) -> qs.Curve:
    """Replicate ``replicate``'s runs of ``recipe`` at ``budgets`` as a :class:`quality_stats.Curve`
    on held-out set ``form``: one point per run, at its training seconds (``budget.json``'s
    ``finished_seconds``), with its correct and total counts per held-out document (``documents``,
    int64 [N], each row's: :func:`ttq.heldout.row_documents`), or per row where ``documents`` is
    None.

    Raises:
        ValueError: a run is missing, or ``documents`` is not one per scored row.
    """
    points = []
    for budget in budgets:
        record = _ours(records, recipe, budget, replicate)
        if record is None:
            raise ValueError(f"no {recipe} run of {budget} s in replicate {replicate}")
        score = record["scores"][form]
        correct, total = np.asarray(score["correct"], np.int64), np.asarray(score["total"], np.int64)
        if documents is not None:
            correct, total = by_document(correct, documents), by_document(total, documents)
        points.append(qs.Point(record["seconds"], correct, total))
    return qs.Curve(recipe, replicate, points)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _interval(result: qs.Difference) -> dict[str, Any]:
    return {
        "estimate": result.estimate,
        "low": result.low,
        "high": result.high,
        "replicates": result.replicates,
    }


def summarize(
    records: Sequence[dict[str, Any]],
    size: Size,
    replicates: int,
    ablation_replicates: int,
    documents: dict[int, dict[str, np.ndarray]] | None = None,
) -> dict[str, Any]:
    """The results from every run's record (see the module's docstring): ``curves`` (per recipe and
    budget, medians over replicates), ``ratio`` (per held-out set, modern's time to classic's
    full-budget accuracy / classic's seconds, with its interval; its bootstrap draws held-out
    documents where ``documents`` gives each replicate's rows' documents per set, else rows),
    ``finetune``, ``ablation``, ``budget_fidelity`` and ``targets``."""
    budgets = [size.seconds(f) for f in size.fractions]
    full = budgets[-1]
    found: dict[str, Any] = {"budgets": budgets}
    rows = []
    for recipe in (*HEADLINE, "hf-peer"):
        for fraction, budget in zip(size.fractions, budgets, strict=True):
            runs = [r for i in range(replicates) if (r := _ours(records, recipe, budget, i)) is not None]
            if not runs:
                continue
            rows.append(
                {
                    "recipe": recipe,
                    "fraction": fraction,
                    "budget": budget,
                    "replicates": len(runs),
                    "seconds": _median([r["seconds"] for r in runs]),
                    "steps": _median([r["steps"] for r in runs]),
                    "accuracy": {form: _median([r["accuracy"][form] for r in runs]) for form in FORMATS},
                    "description": runs[0].get("description") or runs[0].get("config"),
                }
            )
    found["curves"] = rows

    ratios: dict[str, Any] = {}
    complete, left_out = [], []
    for i in range(replicates):
        by_recipe = {recipe: [_ours(records, recipe, b, i) for b in budgets] for recipe in HEADLINE}
        if any(r is None for found in by_recipe.values() for r in found):
            continue
        # A curve's x is its runs' clock seconds: where a run ended far off its budget, a larger
        # budget can have trained fewer seconds, and the curve (and the target, its full-budget
        # point) no longer reads left to right. Such a replicate is left out and named.
        seconds = {
            recipe: [r["seconds"] for r in found if r is not None] for recipe, found in by_recipe.items()
        }
        if all(all(a < b for a, b in itertools.pairwise(s)) for s in seconds.values()):
            complete.append(i)
        else:
            left_out.append({"replicate": i, "seconds": seconds})
    found["ratio_left_out"] = left_out
    for form in FORMATS:
        if not complete:
            break
        units = {i: None if documents is None else documents[i][form] for i in complete}
        modern = [curve(records, "modern", i, budgets, form, units[i]) for i in complete]
        classic = [curve(records, "classic", i, budgets, form, units[i]) for i in complete]
        result = qs.time_to_target_ratio(modern, classic)
        needed = None
        if result.width is not None:
            needed = qs.replicates_needed(result.width, result.replicates, TARGET_WIDTH)
        ratios[form] = {
            "estimate": result.estimate,
            "low": result.low,
            "high": result.high,
            "width": result.width,
            "replicates": result.replicates,
            "units": "rows" if documents is None else "documents",
            "units_per_replicate": [len(c.points[0].total) for c in classic],
            "replicates_needed": needed,
            "resamples": result.resamples,
            "unreached": result.unreached,
            "targets": list(result.targets),
            "ratios": list(result.ratios),
            "bounds": [t.bound for t in result.per_replicate],
            "upper_bound": result.upper_bound,
        }
    found["ratio"] = ratios

    by_replicate: dict[str, dict[int, float]] = {}  # model -> replicate -> median of its seeds
    for name in (*HEADLINE, "hf-peer"):
        by_replicate[name] = {}
        for i in range(replicates):
            record = _ours(records, name, full, i)
            if record is not None and record.get("finetune"):
                by_replicate[name][i] = record["finetune"]["median"]
    random_init = [r["finetune"]["median"] for r in records if r.get("kind") == "random-init"]
    pairs = {}
    for a, b in (("modern", "classic"), ("classic", "hf-peer"), ("modern", "hf-peer")):
        shared = sorted(set(by_replicate[a]) & set(by_replicate[b]))
        if shared:
            pairs[f"{a} - {b}"] = _interval(
                qs.paired_difference(
                    [by_replicate[a][i] for i in shared], [by_replicate[b][i] for i in shared]
                )
            )
    found["finetune"] = {
        "medians": {name: _median(list(values.values())) for name, values in by_replicate.items()},
        "values": {name: list(values.values()) for name, values in by_replicate.items()},
        "differences": pairs,
        "random_init": _median(random_init),
    }

    ablation_budget = size.seconds(size.ablation_fraction)
    table = []
    per_row: dict[str, list[dict[str, Any]]] = {}
    for name in ABLATION:
        runs = [
            r
            for i in range(ablation_replicates)
            if (r := _ours(records, name, ablation_budget, i)) is not None
        ]
        per_row[name] = runs
        if not runs:
            continue
        row: dict[str, Any] = {
            "recipe": name,
            "label": RECIPES[name].label,
            "replicates": len(runs),
            "description": runs[0]["description"],
            "seconds": _median([r["seconds"] for r in runs]),
            "accuracy": {form: statistics.mean(r["accuracy"][form] for r in runs) for form in FORMATS},
            "base": RECIPES[name].base,
            "difference": {},
        }
        base = RECIPES[name].base
        if base is not None and per_row.get(base):
            both = [
                (r, b) for r in runs for b in per_row[base] if r["replicate"] == b["replicate"]
            ]  # paired by replicate
            for form in FORMATS:
                row["difference"][form] = _interval(
                    qs.paired_difference(
                        [r["accuracy"][form] for r, _ in both], [b["accuracy"][form] for _, b in both]
                    )
                )
        table.append(row)
    found["ablation"] = {"budget": ablation_budget, "rows": table}

    timed = [r for r in records if r.get("kind") in ("ours", "peer")]
    off = [
        {
            "run": f"{r['recipe']} {r['budget_seconds']} s (seed {r['seed']})",
            "seconds": r["seconds"],
            "budget": r["budget_seconds"],
            "off": r["seconds"] / r["budget_seconds"] - 1,
        }
        for r in timed
        if abs(r["seconds"] / r["budget_seconds"] - 1) > BUDGET_TOLERANCE
    ]
    worst = max((abs(r["seconds"] / r["budget_seconds"] - 1) for r in timed), default=None)
    found["budget_fidelity"] = {"runs": len(timed), "worst": worst, "off": off}
    found["machine"] = machine_speeds(timed)
    found["targets"] = targets(found)
    return found


def machine_speeds(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How fast the machine was when each recipe's runs ended (``machine_gflops``, GFLOP/s, see
    ``ttq.runner.machine_gflops``): ``medians`` per recipe (None where none of its runs has the
    figure: records made before it was recorded), ``missing`` (runs without it), ``spread``
    (the largest median / the smallest - 1; None with fewer than two recipes measured) and
    ``p_value`` (:func:`_same_speed_p`)."""
    values: dict[str, list[float]] = {}
    missing = 0
    for record in records:
        speed = record.get("machine_gflops")
        values.setdefault(record["recipe"], [])
        if speed is None:
            missing += 1
        else:
            values[record["recipe"]].append(speed)
    medians = {name: statistics.median(v) if v else None for name, v in values.items()}
    known = [m for m in medians.values() if m is not None]
    spread = max(known) / min(known) - 1 if len(known) >= 2 else None
    return {"medians": medians, "missing": missing, "spread": spread, "p_value": _same_speed_p(values)}


def _same_speed_p(values: dict[str, list[float]]) -> float | None:
    """The Kruskal-Wallis test's p-value that every recipe's runs ended at machine speeds drawn
    from one distribution (Kruskal and Wallis 1952, ``scipy.stats.kruskal``): small when the
    recipes' speeds differ by more than the probe's spread between runs explains. None with fewer
    than two recipes measured, or when every figure is the same."""
    from scipy import stats  # here: scipy.stats takes a noticeable part of a second to import

    groups = [v for v in values.values() if v]
    if len(groups) < 2:
        return None
    try:
        p = float(stats.kruskal(*groups).pvalue)
    except ValueError:  # all numbers identical (older scipy): no difference to test
        return None
    return None if math.isnan(p) else p


def machine_lines(machine: dict[str, Any]) -> list[str]:
    """The machine-speed paragraph of the tables: each recipe's median, and a warning where the
    recipes' medians differ by more than :data:`MACHINE_SPREAD` and the test of
    :func:`_same_speed_p` puts that beyond the probe's own spread (p below :data:`MACHINE_P`), or
    some runs have no figure."""
    medians = ", ".join(
        f"{name} {'not recorded' if value is None else f'{value:.1f}'}"
        for name, value in machine["medians"].items()
    )
    line = (
        "Machine speed as each run ended (fp32 512 x 512 matrix products, GFLOP/s, median over a "
        f"recipe's timed runs): {medians}."
    )
    spread, p = machine["spread"], machine.get("p_value")
    if spread is not None and spread > MACHINE_SPREAD:
        test = "" if p is None else f" (Kruskal-Wallis p = {p:.2g} that they ran at one speed)"
        if p is None or p < MACHINE_P:
            line += (
                f" **The recipes' runs were made at machine speeds {spread:.0%} apart{test}: their "
                "seconds do not compare.**"
            )
        else:
            line += (
                f" The medians are {spread:.0%} apart, within the probe's spread from run to run{test}: "
                "no sign that one recipe ran on a slower machine."
            )
    if machine["missing"]:
        line += (
            f" {machine['missing']} runs have no figure (recorded before it was): whether the machine's "
            "speed moved between them and the rest cannot be told."
        )
    return [line]


def targets(found: dict[str, Any]) -> dict[str, bool | None]:
    """The issue's targets (None: not measured): ``third_of_the_time``, on both held-out sets, the
    ratio's estimate at most 1/3 and its interval's upper end below 1/2; ``finetune_kept``: modern's
    fine-tuned median not below classic's; ``beat_peer``: classic's and modern's both above the
    peer's; ``within_budget``: every run within 2% of its budget."""
    ratios = found["ratio"]
    third: bool | None = None
    if len(ratios) == len(FORMATS) and all(r["high"] is not None for r in ratios.values()):
        third = all(r["estimate"] <= TARGET_RATIO and r["high"] < TARGET_HIGH for r in ratios.values())
    medians = found["finetune"]["medians"]
    classic, modern, peer = (medians.get(name) for name in ("classic", "modern", "hf-peer"))
    return {
        "third_of_the_time": third,
        "finetune_kept": None if classic is None or modern is None else modern >= classic,
        "beat_peer": None if None in (classic, modern, peer) else min(classic, modern) > peer,
        "within_budget": None
        if not found["budget_fidelity"]["runs"]
        else not found["budget_fidelity"]["off"],
    }


# Tables -------------------------------------------------------------------------------------------


def _cell(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if math.isinf(value):
        return "never"
    return f"{value:.{digits}f}"


def _range(interval: dict[str, Any], digits: int = 4) -> str:
    if interval.get("low") is None:
        return f"{_cell(interval['estimate'], digits)} (one replicate: no interval)"
    low, high = _cell(interval["low"], digits), _cell(interval["high"], digits)
    return f"{_cell(interval['estimate'], digits)} [{low}, {high}]"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = [f"| {' | '.join(header)} |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += [f"| {' | '.join(row)} |" for row in rows]
    return [*lines, ""]


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "not met", None: "not measured"}[met]


CURVE_COLUMNS = ("recipe", "budget", "replicates", "seconds", "steps", "singles acc", "pairs acc")
RATIO_COLUMNS = (
    "held-out set",
    "classic's full-budget acc",
    "ratio",
    "90% interval",
    "width",
    "replicates",
    "replicates for width < 0.15",
    "per replicate",
)
ABLATION_COLUMNS = (
    "row",
    "recipe",
    "replicates",
    "seconds",
    "singles acc",
    "pairs acc",
    "singles vs base [90%]",
    "pairs vs base [90%]",
)


def tables(results: dict[str, Any]) -> list[str]:
    """The Markdown lines of ``results`` (what :func:`summarize` returns, with the run's settings)."""
    summary = results["summary"]
    lines = [
        "Held-out MLM accuracy against training seconds (medians over replicates; seconds are "
        "budget.json's finished_seconds):",
        "",
    ]
    lines += _table(
        CURVE_COLUMNS,
        [
            [
                row["recipe"],
                f"{fraction_label(row['fraction'])} ({row['budget']} s)",
                str(row["replicates"]),
                f"{row['seconds']:.1f}",
                f"{row['steps']:g}",
                _cell(row["accuracy"]["singles"]),
                _cell(row["accuracy"]["pairs"]),
            ]
            for row in summary["curves"]
        ],
    )
    ratio_rows = []
    for form, ratio in summary["ratio"].items():
        interval = (
            "n/a (one replicate)"
            if ratio["low"] is None
            else f"[{_cell(ratio['low'], 3)}, {_cell(ratio['high'], 3)}]"
        )
        per = ", ".join(
            _cell(value, 3) + ("<=" if bound == "at_most" else "")
            for value, bound in zip(ratio["ratios"], ratio["bounds"], strict=True)
        )
        ratio_rows.append(
            [
                form,
                _cell(_median(ratio["targets"])),
                _cell(ratio["estimate"], 3),
                interval,
                _cell(ratio["width"], 3),
                str(ratio["replicates"]),
                "n/a" if ratio["replicates_needed"] is None else str(ratio["replicates_needed"]),
                per,
            ]
        )
    units = {
        f"{form}: {', '.join(map(str, ratio['units_per_replicate']))} {ratio['units']}"
        for form, ratio in summary["ratio"].items()
    }
    kinds = " or ".join(sorted({r["units"] for r in summary["ratio"].values()}))
    whole = ", each with all its rows," if "documents" in kinds else ""
    lines += [
        "Time to target: modern's seconds to reach classic's full-budget accuracy (interpolated on its "
        "curve) / classic's seconds; median over replicates, 90% interval from a paired bootstrap over "
        f"replicates, then held-out {kinds}{whole} (per replicate: "
        f"{'; '.join(sorted(units))}; `<=`: reached at modern's first point, an upper bound):",
        "",
    ]
    lines += _table(RATIO_COLUMNS, ratio_rows)
    for left in summary.get("ratio_left_out", []):
        seconds = "; ".join(f"{k} {', '.join(f'{v:.1f}' for v in s)}" for k, s in left["seconds"].items())
        lines += [
            f"Replicate {left['replicate']} left out of the ratio: its runs' seconds do not increase "
            f"with their budgets ({seconds}).",
            "",
        ]
    finetune = summary["finetune"]
    ft_rows = [
        [name, _cell(finetune["medians"][name]), str(len(finetune["values"][name]))]
        for name in finetune["medians"]
        if finetune["medians"][name] is not None
    ]
    lines += [
        "Fine-tuned (one protocol for every model: the median of its 3 seeds, then the median over "
        "replicates):",
        "",
    ]
    lines += _table(("model", "fine-tuned acc", "replicates"), ft_rows)
    if finetune["differences"]:
        lines += _table(
            ("difference", "mean [90% t interval]"),
            [[name, _range(value)] for name, value in finetune["differences"].items()],
        )
    if finetune["random_init"] is not None:
        lines += [
            f"Fine-tuned from random weights (no pretraining), for reference: {finetune['random_init']:.4f}.",
            "",
        ]
    ablation = summary["ablation"]
    if ablation["rows"]:
        lines += [
            f"Ablation at {ablation['budget']} s (means over replicates; each row against the row it adds "
            "to, paired by replicate, 90% t interval):",
            "",
        ]
        lines += _table(
            ABLATION_COLUMNS,
            [
                [
                    row["label"],
                    row["description"],
                    str(row["replicates"]),
                    f"{row['seconds']:.1f}",
                    _cell(row["accuracy"]["singles"]),
                    _cell(row["accuracy"]["pairs"]),
                    _range(row["difference"]["singles"]) if row["difference"] else "-",
                    _range(row["difference"]["pairs"]) if row["difference"] else "-",
                ]
                for row in ablation["rows"]
            ],
        )
    fidelity = summary["budget_fidelity"]
    met = summary["targets"]
    lines += [
        f"Targets: modern reaches classic's full-budget accuracy in at most 1/3 of its seconds, interval "
        f"below 1/2, on both held-out sets: {_verdict(met['third_of_the_time'])}; modern's fine-tuned score "
        f"not below "
        f"classic's: {_verdict(met['finetune_kept'])}; classic and modern both above the tuned peer: "
        f"{_verdict(met['beat_peer'])}; every run within 2% of its budget: {_verdict(met['within_budget'])} "
        f"(worst {_cell(fidelity['worst'] and 100 * fidelity['worst'], 1)}% of {fidelity['runs']} runs).",
    ]
    lines += [
        f"- {o['run']}: {o['seconds']:.1f} s of {o['budget']} s ({o['off']:+.1%})" for o in fidelity["off"]
    ]
    if "machine" in summary:
        lines += ["", *machine_lines(summary["machine"])]
    lines += ["", *sides(results)]
    return lines


def _data_words(recipe: Recipe) -> str:
    """A recipe's training rows in a few words, as the sides table gives them."""
    rows = "sentence pairs" if recipe.objective == "mlm-nsp" else "single segments"
    if recipe.packing != "none":
        rows += f" packed ({recipe.packing})"
    return f"{rows}, {recipe.masking} {recipe.masking_rates} masks, {DUPE_FACTOR} copies"


def _batch_row(settings: dict[str, Any] | None, modern: Recipe) -> list[list[str]]:
    """The sides table's global batch row, from the results' size ``settings`` (none without them)."""
    if settings is None:
        return []
    size = Size(**settings)
    ramp = f", ramped from {size.micro_batch}" if modern.batch_ramp is not None else ""
    return [
        [
            "global batch (sequences a step)",
            str(RECIPES["classic"].global_batch(size)),
            f"{modern.global_batch(size)}{ramp}",
            str(size.global_batch),
        ]
    ]


def sides(results: dict[str, Any]) -> list[str]:
    """What each side had: data, optimizer and how its settings were chosen, budget, compile."""
    choices = results["choices"]
    peer = choices.get("peer") or {}
    modern = RECIPES["modern"]
    swept = choices.get(f"{modern.optimizer}_lr")
    optimizer = "LAMB" if modern.optimizer == "lamb" else f"AdamW b2 {modern.beta2:g}"
    return [
        "What each side had:",
        "",
        *_table(
            ("", "classic", "modern", "hf-peer"),
            [
                [
                    "data",
                    _data_words(RECIPES["classic"]),
                    _data_words(modern),
                    "single segments (one pass), dynamic masks each batch, padded per batch",
                ],
                [
                    "optimizer",
                    "LAMB (NVIDIA's, poly)",
                    f"{optimizer} at {'?' if swept is None else f'{swept:g}'} ({modern.schedule})",
                    f"AdamW b2 {peer.get('beta2', '?')} at {peer.get('learning_rate', '?')}, "
                    f"{peer.get('masking', 0):.0%} masking (linear)",
                ],
                *_batch_row(results.get("settings"), modern),
                [
                    "settings chosen",
                    "NVIDIA's",
                    "lr swept on its own training batches' accuracy",
                    "lr x (b2, masking) swept on a validation split of its training rows",
                ],
                [
                    "budget",
                    "calibrated, re-fitted, schedule to its end",
                    "the same",
                    "the same (in the benchmark)",
                ],
                ["on CUDA", "compiled, 1 loader worker", "the same", "torch_compile, 1 loader worker"],
                ["fine-tuning", "dropout 0.1, 3 seeds, median", "the same", "the same"],
            ],
        ),
    ]


# The plot -----------------------------------------------------------------------------------------

_COLOURS = {"classic": "#1f77b4", "modern": "#d62728", "hf-peer": "#2ca02c"}


def svg(records: Sequence[dict[str, Any]], size: Size, replicates: int, title: str) -> str:
    """An SVG of held-out MLM accuracy (y) against training seconds (x), one panel per held-out
    set: each replicate's curve per recipe as a thin line with its points, the peer's full-budget
    runs as points. Plain SVG 1.1, no script: any browser opens it."""
    budgets = [size.seconds(f) for f in size.fractions]
    panel_w, panel_h, left, top, gap = 420, 300, 60, 50, 70
    width, height = left + 2 * panel_w + gap + 30, top + panel_h + 80
    timed = [r for r in records if r.get("kind") in ("ours", "peer") and r.get("replicate", 0) < replicates]
    max_x = max([r["seconds"] for r in timed] + [1.0]) * 1.05
    max_y = max([r["accuracy"][f] for r in timed for f in FORMATS] + [0.01]) * 1.1
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{_escape(title)}</text>',
    ]
    for panel, form in enumerate(FORMATS):
        x0 = left + panel * (panel_w + gap)

        def x(seconds: float, x0: int = x0) -> float:
            return x0 + seconds / max_x * panel_w

        def y(accuracy: float) -> float:
            return top + panel_h - accuracy / max_y * panel_h

        out.append(
            f'<rect x="{x0}" y="{top}" width="{panel_w}" height="{panel_h}" fill="none" stroke="black"/>'
        )
        out.append(f'<text x="{x0 + panel_w / 2}" y="{top - 8}" text-anchor="middle">held-out {form}</text>')
        for i in range(6):
            sx, ay = max_x * i / 5, max_y * i / 5
            out.append(f'<text x="{x(sx):.1f}" y="{top + panel_h + 16}" text-anchor="middle">{sx:.0f}</text>')
            out.append(f'<text x="{x0 - 6}" y="{y(ay) + 4:.1f}" text-anchor="end">{ay:.3f}</text>')
            out.append(
                f'<line x1="{x0}" x2="{x0 + panel_w}" y1="{y(ay):.1f}" y2="{y(ay):.1f}" stroke="#ddd"/>'
            )
        out.append(
            f'<text x="{x0 + panel_w / 2}" y="{top + panel_h + 36}" text-anchor="middle">'
            "training seconds</text>"
        )
        for recipe in (*HEADLINE, "hf-peer"):
            colour = _COLOURS[recipe]
            for replicate in range(replicates):
                runs = [r for b in budgets if (r := _ours(records, recipe, b, replicate)) is not None]
                points = [(x(r["seconds"]), y(r["accuracy"][form])) for r in runs]
                if len(points) > 1:
                    path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
                    out.append(
                        f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-opacity="0.6"/>'
                    )
                out += [f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{colour}"/>' for px, py in points]
    for i, recipe in enumerate((*HEADLINE, "hf-peer")):
        lx = left + i * 140
        out.append(f'<rect x="{lx}" y="{height - 24}" width="12" height="12" fill="{_COLOURS[recipe]}"/>')
        out.append(f'<text x="{lx + 18}" y="{height - 14}">{recipe}</text>')
    out.append(
        f'<text x="{left + 420}" y="{height - 14}">one line per replicate; y: held-out MLM accuracy</text>'
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
