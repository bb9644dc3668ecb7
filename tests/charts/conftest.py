"""Fixtures running the real helm binary against charts/bertjob."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm_chart import CHART, NAMESPACE, RELEASE, helm_or_skip


@pytest.fixture(scope="session")
def helm() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run helm with the given arguments; the completed process (not checked)."""
    binary = helm_or_skip()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)

    return run


@pytest.fixture(scope="session")
def render(
    helm: Callable[..., subprocess.CompletedProcess[str]], tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., list[dict[str, Any]]]:
    """``render(values={...}, files=[...])``: the objects ``helm template`` makes of the chart with
    those values (a dict, given as a values file) and values files, in release namespace
    bertjob-system. A failure fails the test with helm's message."""
    directory = tmp_path_factory.mktemp("values")
    counter = iter(range(1_000_000))

    def run(
        values: Mapping[str, Any] | None = None, files: tuple[Path, ...] | list[Path] = ()
    ) -> list[dict[str, Any]]:
        arguments = [f"--values={file}" for file in files]
        if values is not None:
            path = directory / f"{next(counter)}.yaml"
            # JSON is YAML: the values reach helm exactly as the test wrote them.
            path.write_text(json.dumps(values))
            arguments.append(f"--values={path}")
        result = helm("template", RELEASE, str(CHART), f"--namespace={NAMESPACE}", *arguments)
        assert result.returncode == 0, result.stderr
        return [obj for obj in yaml.safe_load_all(result.stdout) if obj]

    return run
