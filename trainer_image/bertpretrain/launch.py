"""``python -m bertpretrain.launch [torchrun options] --module bertpretrain run --config FILE``:
torchrun that exits with its ranks' exit code.

torchrun (``torch.distributed.run``) exits 1 whenever a rank fails, and when it is stopped by a
signal, so Kubeflow's ``restartPolicy: ExitCode`` would read a preemption (the trainer's 143) or a
full volume (200) as a permanent failure. This is torchrun itself, the same parser (options and
``PET_*`` variables alike) and the same agent, with only its exit status changed:

- a rank failed: the exit code of the first rank to fail, the root cause torch's own summary
  names, since a rank's failure makes the agent stop the others (they exit 143 after SIGTERM, or
  fail in a collective, after it); a rank killed by signal N exits 128 + N, as a shell reports it;
- the agent received signal N (SIGTERM when the pod is deleted): 128 + N, once it has stopped the
  ranks with the same signal (they save a checkpoint first) or its shutdown timeout ran out.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record


def exit_code(error: ChildFailedError) -> int:
    """The exit code that stands for ``error``: its first failure's, as torch picks it
    (``get_first_failure``: the earliest timestamp, in whole seconds, a tie going to the failure
    recorded first), and 128 + N for a rank killed by signal N (torch reports -N)."""
    _, failure = error.get_first_failure()
    return 128 - failure.exitcode if failure.exitcode < 0 else failure.exitcode


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` as torchrun does, run it, and return 0 when every rank succeeded, else
    :func:`exit_code` of the failure, or 128 + the signal that stopped the agent."""
    args = torchrun.parse_args(None if argv is None else list(argv))
    try:
        # As torchrun's main: the root cause's error file becomes this process's, if it has one.
        record(torchrun.run)(args)
    except ChildFailedError as error:
        code = exit_code(error)
        print(f"{error}\nbertpretrain.launch: exit {code}, the first failed rank's", file=sys.stderr)
        return code
    except SignalException as stop:
        code = 128 + int(stop.sigval)
        print(f"bertpretrain.launch: {stop.sigval.name} stopped the ranks; exit {code}", file=sys.stderr)
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
