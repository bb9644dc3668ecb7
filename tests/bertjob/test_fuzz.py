"""Property-based fuzzing of job documents (issue 15), with hypothesis.

Each example starts from a job that works (bertjob_testing.jobs.valid_job() made into each launcher
and topology, and the examples/ jobs) and mutates it a few times: hostile text in a string field or a
name (YAML, JSON and shell metacharacters, newlines, ``{{ }}``, Unicode, NUL, lone surrogates,
very long strings), values of the wrong type, numbers out of range (int32 and int64 bounds, NaN,
infinity), Kubernetes objects passed through to the pods with a mutation deep inside, nesting
thousands of levels deep, unknown keys, missing fields. The invariant, for what ``bertjob validate``
(parse_job, then cluster_job) and :func:`bertjob.render.render` do with it:

- either both refuse it with a SpecError whose every problem names a field (or the file's
  line) on one line,
- or both accept it, and then every rendered object passes Kubernetes' schema (kubernetes-validate,
  strict) and the child its Kubeflow CRD's schema, the document passes our own CRD's schema (what
  validate accepts, kubectl apply accepts), the ConfigMap's job.yaml reads back as the validated
  job, and every injected string that reaches the child comes out there verbatim as a string.

Anything else (another exception, an example slower than DEADLINE) fails the test. The same holds
for the CLI: `bertjob validate FILE` on each document written as YAML exits 0 or 2, never with a
traceback.

Reproducibility: the examples are derandomized (hypothesis derives its seed from each test) and no
example database is kept, so `make test` tries the same examples on every run and machine and a red
build is the commit's doing, not a new draw's. To explore beyond them, draw afresh and more often:

    BERTJOB_FUZZ_RANDOM=1 BERTJOB_FUZZ_EXAMPLES=2000 .venv/bin/pytest tests/bertjob/test_fuzz.py

(a failure prints the seed to rerun it with, ``@seed(...)``; add the document it found to a test).
"""

from __future__ import annotations

import copy
import math
import os
import random
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from bertjob.cli import main
from bertjob.launchers import registry
from bertjob.render import render
from bertjob_api.crd import resource_schema
from bertjob_api.jobfile import dump, read_document
from bertjob_api.spec import BertPretrainJob, SpecError, parse_job, to_document
from bertjob_api.validation import cluster_job
from bertjob_testing.jobs import INJECTIONS, example, valid_job, with_value
from tests.k8s_schema import errors

KUBERNETES_VERSION = "1.33"
EXAMPLES = int(os.environ.get("BERTJOB_FUZZ_EXAMPLES", "0"))
RANDOM = bool(os.environ.get("BERTJOB_FUZZ_RANDOM"))
DEADLINE = timedelta(seconds=20)


def _settings(examples: int, *allowed: HealthCheck) -> settings:
    return settings(
        max_examples=EXAMPLES or examples,
        deadline=DEADLINE,
        derandomize=not RANDOM,
        database=None,
        # Rendering runs kustomize (~0.2 s), and a long string is large on purpose.
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, *allowed],
    )


# -- The jobs mutated ----------------------------------------------------------------------------


def _variant(changes: dict[str, Any]) -> dict[str, Any]:
    document = valid_job()
    for field, value in changes.items():
        document = with_value(document, field, value)
    return document


