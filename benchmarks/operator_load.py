"""The operator under load: many BertPretrainJobs created at once against the Kubernetes emulator,
this checkout's operator and, with ``--before``, an older checkout's, in one run of one harness.

    python benchmarks/operator_load.py                                  # 200 jobs, this operator
    python benchmarks/operator_load.py --before /work/baseline          # before and after
    python benchmarks/operator_load.py --before DIR --jobs 50 --rounds 3

Each round runs each side in turn (before, after, before, after, ...). A side is an operator:
``after`` is this checkout's ``bertjob``; ``before`` is the ``bertjob`` package of the checkout
``DIR``, run with ``PYTHONPATH=DIR/operator`` (and ``DIR/api`` where it has that folder, so that its
packages are imported instead of ours) and ``BERTJOB_KUSTOMIZE_DIR=DIR/kustomize``. For each side
and round it prints:

- render: the median time of :func:`bertjob.render.render` for one job over ``--renders`` renders
  of the same job after one to warm up (for ``after`` timed in this process; for ``before`` in a
  subprocess with its PYTHONPATH, as its operator would run it);
- the time the client took to create the jobs, one after another as fast as it goes;
- the time from the first create until every job's children exist and its status is Pending;
- each job's reconcile latency (its create to its status Pending with its PyTorchJob present),
  p50, p95 and max;
- the operator's peak resident memory (VmHWM of the kopf process);
- the CPU time of the operator, and of this process (the emulator and the client);
- the operator's requests per job, in all and by verb and resource (a handler that ran twice for
  one job shows as a 409 create followed by a GET of the child); these and the CPU times are taken
  once the operator has made no request for 2 s, after the last job is Pending.

kmock's emulator and ``kopf run -m bertjob.handlers`` start as in the end-to-end tests
(:func:`bertjob_testing.kube_emulator.running_cluster`), a fresh cluster per side and round;
``--logs DIR`` keeps each operator's log there. The emulator serves from a thread of this process,
so it shares one interpreter (and its lock) with the client creating the jobs and with the poller
that times them; the operator is a process of its own. All of them share the machine, so the
figures move with its load.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertjob_testing.jobs import valid_job, with_value
from bertjob_testing.kube_emulator import cluster_crds, running_cluster

TIMEOUT_S = 600
# Seconds without a request from the operator after which it counts as done with the jobs.
QUIET_S = 2.0
# Renders the job given as JSON in argv[1] argv[2] times with whichever bertjob PYTHONPATH finds
# first (the one warm-up render left out); prints the seconds of each as a JSON list.
RENDER_TIMER = """
import json, sys, time
from bertjob.render import render
try:
    from bertjob_api.spec import parse_job
except ImportError:  # before the API package: the job API lived in bertjob
    from bertjob.spec import parse_job
job = parse_job(json.loads(sys.argv[1]))
render(job)
times = []
for _ in range(int(sys.argv[2])):
    started = time.perf_counter()
    render(job)
    times.append(time.perf_counter() - started)
