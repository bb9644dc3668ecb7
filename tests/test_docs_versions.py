"""No doc names a version of a built component, or a tier, that contradicts ``hack/versions.env``.

The docs (README.md, docs/*.md, charts/bertjob/README.md) name the versions the tests build
(``Kueue v0.17.0``, ``kube-apiserver v1.36.3``) and what runs on the version floor. When
versions.env moves, a doc that still says the old version would go on claiming what no test ran.

What counts as a claim (the rule the docs are written to), so that the check has no false
positives:

- **A component's name followed by a version written with a ``v``** and at least a minor
  (``Trainer v2.3.0``, ``CoreDNS v1.15.0``, ``the staging modules at v0.28.15``), or a table row
  whose first cell starts with a component's name and a later cell with such a version. The
  version must be versions.env's (a shorter one its prefix: ``v1.36`` for ``v1.36.3``); the
  Kubernetes binaries may also be at the floor's version. A version without ``v`` is a feature's
  or a minimum's (``Kubernetes 1.30 and newer``, ``kubectl 1.32``, ``etcd 0.3 s``), not checked
  here; the claimed minimum is held to the floor by tests/cluster/test_version_floor.py. A line
  that says the version is an older or newer one (``older``, ``newer``, ``before``, ...) is
  exempt: it speaks of another version on purpose.
- **The floor followed or preceded by a version** (``the floor, v1.28.15``, ``the 1.28 floor``)
  must be ``KUBERNETES_FLOOR_VERSION``.
- **The chart installed, tested or run on the floor** (``the chart is installed on the 1.28
  floor``): only the CRD is installed there (tests/cluster/test_version_floor.py); the chart and
  the operator run on ``KUBERNETES_VERSION``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from bertjob_testing.cluster.catalog import REPO, versions

DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "charts" / "bertjob" / "README.md")
KUBERNETES_BINARIES = (
    "Kubernetes",
    "kube-apiserver",
    "API server",
    "kube-controller-manager",
    "controller-manager",
    "kube-scheduler",
    "scheduler",
    "kubelet",
    "kube-proxy",
    "kubectl",
)
# Each version variable of versions.env: the names the docs give its component (regular
# expressions, matched at word boundaries).
COMPONENTS: dict[str, tuple[str, ...]] = {
    "KUBERNETES_VERSION": KUBERNETES_BINARIES,
    "KUBERNETES_FLOOR_VERSION": KUBERNETES_BINARIES,
    "KUBERNETES_STAGING_VERSION": ("staging modules",),
    "KUBERNETES_FLOOR_STAGING_VERSION": ("staging modules",),
    "ETCD_VERSION": ("etcd",),
    "KWOK_VERSION": ("kwok",),
    "CONTAINERD_VERSION": ("containerd",),
    "CNI_PLUGINS_VERSION": ("CNI plugins", "the plugins"),
    "COREDNS_VERSION": ("CoreDNS",),
    "TRAINING_OPERATOR_VERSION": ("training-operator", "training operator"),
    "MPI_OPERATOR_VERSION": ("mpi-operator",),
    "TRAINER_VERSION": ("Trainer",),
    "JOBSET_VERSION": ("JobSet",),
    "KUEUE_VERSION": ("Kueue",),
    "ACTIONLINT_VERSION": ("actionlint",),
}
# A line with one of these speaks of another version on purpose.
OTHER_VERSION = re.compile(r"\b(older|newer|earlier|later|before|previous|upstream)\b", re.IGNORECASE)
_VERSION = r"v(\d+\.\d+(?:\.\d+)?)(?![\w.]*\d)"  # v1.36 or v1.36.3, not the start of v1.36.3.1
_FLOOR_NUMBER = r"v?(\d+\.\d+(?:\.\d+)?)(?![\w.]*\d)"


def _allowed(env: dict[str, str]) -> dict[str, set[str]]:
    """Each name's allowed versions, without the ``v``."""
    allowed: dict[str, set[str]] = {}
    for variable, names in COMPONENTS.items():
        for name in names:
            allowed.setdefault(name, set()).add(env[variable].removeprefix("v"))
    return allowed


def _matches(claimed: str, allowed: set[str]) -> bool:
    # v1.36 claims the minor of v1.36.3; v1.3 does not.
    return any(version == claimed or version.startswith(claimed + ".") for version in allowed)


def _lines(text: str) -> list[str]:
    return text.splitlines()