POD = {
    "resources": {"requests": {"cpu": 0.5, "memory": "1Gi"}, "limits": {"memory": 2**31}},
    "nodeSelector": {"node.kubernetes.io/instance-type": "m5.large"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    },
    "env": [{"name": "HF_HOME", "value": "/data/hf"}],
    "securityContext": {"runAsUser": 1000, "fsGroup": 1000},
    "imagePullSecrets": ["registry"],
    "serviceAccountName": "trainer",
}
BATCHES = {"spec.phases.0.globalBatchSize": 96, "spec.phases.1.globalBatchSize": 48}
BASES: dict[str, dict[str, Any]] = {
    "valid_job": valid_job(),
    "pytorchjob-3-nodes-pod": _variant(
        {**BATCHES, "spec.topology.nodes": 3, "spec.pod": POD, "spec.queueName": "team-a"}
    ),
    "mpijob-2-nodes-prepare": _variant(
        {
            **BATCHES,
            "spec.launcher": "mpijob",
            "spec.accelerator": "xeon-cpu",
            "spec.topology": {"nodes": 2, "processesPerNode": 2},
            "spec.prepare": {"enabled": True, "resources": {"requests": {"cpu": 2}}},
            "spec.volumes": [
                {
                    "name": "data",
                    "mountPath": "/data",
                    "source": {"persistentVolumeClaim": {"claimName": "d"}},
                }
            ],
            "spec.runPolicy": {"backoffLimit": 3, "schedulingPolicy": {"minAvailable": 3}},
        }
    ),
    "pytorchjob-elastic": _variant(
        {**BATCHES, "spec.topology.nodes": 2, "spec.elastic": {"minNodes": 1, "maxNodes": 3}}
    ),
    # Trainer v2 refuses what its runtime holds (priorityClassName, schedulerName, imagePullPolicy).
    "trainjob-torch-3-nodes-pod": _variant(
        {
            **BATCHES,
            "spec.launcher": "trainjob",
            "spec.topology.nodes": 3,
            "spec.pod": POD,
            "spec.queueName": "team-a",
        }
    ),
    "trainjob-mpi-2-nodes-prepare": _variant(
        {
            **BATCHES,
            "spec.launcher": "trainjob",
            "spec.trainJob": {"mlPolicy": "mpi", "runtimeRef": {"name": "platform-mpi"}},
            "spec.accelerator": "xeon-cpu",
            "spec.topology": {"nodes": 2, "processesPerNode": 2},
            "spec.prepare": {"enabled": True, "resources": {"requests": {"cpu": 2}}},
            "spec.pod": POD,
            "spec.runPolicy": {"activeDeadlineSeconds": 86400, "suspend": True},
        }
    ),
    **{
        name: example(f"{name}.yaml")
        for name in (
            "bert-base-8xa100",
            "bert-large-1x8xa100",
            "bert-large-gaudi",
            "bert-large-xeon-mpijob",
            "bert-base-trainjob",
            "bert-tiny-local",  # refused: its paths are relative, for `bertjob run`
        )
    },
}

# Fields a base may lack that a mutation may set, to reach every check.
OPTIONAL = [
    ("metadata", "namespace"),
    ("spec", "queueName"),
    ("spec", "image"),
    ("spec", "pod", "affinity"),
    ("spec", "pod", "tolerations"),
    ("spec", "pod", "env"),
    ("spec", "pod", "securityContext"),
    ("spec", "pod", "nodeSelector"),
    ("spec", "pod", "serviceAccountName"),
    ("spec", "pod", "priorityClassName"),
    ("spec", "pod", "schedulerName"),
    ("spec", "pod", "imagePullSecrets"),
    ("spec", "pod", "resources", "requests", "cpu"),
    ("spec", "pod", "resources", "limits", "nvidia.com/gpu"),
    ("spec", "volumes"),
    ("spec", "runPolicy", "backoffLimit"),
    ("spec", "runPolicy", "schedulingPolicy", "minAvailable"),
    ("spec", "runPolicy", "schedulingPolicy", "queue"),
    ("spec", "elastic"),
    ("spec", "model", "initFrom"),
    ("spec", "export", "path"),
    ("spec", "logging", "path"),
    ("spec", "mpi", "sshAuthMountPath"),
    ("spec", "prepare", "enabled"),
]
# Kubernetes objects a pod field takes, each valid; a mutation then goes inside one.
PASS_THROUGH: dict[tuple[str, ...], list[Any]] = {
    ("spec", "pod", "affinity"): [POD["affinity"], {"podAntiAffinity": {}}],
    ("spec", "pod", "tolerations"): [POD["tolerations"], [{"operator": "Exists"}]],
    ("spec", "pod", "env"): [
        POD["env"],
        [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
    ],
    ("spec", "pod", "securityContext"): [
        POD["securityContext"],
        {"seccompProfile": {"type": "RuntimeDefault"}},
    ],
    ("spec", "volumes"): [
        [{"name": "data", "mountPath": "/data", "source": {"emptyDir": {"sizeLimit": "10Gi"}}}],
        [
            {
                "name": "corpus",
                "mountPath": "/corpus",
                "readOnly": True,
                "source": {"nfs": {"server": "s", "path": "/c"}},
            }
        ],
    ],
}

# -- What is injected ----------------------------------------------------------------------------

HOSTILE = [
    *INJECTIONS,
    "; rm -rf / #",
    "- a\n- b",
    "{a: 1}",
    "[1, 2]",
    "&anchor *alias",
    "<<: *a",
    "'\"\\",
    "null",
    "~",
    "y",
    "NO",
    "0x1F",
    "1e3",
    "4:16",
    ".inf",
    "-1",
    "",
    " ",
    "\t",
    "\r\n",
    "\x00",
    "\ud800",
    "\u2028",
    "\ufeffbom",
    "é\u0301",
    "名前",
    "🚀",
]
# Over a label's 63 characters, a subdomain's 253, and far over anything (a path on /data).
long_text = st.builds(
    lambda n, start: start + "x" * n,
    st.sampled_from([64, 254, 5000, 200_000]),
    st.sampled_from(["", "/data/"]),
)
text = st.one_of(
    st.sampled_from(HOSTILE),
    long_text,
    st.text(max_size=24),
    st.builds(lambda name: "/data/" + name, st.text(max_size=16)),
    st.from_regex(r"[a-z][-a-z0-9]{0,70}", fullmatch=True),
)
number = st.one_of(
    st.sampled_from(
        [
            *(0, -1, 1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30),
            *(0.5, 1e30, -0.0, math.nan, math.inf, -math.inf, True, False),
        ]
    ),
    st.integers(),
    st.floats(),
)
KEYS = [
    "name",
    "value",
    "key",
    "operator",
    "values",
    "path",
    "claimName",
    "runAsUser",
    "sizeLimit",
    "nodeSelectorTerms",
]
scalar = st.one_of(st.none(), number, text)
json_value = st.recursive(
    scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), text), inner, max_size=3),
    ),
    max_leaves=8,
)


