"""The CRD's CEL rules (x-kubernetes-validations), evaluated by a real CEL implementation
(cel-python) after the CRD's defaults, as the API server evaluates them: every good job passes,
each bad job is refused by the rule expected and in the CLI's words, no rule refuses what
``bertjob validate`` allows, and every rule stays within what the API server accepts (core CEL,
bounded lists, paths that exist)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertjob_api import reference
from bertjob_api.crd import crd, resource_schema
from bertjob_api.defaults import batch_split_problem
from bertjob_api.spec import SpecError, parse_job
from bertjob_api.spec.cel import MAX_FINETUNE_TASKS, MAX_PHASES
from bertjob_api.spec.cluster import RESERVED_POD_LABEL_PREFIXES, RESERVED_POD_LABELS
from bertjob_api.validation import cluster_job
from bertjob_testing import cel
from bertjob_testing.admission_cases import job_cases, stored
from bertjob_testing.jobs import valid_job, with_value
from tests.k8s_schema import errors

KUBERNETES_VERSION = "1.33"
SCHEMA = resource_schema()
SPEC = SCHEMA["properties"]["spec"]


def _job(**changes: Any) -> dict[str, Any]:
    """valid_job() with each ``changes`` item (a dotted path with ``__`` for ``.``) set."""
    document = valid_job()
    for dotted, value in changes.items():
        document = with_value(document, dotted.replace("__", "."), value)
    return stored(document)


def _tie(predictions: int) -> dict[str, Any]:
    """One phase of 10 tokens at maskedLmProb 0.25 (2.5 masked tokens, a rounding tie) with
    ``predictions`` masked positions."""
    phase = {**valid_job()["spec"]["phases"][0], "maxSeqLength": 10, "maxPredictionsPerSeq": predictions}
    return _job(spec__data__maskedLmProb=0.25, spec__phases=[phase])


BUDGET = {"time": "1h30m"}


def _without_steps(*shares: float) -> list[dict[str, Any]]:
    """valid_job()'s two phases without steps, with ``shares`` as their budgetProportion in turn."""
    phases = []
    for index, phase in enumerate(valid_job()["spec"]["phases"]):
        phase = {key: value for key, value in phase.items() if key != "steps"}
        if index < len(shares):
            phase["budgetProportion"] = shares[index]
        phases.append(phase)
    return phases


BUILTIN_TASK = {"name": "modules", "type": "classification", "builtin": "python-docs-modules"}
DEEPSPEED = {"deepspeed": {"zeroStage": 1}}

