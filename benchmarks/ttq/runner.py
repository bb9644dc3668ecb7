"""Running the benchmark's runs, each once: ours through ``python -m bertpretrain``, the peer in
this process, every finished run's record kept in the :class:`~ttq.store.RunStore` and reused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ttq import jobs, peer, probe
from ttq.heldout import EvalSet, heldout_documents, row_documents, score_export, score_model
from ttq.settings import (
    ABLATION,
    FINETUNE_METRIC,
    FINETUNE_SEEDS,
    FINETUNE_TASK,
    HEADLINE,
    OURS_SWEEP_TAIL,
    PAIRS_PREDICTIONS,
    PEER_CONFIGS,
    PEER_VALIDATION_SHARE,
    RECIPES,
    REPO,
    SEED,
    SEQ_LEN,
    SINGLES_PREDICTIONS,
    SWEPT,
    PeerConfig,
    Recipe,
    Size,
    fraction_label,
)
from ttq.store import RunStore, run_key, without_paths

DATA_SECONDS = 30.0  # the plan's estimate of a replicate's data preparation here
# The trainer refuses a budget its calibration leaves no step in (spec.budget.time: ... so no step
# fits): on this shared 2-core machine a few-second budget met that while other work ran; such a run
# is tried again after a pause, twice at most.
NO_STEP_FITS = "so no step fits"
NO_STEP_RETRIES = 2
RETRY_PAUSE = 20.0


class BenchmarkError(RuntimeError):
    """A step that failed; the message names it and its log."""


def say(line: str) -> None:
    """One progress line on stdout."""
    print(f"time_to_quality: {line}", flush=True)


def machine_gflops(seconds: float = probe.SECONDS) -> float:
    """This machine's speed now, in GFLOP/s (:func:`ttq.probe.gflops` over ``seconds``), measured
    in a fresh process (``python -m ttq.probe``), so that a run made in this process (the
    peer's) and a run made in a subprocess (ours) are followed by the same measurement: the third
    demo run's in-process figure after the peer's runs was 241 against 288-305 after ours.

    Written into each run's record as the run ends, so that runs made at different times (a rerun
    reuses finished ones) can be told apart when the machine's speed moved in between: on this
    2-core machine one recipe's 160 s runs took 350 to 594 steps within one afternoon.

    Raises:
        subprocess.CalledProcessError: the probe failed.
    """
    found = subprocess.run(
        [sys.executable, "-m", "ttq.probe", str(seconds)],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(found.stdout.split()[-1])


def run_logged(label: str, command: list[str], log: Path) -> float:
    """Run ``command`` with its output in ``log``; returns its seconds.

    Raises:
        BenchmarkError: it failed; the message has the log's last lines.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    say(f"{label}: {' '.join(command[1:])} (log {log})")
    started = time.perf_counter()
    with log.open("w") as output:
        code = subprocess.call(command, stdout=output, stderr=subprocess.STDOUT, cwd=REPO)
    seconds = time.perf_counter() - started
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise BenchmarkError(f"{label}: exit {code} after {seconds:.0f} s; the end of {log}:\n{tail}")
    say(f"{label}: done in {seconds:.1f} s")
    return seconds


def write_job(document: dict[str, Any], path: Path) -> Path:
    """``document`` as YAML at ``path`` (a temporary name, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(yaml.safe_dump(document, sort_keys=False))
    temporary.replace(path)
    return path


@dataclass(frozen=True)
class TrainLog:
    """What our run's ``train.jsonl`` says of its phase."""

    steps: int
    sequences: int
    progressive_mlm_accuracy: float | None  # its last OURS_SWEEP_TAIL of logged training batches


