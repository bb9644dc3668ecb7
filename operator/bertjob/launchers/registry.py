"""The launchers by name: the one for a job's ``spec.launcher``, or for a child's kind.

Apart from :mod:`bertjob.launchers`, whose types the launcher modules import, so that the package's
``__init__`` imports none of them.
"""

from __future__ import annotations

from bertjob.launchers import Launcher
from bertjob.launchers.mpijob import MPIJobLauncher
from bertjob.launchers.pytorchjob import PyTorchJobLauncher
from bertjob.launchers.trainjob import TrainJobLauncher
from bertjob_api.spec import SpecError

# Each value of spec.launcher and its launcher.
LAUNCHERS: dict[str, Launcher] = {
    "pytorchjob": PyTorchJobLauncher(),
    "mpijob": MPIJobLauncher(),
    "trainjob": TrainJobLauncher(),
}


def get(name: str) -> Launcher:
    """The launcher for ``spec.launcher``.

    Raises:
        SpecError: no launcher of that name is implemented.
    """
    try:
        return LAUNCHERS[name]
    except KeyError:
        raise SpecError("<spec>", [("spec.launcher", f"{name} is not implemented")]) from None


def of_kind(api_version: object, kind: object) -> Launcher | None:
    """The launcher whose child has ``apiVersion`` and ``kind``; None for another kind."""
    return next(
        (
            launcher
            for launcher in LAUNCHERS.values()
            if (launcher.child.api_version, launcher.child.kind) == (api_version, kind)
        ),
        None,
    )
