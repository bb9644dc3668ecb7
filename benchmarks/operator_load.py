"""The operator under load: many BertPretrainJobs created at once against the Kubernetes emulator.

    python benchmarks/operator_load.py            # 200 jobs
    python benchmarks/operator_load.py --jobs 50

Starts kmock's emulator on 127.0.0.1 and ``kopf run -m bertjob.handlers`` against it, as the
end-to-end tests do (``tests/kube_emulator.py``), creates the jobs one after another as fast as
the client goes, and prints: the time from the first create to every job's children existing
and its status Pending; each job's reconcile latency (its create to its status Pending with its
children present), p50 and p95; and the operator's peak resident memory (VmHWM of the kopf
process). Each job is rendered with ``kubectl kustomize`` (about 0.1 s), which bounds the rate.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import yaml

from bertjob_api.crd import crd
from bertjob_testing.jobs import valid_job, with_value
from bertjob_testing.kube_emulator import running_cluster

UPSTREAM = Path(__file__).resolve().parents[2] / "shared" / "upstream-crds" / "kubeflow.org_pytorchjobs.yaml"
TIMEOUT_S = 600


def peak_rss_mb(pid: int) -> float:
    """VmHWM (peak resident set) of a process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    args = parser.parse_args()
    crds = [crd(), yaml.safe_load(UPSTREAM.read_text())]
    with tempfile.TemporaryDirectory() as workdir, running_cluster(Path(workdir), crds) as cluster:
        assert cluster.operator is not None
        names = [f"load-{index:04d}" for index in range(args.jobs)]
        created: dict[str, float] = {}
        done: dict[str, float] = {}

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
        started = time.perf_counter()
        for name in names:
            created[name] = time.perf_counter()
            cluster.create_job(with_value(valid_job(), "metadata.name", name))
        watcher.join(timeout=TIMEOUT_S)
        if len(done) < len(names):
            raise SystemExit(f"only {len(done)} of {len(names)} jobs reconciled in {TIMEOUT_S} s")
        total = max(done.values()) - started
        latencies = sorted(done[name] - created[name] for name in names)
        quantiles = statistics.quantiles(latencies, n=100)
        print(f"jobs: {len(names)}")
        print(f"creating them took {created[names[-1]] - started:.1f} s")
        print(
            f"all children created and every status Pending after {total:.1f} s "
            f"({len(names) / total:.1f} jobs/s)"
        )
        print(
            f"reconcile latency: p50 {quantiles[49]:.2f} s, p95 {quantiles[94]:.2f} s, "
            f"max {latencies[-1]:.2f} s"
        )
        print(f"operator peak RSS (VmHWM): {peak_rss_mb(cluster.operator.pid):.0f} MB")


if __name__ == "__main__":
    main()