def read_train_log(path: Path) -> TrainLog:
    """Read ``train.jsonl`` (one phase): the last step, the sequences trained, and the MLM accuracy
    of the training batches logged in the last :data:`OURS_SWEEP_TAIL` of the steps (weighted by
    their sequences): what our sweep chooses by, since the held-out sets are not for choosing.

    Raises:
        BenchmarkError: no training record in it.
    """
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    train = [r for r in records if r["type"] == "LOG" and r["data"].get("split") == "train"]
    if not train:
        raise BenchmarkError(f"{path}: no training record")
    steps = int(train[-1]["step"][1])
    tail = [r for r in train if r["step"][1] > steps * (1 - OURS_SWEEP_TAIL) and "mlm_accuracy" in r["data"]]
    weight = sum(r["data"]["sequences"] for r in tail)
    accuracy = (
        sum(r["data"]["mlm_accuracy"] * r["data"]["sequences"] for r in tail) / weight if weight else None
    )
    return TrainLog(steps, round(sum(r["data"]["sequences"] for r in train)), accuracy)


def finetune_score(path: Path) -> dict[str, Any]:
    """The fine-tuning task's result in ``finetune.json``: the median over its seeds, each seed's
    value and the settings it ran with."""
    results = json.loads(path.read_text())
    task = next(t for t in results["tasks"] if t["task"] == FINETUNE_TASK)
    values = [run["metrics"][FINETUNE_METRIC] for run in task["runs"] if run["init"] == "pretrained"]
    return {
        "metric": FINETUNE_METRIC,
        "median": task["summary"]["pretrained"][FINETUNE_METRIC]["median"],
        "values": values,
        "seeds": task["seeds"],
        "settings": task["settings"],
    }


@dataclass
class Replicate:
    """Replicate ``index``: its seed, work directory and (once prepared) its evaluation sets."""

    index: int
    work: Path
    sets: dict[str, EvalSet] | None = None
    evaluation: dict[str, Any] | None = None
    documents: dict[str, np.ndarray] | None = None  # per set, each row's held-out document [N]
    peer_data: peer.PeerData | None = None

    @property
    def seed(self) -> int:
        """SEED + index."""
        return SEED + self.index

    @property
    def data(self) -> Path:
        """The replicate's data directory."""
        return self.work / "data"

    @property
    def singles(self) -> Path:
        """The single-segment dataset: the singles held-out set and the peer's training rows."""
        return self.data / f"seq_len_{SEQ_LEN}_max_pred_{SINGLES_PREDICTIONS}"

    @property
    def pairs(self) -> Path:
        """The pair dataset: the pairs held-out set (and the classic recipe's training data)."""
        return self.data / f"seq_len_{SEQ_LEN}_max_pred_{PAIRS_PREDICTIONS}"


