"""The operator under load: many BertPretrainJobs created at once against a real Kubernetes control
plane (by default) or kmock's emulator (``--emulator``), this checkout's operator and, with
``--before``, an older checkout's, in one run of one harness.

    python benchmarks/operator_load.py                                  # 200 jobs, this operator
    python benchmarks/operator_load.py --jobs 1000 --rounds 1
    python benchmarks/operator_load.py --before /work/baseline          # before and after
    python benchmarks/operator_load.py --emulator --jobs 50 --rounds 3  # the emulator's harness

Each round runs each side in turn (before, after, before, after, ...). A side is an operator:
``after`` is this checkout's ``bertjob``; ``before`` is the ``bertjob`` package of the checkout
``DIR``, run with ``PYTHONPATH=DIR/operator`` (and ``DIR/api`` where it has that folder, so that its
packages are imported instead of ours) and ``BERTJOB_KUSTOMIZE_DIR=DIR/kustomize``. On the real
server each side's operator runs under its own checkout's chart (its CRD and RBAC): an older
operator may need verbs this checkout's chart no longer grants.

The real server (the default): a fresh control plane per side and round
(:mod:`bertjob_testing.cluster`: etcd, kube-apiserver, controller-manager, scheduler and kwok on
127.0.0.1, as the cluster tests start them), ``charts/bertjob`` installed by helm with its webhook
on, and the operator run as a local ``kopf run`` under the chart's ServiceAccount token
(:func:`bertjob_testing.cluster.operator.install`); the jobs are created in namespace ``load``
with the admin's client certificate, so each create also passes the CRD's CEL rules and our
webhook. Counting the operator's requests: the API server is started with an audit policy that
logs, at the ``Metadata`` level, only the requests of the chart's ServiceAccount (the group
``system:serviceaccounts:bertjob-system``: the operator's token; kwok's pod of the chart's
Deployment runs nothing), and nothing else; its audit log is exact and holds no request of the
benchmark's client or of the other components. That is the only change to the control plane as
the tests start it (the flags are added by :func:`audited_control_plane`); the audit backend's one
line per operator request costs the API server a little CPU. Watches are counted apart (the audit
log's ``ResponseStarted``); every other request when it completes, by verb, resource and, for an
error, its code. Counting starts once the started operator has gone quiet (its startup's lists and
watches are left out).

The emulator (``--emulator``): kmock's emulator and ``kopf run -m bertjob.handlers`` start as in
the end-to-end tests (:func:`bertjob_testing.kube_emulator.running_cluster`), a fresh cluster per
side and round; the emulator serves from a thread of this process, so it shares one interpreter
(and its lock) with the client creating the jobs and with the poller that times them, and it
records the operator's requests itself.

For each side and round it prints:

- render: the median time of :func:`bertjob.render.render` for one job over ``--renders`` renders
  of the same job after one to warm up (for ``after`` timed in this process; for ``before`` in a
  subprocess with its PYTHONPATH, as its operator would run it);
- the time the client took to create the jobs, one after another as fast as it goes, and the
  median time of one create (on the real server it passes the CRD's CEL rules and our webhook);
- the time from the first create until every job's children exist and its status is Pending;
- each job's reconcile latency (from the start of its create to its status Pending with its
  PyTorchJob present), p50, p95 and max, and the p95 counted from the create's answer instead; on
  the real server timed from two watches of this process (the jobs and the PyTorchJobs of the
  namespace, from the resourceVersion of a list made before the first create), a job done when
  both its Pending status and its PyTorchJob have been seen; on the emulator by polling its store
  every 50 ms;
- the operator's peak resident memory (VmHWM of the kopf process);
- the CPU time of the operator, of the API server and etcd (real server), and of this process
  (the client and its watches; with ``--emulator``, the emulator too);
- the operator's requests per job, in all and by verb and resource (a handler that ran twice for
  one job shows as a 409 create followed by a GET of the child); these and the CPU times are taken
  once the operator has made no request for 2 s, after the last job is Pending.

``--logs DIR`` keeps each operator's log there (and on the real server the audit log and the API
server's log beside it). All the processes share the machine, so the figures move with its load:
each round's line ends with the machine's load average.
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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import watch
from kubernetes.client import CustomObjectsApi
from kubernetes.client.exceptions import ApiException

# bertjob_testing is the tests' own package, which the bertjob wheel does not install.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testing"))
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.operator import CHART, install
from bertjob_testing.cluster.operator import NAMESPACE as OPERATOR_NAMESPACE
from bertjob_testing.jobs import valid_job, with_value
from bertjob_testing.kube_emulator import cluster_crds, running_cluster

TIMEOUT_S = 600
# Seconds without a request from the operator after which it counts as done with the jobs.
QUIET_S = 2.0
# The namespace the jobs are created in on the real server.
LOAD_NAMESPACE = "load"
# Logs the operator's requests (the chart's ServiceAccounts) and nothing else.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": [f"system:serviceaccounts:{OPERATOR_NAMESPACE}"]},
        {"level": "None"},
    ],
}
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
    # The chart installed for this side on the real server: its checkout's, whose RBAC its operator
    # was written for (this checkout's for ``after``).
    chart: Path = CHART


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


def own_cpu_seconds() -> float:
    """User plus system CPU time of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``env`` added, restored after (the operator inherits it)."""
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


def create_figures(
    creating: float,
    took: dict[str, float],
    created: dict[str, float],
    done: dict[str, float],
    names: list[str],
    started: float,
) -> dict[str, float]:
    """What both harnesses report of the creates: all of them (s), one's median (ms), the p95 from a
    create's answer to Pending (s), and :func:`latency_figures`."""
    return {
        "create_s": creating,
        "create_ms": statistics.median(took.values()) * 1000,
        "p95_returned_s": statistics.quantiles(
            [done[name] - created[name] - took[name] for name in names], n=100
        )[94],
        **latency_figures(created, done, started),
    }