def _deep(depth: int, as_list: bool) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value] if as_list else {"nodeAffinity": value}
    return value


deep = st.builds(_deep, st.sampled_from([40, 101, 1000, 20_000]), st.booleans())
# What PyYAML can still write (its emitter recurses once per level).
deep_cli = st.builds(_deep, st.sampled_from([40, 101, 150]), st.booleans())

# -- Mutating a document -------------------------------------------------------------------------

Location = tuple[str | int, ...]


def _locations(value: Any, depth: int = 12) -> list[Location]:
    """Every field and list item under ``value`` (not ``value`` itself), down to ``depth`` levels."""
    found: list[Location] = []
    stack: list[tuple[Location, Any]] = [((), value)]
    while stack:
        here, item = stack.pop()
        if len(here) >= depth:
            continue
        children = (
            item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else []
        )
        for key, child in children:
            found.append((*here, key))
            stack.append(((*here, key), child))
    return sorted(found, key=repr)


def _parent(document: Any, location: Location, create: bool) -> Any:
    node = document
    for part in location[:-1]:
        if isinstance(node, dict) and (part in node or create):
            node = node.setdefault(part, {}) if create else node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return None
    return node


def _set(document: Any, location: Location, value: Any) -> bool:
    node, last = _parent(document, location, create=True), location[-1]
    fits = isinstance(node, dict) and isinstance(last, str)
    fits = fits or (isinstance(node, list) and isinstance(last, int) and last < len(node))
    if fits:
        node[last] = value
    return fits


def _short(value: Any, depth: int = 0) -> Any:
    """``value`` with long strings cut and deep nesting elided, for a failure's report."""
    if depth > 20:
        return "<deeper>"
    if isinstance(value, str):
        return value if len(value) <= 80 else f"{value[:40]}...<{len(value)} characters>"
    if isinstance(value, dict):
        return {_short(key, depth + 1): _short(child, depth + 1) for key, child in value.items()}
    if isinstance(value, list):
        return [_short(child, depth + 1) for child in value]
    return value


class Mutated:
    """A document and the strings injected into it, by where they went."""

    def __init__(self, document: dict[str, Any]):
        self.document = document
        self.injected: dict[Location, str] = {}

    def __repr__(self) -> str:
        return f"Mutated({_short(self.document)!r})"

    def set(self, location: Location, value: Any) -> None:
        if _set(self.document, location, value):
            self.injected = {
                where: s for where, s in self.injected.items() if where[: len(location)] != location
            }
            if isinstance(value, str):
                self.injected[location] = value