print(json.dumps(times))
"""


@dataclass
class Side:
    """One operator to measure: ``env`` is added to the operator's environment (and the render
    timer's, which runs in a subprocess when ``env`` is not empty)."""

    name: str
    env: dict[str, str]
    runs: list[dict[str, float]] = field(default_factory=list)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used, in seconds (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    """VmHWM (peak resident set) of a process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``env`` added, restored after (the emulator's operator inherits it)."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def render_seconds(side: Side, renders: int) -> list[float]:
    """The seconds each of ``renders`` renders of the demo job took on ``side``."""
    document = valid_job()
    if not side.env:
        from bertjob.render import render
        from bertjob_api.spec import parse_job

        job = parse_job(document)
        render(job)  # builds the combination once, as the operator's first job does
        times = []
        for _ in range(renders):
            started = time.perf_counter()
            render(job)
            times.append(time.perf_counter() - started)
        return times
    result = subprocess.run(
        [sys.executable, "-c", RENDER_TIMER, json.dumps(document), str(renders)],
        env={**os.environ, **side.env},
        capture_output=True,
        text=True,
        check=True,
    )
    return [float(seconds) for seconds in json.loads(result.stdout)]


def load(side: Side, jobs: int, log: Path | None = None) -> dict[str, float]:
    """Create ``jobs`` jobs against a fresh emulator running ``side``'s operator; the figures.
    With ``log``, the operator's log is copied there."""
    names = [f"load-{index:04d}" for index in range(jobs)]
    created: dict[str, float] = {}
    done: dict[str, float] = {}
    with (
        environment(side.env),
        tempfile.TemporaryDirectory() as workdir,
        running_cluster(Path(workdir), cluster_crds(["pytorchjob"])) as cluster,
    ):
        assert cluster.operator is not None

        def watch() -> None:
            # Polls the emulator's store directly, so that the client's requests do not load the operator.
            while len(done) < len(names):
                now = time.perf_counter()
                children = {obj["metadata"]["name"] for obj in cluster.stored("kubeflow.org/v1/pytorchjobs")}
                for obj in cluster.stored("bertjob.dev/v1alpha1/bertpretrainjobs"):
                    name = obj["metadata"]["name"]
                    if (
                        name not in done
                        and (obj.get("status") or {}).get("phase") == "Pending"
                        and name in children
                    ):
                        done[name] = now
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        calls_before = len(cluster.server.calls)
        operator_cpu = cpu_seconds(cluster.operator.pid)
        own_cpu = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        for name in names:
            created[name] = time.perf_counter()
            cluster.create_job(with_value(valid_job(), "metadata.name", name))
        creating = time.perf_counter() - started
        watcher.join(timeout=TIMEOUT_S)
        if len(done) < len(names):
            raise SystemExit(
                f"{side.name}: only {len(done)} of {len(names)} jobs reconciled in {TIMEOUT_S} s"
            )
        # The work that follows Pending (posting the Events, kopf's own patches) is the operator's
        # too: requests and CPU are counted once it has gone quiet.
        quiet_since, seen = time.perf_counter(), len(cluster.server.calls)
        while time.perf_counter() - quiet_since < QUIET_S and time.perf_counter() - started < TIMEOUT_S:
            time.sleep(0.1)
            if len(cluster.server.calls) != seen:
                quiet_since, seen = time.perf_counter(), len(cluster.server.calls)
        rss = peak_rss_mb(cluster.operator.pid)
        operator_cpu = cpu_seconds(cluster.operator.pid) - operator_cpu
        now_cpu = resource.getrusage(resource.RUSAGE_SELF)
        harness_cpu = now_cpu.ru_utime + now_cpu.ru_stime - own_cpu.ru_utime - own_cpu.ru_stime
        calls = collections.Counter(
            f"{call.method} {call.resource}{'/' + call.subresource if call.subresource else ''}"
            for call in cluster.server.calls[calls_before:]
            if not call.watch
        )
        if log is not None:
            cluster.stop()  # its log is complete once it has stopped
            log.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cluster.log, log)
    latencies = sorted(done[name] - created[name] for name in names)
    quantiles = statistics.quantiles(latencies, n=100)
    return {
        "create_s": creating,
        "all_s": max(done.values()) - started,
        "p50_s": quantiles[49],
        "p95_s": quantiles[94],
        "max_s": latencies[-1],
        "rss_mb": rss,
        "operator_cpu_s": operator_cpu,
        "harness_cpu_s": harness_cpu,
        "requests_per_job": sum(calls.values()) / jobs,
        "calls": calls,  # type: ignore[dict-item]
    }


def line(name: str, run: dict[str, float], jobs: int) -> str:
    """One side's figures of one round (or their medians), as printed."""
    return (
        f"{name:>6}: render {run['render_ms']:7.2f} ms/job | create {jobs} jobs {run['create_s']:5.1f} s | "
        f"all Pending {run['all_s']:5.1f} s | latency p50 {run['p50_s']:5.2f} s, p95 {run['p95_s']:5.2f} s, "
        f"max {run['max_s']:5.2f} s | operator peak RSS {run['rss_mb']:4.0f} MB | CPU: operator "
        f"{run['operator_cpu_s']:5.1f} s, emulator and client {run['harness_cpu_s']:5.1f} s | "
        f"{run['requests_per_job']:4.1f} operator requests/job"
    )


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--renders", type=int, default=200, help="renders timed per side and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--before", type=Path, help="a checkout of the older commit, run as 'before'")
    parser.add_argument("--logs", type=Path, help="a folder to keep the operators' logs in")
    args = parser.parse_args()
    sides = [Side("after", {})]
    if args.before is not None:
        before = args.before.resolve()
        # Its own job API package too, where it has one: else ours (installed) would stand in for it.
        packages = [str(before / part) for part in ("operator", "api") if (before / part).is_dir()]
        env = {"PYTHONPATH": os.pathsep.join(packages), "BERTJOB_KUSTOMIZE_DIR": str(before / "kustomize")}
        sides.insert(0, Side("before", env))
    print(
        f"{args.jobs} jobs, {args.renders} renders, {args.rounds} rounds, sides in turn: "
        + ", ".join(side.name for side in sides)
    )
    for round_ in range(1, args.rounds + 1):
        for side in sides:
            render_ms = statistics.median(render_seconds(side, args.renders)) * 1000
            log = args.logs / f"operator-{side.name}-{round_}.log" if args.logs else None
            run: dict[str, Any] = {"render_ms": render_ms, **load(side, args.jobs, log)}
            side.runs.append(run)
            print(f"round {round_} " + line(side.name, run, args.jobs), flush=True)
            requests = ", ".join(
                f"{what} {count / args.jobs:.1f}" for what, count in run.pop("calls").most_common()
            )
            print(f"        {side.name} requests per job: {requests}", flush=True)
    print("medians over the rounds:")
    for side in sides:
        medians = {key: statistics.median(run[key] for run in side.runs) for key in side.runs[0]}
        print("        " + line(side.name, medians, args.jobs))


if __name__ == "__main__":
    main()