def latency_figures(created: dict[str, float], done: dict[str, float], started: float) -> dict[str, float]:
    """Reconcile latency p50, p95 and max of the jobs in ``created`` (each its create's time to
    its ``done`` time), and the seconds from ``started`` until the last was done."""
    latencies = sorted(done[name] - created[name] for name in created)
    quantiles = statistics.quantiles(latencies, n=100)
    return {
        "all_s": max(done.values()) - started,
        "p50_s": quantiles[49],
        "p95_s": quantiles[94],
        "max_s": latencies[-1],
    }


def audited_requests(events: Iterable[dict[str, Any]]) -> collections.Counter[str]:
    """The requests of audit ``events`` by ``VERB resource[/subresource]`` (with `` CODE`` for an
    error): each request once, when it completed; a watch, when it started (``watch ...``)."""
    calls: collections.Counter[str] = collections.Counter()
    for event in events:
        verb, stage = event.get("verb", "?"), event.get("stage")
        if (verb == "watch") != (stage == "ResponseStarted") or stage not in (
            "ResponseStarted",
            "ResponseComplete",
        ):
            continue
        ref = event.get("objectRef") or {}
        what = ref.get("resource") or event.get("requestURI", "?").split("?")[0]
        if ref.get("subresource"):
            what += "/" + ref["subresource"]
        code = (event.get("responseStatus") or {}).get("code", 0)
        calls[f"{verb} {what}" + (f" {code}" if code >= 400 else "")] += 1
    return calls


def read_audit(path: Path, offset: int) -> list[dict[str, Any]]:
    """The audit events of the JSON-lines log ``path`` from byte ``offset`` on."""
    with path.open("rb") as log:
        log.seek(offset)
        return [json.loads(line) for line in log.read().splitlines() if line.strip()]


def wait_quiet(size: Callable[[], int], deadline: float) -> None:
    """Wait until ``size()`` (of a log of the operator's requests) has not changed for
    :data:`QUIET_S` seconds, or until ``deadline`` (``time.perf_counter()``)."""
    quiet_since, seen = time.perf_counter(), size()
    while time.perf_counter() - quiet_since < QUIET_S and time.perf_counter() < deadline:
        time.sleep(0.1)
        if (now := size()) != seen:
            quiet_since, seen = time.perf_counter(), now