def _current(document: Any, location: Location) -> Any:
    parent = _parent(document, location, create=False)
    last = location[-1]
    if isinstance(parent, dict):
        return parent.get(last)
    if isinstance(parent, list) and isinstance(last, int) and last < len(parent):
        return parent[last]
    return None


def _like(draw: st.DrawFn, current: Any, cli: bool) -> Any:
    """A value for a field that holds ``current``: mostly of its type (hostile text for a string,
    often appended to it so that a path stays on its volume; an out-of-range number for a number),
    sometimes anything at all."""
    if isinstance(current, str):
        like = st.one_of(text, st.builds(lambda suffix: current + suffix, st.sampled_from(HOSTILE) | text))
    elif isinstance(current, bool):
        like = st.booleans()
    elif isinstance(current, int):
        like = st.one_of(number, st.builds(lambda step: current + step, st.integers(-2, 2)))
    elif isinstance(current, float):
        like = st.one_of(
            number, st.builds(lambda factor: current * factor, st.sampled_from([0.5, 2.0, 1e-9]))
        )
    else:
        like = st.one_of(json_value, text, number)
    anything = st.one_of(json_value, deep_cli if cli else deep)
    return draw(st.one_of(like, like, like, anything))


MUTATIONS = ["replace"] * 6 + ["pass-through"] * 2 + ["extra", "delete"]


@st.composite
def mutated(draw: st.DrawFn, cli: bool = False) -> Mutated:
    """A base document with one to three mutations; ``cli`` keeps nesting within what a YAML
    writer can write."""
    base = draw(st.sampled_from(sorted(BASES)))
    job = Mutated(copy.deepcopy(BASES[base]))
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 2, 3]))):
        # Uniformly, by a seed: hypothesis draws the first of a sampled_from's elements (and of a
        # random's choices) far more often than the others.
        location = random.Random(draw(st.integers(0, 2**32))).choice(_locations(job.document) + OPTIONAL)
        kind = draw(st.sampled_from(MUTATIONS))
        if kind == "replace":
            job.set(location, _like(draw, _current(job.document, location), cli))
        elif kind == "extra":
            job.set((*location, draw(text)), draw(scalar))
        elif kind == "delete":
            parent = _parent(job.document, location, create=False)
            if isinstance(parent, dict) and location[-1] in parent:
                del parent[location[-1]]
                job.injected = {w: s for w, s in job.injected.items() if w[: len(location)] != location}
        else:
            slot = draw(st.sampled_from(sorted(PASS_THROUGH)))
            value = copy.deepcopy(draw(st.sampled_from(PASS_THROUGH[slot])))
            inside = _locations(value)
            if inside:
                where = draw(st.sampled_from(inside))
                _set(value, where, _like(draw, _current(value, where), cli))
            job.set(slot, value)
    return job


# -- The invariant -------------------------------------------------------------------------------


def _assert_names_fields(error: SpecError) -> None:
    assert error.problems, error
    assert str(error).startswith(f"{error.source}: invalid BertPretrainJob\n")
    for path, message in error.problems:
        assert path and message, error.problems
        assert "\n" not in path and "\n" not in message, (path, message)
        assert path.split(".")[0].split("[")[0] in {"apiVersion", "kind", "metadata", "spec", ""}, path
        assert len(path) + len(message) < 2000, (path[:200], message[:200])


