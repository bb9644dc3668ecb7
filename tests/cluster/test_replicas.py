"""Two replicas of the operator, as the chart runs them (kopf's peering in the chart's
ClusterKopfPeering CRD, under the chart's RBAC), on the real control plane: one reconciles, the
other waits; the one reconciling is SIGKILLed while 50 jobs are created, the other takes over, and
no job is lost or made twice. The takeover time is printed.

The jobs go to a namespace the webhook does not serve: this folder's webhook is routed to its own
standalone operator, which is stopped for the test (two replicas beside it would be three
reconcilers).

Why kwok: no pod needs to run: 50 jobs at once, their children checked as stored objects.
"""

from __future__ import annotations

import time
from pathlib import Path

import attrs
import pytest

from bertjob import progress
from bertjob.admission import PORT_ENV
from bertjob.replicas import LIFETIME_S
from bertjob_testing.cluster.operator import OPERATOR, RealCluster, is_paused
from bertjob_testing.cluster.process import free_port
from tests.cluster.test_operator_killed import JOBS, Burst, _all_pending, _jobs, assert_each_job_once

pytestmark = [pytest.mark.xdist_group("operator"), pytest.mark.slow, pytest.mark.timeout(400)]


def _replica(cluster: RealCluster, workdir: Path) -> RealCluster:
    """Another operator process like ``cluster``'s, in the chart's peering, logging to ``workdir``."""
    workdir.mkdir()
    # Ports of its own: the replicas of a Deployment each have their pod's.
    env = {**cluster.env, PORT_ENV: str(free_port()), progress.PORT_ENV: str(free_port())}
    return attrs.evolve(cluster, workdir=workdir, operator=None, starts=0, peering=OPERATOR, env=env)


def test_the_reconciling_replica_killed_under_50_jobs_the_other_takes_over_losing_nothing(
    unguarded: RealCluster, tmp_path: Path
) -> None:
    cluster = unguarded
    assert cluster.plane is not None
    cluster.stop()  # started again after the test (tests/cluster/conftest.py)
    replicas = [_replica(cluster, tmp_path / f"replica-{index}") for index in range(2)]
    try:
        for replica in replicas:
            replica.start()
        # Once both records are in the peering, the lower priority pauses; the other reconciles.
        cluster.wait_for(
            "one replica to reconcile and the other to pause for it",
            lambda: [is_paused(r.log.read_text()) for r in replicas].count(False) == 1 or None,
            wait_s=60,
        )
        [standby] = [r for r in replicas if is_paused(r.log.read_text())]
        [active] = [r for r in replicas if r is not standby]
        assert active.operator is not None

        names = [f"burst-{index:02d}" for index in range(JOBS)]
        burst = Burst(cluster, names)
        cluster.wait_for(
            "a first job reconciled",
            lambda: burst.errors or any(job.get("status") for job in _jobs(cluster).values()),
        )
        active.operator.kill()
        killed = time.monotonic()
        active.operator.wait(timeout=10)
        killed_at = len(burst.created)
        done_before = sum(bool(job.get("status")) for job in _jobs(cluster).values())
        assert killed_at < JOBS, "killed after every job was created: too late to test a takeover"

        def reconciled_since() -> int | None:
            done = sum(bool(job.get("status")) for job in _jobs(cluster).values())
            return done if done > done_before else None

        cluster.wait_for("the standby to reconcile a job", reconciled_since, wait_s=LIFETIME_S + 60)
        takeover_s = time.monotonic() - killed
        burst.join()

        jobs = cluster.wait_for(
            "every job Pending, its Events posted", lambda: _all_pending(cluster, names), 180
        )
        assert_each_job_once(cluster, names, jobs)
        assert "Resuming operations after the pause" in standby.log.read_text(), standby.log_tail()
        # A killed reconciler's record stands for its lifetime, then the standby resumes.
        assert takeover_s < LIFETIME_S + 30, takeover_s
        print(
            f"\nreconciler killed after {killed_at} of {JOBS} created, {done_before} reconciled; "
            f"takeover {takeover_s:.1f} s"
        )
    finally:
        for replica in replicas:
            replica.stop()