def load_emulator(side: Side, jobs: int, log: Path | None = None) -> dict[str, Any]:
    """Create ``jobs`` jobs against a fresh emulator running ``side``'s operator; the figures.
    With ``log``, the operator's log is copied there."""
    names = [f"load-{index:04d}" for index in range(jobs)]
    created: dict[str, float] = {}
    took: dict[str, float] = {}
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
        own_cpu = own_cpu_seconds()
        started = time.perf_counter()
        for name in names:
            created[name] = time.perf_counter()
            cluster.create_job(with_value(valid_job(), "metadata.name", name))
            took[name] = time.perf_counter() - created[name]
        creating = time.perf_counter() - started
        watcher.join(timeout=TIMEOUT_S)
        if len(done) < len(names):
            raise SystemExit(
                f"{side.name}: only {len(done)} of {len(names)} jobs reconciled in {TIMEOUT_S} s"
            )
        # The work that follows Pending (posting the Events, kopf's own patches) is the operator's
        # too: requests and CPU are counted once it has gone quiet.
        wait_quiet(lambda: len(cluster.server.calls), started + TIMEOUT_S)
        rss = peak_rss_mb(cluster.operator.pid)
        operator_cpu = cpu_seconds(cluster.operator.pid) - operator_cpu
        harness_cpu = own_cpu_seconds() - own_cpu
        calls = collections.Counter(
            f"{call.method} {call.resource}{'/' + call.subresource if call.subresource else ''}"
            for call in cluster.server.calls[calls_before:]
            if not call.watch
        )
        if log is not None:
            cluster.stop()  # its log is complete once it has stopped
            log.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cluster.log, log)
    return {
        **create_figures(creating, took, created, done, names, started),
        "rss_mb": rss,
        "operator_cpu_s": operator_cpu,
        "client_cpu_s": harness_cpu,
        "requests_per_job": sum(calls.values()) / jobs,
        "calls": calls,
    }


def audited_control_plane(workdir: Path) -> ControlPlane:
    """A :class:`ControlPlane` whose API server writes its audit log with policy
    :data:`AUDIT_POLICY` (to ``workdir/audit.log``, JSON lines) in place of the tests' own: later
    flags win over the component's."""
    policy = workdir / "load-audit-policy.json"
    policy.write_text(json.dumps(AUDIT_POLICY))
    arguments = [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={workdir / 'audit.log'}",
        "--audit-log-format=json",
    ]
    return ControlPlane(workdir, extra_args={"kube-apiserver": arguments})


# The resources whose watch events time a job: (group, version, plural).
JOBS = ("bertjob.dev", "v1alpha1", "bertpretrainjobs")
PYTORCHJOBS = ("kubeflow.org", "v1", "pytorchjobs")


