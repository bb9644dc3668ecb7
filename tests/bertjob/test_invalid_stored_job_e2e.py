"""A stored job that the CRD refuses, failed by the operator naming the field, on the emulator.

The emulator: a real API server's CRD schema and CEL rules refuse each of these jobs at create
(tests/cluster/test_handlers_e2e.py checks that it does, and that it prunes the misspelt field), so
only the emulator, which applies neither, can hand them to the operator, as a cluster without the
CRD's schema would (one whose CRD was applied by hand without it, or an older one). What the real
server stores and only the operator refuses is tested there.
"""

from __future__ import annotations

from typing import Any

import pytest

from bertjob_testing.jobs import with_value
from bertjob_testing.kube_emulator import Cluster
from tests.bertjob.e2e import assert_fails_naming
from tests.bertjob.e2e import named_job as _named

HUGE = "x" * 200_000
# (name, field, value, what the operator's message names); a real server refuses each at create.
REFUSED_BY_THE_CRD = [
    # Fits the schema, but 64 sequences cannot be split over 3 processes (CEL).
    ("indivisible", "spec.topology.processesPerNode", 3, "spec.phases[0].globalBatchSize"),
    ("phase-2-shorter", "spec.phases.1.maxSeqLength", 100, "spec.phases[1].maxSeqLength"),
    # What a cluster without the CRD (or with schema validation off) would let through.
    ("mistyped", "spec.image", 5, "spec.image"),
    ("not-a-mapping", "spec", "hello", "spec: Input should be a valid dictionary"),
    ("a-list", "spec", [1, 2], "spec: Input should be a valid dictionary"),
    ("huge-launcher", "spec.launcher", HUGE, "spec.launcher"),
    ("templated-launcher", "spec.launcher", "{{ 7 * 7 }}: {a: [b", "spec.launcher"),
    ("nested-wrong", "spec.runPolicy", {"suspend": "yes"}, "spec.runPolicy.suspend"),
]
# A field the schema does not know: a real server prunes it and stores a valid job.
PRUNED_BY_THE_CRD = [("misspelt", "spec.phases.0.batchSize", 64, "spec.phases[0].batchSize")]


@pytest.mark.parametrize(("name", "field", "value", "named"), REFUSED_BY_THE_CRD + PRUNED_BY_THE_CRD)
def test_a_bad_spec_fails_the_job_naming_the_field(
    cluster: Cluster, name: str, field: str, value: Any, named: str
) -> None:
    cluster.create_job(with_value(_named(name), field, value))

    assert_fails_naming(cluster, name, named)
