"""The trainer's entry point with a crash planted from outside: the process SIGKILLs itself at a
chosen point, as the OOM killer or a node failure would kill it, or sends itself SIGTERM once its
work is done, as Kubernetes does when the pod is deleted as the job ends
(tests/bertpretrain/test_crash_resume.py).

    python crash_driver.py POINT COUNT run --config FILE

``POINT`` and ``COUNT`` choose where, the rest is :func:`bertpretrain.run.main`'s command line:

- ``shards``: once COUNT shard files (``*/*.hdf5`` under ``spec.data.shards``) are in place,
  while data preparation's workers may be writing others;
- ``step``: in the COUNT-th optimizer step, after its forward and backward passes, before the
  update;
- ``checkpoint``: halfway through writing the COUNT-th checkpoint (``torch.save``): half of its
  bytes are in the temporary file;
- ``evaluation``: at the COUNT-th held-out batch evaluated;
- ``export``: the COUNT-th time a directory is to be renamed into place from a hidden staging
  directory beside it (``.hf.<suffix>`` to ``hf``): the export, all of its files written, but
  not in place;
- ``sigterm``: SIGTERM (not SIGKILL) right after the COUNT-th export has returned, all of it in
  place.

Nothing in the trainer knows of this: the driver wraps library functions and trainer methods
before calling ``main``, and fails at once (exit 3) when one it wraps no longer exists.

The module imports the standard library alone at its top: data preparation's worker processes
are spawned, and each imports the main module again, which should cost them no more than
``python -m bertpretrain`` (whose ``__main__`` they skip) does.
"""

from __future__ import annotations

import functools
import io
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

POINTS = ("shards", "step", "checkpoint", "evaluation", "export", "sigterm")


def die(*_: Any, **__: Any) -> None:
    """SIGKILL this process: no handler, no ``finally``, no flush runs (arguments are ignored)."""
    os.kill(os.getpid(), signal.SIGKILL)


def terminate(*_: Any, **__: Any) -> None:
    """Send SIGTERM to this process, which its handler, if any, receives (arguments are ignored)."""
    os.kill(os.getpid(), signal.SIGTERM)


def _wrap(owner: Any, name: str, count: int, action: Callable[..., None] = die, after: bool = False) -> None:
    """Replace ``owner.name`` so that its ``count``-th call runs ``action`` (by default: dies)
    first, or with ``after``, once the call has returned."""
    original = getattr(owner, name)
    calls = 0

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == count and not after:
            action(*args, **kwargs)
        result = original(*args, **kwargs)
        if calls == count and after:
            action(*args, **kwargs)
        return result

    setattr(owner, name, wrapper)


def _half_written(original: Callable[..., None]) -> Callable[..., None]:
    """``torch.save`` that puts half of the serialized bytes into its file, then dies."""

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        buffer = io.BytesIO()
        original(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        with open(f, "wb") if isinstance(f, str | os.PathLike) else f as file:
            file.write(data[: len(data) // 2])
            file.flush()
            os.fsync(file.fileno())
        die()

    return save


def _staged_rename(count: int) -> None:
    """``os.rename`` (which ``Path.rename`` calls too) that dies at the ``count``-th move of a
    directory ``.<name>.<suffix>`` to ``<name>`` beside it, before the move."""
    original = os.rename
    moves = 0

    def rename(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal moves
        source, target = Path(source), Path(target)
        if source.is_dir() and source.parent == target.parent and source.name.startswith(f".{target.name}."):
            moves += 1
            if moves == count:
                die()
        original(source, target, *args, **kwargs)

    os.rename = rename  # type: ignore[assignment]


def _watch_shards(config: Path, count: int) -> None:
    """Die from a thread once ``count`` shard files exist under the job's ``spec.data.shards``."""
    import yaml

    root = Path(yaml.safe_load(config.read_text())["spec"]["data"]["shards"])

    def watch() -> None:
        while len(list(root.glob("*/*.hdf5"))) < count:
            time.sleep(0.002)
        die()

    threading.Thread(target=watch, daemon=True).start()


def plant(point: str, count: int, config: Path) -> None:
    """Plant the crash ``point`` (one of ``POINTS``) at its ``count``-th occurrence.

    Raises:
        AttributeError: the trainer's method that the point wraps is no longer there.
        ValueError: an unknown point.
    """
    import torch

    from bertpretrain.runtime import engine
    from bertpretrain.training import export

    if point == "shards":
        _watch_shards(config, count)
    elif point == "step":
        _wrap(engine.Engine, "optimizer_step", count)
    elif point == "checkpoint":
        original = torch.save
        _wrap(torch, "save", count, action=_half_written(original))
    elif point == "evaluation":
        _wrap(engine.Engine, "evaluate", count)
    elif point == "export":
        _staged_rename(count)
    elif point == "sigterm":
        _wrap(export, "export_hf", count, action=terminate, after=True)
    else:
        raise ValueError(f"unknown crash point {point!r}; one of {', '.join(POINTS)}")


def main(argv: list[str]) -> int:
    point, count, *trainer_argv = argv
    config = Path(trainer_argv[trainer_argv.index("--config") + 1])
    try:
        plant(point, int(count), config)
    except (AttributeError, ValueError) as error:
        print(f"crash_driver: cannot plant {point}: {error}", file=sys.stderr)
        return 3
    from bertpretrain import run

    return run.main(trainer_argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
