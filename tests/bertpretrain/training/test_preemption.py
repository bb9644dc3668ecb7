"""Preemption's exit code is the contract's: the one the children's restartPolicy retries."""

from __future__ import annotations

import signal
from pathlib import Path

from bertjob_api import contract
from bertpretrain.training.preemption import Preempted


def test_a_preempted_run_exits_with_the_contracts_retryable_code() -> None:
    stopped = Preempted(signal.SIGTERM, 12, Path("/data/checkpoints/phase1/step_000012.pt"))
    assert stopped.exit_code == contract.EXIT_PREEMPTED
    assert stopped.exit_code in contract.RETRYABLE_EXIT_CODES