def _strings(value: Any) -> Iterator[str]:
    """Every string in ``value``: values and keys."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            yield from (key for key in item if isinstance(key, str))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_nulls(child) for key, child in value.items() if child is not None}
    if isinstance(value, list):
        return [_without_nulls(child) for child in value]
    return value


def _pods(child: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = child["spec"]
    if child["kind"] == "TrainJob":
        return {"node": registry.get("trainjob").trainer_template(child)}
    replicas = spec.get("pytorchReplicaSpecs") or spec["mpiReplicaSpecs"]
    return {name: replica["template"] for name, replica in replicas.items()}


def _assert_valid_kubernetes(obj: dict[str, Any], schemas: dict[str, dict[str, Any]]) -> None:
    if obj["kind"] in schemas:
        problems = errors(obj, schemas[obj["kind"]])
        assert not problems, problems
        for name, pod in _pods(obj).items():
            template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name.lower()}}
            kubernetes_validate.validate({**template, "template": pod}, KUBERNETES_VERSION, strict=True)
    else:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


# Fields whose value the child carries as written (paths under them).
REACHES_CHILD = [
    ("spec", "image"),
    ("spec", "pod"),
    ("spec", "volumes"),
    ("spec", "queueName"),
    ("metadata", "namespace"),
]


def _check(job: Mutated, schemas: dict[str, dict[str, Any]], note: Any = event) -> None:
    """The invariant (see the module's docstring); ``note`` records the outcome (hypothesis' event)."""
    document = job.document
    parsed: BertPretrainJob | None = None
    try:
        parsed = parse_job(document)
        accepted = cluster_job(parsed)
    except SpecError as error:
        note("refused by " + ("cluster_job" if parsed is not None else "parse_job"))
        _assert_names_fields(error)
        if parsed is not None:
            # The operator renders with the same checks.
            with pytest.raises(SpecError) as refused:
                render(parsed)
            assert refused.value.problems == error.problems
        return
    note("accepted and rendered")
    rendered = render(parsed)

    prepare = accepted.spec.prepare.enabled
    kinds = ["ConfigMap", *(["Job"] if prepare else []), _child_kind(accepted)]
    assert [obj["kind"] for obj in rendered] == kinds
    for obj in rendered:
        _assert_valid_kubernetes(obj, schemas)
    # What validate accepts, kubectl apply accepts (the API server drops a null, as if unset).
    assert not errors(_without_nulls(document), schemas["BertPretrainJob"])
    with tempfile.TemporaryDirectory() as folder:
        job_file = Path(folder) / "job.yaml"
        job_file.write_text(rendered[0]["data"]["job.yaml"], encoding="utf-8")
        assert read_document(job_file) == to_document(accepted)
    child_strings = set(_strings(rendered[-1]))
    for location, injected in job.injected.items():
        if any(location[: len(prefix)] == prefix for prefix in REACHES_CHILD):
            assert injected in child_strings, (location, injected[:200])


def _child_kind(job: BertPretrainJob) -> str:
    return registry.get(job.spec.launcher).child.kind


class Schemas(dict[str, dict[str, Any]]):
    """The openAPIV3Schemas by kind; a short repr, as hypothesis prints a failing call's arguments."""

    def __repr__(self) -> str:
        return f"Schemas({', '.join(self)})"


@pytest.fixture(scope="module")
def schemas(
    pytorchjob_schema: dict[str, Any], mpijob_schema: dict[str, Any], trainjob_schema: dict[str, Any]
) -> Schemas:
    return Schemas(
        PyTorchJob=pytorchjob_schema,
        MPIJob=mpijob_schema,
        TrainJob=trainjob_schema,
        BertPretrainJob=resource_schema(),
    )


# -- The tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BASES))
def test_each_base_is_accepted_unless_meant_for_run(name: str, schemas: dict[str, dict[str, Any]]) -> None:
    job = Mutated(copy.deepcopy(BASES[name]))
    if name == "bert-tiny-local":
        with pytest.raises(SpecError):
            cluster_job(parse_job(job.document))
    else:
        cluster_job(parse_job(job.document))
    _check(job, schemas, note=print)


@_settings(300)
@given(job=mutated())
def test_validate_and_render_accept_valid_objects_or_name_the_field(
    job: Mutated, schemas: dict[str, dict[str, Any]]
) -> None:
    _check(job, schemas)


# capsys is read after each call, so one for every example is fine.
@_settings(100, HealthCheck.function_scoped_fixture)
@given(job=mutated(cli=True))
def test_bertjob_validate_exits_0_or_2(job: Mutated, capsys: pytest.CaptureFixture[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "job.yaml"
        path.write_text(dump(job.document), encoding="utf-8")
        code = main(["validate", str(path)])
    out, err = capsys.readouterr()
    assert code in (0, 2), (code, err[-2000:])
    if code == 0:
        assert out.startswith(f"{path}: valid BertPretrainJob"), out
    else:
        assert err.startswith(f"{path}: invalid BertPretrainJob\n"), err[:2000]
        assert "Traceback" not in err
