"""tests/conftest.py's CI=true rule: in CI a skip fails, a module skipped as it is collected too,
unless its reason is one CI_SKIPS allows (no GPU, a case a test declares not applicable).

Each case runs pytest on a small module of its own (pytester) with the rule's two hooks as that
run's conftest.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

CONFTEST = "from tests.conftest import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401\n"
PASSING = "def test_passes():\n    pass\n"


def _run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: bool, module: str
) -> pytest.RunResult:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_a=module, test_b=PASSING)
    if ci:
        monkeypatch.setenv("CI", "true")
    else:
        monkeypatch.delenv("CI", raising=False)
    # pytest-asyncio only warns about its settings here: these modules have no coroutine.
    return pytester.runpytest("-p", "no:cacheprovider", "-p", "no:asyncio")


MISSING_MODULE = "import pytest\n\npytest.importorskip('bertjob_no_such_module')\n\n" + PASSING


def test_a_module_skipped_at_collection_fails_under_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _run(pytester, monkeypatch, True, MISSING_MODULE)

    # A failed collection: pytest runs no test at all.
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*CI=true and this module skipped at collection: *could not import 'bertjob_no_such_module'*"]
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED


def test_a_module_skipped_at_collection_only_skips_outside_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run(pytester, monkeypatch, False, MISSING_MODULE).assert_outcomes(passed=1, skipped=1)


def test_a_module_may_skip_under_ci_for_a_reason_ci_allows(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = "import pytest\n\npytest.skip('no GPU here', allow_module_level=True)\n"
    _run(pytester, monkeypatch, True, module).assert_outcomes(passed=1, skipped=1)


@pytest.mark.parametrize(
    ("reason", "outcomes"),
    [
        ("helm is not installed", {"passed": 1, "failed": 1}),
        ("CUDA is not available", {"passed": 1, "skipped": 1}),
    ],
)
def test_a_test_that_skips_fails_under_ci_unless_ci_allows_its_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, reason: str, outcomes: dict[str, int]
) -> None:
    module = f"import pytest\n\ndef test_skips():\n    pytest.skip({reason!r})\n"
    _run(pytester, monkeypatch, True, module).assert_outcomes(**outcomes)