@dataclass
class Benchmark:
    """One invocation: the size, where things go, and the counts of runs trained and reused."""

    size_name: str
    size: Size
    device: str
    out: Path
    keep: bool = False
    trained: int = 0
    reused: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def work(self) -> Path:
        """``<out>/work``: shards, checkpoints, exports, logs."""
        return self.out / "work"

    @property
    def store(self) -> RunStore:
        """``<out>/runs``."""
        return RunStore(self.out / "runs")

    def replicate(self, index: int) -> Replicate:
        """Replicate ``index``'s handle (nothing prepared yet)."""
        return Replicate(index, self.work / f"seed-{SEED + index}")

    # The data ------------------------------------------------------------------------------------

    def prepare(self, rep: Replicate) -> dict[str, EvalSet]:
        """The replicate's held-out sets, preparing its data first (once per invocation)."""
        if rep.sets is not None:
            return rep.sets
        for name, make in (("singles", jobs.singles_job), ("pairs", jobs.pairs_job)):
            job = write_job(make(self.size, self.device, rep.work, rep.seed), rep.work / name / "job.yaml")
            command = [sys.executable, "-m", "bertpretrain", "prepare", "--config", str(job)]
            run_logged(f"{name} data (seed {rep.seed})", command, rep.work / name / "prepare.log")
        rep.sets = {"singles": EvalSet.read(rep.singles), "pairs": EvalSet.read(rep.pairs)}
        documents = heldout_documents(rep.data / "documents")
        rep.documents = {name: row_documents(rows, documents) for name, rows in rep.sets.items()}
        rep.evaluation = {name: rows.describe() for name, rows in rep.sets.items()}
        for name, counts in rep.evaluation.items():
            found = rep.documents[name]
            counts["documents"] = len(np.unique(found[found >= 0]))
            counts["rows_without_document"] = int((found < 0).sum())
            say(
                f"seed {rep.seed}: held-out {name}: {counts['rows']} rows, "
                f"{counts['distinct_segments']} distinct segments from {counts['documents']} documents "
                f"({counts['rows_without_document']} rows not traced to one), "
                f"{counts['predictions']} masked positions, {counts['rows_with_segment_b']} with segment B"
            )
        return rep.sets

    # Records ---------------------------------------------------------------------------------------

    def _cached(self, key: str, label: str) -> dict[str, Any] | None:
        shared = next((r for r in self.records if r["key"] == key), None)
        if shared is not None:  # the curves' and the ablation's run, asked for twice
            return shared
        record = self.store.get(key)
        if record is not None:
            self.reused += 1
            say(f"{label}: finished before, reusing {self.store.path(key).relative_to(self.out)}")
            self.records.append(record)
        return record

    def _finish(self, record: dict[str, Any], run_dir: Path | None) -> dict[str, Any]:
        record["machine_gflops"] = machine_gflops()
        self.store.put(record)
        self.trained += 1
        self.records.append(record)
        if run_dir is not None and not self.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
        return record

    def _finetune(self, rep: Replicate, run_dir: Path, export: Path, label: str) -> dict[str, Any]:
        job = jobs.finetune_job(self.size, self.device, rep.work, run_dir, export, rep.seed)
        path = write_job(job, run_dir / "finetune.yaml")
        command = [sys.executable, "-m", "bertpretrain", "finetune", "--config", str(path)]
        run_logged(f"{label} fine-tuning", command, run_dir / "finetune.log")
        score = finetune_score(run_dir / "checkpoints" / "finetune" / "finetune.json")
        score["task"] = without_paths(job["spec"]["finetune"][0], self.work)
        return score

    # Our runs --------------------------------------------------------------------------------------

    def ours(
        self, rep: Replicate, recipe: Recipe, fraction: float, *, lr: float | None, finetune: bool
    ) -> dict[str, Any]:
        """Our run of ``recipe`` at ``fraction`` of the classic's budget in replicate ``rep`` (reused
        when finished before): trained, its export scored on both held-out sets, fine-tuned when
        ``finetune``. Returns its record."""
        size = self.size
        budget = size.seconds(fraction)
        learning_rate = recipe.learning_rate(size, lr)
        run_id = f"{recipe.name}-{budget}s" + (f"-lr{learning_rate:g}" if recipe.sweep(size) else "")
        run_dir = rep.work / run_id
        document = jobs.our_job(
            recipe,
            size,
            self.device,
            rep.work,
            run_dir,
            budget=budget,
            seed=rep.seed,
            learning_rate=learning_rate,
            finetune=finetune,
        )
        settings = without_paths(document["spec"], self.work)
        key = run_key("ours", recipe.name, rep.seed, budget, self.size_name, settings)
        label = f"{recipe.name} {fraction_label(fraction)} ({budget} s, seed {rep.seed})"
        found = self._cached(key, label)
        if found is not None:
            return found
        sets = self.prepare(rep)
        shutil.rmtree(run_dir, ignore_errors=True)  # an interrupted run starts afresh
        job = write_job(document, run_dir / "job.yaml")
        command = [sys.executable, "-m", "bertpretrain", "run", "--config", str(job)]
        for attempt in range(1 + NO_STEP_RETRIES):
            try:
                wall = run_logged(label, command, run_dir / "run.log")
                break
            except BenchmarkError as error:
                if NO_STEP_FITS not in str(error) or attempt == NO_STEP_RETRIES:
                    raise
                say(
                    f"{label}: its calibration left no step in its budget (a busy machine?); "
                    f"again in {RETRY_PAUSE:g} s"
                )
                shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
                time.sleep(RETRY_PAUSE)
        checkpoints = run_dir / "checkpoints"
        budget_record = json.loads((checkpoints / "phase1" / "budget.json").read_text())
        log = read_train_log(checkpoints / "logs" / "train.jsonl")
        scores = score_export(checkpoints / "hf", sets, self.device)
        record = {
            "key": key,
            "kind": "ours",
            "recipe": recipe.name,
            "description": recipe.describe(size, lr),
            "replicate": rep.index,
            "seed": rep.seed,
            "fraction": fraction,
            "budget_seconds": budget,
            "size": self.size_name,
            "learning_rate": learning_rate,
            "seconds": budget_record["finished_seconds"],
            "steps": log.steps,
            "sequences": log.sequences,
            "progressive_mlm_accuracy": log.progressive_mlm_accuracy,
            "fits": len(budget_record.get("fits", [])),
            "job_seconds": wall,
            "evaluation": rep.evaluation,
            "accuracy": {name: score["accuracy"] for name, score in scores.items()},
            "scores": scores,
            "finetune": None,
            "settings": settings,
        }
        if finetune:
            score = finetune_score(checkpoints / "finetune" / "finetune.json")
            score["task"] = settings["finetune"][0]
            record["finetune"] = score
        accuracy = ", ".join(f"{name} {value:.4f}" for name, value in record["accuracy"].items())
        say(
            f"{label}: {record['seconds']:.1f} s of training, {log.steps} steps, "
            f"held-out MLM accuracy {accuracy}"
        )
        return self._finish(record, run_dir)

    def sweep_ours(self, rep: Replicate) -> dict[str, tuple[float, list[dict[str, Any]]]]:
        """Each optimizer's learning rate (:data:`SWEPT`: the modern recipe's LAMB over
        :attr:`Size.lamb_lrs`, the AdamW row's over :attr:`Size.adamw_lrs`), at the full budget in
        ``rep``: the one whose last logged training batches scored best (see :func:`read_train_log`;
        never the held-out sets). The modern recipe's points are fine-tuned, so the chosen one is
        also ``rep``'s full-budget run of its curve. Returns, per optimizer, (the rate, the points'
        records)."""
        chosen = {}
        for name in SWEPT:
            recipe = RECIPES[name]
            headline = name in HEADLINE
            points = [self.ours(rep, recipe, 1.0, lr=lr, finetune=headline) for lr in recipe.sweep(self.size)]
            best = max(points, key=lambda point: point["progressive_mlm_accuracy"] or 0.0)
            say(
                f"our {recipe.optimizer} sweep ({name}): learning rate {best['learning_rate']:g} "
                "(by its last training batches' MLM accuracy)"
            )
            chosen[recipe.optimizer] = (best["learning_rate"], points)
        return chosen

    # The peer ----------------------------------------------------------------------------------------

    def _peer_data(self, rep: Replicate) -> peer.PeerData:
        if rep.peer_data is None:
            self.prepare(rep)
            rep.peer_data = peer.load_peer_data(rep.data / "vocab", rep.singles, rep.seed)
            say(f"hf-peer (seed {rep.seed}): {rep.peer_data.counts}")
        return rep.peer_data

    def _peer_settings(self, lr: float, config: PeerConfig, budget: int) -> dict[str, Any]:
        size = self.size
        return {
            "preset": size.preset,
            "global_batch": size.global_batch,
            "learning_rate": lr,
            "beta2": config.beta2,
            "masking": config.masking,
            "calibration_steps": size.peer_calibration_steps,
            "validation_share": PEER_VALIDATION_SHARE,
            "refits": peer.REFITS,
            "device": self.device,
            "budget": budget,
        }

    def _train_peer(
        self, rep: Replicate, lr: float, config: PeerConfig, budget: int, label: str
    ) -> tuple[Any, peer.PeerRun]:
        data = self._peer_data(rep)
        run = peer.PeerRun(lr, config.beta2, config.masking, float(budget))
        say(f"{label}: training")
        model = peer.train_peer(
            data, self.size, self.device, run, rep.work / "hf-peer-scratch", rep.seed, label
        )
        say(
            f"{label}: {run.steps} steps in {run.seconds:.1f} s of a {budget} s budget ({len(run.fits)} fits)"
        )
        return model, run

    def sweep_peer(self, rep: Replicate) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The peer's sweep in ``rep``: every learning rate of :attr:`Size.peer_lrs` with every
        :data:`PEER_CONFIGS` entry, each for :attr:`Size.peer_sweep_fraction` of the budget under the
        same budget mechanism, scored on its validation split. Returns (the best point's record,
        all points' records)."""
        budget = self.size.seconds(self.size.peer_sweep_fraction)
        points = []
        for config in PEER_CONFIGS:
            for lr in self.size.peer_lrs:
                settings = self._peer_settings(lr, config, budget)
                key = run_key("peer-sweep", "hf-peer-sweep", rep.seed, budget, self.size_name, settings)
                label = f"hf-peer sweep {config.name} lr {lr:g} ({budget} s, seed {rep.seed})"
                found = self._cached(key, label)
                if found is None:
                    model, run = self._train_peer(rep, lr, config, budget, label)
                    accuracy = peer.validation_accuracy(model, self._peer_data(rep), self.device)
                    say(f"{label}: validation MLM accuracy {accuracy:.4f}")
                    found = self._finish(
                        {
                            "key": key,
                            "kind": "peer-sweep",
                            "config": config.name,
                            "replicate": rep.index,
                            "seed": rep.seed,
                            "budget_seconds": budget,
                            "size": self.size_name,
                            "validation_mlm_accuracy": accuracy,
                            "run": run.record(),
                            "settings": settings,
                        },
                        None,
                    )
                points.append(found)
        best = max(points, key=lambda point: point["validation_mlm_accuracy"])
        edges = (self.size.peer_lrs[0], self.size.peer_lrs[-1])
        if len(self.size.peer_lrs) > 1 and best["settings"]["learning_rate"] in edges:
            say(
                f"hf-peer: the best learning rate, {best['settings']['learning_rate']:g}, "
                "is at an edge of the sweep"
            )
        say(f"hf-peer sweep: {best['config']} at lr {best['settings']['learning_rate']:g} (validation split)")
        return best, points

    def run_peer(self, rep: Replicate, best: dict[str, Any]) -> dict[str, Any]:
        """The peer at the sweep's choice for the full budget in ``rep``: scored on both held-out
        sets, exported, fine-tuned by the one protocol. Returns its record."""
        config = next(c for c in PEER_CONFIGS if c.name == best["config"])
        lr, budget = best["settings"]["learning_rate"], self.size.seconds(1.0)
        settings = self._peer_settings(lr, config, budget)
        key = run_key("peer", "hf-peer", rep.seed, budget, self.size_name, settings)
        label = f"hf-peer 1 ({budget} s, seed {rep.seed})"
        found = self._cached(key, label)
        if found is not None:
            return found
        sets = self.prepare(rep)
        run_dir = rep.work / "hf-peer"
        shutil.rmtree(run_dir, ignore_errors=True)
        model, run = self._train_peer(rep, lr, config, budget, label)
        scores = score_model(model, sets, self.device)
        data = self._peer_data(rep)
        export = peer.save_export(model, data.tokenizer, rep.data / "vocab", run_dir / "hf")
        finetune = self._finetune(rep, run_dir, export, label)
        accuracy = ", ".join(f"{name} {score['accuracy']:.4f}" for name, score in scores.items())
        say(f"{label}: held-out MLM accuracy {accuracy}; fine-tuned {finetune['median']:.4f}")
        record = {
            "key": key,
            "kind": "peer",
            "recipe": "hf-peer",
            "config": config.name,
            "replicate": rep.index,
            "seed": rep.seed,
            "fraction": 1.0,
            "budget_seconds": budget,
            "size": self.size_name,
            "learning_rate": lr,
            "seconds": run.seconds,
            "steps": run.steps,
            "sequences": run.steps * self.size.global_batch,
            "run": run.record(),
            "peer_data": data.counts,
            "evaluation": rep.evaluation,
            "accuracy": {name: s["accuracy"] for name, s in scores.items()},
            "scores": scores,
            "finetune": finetune,
            "settings": settings,
        }
        return self._finish(record, run_dir)

    def random_init(self, rep: Replicate) -> dict[str, Any]:
        """An untrained model of the same dimensions fine-tuned by the one protocol: the reference
        of no pretraining. Returns its record."""
        settings = {"preset": self.size.preset, "task": jobs.finetune_task(self.size, init_from="<export>")}
        key = run_key("random-init", "random-init", rep.seed, 0, self.size_name, settings)
        label = f"random init (seed {rep.seed})"
        found = self._cached(key, label)
        if found is not None:
            return found
        self.prepare(rep)
        run_dir = rep.work / "random-init"
        shutil.rmtree(run_dir, ignore_errors=True)
        export = peer.random_init_export(self.size, rep.data / "vocab", run_dir / "hf", rep.seed)
        finetune = self._finetune(rep, run_dir, export, label)
        record = {
            "key": key,
            "kind": "random-init",
            "recipe": "random-init",
            "replicate": rep.index,
            "seed": rep.seed,
            "size": self.size_name,
            "finetune": finetune,
            "settings": settings,
        }
        return self._finish(record, run_dir)


@dataclass(frozen=True)
class Planned:
    """A run the plan counts: its kind, recipe, seconds of budget and fine-tuning seeds."""

    kind: str
    recipe: str
    replicate: int
    budget: int
    finetune_seeds: int


def plan(size: Size, replicates: int, ablation_replicates: int) -> list[Planned]:
    """Every run the benchmark trains, each once (a run the curves and the ablation share, or our
    sweep and the modern curve's full-budget run, is counted once): in replicate 0 our sweeps
    (LAMB's fine-tuned, AdamW's not), the peer's sweep and the random initialisation's
    fine-tuning; in each of the first ``replicates`` the two recipes' curves (the full budget
    fine-tuned) and the peer; in each of the first ``ablation_replicates`` the ablation's rows."""
    runs: dict[tuple[str, int, int, float | None], Planned] = {}

    def add(
        kind: str, recipe: str, replicate: int, budget: int, seeds: int = 0, lr: float | None = None
    ) -> None:
        runs.setdefault((recipe, replicate, budget, lr), Planned(kind, recipe, replicate, budget, seeds))

    ablation_budget = size.seconds(size.ablation_fraction)
    for name in SWEPT:
        for lr in RECIPES[name].sweep(size):
            add("ours", name, 0, size.seconds(1.0), FINETUNE_SEEDS if name in HEADLINE else 0, lr=lr)
    sweep_budget = size.seconds(size.peer_sweep_fraction)
    for config in PEER_CONFIGS:
        for lr in size.peer_lrs:
            add("peer-sweep", f"hf-peer {config.name}", 0, sweep_budget, lr=lr)
    add("random-init", "random-init", 0, 0, FINETUNE_SEEDS)

    def lr_of(name: str) -> float | None:  # each sweep's first point stands for its choice
        swept = RECIPES[name].sweep(size)
        return swept[0] if swept else None

    for replicate in range(replicates):
        for name in HEADLINE:
            for fraction in size.fractions:
                seeds = FINETUNE_SEEDS if fraction == 1 else 0
                add("ours", name, replicate, size.seconds(fraction), seeds, lr=lr_of(name))
        add("peer", "hf-peer", replicate, size.seconds(1.0), FINETUNE_SEEDS)
    for replicate in range(ablation_replicates):
        for name in ABLATION:
            add("ours", name, replicate, ablation_budget, lr=lr_of(name))
    return list(runs.values())


def estimate_seconds(size: Size, planned: list[Planned], replicates: int) -> float:
    """The plan's time on this machine: each run's budget and :attr:`Size.run_overhead` (the peer's
    sweep points a third of it: no subprocess, no export), each fine-tuning seed, each replicate's
    data."""
    total = replicates * DATA_SECONDS
    for run in planned:
        overhead = size.run_overhead / 3 if run.kind == "peer-sweep" else size.run_overhead
        total += run.budget + overhead + run.finetune_seeds * size.finetune_seed_seconds
    return total