def contradictions(doc: str, text: str, env: dict[str, str]) -> Iterator[str]:
    """Each claim of ``text`` (the doc named ``doc``) that versions.env contradicts, as
    ``doc:line: what it says; versions.env says what``."""
    allowed = _allowed(env)
    lines = _lines(text)
    flat = text.replace("\n", " ")  # one offset per character, so that a claim may wrap

    def line_of(offset: int) -> int:
        return text.count("\n", 0, offset) + 1

    names = "|".join(re.escape(name) for name in sorted(allowed, key=len, reverse=True))
    # "Trainer v2.3.0", "kube-apiserver's v1.28.15", "the staging modules at v0.28.15".
    mention = re.compile(rf"\b({names})(?:'s)?\s+(?:at\s+|is\s+)?{_VERSION}")
    found = [(m.start(), m[1], m[2]) for m in mention.finditer(flat)]
    # A table row: its first cell names the component, a later cell starts with its version.
    row = re.compile(rf"^\|\s*({names})\b[^|\n]*\|(?:[^|\n]*\|)*?\s*{_VERSION}", re.MULTILINE)
    found += [(m.start(), m[1], m[2]) for m in row.finditer(text)]
    for offset, name, version in found:
        line = line_of(offset)
        said = lines[line - 1]
        if _matches(version, allowed[name]) or OTHER_VERSION.search(said):
            continue
        wanted = " or ".join(f"v{v}" for v in sorted(allowed[name]))
        yield f"{doc}:{line}: {name} v{version}; hack/versions.env says {wanted}"

    floor = env["KUBERNETES_FLOOR_VERSION"].removeprefix("v")
    floor_claim = re.compile(rf"\bfloor(?:'s)?,?\s+(?:is\s+|of\s+)?{_FLOOR_NUMBER}|{_FLOOR_NUMBER}\s+floor\b")
    for m in floor_claim.finditer(flat):
        version = m[1] or m[2]
        if not _matches(version, {floor}):
            yield f"{doc}:{line_of(m.start())}: the floor {version}; hack/versions.env says v{floor}"

    # "the chart is installed on the 1.28 floor": within one clause (no sentence's end, ; or |
    # between), the chart, then installed/tested/run(s), then on/at and at most three words
    # without a comma ("the", "an API server"), then the floor or its version.
    minor = re.escape(".".join(floor.split(".")[:2]))
    clause = r"(?:(?!\.\s)[^;|])*?"
    on_floor = re.compile(
        rf"\bchart\b{clause}\b(?:installed|tested|runs?|ran)\b{clause}\b(?:on|at)\s+"
        rf"(?:[^\s,;|]+\s+){{0,3}}?(?:floor\b|v?{minor}(?:\.\d+)?\b)",
        re.IGNORECASE,
    )
    for m in on_floor.finditer(flat):
        yield (
            f"{doc}:{line_of(m.start())}: says the chart is on the floor ({m[0]!r}); only the CRD is "
            f"installed on {env['KUBERNETES_FLOOR_VERSION']} (tests/cluster/test_version_floor.py)"
        )


def test_every_version_variable_has_its_component_names() -> None:
    # A new component in versions.env is checked too, once its names are written here.
    variables = {name for name in versions() if name.endswith("_VERSION")}
    assert variables == set(COMPONENTS), sorted(variables ^ set(COMPONENTS))


@pytest.mark.parametrize("doc", DOCS, ids=[str(doc.relative_to(REPO)) for doc in DOCS])
def test_no_doc_contradicts_versions_env(doc: Path) -> None:
    found = list(contradictions(str(doc.relative_to(REPO)), doc.read_text(encoding="utf-8"), versions()))
    assert not found, "\n".join(found)


ENV = {name: "v0.0.0" for name in COMPONENTS} | {
    "KUBERNETES_VERSION": "v1.36.3",
    "KUBERNETES_FLOOR_VERSION": "v1.28.15",
    "KUEUE_VERSION": "v0.17.0",
    "TRAINER_VERSION": "v2.3.0",
}
# What the check must find (the text, a piece of its message) and what it must leave alone.
CONTRADICTIONS = {
    "a Kubernetes version": ("tested on Kubernetes v1.35 here", "Kubernetes v1.35;"),
    "a wrapped line": ("the jobs go through Kueue\nv0.16.0 in the tests", "Kueue v0.16.0;"),
    "a table row": ("| Kueue | `sigs.k8s.io/kueue` | v0.18.0 | its own module |", "Kueue v0.18.0;"),
    "the floor's version": ("the floor, v1.27.3, takes the CRD", "the floor 1.27.3;"),
    "the chart on the floor": ("the chart is installed on the 1.28 floor", "says the chart is on the floor"),
    "the chart tested at the floor": ("The chart was tested at v1.28.15.", "says the chart is on the floor"),
}
CONSISTENT = {
    "the version": "Kubeflow Trainer v2.3.0 with JobSet",
    "its minor": "kube-apiserver v1.36 and Kueue v0.17",
    "the floor's API server": "the CRD on an API server v1.28.15, the chart and the operator on v1.36.3",
    "an older version, said so": "Kueue v0.16.0 and older pin another Trainer",
    "no v: a minimum or a feature": "Kubernetes 1.30 and newer; kubectl 1.32; etcd 0.3 s",
    "the product's name": "Kubeflow Trainer v2 (TrainJob)",
    "only the CRD on the floor": "Only the CRD is installed on the 1.28 floor; the chart runs on v1.36.3.",
}


@pytest.mark.parametrize("case", list(CONTRADICTIONS))
def test_a_contradiction_is_found(case: str) -> None:
    text, message = CONTRADICTIONS[case]
    found = list(contradictions("doc.md", text, ENV))
    assert len(found) == 1 and message in found[0], found


@pytest.mark.parametrize("case", list(CONSISTENT))
def test_a_consistent_mention_is_left_alone(case: str) -> None:
    assert list(contradictions("doc.md", CONSISTENT[case], ENV)) == []
