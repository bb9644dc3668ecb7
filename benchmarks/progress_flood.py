"""Reconciliation while one pod floods the operator's progress endpoint, against the same without
the flood, on a real control plane (issue 46: "1,000 reports a second from one pod are rate-limited
without slowing reconciliation").

    python benchmarks/progress_flood.py                      # 100 jobs per side, 2 rounds
    python benchmarks/progress_flood.py --jobs 200 --threads 8

One control plane for the run (:mod:`bertjob_testing.cluster`), the chart installed and the
operator running as in the cluster tests (:func:`bertjob_testing.cluster.operator.install`: a local
``kopf run`` under the chart's ServiceAccount token, its progress endpoint on 127.0.0.1). A job
``flooder`` and a stand-in pod of it (labelled as its pods are) give a token bound to that pod for
the audience ``bertjob.dev``, as the kubelet projects it. Each round runs both sides in turn: ``quiet``
creates ``--jobs`` jobs one after another and times each until it is Pending with its PyTorchJob
(the watches of benchmarks/operator_load.py); ``flood`` does the same while ``--threads`` threads
POST valid reports with that token as fast as they can, each a new HTTPS connection as the
trainer's are. It prints per side and round: the reconcile latency p50, p95 and max, and for the
flood the reports sent per second and how they were answered (429 is the rate limit).
"""

from __future__ import annotations

import argparse
import collections
import json
import ssl
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from kubernetes.client import CustomObjectsApi

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testing"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from operator_load import LOAD_NAMESPACE, TIMEOUT_S, Watcher, load_average

from bertjob_api.contract import JOB_LABEL, PROGRESS_AUDIENCE, PROGRESS_CA_KEY, PROGRESS_URL_KEY
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.operator import install, wait_until
from bertjob_testing.jobs import valid_job, with_value

FLOODER = "flooder"


class Flood:
    """``threads`` threads POSTing ``body`` to ``url`` with ``token`` until stopped; answers counted."""

    def __init__(self, url: str, ca: Path, token: str, threads: int) -> None:
        self.codes: collections.Counter[int] = collections.Counter()
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        progress = {"phase": 1, "step": 1, "totalSteps": 10, "updateTime": "2026-12-05T00:00:00Z"}
        self.request = (url, json.dumps({"progress": progress}).encode(), token)
        self.context = ssl.create_default_context(cafile=str(ca))
        self.threads = [threading.Thread(target=self._post, daemon=True) for _ in range(threads)]
        self.started = time.perf_counter()
        for thread in self.threads:
            thread.start()

    def _post(self) -> None:
        url, body, token = self.request
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        while not self.stopping.is_set():
            request = urllib.request.Request(url, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=10, context=self.context) as answer:
                    code = answer.status
            except urllib.error.HTTPError as error:
                code = error.code
            except OSError:
                code = 0
            with self.lock:
                self.codes[code] += 1

    def stop(self) -> tuple[float, collections.Counter[int]]:
        """Stop; reports sent per second, and the answers by HTTP status (0: no answer)."""
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=30)
        return sum(self.codes.values()) / (time.perf_counter() - self.started), self.codes


def flooder(plane: ControlPlane, workdir: Path) -> tuple[str, Path, str]:
    """The job ``flooder``, a stand-in pod of it and a token bound to that pod: its report URL,
    the endpoint's CA (a file in ``workdir``) and the token."""
    job = with_value(valid_job(), "metadata.name", FLOODER)
    plane.kubectl("apply", "-n", LOAD_NAMESPACE, "-f", "-", input=json.dumps(job))
    config = wait_until(
        "the flooder's ConfigMap",
        lambda: plane.kubectl.get("configmap", f"{FLOODER}-job", "-n", LOAD_NAMESPACE),
    )["data"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{FLOODER}-master-0", "labels": {JOB_LABEL: FLOODER}},
        "spec": {"containers": [{"name": "trainer", "image": "trainer"}]},
    }
    plane.kubectl("apply", "-n", LOAD_NAMESPACE, "-f", "-", input=json.dumps(pod))
    wait_until(
        "the default account", lambda: plane.kubectl.get("serviceaccount", "default", "-n", LOAD_NAMESPACE)
    )
    token = plane.kubectl(
        "create",
        "token",
        "default",
        "-n",
        LOAD_NAMESPACE,
        f"--audience={PROGRESS_AUDIENCE}",
        "--bound-object-kind=Pod",
        f"--bound-object-name={FLOODER}-master-0",
        "--duration=1h",
    ).stdout.strip()
    ca = workdir / "ca.crt"
    ca.write_text(config[PROGRESS_CA_KEY])
    return config[PROGRESS_URL_KEY], ca, token


def reconcile(objects: CustomObjectsApi, watcher: Watcher, names: list[str]) -> list[float]:
    """Create the jobs one after another; each one's seconds until it is Pending with its child."""
    created: dict[str, float] = {}
    for name in names:
        created[name] = time.perf_counter()
        job = with_value(valid_job(), "metadata.name", name)
        objects.create_namespaced_custom_object(
            "bertjob.dev", "v1alpha1", LOAD_NAMESPACE, "bertpretrainjobs", job
        )
    deadline = time.perf_counter() + TIMEOUT_S
    while not set(names) <= set(done := watcher.done()) and time.perf_counter() < deadline:
        time.sleep(0.05)
    missing = set(names) - set(done)
    if missing:
        raise SystemExit(f"{len(missing)} jobs not reconciled in {TIMEOUT_S} s")
    return [done[name] - created[name] for name in names]


def figures(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p95 = ordered[max(0, round(0.95 * len(ordered)) - 1)]
    return f"latency p50 {statistics.median(ordered):5.2f} s, p95 {p95:5.2f} s, max {ordered[-1]:5.2f} s"


def main() -> None:
    """Run the rounds and print each side's figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=100, help="jobs per side and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4, help="threads posting reports in the flood")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        (Path(workdir) / "plane").mkdir()
        plane = ControlPlane(Path(workdir) / "plane")
        plane.start()
        cluster = None
        try:
            cluster = install(plane, Path(workdir) / "operator")
            plane.kubectl("create", "namespace", LOAD_NAMESPACE)
            url, ca, token = flooder(plane, Path(workdir))
            objects = CustomObjectsApi(cluster.api)
            watcher = Watcher(objects, LOAD_NAMESPACE)
            print(
                f"{args.jobs} jobs per side, {args.rounds} rounds, {args.threads} flood threads; "
                f"load {load_average()}"
            )
            for round_ in range(1, args.rounds + 1):
                for side in ("quiet", "flood"):
                    flood = Flood(url, ca, token, args.threads) if side == "flood" else None
                    latencies = reconcile(
                        objects, watcher, [f"r{round_}-{side}-{i:03d}" for i in range(args.jobs)]
                    )
                    line = f"round {round_} {side:5}: {figures(latencies)}"
                    if flood is not None:
                        rate, codes = flood.stop()
                        answers = ", ".join(
                            f"{code or 'none'} {count}" for code, count in sorted(codes.items())
                        )
                        line += f" | reports {rate:6.0f}/s: {answers}"
                    print(line + f" | load {load_average()}", flush=True)
            watcher.stopping = True
        finally:
            if cluster is not None:
                cluster.stop()
            plane.stop()


if __name__ == "__main__":
    main()