class Watcher:
    """The times at which this process first saw each job Pending and each job's PyTorchJob, from
    two watches of namespace ``namespace`` in threads of their own, each from the resourceVersion
    of a list made when the watcher is made. A watch that the server ends (it closes a watch whose
    client falls behind) is made again from the last resourceVersion seen; ``restarts`` counts
    them."""

    def __init__(self, api: CustomObjectsApi, namespace: str) -> None:
        self.pending: dict[str, float] = {}
        self.children: dict[str, float] = {}
        self.restarts = 0
        self.stopping = False
        self.lock = threading.Lock()
        self.api, self.namespace = api, namespace
        for resource_, seen in ((JOBS, self.pending), (PYTORCHJOBS, self.children)):
            since = self._list(resource_, seen)
            threading.Thread(target=self._follow, args=(resource_, since, seen), daemon=True).start()

    def _list(self, resource_: tuple[str, str, str], seen: dict[str, float]) -> str:
        """List the resource, note what it shows as seen now; its resourceVersion."""
        group, version, plural = resource_
        listed = self.api.list_namespaced_custom_object(group, version, self.namespace, plural)
        assert isinstance(listed, dict)
        for obj in listed["items"]:
            self._saw(resource_, obj, seen, time.perf_counter())
        return str(listed["metadata"]["resourceVersion"])

    def _saw(
        self, resource_: tuple[str, str, str], obj: dict[str, Any], seen: dict[str, float], now: float
    ) -> None:
        name = obj["metadata"]["name"]
        if name not in seen and (
            resource_ == PYTORCHJOBS or (obj.get("status") or {}).get("phase") == "Pending"
        ):
            with self.lock:
                seen[name] = now

    def _follow(self, resource_: tuple[str, str, str], since: str, seen: dict[str, float]) -> None:
        group, version, plural = resource_
        while not self.stopping:
            try:
                for event in watch.Watch().stream(
                    self.api.list_namespaced_custom_object,
                    group,
                    version,
                    self.namespace,
                    plural,
                    resource_version=since,
                    allow_watch_bookmarks=True,
                    deserialize=False,
                ):
                    now = time.perf_counter()
                    obj = event["object"]
                    since = obj["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._saw(resource_, obj, seen, now)
            except (ApiException, KeyError) as error:
                # 410 Gone: too old to resume, list again. (An ERROR event in the stream is a
                # KeyError inside the client when it does not deserialize.)
                if self.stopping:
                    return
                if isinstance(error, ApiException) and error.status != 410:
                    raise
                self.restarts += 1
                since = self._list(resource_, seen)
            except Exception:
                if self.stopping:  # the control plane has stopped under it
                    return
                self.restarts += 1

    def done(self) -> dict[str, float]:
        """Each job seen both Pending and with its PyTorchJob: the time the later was seen."""
        with self.lock:
            return {
                name: max(at, self.children[name])
                for name, at in self.pending.items()
                if name in self.children
            }


def load_real(side: Side, jobs: int, log: Path | None = None) -> dict[str, Any]:
    """Create ``jobs`` jobs in a fresh control plane with the chart installed and ``side``'s
    operator running; the figures. With ``log``, the operator's log is copied there, and beside it
    the audit log (suffix ``.audit``) and the API server's log (``.apiserver``), also when the
    run fails."""
    names = [f"load-{index:04d}" for index in range(jobs)]
    created: dict[str, float] = {}
    took: dict[str, float] = {}
    watcher: Watcher | None = None
    with environment(side.env), tempfile.TemporaryDirectory() as workdir:
        (Path(workdir) / "plane").mkdir()
        plane = audited_control_plane(Path(workdir) / "plane")
        cluster = None
        try:
            plane.start()
            cluster = install(plane, Path(workdir) / "operator", chart=side.chart)
            assert cluster.operator is not None
            plane.kubectl("create", "namespace", LOAD_NAMESPACE)
            audit = plane.workdir / "audit.log"
            wait_quiet(lambda: audit.stat().st_size, time.perf_counter() + 60)
            offset = audit.stat().st_size
            watcher = Watcher(CustomObjectsApi(cluster.api), LOAD_NAMESPACE)
            operator_cpu = cpu_seconds(cluster.operator.pid)
            server_pids = [plane.pids["kube-apiserver"], plane.pids["etcd"]]
            server_cpu = sum(map(cpu_seconds, server_pids))
            own_cpu = own_cpu_seconds()
            started = time.perf_counter()
            for name in names:
                created[name] = time.perf_counter()
                cluster.create_job(with_value(valid_job(), "metadata.name", name), namespace=LOAD_NAMESPACE)
                took[name] = time.perf_counter() - created[name]
            creating = time.perf_counter() - started
            while len(done := watcher.done()) < jobs and time.perf_counter() - started < TIMEOUT_S:
                time.sleep(0.05)
            if len(done) < jobs:
                raise SystemExit(f"{side.name}: only {len(done)} of {jobs} jobs reconciled in {TIMEOUT_S} s")
            # The work that follows Pending (posting the Events, kopf's own patches) is the
            # operator's too: requests and CPU are counted once it has gone quiet.
            wait_quiet(lambda: audit.stat().st_size, started + TIMEOUT_S)
            rss = peak_rss_mb(cluster.operator.pid)
            operator_cpu = cpu_seconds(cluster.operator.pid) - operator_cpu
            server_cpu = sum(map(cpu_seconds, server_pids)) - server_cpu
            client_cpu = own_cpu_seconds() - own_cpu
            calls = audited_requests(read_audit(audit, offset))
        finally:
            if watcher is not None:
                watcher.stopping = True
            if cluster is not None:
                cluster.stop()  # its log is complete once it has stopped
            plane.stop()
            if log is not None:
                log.parent.mkdir(parents=True, exist_ok=True)
                for source, target in (
                    (cluster.log if cluster else None, log),
                    (plane.workdir / "audit.log", log.with_suffix(".audit")),
                    (plane.workdir / "kube-apiserver.log", log.with_suffix(".apiserver")),
                ):
                    if source is not None and source.exists():
                        shutil.copyfile(source, target)
    watches = sum(count for what, count in calls.items() if what.startswith("watch "))
    return {
        **create_figures(creating, took, created, done, names, started),
        "rss_mb": rss,
        "operator_cpu_s": operator_cpu,
        "server_cpu_s": server_cpu,
        "client_cpu_s": client_cpu,
        "requests_per_job": (sum(calls.values()) - watches) / jobs,
        "watch_restarts": watcher.restarts,
        "calls": calls,
    }


def load_average() -> str:
    """The machine's load average over 1, 5 and 15 minutes (other work on the machine moves the
    figures)."""
    return "/".join(f"{value:.1f}" for value in os.getloadavg())


def line(name: str, run: dict[str, float], jobs: int) -> str:
    """One side's figures of one round (or their medians), as printed."""
    server = f"API server and etcd {run['server_cpu_s']:5.1f} s, " if "server_cpu_s" in run else ""
    client = "client" if "server_cpu_s" in run else "emulator and client"
    return (
        f"{name:>6}: render {run['render_ms']:7.2f} ms/job | create {jobs} jobs {run['create_s']:5.1f} s "
        f"({run['create_ms']:3.0f} ms each) | "
        f"all Pending {run['all_s']:5.1f} s | latency p50 {run['p50_s']:5.2f} s, p95 {run['p95_s']:5.2f} s, "
        f"max {run['max_s']:5.2f} s (p95 from the create's answer {run['p95_returned_s']:5.2f} s) | "
        f"operator peak RSS {run['rss_mb']:4.0f} MB | CPU: operator "
        f"{run['operator_cpu_s']:5.1f} s, {server}{client} {run['client_cpu_s']:5.1f} s | "
        f"{run['requests_per_job']:4.1f} operator requests/job"
    )


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--renders", type=int, default=200, help="renders timed per side and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--before", type=Path, help="a checkout of the older commit, run as 'before'")
    parser.add_argument(
        "--emulator", action="store_true", help="kmock's emulator instead of a real API server"
    )
    parser.add_argument("--logs", type=Path, help="a folder to keep the operators' logs in")
    args = parser.parse_args()
    sides = [Side("after", {})]
    if args.before is not None:
        before = args.before.resolve()
        # Its own job API package too, where it has one: else ours (installed) would stand in for it.
        packages = [str(before / part) for part in ("operator", "api") if (before / part).is_dir()]
        env = {"PYTHONPATH": os.pathsep.join(packages), "BERTJOB_KUSTOMIZE_DIR": str(before / "kustomize")}
        sides.insert(0, Side("before", env, chart=before / "charts" / "bertjob"))
    load = load_emulator if args.emulator else load_real
    print(
        f"{args.jobs} jobs, {args.renders} renders, {args.rounds} rounds, "
        f"{'kmock emulator' if args.emulator else 'real API server'}, sides in turn: "
        + ", ".join(side.name for side in sides)
        + f"; {os.cpu_count()} CPUs, load {load_average()}"
    )
    for round_ in range(1, args.rounds + 1):
        for side in sides:
            render_ms = statistics.median(render_seconds(side, args.renders)) * 1000
            log = args.logs / f"operator-{side.name}-{round_}.log" if args.logs else None
            run: dict[str, Any] = {"render_ms": render_ms, **load(side, args.jobs, log)}
            side.runs.append(run)
            print(
                f"round {round_} " + line(side.name, run, args.jobs) + f" | load {load_average()}", flush=True
            )
            requests = ", ".join(
                f"{what} {count / args.jobs:.2f}" for what, count in run.pop("calls").most_common()
            )
            restarts = f" ({run['watch_restarts']:.0f} watch restarts)" if run.get("watch_restarts") else ""
            print(f"        {side.name} requests per job: {requests}{restarts}", flush=True)
    print("medians over the rounds:")
    for side in sides:
        medians = {key: statistics.median(run[key] for run in side.runs) for key in side.runs[0]}
        print("        " + line(side.name, medians, args.jobs))


if __name__ == "__main__":
    main()