# More cases than the admission table's, one or more per rule: (id, document, the fields the
# refusal names; none for a job every rule passes).
CASES: list[tuple[str, dict[str, Any], set[str]]] = [
    ("predictions-of-phase-1", _job(spec__phases__0__maxPredictionsPerSeq=128), {"spec.phases[0]"}),
    ("predictions-not-below-sequence", _job(spec__phases__1__maxPredictionsPerSeq=512), {"spec.phases[1]"}),
    (
        "masking-cap-of-phase-2",
        _job(spec__phases__1__maxPredictionsPerSeq=76),
        {"spec.phases[1].maxPredictionsPerSeq"},
    ),
    # 10 x 0.25 = 2.5 rounds to 2 (half to even): 2 predictions are enough, 1 is not.
    ("masking-cap-at-a-tie", _tie(predictions=1), {"spec.phases[0].maxPredictionsPerSeq"}),
    ("masking-cap-met-at-a-tie", _tie(predictions=2), set()),
    # A budget replaces every phase's steps; the shares add up to 1.
    ("steps-missing", _job(spec__phases=_without_steps()), {"spec.phases[0].steps", "spec.phases[1].steps"}),
    (
        "budget-with-steps",
        _job(spec__budget={"time": "2h"}),
        {"spec.phases[0].steps", "spec.phases[1].steps"},
    ),
    (
        "share-without-budget",
        _job(spec__phases__0__budgetProportion=0.5, spec__phases__1__budgetProportion=0.5),
        {"spec.phases[0].budgetProportion", "spec.phases[1].budgetProportion"},
    ),
    (
        "budget-shares-over-1",
        _job(spec__budget=BUDGET, spec__phases=_without_steps(0.7, 0.4)),
        {"spec.budget"},
    ),
    ("budget-shares-1", _job(spec__budget=BUDGET, spec__phases=_without_steps(0.7, 0.3)), set()),
    (
        "budget-share-leaving-nothing",
        _job(spec__budget=BUDGET, spec__phases=_without_steps(1.0)),
        {"spec.budget"},
    ),
    ("budget-share-and-the-rest", _job(spec__budget=BUDGET, spec__phases=_without_steps(0.9)), set()),
    (
        "budget-one-phase-short",
        _job(spec__budget=BUDGET, spec__phases=_without_steps(0.5)[:1]),
        {"spec.budget"},
    ),
    ("budget-one-phase", _job(spec__budget=BUDGET, spec__phases=_without_steps()[:1]), set()),
    # The batch ramp: needs accumulation (64 = 2 x 32 has it, 64 = 1 x 64 not), DDP, no lrScaling.
    (
        "batch-ramp-without-accumulation",
        _job(spec__phases__0__batchRampProportion=0.5, spec__phases__0__microBatchSize=64),
        {"spec.phases[0].batchRampProportion"},
    ),
    (
        "batch-ramp-with-the-least-accumulation",
        _job(spec__phases__0__batchRampProportion=0.5, spec__phases__0__microBatchSize=32),
        set(),
    ),
    (
        "batch-ramp-with-lr-scaling",
        _job(
            spec__phases__0__batchRampProportion=0.5,
            spec__phases__0__microBatchSize=8,
            spec__phases__1__batchRampProportion=0.5,
            spec__phases__1__microBatchSize=8,
            spec__optimizer={"lrScaling": "linear", "referenceGlobalBatchSize": 64},
        ),
        {"spec.phases[0].batchRampProportion", "spec.phases[1].batchRampProportion"},
    ),
    (
        "batch-ramp-under-deepspeed",
        _job(
            spec__phases__1__batchRampProportion=0.5,
            spec__phases__1__microBatchSize=8,
            spec__distributed=DEEPSPEED,
        ),
        {"spec.phases[1].batchRampProportion"},
    ),
    (
        "phase-2-shorter",
        _job(spec__phases__1__maxSeqLength=64, spec__phases__1__maxPredictionsPerSeq=10),
        {"spec.phases[1].maxSeqLength"},
    ),
    (
        "finetune-splits",
        _job(
            spec__topology={"nodes": 2, "processesPerNode": 2},
            spec__finetune=[
                {**BUILTIN_TASK, "globalBatchSize": 32},
                # One rank per run: 30 splits into micro-batches of 30.
                {**BUILTIN_TASK, "name": "seeds", "globalBatchSize": 30, "parallelism": "seeds"},
            ],
        ),
        set(),
    ),
    (
        "finetune-not-divisible-by-world-size",
        _job(
            spec__topology={"nodes": 2, "processesPerNode": 2},
            spec__finetune=[BUILTIN_TASK, {**BUILTIN_TASK, "name": "odd", "globalBatchSize": 30}],
        ),
        {"spec.finetune[].globalBatchSize"},
    ),
    (
        "finetune-seeds-micro-batch",
        _job(spec__finetune=[{**BUILTIN_TASK, "parallelism": "seeds", "microBatchSize": 7}]),
        {"spec.finetune[].globalBatchSize"},
    ),
    (
        "trainjob-mpi-on-habana-hpu",
        _job(spec__launcher="trainjob", spec__trainJob={"mlPolicy": "mpi"}, spec__accelerator="habana-hpu"),
        {"spec.launcher"},
    ),
    (
        "trainjob-torch-on-habana-hpu",
        _job(spec__launcher="trainjob", spec__trainJob={"mlPolicy": "torch"}, spec__accelerator="habana-hpu"),
        set(),
    ),
    ("pytorchjob-on-habana-hpu", _job(spec__accelerator="habana-hpu"), set()),
    (
        "bf16-compression-under-mpijob",
        _job(spec__launcher="mpijob", spec__distributed={"gradientCompression": "bf16"}),
        {"spec.distributed.gradientCompression"},
    ),
    (
        "bf16-compression-under-trainjob-mpi",
        _job(
            spec__launcher="trainjob",
            spec__trainJob={"mlPolicy": "mpi"},
            spec__distributed={"gradientCompression": "bf16"},
        ),
        {"spec.distributed.gradientCompression"},
    ),
    ("bf16-compression-under-ddp", _job(spec__distributed={"gradientCompression": "bf16"}), set()),
    ("elastic-in-range", _job(spec__elastic={"minNodes": 1, "maxNodes": 4}), set()),
    (
        "elastic-min-above-nodes",
        _job(spec__elastic={"minNodes": 2, "maxNodes": 4}),
        {"spec.elastic.minNodes"},
    ),
    (
        "elastic-max-below-nodes",
        _job(
            spec__topology={"nodes": 4, "processesPerNode": 1}, spec__elastic={"minNodes": 1, "maxNodes": 2}
        ),
        {"spec.elastic.maxNodes"},
    ),
    (
        "elastic-min-above-max",
        _job(
            spec__topology={"nodes": 2, "processesPerNode": 1}, spec__elastic={"minNodes": 3, "maxNodes": 2}
        ),
        {"spec.elastic", "spec.elastic.minNodes"},
    ),
    (
        "elastic-mpijob-under-mpirun",
        _job(
            spec__launcher="mpijob",
            spec__topology={"nodes": 2, "processesPerNode": 1},
            spec__elastic={"minNodes": 1, "maxNodes": 4},
        ),
        {"spec.mpi.command"},
    ),
    (
        "elastic-mpijob-on-one-node",
        _job(
            spec__launcher="mpijob",
            spec__mpi={"command": "horovodrun"},
            spec__elastic={"minNodes": 1, "maxNodes": 2},
        ),
        {"spec.topology.nodes"},
    ),
    (
        "elastic-trainjob",
        _job(spec__launcher="trainjob", spec__elastic={"minNodes": 1, "maxNodes": 2}),
        {"spec.elastic"},
    ),
    (
        "trainjob-mpi-under-horovodrun",
        _job(
            spec__launcher="trainjob", spec__trainJob={"mlPolicy": "mpi"}, spec__mpi={"command": "horovodrun"}
        ),
        {"spec.mpi.command"},
    ),
    (
        "deepspeed-zero-stage-0",
        _job(spec__distributed={"deepspeed": {"zeroStage": 0}}),
        {"spec.distributed.deepspeed.zeroStage"},
    ),
    ("deepspeed", _job(spec__distributed=DEEPSPEED), set()),
    (
        "deepspeed-fp16-on-xeon",
        _job(spec__distributed=DEEPSPEED, spec__accelerator="xeon-cpu", spec__precision="fp16"),
        {"spec.precision"},
    ),
    (
        "deepspeed-with-compression",
        _job(spec__distributed={**DEEPSPEED, "gradientCompression": "fp16"}),
        {"spec.distributed.gradientCompression"},
    ),
    (
        "deepspeed-elastic",
        _job(spec__distributed=DEEPSPEED, spec__elastic={"minNodes": 1, "maxNodes": 2}),
        {"spec.elastic"},
    ),
    (
        "deepspeed-under-horovodrun",
        _job(spec__launcher="mpijob", spec__mpi={"command": "horovodrun"}, spec__distributed=DEEPSPEED),
        {"spec.mpi.command"},
    ),
    ("evaluation-without-heldout", _job(spec__evaluation={"everySteps": 10}), {"spec.evaluation.everySteps"}),
    (
        "evaluation-with-heldout",
        _job(spec__evaluation={"everySteps": 10}, spec__data__heldoutFraction=0.1),
        set(),
    ),
    ("init-from-without-vocabulary", _job(spec__model={"initFrom": "/data/model"}), {"spec.data.vocab.file"}),
    (
        "init-from-with-vocabulary",
        _job(spec__model={"initFrom": "/data/model"}, spec__data__vocab={"file": "/data/model/vocab.txt"}),
        set(),
    ),
    (
        "shards-counted-twice",
        _job(spec__data__numShards=2, spec__data__maxShardMB=10),
        {"spec.data.maxShardMB"},
    ),
    ("shards-by-size", _job(spec__data__maxShardMB=10), set()),
    (
        "packing-with-dynamic-masking",
        _job(spec__data__packing="spfhp", spec__data__masking="dynamic"),
        {"spec.data.packing"},
    ),
    (
        "masking-schedule-with-static-masking",
        _job(spec__data__finalMaskedLmProb=0.1),
        {"spec.data.finalMaskedLmProb"},
    ),
    (
        "masking-schedule-with-whole-words",
        _job(
            spec__data__finalMaskedLmProb=0.1, spec__data__masking="dynamic", spec__data__wholeWordMask=True
        ),
        {"spec.data.finalMaskedLmProb"},
    ),
    (
        "masking-schedule-rising",
        _job(spec__data__finalMaskedLmProb=0.2, spec__data__masking="dynamic"),
        {"spec.data.finalMaskedLmProb"},
    ),
    (
        "masking-schedule",
        _job(spec__data__finalMaskedLmProb=0.1, spec__data__masking="dynamic"),
        set(),
    ),
    (
        "vocabulary-twice",
        _job(spec__data__vocab={"trainSize": 100, "file": "/data/vocab.txt"}),
        {"spec.data.vocab"},
    ),
    ("vocabulary-neither", _job(spec__data__vocab={"padToMultipleOf": 8}), {"spec.data.vocab"}),
    ("lr-scaling-without-reference", _job(spec__optimizer={"lrScaling": "sqrt"}), {"spec.optimizer"}),
    (
        "lr-scaling-with-reference",
        _job(spec__optimizer={"lrScaling": "linear", "referenceGlobalBatchSize": 256}),
        set(),
    ),
    # What the rules leave to the webhook and the operator: relative paths, a name too long.
    ("relative-checkpoint-path", _job(spec__checkpoint={"path": "checkpoints"}), set()),
    # spec.pod.labels: each reserved key and domain refused, a key that only looks like one taken.
    *(
        (f"pod-label-{key}", _job(spec__pod={"labels": {"team": "nlp", key: "x"}}), {"spec.pod.labels"})
        for key in (*RESERVED_POD_LABELS, *(prefix + "x" for prefix in RESERVED_POD_LABEL_PREFIXES))
    ),
    (
        "pod-labels-near-reserved",
        _job(
            spec__pod={
                "labels": {
                    "app.kubernetes.io/part-of": "x",
                    "bertjob.dev": "x",
                    "example.com/job-name": "x",
                    "sub.training.kubeflow.org/x": "x",
                    "sidecar.istio.io/inject": "false",
                }
            }
        ),
        set(),
    ),
    ("pod-labels-none", _job(spec__pod={"annotations": {"bertjob.dev/job": "x"}}), set()),
]
ALL_CASES = [(case["id"], case["document"]) for case in job_cases()] + [(id_, doc) for id_, doc, _ in CASES]


