"""The operator SIGKILLed while 50 jobs are being created, on the real control plane: once it is
started again, no job is lost (each is reconciled and gets its one Pending Event) and nothing is
made twice (each job has exactly one child of each kind, each child exactly one ownerReference, to
its job).

The jobs go to a namespace the webhook does not serve, so that they keep arriving while the
operator is dead: where it serves, the chart's failurePolicy: Fail refuses a job until the operator
is back (tests/cluster/test_e2e_lifecycle.py shows it).

Why kwok: no pod needs to run: 50 jobs at once (scale), their children checked as stored objects;
their pods, each asking for a GPU, could not run on this machine for real.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import pytest
from kubernetes.client import CustomObjectsApi
from kubernetes.config import new_client_from_config

from bertjob.render import JOB_LABEL
from bertjob_api.contract import GROUP, PLURAL, VERSION
from bertjob_testing.cluster.operator import RealCluster
from tests.bertjob.e2e import OWNED, home, named_job

pytestmark = [pytest.mark.xdist_group("operator"), pytest.mark.slow, pytest.mark.timeout(300)]

JOBS = 50
# Seconds between two creations: the 50 take about 6 s, and the kill comes while they arrive (the
# operator takes a second or two over its first job).
PACE_S = 0.1
# What a pytorchjob job's children are, one of each (and no RBAC: tests/cluster/test_progress.py).
CHILDREN = {
    "v1/configmaps",
    "kubeflow.org/v1/pytorchjobs",
}


def _jobs(cluster: RealCluster) -> dict[str, dict[str, Any]]:
    return {
        job["metadata"]["name"]: job for job in cluster.stored(f"{GROUP}/{VERSION}/{PLURAL}", home(cluster))
    }


def _all_pending(cluster: RealCluster, names: list[str]) -> dict[str, dict[str, Any]] | None:
    """The jobs once every one is Pending with its Events posted; None before.

    Raises:
        AssertionError: a job failed (its last condition's message).
    """
    jobs = _jobs(cluster)
    failed = {
        name: job["status"]["conditions"][-1]["message"]
        for name, job in jobs.items()
        if (job.get("status") or {}).get("phase") == "Failed"
    }
    assert not failed, f"jobs failed after the restart: {failed}"
    done = all(
        (jobs.get(name, {}).get("status") or {}).get("phase") == "Pending"
        and not jobs[name]["status"].get("pendingEvents")
        for name in names
    )
    return jobs if done else None


class Burst:
    """The jobs ``names`` created one after another, :data:`PACE_S` apart, by a thread with a
    client of its own (the main thread keeps using ``cluster.api``); ``created`` grows as they are."""

    def __init__(self, cluster: RealCluster, names: list[str]) -> None:
        assert cluster.plane is not None
        self.created: list[str] = []
        self.errors: list[BaseException] = []
        creator = CustomObjectsApi(new_client_from_config(config_file=str(cluster.plane.admin)))

        def create_all() -> None:
            try:
                for name in names:
                    creator.create_namespaced_custom_object(
                        GROUP, VERSION, home(cluster), PLURAL, named_job(name)
                    )
                    self.created.append(name)
                    time.sleep(PACE_S)
            except BaseException as error:  # reported by join()
                self.errors.append(error)

        self.thread = threading.Thread(target=create_all)
        self.thread.start()

    def join(self) -> None:
        """Wait for the last create; fail if one failed."""
        self.thread.join(timeout=60)
        assert not self.thread.is_alive() and not self.errors, self.errors


def assert_each_job_once(cluster: RealCluster, names: list[str], jobs: dict[str, dict[str, Any]]) -> None:
    """No job lost and nothing made twice: every job of ``names`` stored, each with exactly one
    child of each kind, owned once, by its job, and one Pending Event."""
    uids = {name: job["metadata"]["uid"] for name, job in jobs.items()}
    assert sorted(uids) == names

    # Every child of every job: exactly one of each kind, owned once, by its job.
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for resource in OWNED:
        for child in cluster.stored(resource, home(cluster)):
            owner = (child["metadata"].get("labels") or {}).get(JOB_LABEL)
            if owner is None:
                continue
            counts[(owner, resource)] += 1
            refs = child["metadata"].get("ownerReferences") or []
            assert [(ref["uid"], ref.get("controller")) for ref in refs] == [(uids[owner], True)], (
                f"{resource} {child['metadata']['name']}: {refs}"
            )
    for name in names:
        found = {resource: count for (owner, resource), count in counts.items() if owner == name}
        assert found == dict.fromkeys(CHILDREN, 1), (name, found)

    # No event lost nor posted twice: one Pending Event per job.
    pending = collections.Counter(
        event["involvedObject"]["name"]
        for event in cluster.stored("v1/events", home(cluster))
        if event["reason"] == "Pending" and event["involvedObject"].get("kind") == "BertPretrainJob"
    )
    assert {name: pending[name] for name in names} == dict.fromkeys(names, 1)


def test_an_operator_killed_under_50_jobs_loses_none_and_makes_nothing_twice(unguarded: RealCluster) -> None:
    cluster = unguarded
    assert cluster.plane is not None and cluster.operator is not None
    names = [f"burst-{index:02d}" for index in range(JOBS)]
    started = time.monotonic()
    burst = Burst(cluster, names)
    # Killed once it has reconciled a first job and a few more have arrived, in the middle of the
    # burst. Whether a job is half-reconciled at that moment is up to the operator's pace (it can
    # keep up with one job per PACE_S), so only the jobs that arrive while it is dead are certain.
    cluster.wait_for(
        "a first job reconciled and 5 created",
        lambda: (
            burst.errors
            or (len(burst.created) >= 5 and any(job.get("status") for job in _jobs(cluster).values()))
        ),
    )
    cluster.operator.kill()
    killed_at = len(burst.created)
    cluster.operator.wait(timeout=10)
    done = sum(bool(job.get("status")) for job in _jobs(cluster).values())
    assert killed_at < JOBS, f"the burst ended before the kill: {killed_at} created, {done} reconciled"
    burst.join()
    cluster.start()

    jobs = cluster.wait_for("every job Pending, its Events posted", lambda: _all_pending(cluster, names), 120)
    elapsed = time.monotonic() - started
    assert_each_job_once(cluster, names, jobs)
    print(
        f"\nkilled after {killed_at} of {JOBS} created, {done} reconciled; all reconciled in {elapsed:.1f} s"
    )