@dataclass(frozen=True)
class Cli:
    """What ``bertjob validate`` says of a document: its problems as ``path: message`` lines, and
    whether it stopped at the spec's own types and validators (``parse_job``) before the checks
    across fields."""

    lines: list[str]
    at_parse: bool


def _cli(document: dict[str, Any]) -> Cli:
    try:
        job = parse_job(document)
    except SpecError as error:
        return Cli([f"{path}: {message}" for path, message in error.problems], at_parse=True)
    try:
        cluster_job(job)
    except SpecError as error:
        return Cli([f"{path}: {message}" for path, message in error.problems], at_parse=False)
    return Cli([], at_parse=False)


def _named(refusals: list[cel.Refusal]) -> set[str]:
    """The fields the refusals name: what each message says before its first ': '."""
    return {refusal.message.partition(": ")[0] for refusal in refusals}


def _fields(lines: set[str] | list[str]) -> set[str]:
    """The fields messages name, a fine-tuning task's index left out (the rule on spec.finetune
    names ``spec.finetune[]``: a CEL message cannot say which task, see bertjob_api.spec.cel)."""
    return {re.sub(r"^spec\.finetune\[\d+\]", "spec.finetune[]", line.partition(": ")[0]) for line in lines}


def _refusals(document: dict[str, Any]) -> list[cel.Refusal]:
    found = cel.refusals(document, SCHEMA)
    assert not [refusal for refusal in found if refusal.error], found
    return found


@pytest.mark.parametrize(
    "case", [case for case in job_cases() if case["allowed"]], ids=lambda case: case["id"]
)
def test_every_allowed_job_of_the_admission_table_passes_every_rule(case: dict[str, Any]) -> None:
    assert _refusals(case["document"]) == []


@pytest.mark.parametrize(
    "case", [case for case in job_cases() if case["cel"] and not case["allowed"]], ids=lambda case: case["id"]
)
def test_the_rules_refuse_the_admission_tables_cel_cases_naming_its_fields(case: dict[str, Any]) -> None:
    found = _refusals(case["document"])

    assert _named(found) == set(case["fields"])
    assert _fields([refusal.message for refusal in found]) <= _fields(_cli(case["document"]).lines)


@pytest.mark.parametrize(
    ("document", "fields"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_each_rule_refuses_its_case_naming_the_field(document: dict[str, Any], fields: set[str]) -> None:
    assert not errors(document, SCHEMA), "a case for the rules must pass the schema"

    assert _named(_refusals(document)) == fields


@pytest.mark.parametrize(("document"), [case[1] for case in ALL_CASES], ids=[case[0] for case in ALL_CASES])
def test_no_rule_refuses_what_the_cli_allows(document: dict[str, Any]) -> None:
    if errors(document, SCHEMA):
        pytest.skip("the schema refuses it before any rule runs")
    messages = {refusal.message for refusal in _refusals(document)}
    cli = _cli(document)

    if messages:
        assert cli.lines, f"only CEL refuses it: {sorted(messages)}"
    if cli.at_parse:
        # The CLI stops at the spec's own validators, before the checks across fields that
        # CEL, which runs every rule at once, may also find: the CLI's problem must be among CEL's.
        assert not messages or _fields(messages) & _fields(cli.lines), (sorted(messages), cli.lines)
    else:
        # Each names a field that `bertjob validate` names.
        assert _fields(messages) <= _fields(cli.lines), (sorted(messages), cli.lines)


def test_every_rule_refuses_some_case() -> None:
    # So that each rule has been seen to fail, and its message to match the CLI's.
    failed = {
        refusal.rule
        for _, document in ALL_CASES
        if not errors(document, SCHEMA)
        for refusal in _refusals(document)
    }
    rules = {site.entry["rule"] for site in cel.sites(SCHEMA)}
    assert rules - failed == set()


@dataclass(frozen=True)
class _Batch:
    global_batch_size: int
    micro_batch_size: int | None


def _rule_at(path: str, message_start: str) -> Mapping[str, str]:
    [entry] = [
        site.entry
        for site in cel.sites(SCHEMA)
        if site.path == path and site.entry["message"].startswith(message_start)
    ]
    return entry


def _spec_value(spec: dict[str, Any]) -> Any:
    return cel.to_cel(cel.apply_defaults(spec, SPEC), SPEC)


@pytest.mark.parametrize("index", range(MAX_PHASES))
def test_the_batch_rule_agrees_with_batch_split_problem(index: int) -> None:
    entry = _rule_at("spec", f"spec.phases[{index}].globalBatchSize")
    phase = {"maxSeqLength": 128, "maxPredictionsPerSeq": 20, "learningRate": 0.1, "steps": 1}
    checked = 0
    for nodes, per_node in [(1, 1), (2, 2), (1, 3), (5, 1)]:
        for size in range(1, 13):
            # Unset (the default micro-batch), dividing, not dividing, and above size / world size.
            for micro in [None, 1, 2, 3, 5, 13]:
                batch = {"globalBatchSize": size} | ({"microBatchSize": micro} if micro else {})
                spec = {
                    "topology": {"nodes": nodes, "processesPerNode": per_node},
                    "phases": [{**phase, **batch}] * 2,
                }
                value = cel.to_cel(spec, SPEC)
                problem = batch_split_problem(_Batch(size, micro), nodes * per_node)

                assert bool(cel.evaluate(entry["rule"], value)) == (problem is None), (
                    nodes,
                    per_node,
                    size,
                    micro,
                )
                checked += 1
    assert checked == 4 * 12 * 6


def test_the_batch_rule_cannot_overflow() -> None:
    # world size x microBatchSize would pass 2^63: the rule refuses without computing it.
    entry = _rule_at("spec", "spec.phases[0].globalBatchSize")
    top = 2**63 - 1
    spec = valid_job()["spec"] | {"topology": {"nodes": 2**31 - 1, "processesPerNode": 2**31 - 1}}
    spec["phases"] = [{**spec["phases"][0], "globalBatchSize": top, "microBatchSize": top}]

    assert not cel.evaluate(entry["rule"], _spec_value(spec))


def test_the_finetune_rule_agrees_with_batch_split_problem_at_its_index() -> None:
    entry = _rule_at("spec", "spec.finetune[]")
    tasks = [
        {**BUILTIN_TASK, "name": f"t{index}", "globalBatchSize": 24} for index in range(MAX_FINETUNE_TASKS)
    ]
    # The last task the schema allows: the message's index list reaches it.
    tasks[-1] = {**tasks[-1], "globalBatchSize": 25, "microBatchSize": 5}
    spec = {"topology": {"nodes": 1, "processesPerNode": 3}, "finetune": tasks}
    value = _spec_value(spec)
    problem = batch_split_problem(_Batch(25, 5), 3)

    assert problem is not None and not cel.evaluate(entry["rule"], value)
    tasks[-1]["parallelism"] = "seeds"  # one rank: 25 = 5 x 5
    assert cel.evaluate(entry["rule"], _spec_value(spec))


def test_defaults_fill_present_objects_only_and_replace_null() -> None:
    spec = {"topology": {"nodes": 2}, "distributed": None, "phases": [{"globalBatchSize": 8}], "data": {}}

    defaulted = cel.apply_defaults(spec, SPEC)

    assert defaulted["topology"] == {"nodes": 2, "processesPerNode": 1}
    assert defaulted["launcher"] == "pytorchjob"
    assert defaulted["phases"][0]["warmupProportion"] == 0.01
    assert defaulted["data"]["packing"] == "none"
    assert "mpi" not in defaulted and "trainJob" not in defaulted
    assert defaulted["distributed"] is None  # no default of its own: the null stays (pruned later)
    assert spec["topology"] == {"nodes": 2}, "the input is left as it was"


def test_values_take_the_schemas_types() -> None:
    value = cel.to_cel({"heldoutFraction": 0, "numShards": 2}, SPEC["properties"]["data"])

    assert cel.evaluate("self.heldoutFraction == 0.0 && self.numShards == 2", value)
    with pytest.raises(TypeError, match="not of type integer"):
        cel.to_cel({"numShards": "2"}, SPEC["properties"]["data"])


# Kubernetes' CEL libraries beyond core CEL (k8s.io/apiserver/pkg/cel/library and cel-go's ext):
# the Python CEL libraries lack them, so the rules must not use them.
KUBERNETES_ONLY = re.compile(
    r"\b(lowerAscii|upperAscii|replace|split|join|substring|trim|indexOf|lastIndexOf|charAt|"
    r"isSorted|sum|min|max|indexOf|reverse|distinct|flatten|url|isURL|quantity|isQuantity|ip|cidr|"
    r"isIP|isCIDR|format|quote|bind|optional|base64|authorizer|semver|isSemver|sets|math)\s*\(|"
    r"\b(cel|math|sets|strings|base64|optional)\.",
)
_LITERAL = re.compile(r"'(?:\\.|[^'\\])*'")
_MACRO = re.compile(r"(self(?:\.\w+)*)\.(?:all|exists|exists_one|filter|map)\((\w+),")
_REFERENCE = re.compile(r"\b(self|[a-z])((?:\.\w+\b(?!\()|\[[^\[\]]+\])+)")


def _expressions(entry: Mapping[str, str]) -> list[str]:
    return [entry[key] for key in ("rule", "messageExpression") if key in entry]


def _resolve(schema: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    """The schema node of a field path (``.a.b[0]``) under ``schema``; KeyError if none."""
    node = schema
    for name, index in re.findall(r"\.(\w+)|\[([^\]]+)\]", path):
        node = node["items"] if index else node["properties"][name]
    return node


def _site_schema(path: str) -> Mapping[str, Any]:
    node: Mapping[str, Any] = SCHEMA
    for part in path.split("."):
        name, _, rest = part.partition("[")
        node = node["properties"][name]
        if rest:
            node = node["items"]
    return node


@pytest.mark.parametrize("site", list(cel.sites(SCHEMA)), ids=lambda site: site.entry["message"][:60])
def test_each_rule_is_one_the_api_server_accepts(site: cel.Site) -> None:
    schema, entry = _site_schema(site.path), site.entry
    assert set(entry) <= {"rule", "message", "messageExpression", "fieldPath"}
    assert entry["message"] and "\n" not in entry["message"]
    if "fieldPath" in entry:
        _resolve(schema, entry["fieldPath"])  # a field of the object, without a list index
        assert "[" not in entry["fieldPath"]
    if "messageExpression" in entry:
        # string() of a number is an unbounded string to the API server's cost estimate: the
        # CRD would be refused (tests/cluster, bertjob_api.spec.cel).
        assert "string(" not in _LITERAL.sub("''", entry["messageExpression"]), entry["messageExpression"]
    for expression in _expressions(entry):
        code = _LITERAL.sub("''", expression)
        assert not KUBERNETES_ONLY.search(code), expression
        assert "oldSelf" not in code, "no transition rules: spec changes are the webhook's"
        # Every list a macro walks has maxItems, and every map maxProperties, so that the cost
        # estimate is bounded. A macro over a map binds its keys, strings.
        bound: dict[str, Mapping[str, Any]] = {}
        for receiver, variable in _MACRO.findall(code):
            walked = _resolve(schema, receiver.removeprefix("self"))
            if walked["type"] == "object":
                assert "maxProperties" in walked and "properties" not in walked, receiver
                bound[variable] = {"type": "string"}
            else:
                assert walked["type"] == "array" and "maxItems" in walked, receiver
                bound[variable] = walked["items"]
        # Every field read exists in the schema (the API server type-checks rules against it).
        for root, path in _REFERENCE.findall(code):
            if root == "self":
                _resolve(schema, path)
            elif root in bound:
                _resolve(bound[root], path)
            else:
                assert path.startswith("["), f"{root}{path}: an unbound variable"
        cel._program(expression)  # core CEL that cel-python parses


def test_the_crd_with_its_rules_passes_the_apiextensions_schema() -> None:
    kubernetes_validate.validate(crd(), KUBERNETES_VERSION, strict=True)


def test_the_reference_lists_each_rule_under_its_objects_table() -> None:
    sections = reference.generate(SCHEMA).split("\n### ")
    for site in cel.sites(SCHEMA):
        heading = "BertPretrainJob" if site.path == "<root>" else site.path
        [section] = [text for text in sections if text.startswith(heading + "\n")]
        assert f"- {site.entry['message']}\n" in section.replace("\\|", "|"), site.entry["message"]


def _maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``value``, or the field left out (:data:`ABSENT`)."""
    return st.one_of(st.just(ABSENT), value)


ABSENT = object()


@st.composite
def _rule_fields(draw: st.DrawFn) -> dict[str, Any]:
    """A job varied in every field a rule reads, and in no other (so that every problem the CLI
    finds is one a rule states)."""
    small = st.integers(1, 4)
    phase = st.fixed_dictionaries(
        {"globalBatchSize": st.integers(1, 48)}, optional={"microBatchSize": st.integers(1, 12)}
    )
    task = st.fixed_dictionaries(
        {"globalBatchSize": st.integers(1, 40)},
        optional={"microBatchSize": st.integers(1, 8), "parallelism": st.sampled_from(["data", "seeds"])},
    )
    fields: dict[str, Any] = {
        "spec.topology": {"nodes": draw(small), "processesPerNode": draw(small)},
        "spec.launcher": draw(st.sampled_from(["pytorchjob", "mpijob", "trainjob"])),
        "spec.accelerator": draw(st.sampled_from(["nvidia-gpu", "habana-hpu", "xeon-cpu"])),
        "spec.precision": draw(st.sampled_from(["bf16", "fp16", "fp32"])),
        "spec.trainJob": draw(
            _maybe(st.fixed_dictionaries({}, optional={"mlPolicy": st.sampled_from(["torch", "mpi"])}))
        ),
        "spec.mpi": draw(
            _maybe(st.fixed_dictionaries({}, optional={"command": st.sampled_from(["mpirun", "horovodrun"])}))
        ),
        "spec.distributed": draw(
            _maybe(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "gradientCompression": st.sampled_from(["none", "fp16", "bf16"]),
                        "deepspeed": st.fixed_dictionaries({}, optional={"zeroStage": st.integers(0, 3)}),
                    },
                )
            )
        ),
        "spec.elastic": draw(_maybe(st.fixed_dictionaries({"minNodes": small, "maxNodes": small}))),
        "spec.evaluation": draw(_maybe(st.just({"everySteps": 10}))),
        "spec.data.heldoutFraction": draw(_maybe(st.sampled_from([0, 0.0, 0.1]))),
        "spec.data.numShards": draw(_maybe(st.just(2))),
        "spec.data.maxShardMB": draw(_maybe(st.just(10))),
        "spec.data.packing": draw(_maybe(st.sampled_from(["none", "spfhp"]))),
        "spec.data.masking": draw(_maybe(st.sampled_from(["static", "dynamic"]))),
        "spec.data.finalMaskedLmProb": draw(_maybe(st.sampled_from([0.1, 0.2]))),
        "spec.data.wholeWordMask": draw(_maybe(st.booleans())),
        "spec.data.vocab": draw(
            _maybe(
                st.fixed_dictionaries(
                    {}, optional={"trainSize": st.just(100), "file": st.just("/data/v.txt")}
                )
            )
        ),
        "spec.model": draw(_maybe(st.just({"initFrom": "/data/model"}))),
        "spec.optimizer": draw(
            _maybe(
                st.fixed_dictionaries(
                    {"lrScaling": st.sampled_from(["none", "linear", "sqrt"])},
                    optional={"referenceGlobalBatchSize": st.just(256)},
                )
            )
        ),
        "spec.phases.0": {**valid_job()["spec"]["phases"][0], **draw(phase)},
        "spec.phases.1": {**valid_job()["spec"]["phases"][1], **draw(phase)},
    }
    tasks = draw(st.lists(task, max_size=3))
    fields["spec.finetune"] = [
        {**BUILTIN_TASK, "name": f"t{index}", **value} for index, value in enumerate(tasks)
    ]
    return fields


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(_rule_fields())
def test_on_the_fields_the_rules_read_they_say_what_the_cli_says(fields: dict[str, Any]) -> None:
    document = valid_job()
    for dotted, value in fields.items():
        if value is not ABSENT:
            document = with_value(document, dotted, value)
    document = stored(document)
    assert not errors(document, SCHEMA)
    messages = {refusal.message for refusal in _refusals(document)}
    cli = _cli(document)

    if cli.at_parse:
        # The CLI stops at the spec's own validators; CEL states those and may find more.
        assert _fields(cli.lines) <= _fields(messages)
        return
    # The same fields (one rule covers every fine-tuning task).
    assert _fields(messages) == _fields(cli.lines)
