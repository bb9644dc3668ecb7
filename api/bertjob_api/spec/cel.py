"""CEL rules the CRD carries (``x-kubernetes-validations``), so that the API server itself refuses a
job whose fields contradict each other, on a cluster without the operator's admission webhook.

Each rule restates a check of :mod:`bertjob_api.validation` or a model validator of the spec, in
the same words: a rule refuses only what ``bertjob validate`` refuses (tests/bertjob_api/test_cel.py
holds them to it on the admission table). A rule sits on the object it reads, in that model's
``json_schema_extra`` (:func:`validations`): one object's own rules beside its pydantic validator
(``spec.data``, ``spec.data.vocab``, ``spec.optimizer``, ``spec.elastic``, ``spec.pod``), the rules across
``spec``'s objects in :data:`JOB_RULES`, which :class:`bertjob_api.spec.JobSpec` carries.
:func:`bertjob_api.crd.structural` copies them into the CRD.

What a rule may use, so that the API server accepts it and the Python CEL libraries can test it:

- core CEL only (macros ``all``, ``filter``, ``map``; ``has``, ``size``, ``string``), none of
  Kubernetes' extension libraries (strings, lists, regex, quantity, ``cel.bind``);
- the object after the CRD's defaults, as the API server evaluates it: a field with a
  ``default`` is always there, an optional object (``spec.topology``, ``spec.mpi``, ...) only
  when written, so a rule reads it behind ``has()`` with the model's own default otherwise;
- only lists with ``maxItems`` (``spec.phases``: 2; ``spec.finetune``:
  :data:`MAX_FINETUNE_TASKS`) and maps with ``maxProperties`` (``spec.pod.labels``:
  :data:`bertjob_api.spec.cluster.MAX_POD_LABELS`), so that the API server's cost estimate stays
  within its budget; strings only compared with literals (``==``, ``startsWith``, whose cost is the
  literal's length);
- a ``messageExpression`` made of string literals only (a choice between them included): the API
  server estimates ``string()`` of an integer as an unbounded string, and a message that
  concatenates one "exceeds budget by factor of more than 100x", so the whole CRD is refused (seen
  on real API servers, v1.28.15 and v1.36.3, tests/cluster; Kubernetes' ``format`` extension, which
  would be cheap, is missing before 1.29). Messages state the rule instead of the values.

A rule on a list item cannot know its index, and ``fieldPath`` cannot carry one; so the rules on
``spec.phases`` come one per index, and the ``spec.finetune`` rule's message names
``spec.finetune[]``: every message starts with the field's path as ``bertjob validate`` prints it
(``spec.phases[1].globalBatchSize: ...``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Phases a job may have (phase 1, then optionally phase 2): the schema's maxItems of spec.phases.
MAX_PHASES = 2
# Fine-tuning tasks a job may have: the schema's maxItems of spec.finetune, which bounds the cost
# of the rule iterating it (GLUE and SQuAD together are 11 tasks).
MAX_FINETUNE_TASKS = 32


@dataclass(frozen=True)
class Rule:
    """One entry of ``x-kubernetes-validations``.

    ``rule`` is true for an object that passes; ``message`` is shown when it fails, unless
    ``message_expression`` (a CEL expression giving a string) says more; ``field_path`` (relative to
    the object, no list index) is where the API server reports the failure.
    """

    rule: str
    message: str
    field_path: str | None = None
    message_expression: str | None = None

    def extension(self) -> dict[str, str]:
        """The entry as the CRD spells it."""
        entry = {"rule": self.rule, "message": self.message}
        if self.field_path is not None:
            entry["fieldPath"] = self.field_path
        if self.message_expression is not None:
            entry["messageExpression"] = self.message_expression
        return entry


def validations(*rules: Rule) -> dict[str, Any]:
    """A model's ``json_schema_extra``: its rules under ``x-kubernetes-validations``."""
    return {"x-kubernetes-validations": [rule.extension() for rule in rules]}


@dataclass(frozen=True)
class _Text:
    """A literal part of a message expression (see :func:`_concat`)."""

    text: str


def quote(text: str) -> str:
    """``text`` as a CEL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _concat(*parts: str | _Text) -> str:
    """A CEL string expression joining ``parts``: expressions as they are, :class:`_Text` quoted,
    adjacent texts as one literal."""
    merged: list[str | _Text] = []
    for part in parts:
        if isinstance(part, _Text) and merged and isinstance(merged[-1], _Text):
            merged[-1] = _Text(merged[-1].text + part.text)
        else:
            merged.append(part)
    return " + ".join(quote(part.text) if isinstance(part, _Text) else part for part in merged)


# Read on spec (self), with the models' defaults where an optional object is absent.
_NODES = "(has(self.topology) ? self.topology.nodes : 1)"
_WORLD_SIZE = "(has(self.topology) ? self.topology.nodes * self.topology.processesPerNode : 1)"
_MPI_POLICY = "(self.launcher == 'trainjob' && has(self.trainJob) && self.trainJob.mlPolicy == 'mpi')"
# Ranks started by mpirun: launcher mpijob, or trainjob's MPI policy (validation._distributed_problems).
_UNDER_MPI = f"(self.launcher == 'mpijob' || {_MPI_POLICY})"
_MPI_COMMAND = "(has(self.mpi) ? self.mpi.command : 'mpirun')"
_COMPRESSION = "(has(self.distributed) ? self.distributed.gradientCompression : 'none')"
_DEEPSPEED = "(has(self.distributed) && has(self.distributed.deepspeed))"


def _micro_batch(item: str, world: str) -> str:
    """defaults.micro_batch_size: microBatchSize, else globalBatchSize / world size, at least 1."""
    share = f"{item}.globalBatchSize / {world}"
    return f"(has({item}.microBatchSize) ? {item}.microBatchSize : ({share} >= 1 ? {share} : 1))"


def _splits(item: str, world: str) -> str:
    """defaults.batch_split_problem is None: globalBatchSize divisible by world x micro-batch.

    Without microBatchSize the default micro-batch makes that ``globalBatchSize % world == 0``.
    With it, a micro-batch over globalBatchSize / world makes world x micro-batch larger than
    globalBatchSize, which it then cannot divide: testing that first keeps the product within
    globalBatchSize, so that it cannot overflow (an error the API server would report instead).
    """
    size, micro = f"{item}.globalBatchSize", f"{item}.microBatchSize"
    return (
        f"(has({micro}) ? ({micro} <= {size} / {world} && {size} % ({world} * {micro}) == 0) "
        f": {size} % {world} == 0)"
    )


# The refusals of a batch ramp, in bertjob_api.validation's words too.
RAMP_ENGINE = (
    "batchRampProportion: the ramp changes the gradient accumulation step by step, which DDP does; "
    "Horovod's backward_passes_per_step and DeepSpeed's config fix it for the phase: use torchrun "
    "(launcher pytorchjob, or trainjob with mlPolicy torch) without spec.distributed.deepspeed"
)
RAMP_LR_SCALING = (
    "batchRampProportion: spec.optimizer.lrScaling scales the rate by globalBatchSize, which the ramp "
    "reaches only at its end; set lrScaling none with a ramp"
)
RAMP_NO_ACCUMULATION = (
    "batchRampProportion: the ramp grows the gradient accumulation from 1, and this phase has none "
    "(globalBatchSize is world size x microBatchSize); lower microBatchSize"
)


# The refusals of a budget, in bertjob_api.validation's words too.
BUDGET_NO_STEPS = "required: set steps, or spec.budget for every phase"
BUDGET_AND_STEPS = "set steps or spec.budget, not both: the budget fixes every phase's steps"
BUDGET_SHARE_ALONE = "needs spec.budget"
BUDGET_SHARES = (
    "the phases' budgetProportion must add up to 1 (a phase without one takes an equal part of what "
    "the others leave, which must then be more than 0)"
)
_SHARE = "self.phases[{}].budgetProportion"


def _shares_add_up() -> str:
    """defaults.budget_shares is not None, for one or two phases (MAX_PHASES)."""
    first, second = _SHARE.format(0), _SHARE.format(1)
    one = f"(!has({first}) || ({first} >= 1.0 - 1e-9))"
    both = f"({first} + {second} - 1.0 <= 1e-9 && 1.0 - {first} - {second} <= 1e-9)"
    partial = f"((!has({first}) || {first} < 1.0) && (!has({second}) || {second} < 1.0))"
    return f"size(self.phases) == 1 ? {one} : (has({first}) && has({second}) ? {both} : {partial})"


def _phase_rules(index: int) -> list[Rule]:
    phase, where = f"self.phases[{index}]", f"spec.phases[{index}]"
    # The schema's minItems (1) makes phase 1 always there.
    present = f"size(self.phases) <= {index} || " if index else ""
    ramp = f"has({phase}.batchRampProportion)"
    if index:
        ramp = f"size(self.phases) > {index} && {ramp}"
    return [
        Rule(
            present + _splits(phase, _WORLD_SIZE),
            f"{where}.globalBatchSize: must be divisible by world size (topology.nodes x "
            "topology.processesPerNode) x microBatchSize",
            field_path=".phases",
        ),
        Rule(
            present + f"{phase}.maxPredictionsPerSeq < {phase}.maxSeqLength",
            f"{where}: maxPredictionsPerSeq must be smaller than maxSeqLength",
            field_path=".phases",
        ),
        Rule(
            present
            + f"{phase}.maxPredictionsPerSeq >= "
            + _masked_count(f"double({phase}.maxSeqLength) * self.data.maskedLmProb"),
            f"{where}.maxPredictionsPerSeq: caps the masking: it must be at least the tokens "
            "spec.data.maskedLmProb masks of maxSeqLength (rounded), or the rate would silently drop",
            field_path=".phases",
        ),
        Rule(f"!({ramp} && ({_DEEPSPEED} || {_UNDER_MPI}))", f"{where}.{RAMP_ENGINE}", field_path=".phases"),
        Rule(
            present + f"has(self.budget) || has({phase}.steps)",
            f"{where}.steps: {BUDGET_NO_STEPS}",
            field_path=".phases",
        ),
        Rule(
            present + f"!(has(self.budget) && has({phase}.steps))",
            f"{where}.steps: {BUDGET_AND_STEPS}",
            field_path=".phases",
        ),
        Rule(
            present + f"has(self.budget) || !has({phase}.budgetProportion)",
            f"{where}.budgetProportion: {BUDGET_SHARE_ALONE}",
            field_path=".phases",
        ),
        Rule(
            f"!({ramp} && has(self.optimizer) && self.optimizer.lrScaling != 'none')",
            f"{where}.{RAMP_LR_SCALING}",
            field_path=".phases",
        ),
        Rule(
            # Divisions, not 2 x world x micro-batch, which could overflow: for positive integers
            # floor(floor(a / b) / c) is floor(a / (b c)).
            f"!({ramp}) || {phase}.globalBatchSize / {_WORLD_SIZE} / {_micro_batch(phase, _WORLD_SIZE)} >= 2",
            f"{where}.{RAMP_NO_ACCUMULATION}",
            field_path=".phases",
        ),
    ]


def _masked_count(product: str) -> str:
    """defaults.masked_count: max(1, round(product)), rounding half to even as Python does (core
    CEL has no round; ``int`` of a positive double truncates)."""
    whole, part = f"int({product})", f"({product} - double(int({product})))"
    rounded = (
        f"({part} > 0.5 ? {whole} + 1 : ({part} < 0.5 ? {whole} : "
        f"({whole} % 2 == 0 ? {whole} : {whole} + 1)))"
    )
    return f"({rounded} > 1 ? {rounded} : 1)"


def _task_world(task: str) -> str:
    """defaults.task_world_size: every rank with parallelism data, one with seeds."""
    return f"({task}.parallelism == 'data' ? {_WORLD_SIZE} : 1)"


def _finetune_rule() -> Rule:
    task_world = _task_world("t")
    return Rule(
        f"!has(self.finetune) || self.finetune.all(t, {_splits('t', task_world)})",
        "spec.finetune[].globalBatchSize: must be divisible by the task's world size (all the "
        "job's processes with parallelism data, 1 with seeds) x microBatchSize",
        field_path=".finetune",
    )


_HABANA_MPI = (
    " cannot run accelerator habana-hpu: its ranks use Horovod, which the Gaudi image lacks (no HPU "
    "support upstream); use launcher pytorchjob, or trainjob with mlPolicy torch"
)
_BF16_MPI = (
    ": Horovod compresses to fp16 only (use fp16 or none, or torchrun: launcher pytorchjob, or "
    "trainJob.mlPolicy torch)"
)
_ELASTIC_HOROVOD = (
    "elastic Horovod starts on at least 2 nodes (it compares two hosts' network interfaces); set "
    "nodes to 2 or more, or use launcher pytorchjob"
)


# The refusal of objective mlm with export.nvidia, in bertjob_api.validation's words too: NVIDIA's
# fine-tuning scripts load a BertForPreTraining, NSP head included.
MLM_NVIDIA_EXPORT = (
    "NVIDIA's format holds the NSP head (cls.seq_relationship) and pooler that objective mlm does "
    "not train; use the Hugging Face export (a BertForMaskedLM), or objective mlm-nsp"
)


def _job_rules() -> list[Rule]:
    mpijob = "self.launcher == 'mpijob'"
    launcher_words = f"({mpijob} ? 'launcher mpijob' : 'launcher trainjob with trainJob.mlPolicy mpi')"
    policy_words = f"({mpijob} ? 'launcher mpijob' : 'Trainer v2\\'s MPI policy')"
    elastic = "has(self.elastic)"
    return [
        *(rule for index in range(MAX_PHASES) for rule in _phase_rules(index)),
        Rule(
            "size(self.phases) < 2 || self.phases[1].maxSeqLength >= self.phases[0].maxSeqLength",
            "spec.phases[1].maxSeqLength: phase 2 must not use shorter sequences than phase 1",
            field_path=".phases",
        ),
        _finetune_rule(),
        Rule(
            f"!(self.accelerator == 'habana-hpu' && {_UNDER_MPI})",
            "spec.launcher: launcher mpijob, or trainjob with trainJob.mlPolicy mpi," + _HABANA_MPI,
            field_path=".launcher",
            message_expression=_concat(_Text("spec.launcher: "), launcher_words, _Text(_HABANA_MPI)),
        ),
        Rule(
            f"!({_COMPRESSION} == 'bf16' && {_UNDER_MPI})",
            "spec.distributed.gradientCompression: bf16 is not available under launcher mpijob or "
            "Trainer v2's MPI policy" + _BF16_MPI,
            field_path=".distributed.gradientCompression",
            message_expression=_concat(
                _Text("spec.distributed.gradientCompression: bf16 is not available under "),
                policy_words,
                _Text(_BF16_MPI),
            ),
        ),
        Rule(
            f"!{elastic} || self.elastic.minNodes <= {_NODES}",
            "spec.elastic.minNodes: must not be more than the nodes of spec.topology",
            field_path=".elastic.minNodes",
        ),
        Rule(
            f"!{elastic} || self.elastic.maxNodes >= {_NODES}",
            "spec.elastic.maxNodes: must not be fewer than the nodes of spec.topology",
            field_path=".elastic.maxNodes",
        ),
        Rule(
            # Its only other value is horovodrun, so the message can name it without reading it.
            f"!({elastic} && {mpijob} && {_MPI_COMMAND} != 'horovodrun')",
            "spec.mpi.command: elastic training under launcher mpijob needs horovodrun (elastic "
            "Horovod), not mpirun",
            field_path=".mpi.command",
        ),
        Rule(
            f"!({elastic} && {mpijob} && {_NODES} < 2)",
            "spec.topology.nodes: " + _ELASTIC_HOROVOD,
            field_path=".topology.nodes",
        ),
        Rule(
            f"!({elastic} && self.launcher == 'trainjob')",
            "spec.elastic: Kubeflow Trainer v2 has no elastic training; use launcher pytorchjob",
            field_path=".elastic",
        ),
        Rule(
            f"!({_MPI_POLICY} && {_MPI_COMMAND} != 'mpirun')",
            "spec.mpi.command: Trainer v2's MPI runtime starts the ranks with mpirun",
            field_path=".mpi.command",
        ),
        Rule(
            f"!{_DEEPSPEED} || self.distributed.deepspeed.zeroStage != 0",
            "spec.distributed.deepspeed.zeroStage: 0 is DeepSpeed without ZeRO, the plain data "
            "parallelism DDP and Horovod already give; leave spec.distributed.deepspeed out, or set "
            "zeroStage 1, 2, 3",
            field_path=".distributed.deepspeed.zeroStage",
        ),
        Rule(
            f"!({_DEEPSPEED} && self.accelerator == 'xeon-cpu' && self.precision == 'fp16')",
            "spec.precision: fp16 under DeepSpeed needs a GPU or HPU; on xeon-cpu use bf16 or fp32",
            field_path=".precision",
        ),
        Rule(
            f"!({_DEEPSPEED} && {_COMPRESSION} != 'none')",
            "spec.distributed.gradientCompression: is for DDP and Horovod; with DeepSpeed set "
            "communication_data_type in spec.distributed.deepspeed.config instead",
            field_path=".distributed.gradientCompression",
        ),
        Rule(
            f"!({_DEEPSPEED} && {elastic})",
            "spec.elastic: DeepSpeed's ZeRO checkpoints are sharded for one world size; elastic "
            "training runs with DDP or Horovod only",
            field_path=".elastic",
        ),
        Rule(
            f"!({_DEEPSPEED} && {mpijob} && {_MPI_COMMAND} == 'horovodrun')",
            "spec.mpi.command: DeepSpeed runs under mpirun (it joins through torch.distributed), not "
            "horovodrun",
            field_path=".mpi.command",
        ),
        Rule(
            "!(has(self.evaluation) && has(self.evaluation.everySteps) && self.data.heldoutFraction == 0.0)",
            "spec.evaluation.everySteps: evaluation needs held-out shards: set "
            "spec.data.heldoutFraction above 0",
            field_path=".evaluation.everySteps",
        ),
        Rule(
            f"!has(self.budget) || ({_shares_add_up()})",
            "spec.budget: " + BUDGET_SHARES,
            field_path=".budget",
        ),
        Rule(
            "!(self.objective == 'mlm' && has(self.export) && self.export.nvidia)",
            "spec.export.nvidia: " + MLM_NVIDIA_EXPORT,
            field_path=".export.nvidia",
        ),
        Rule(
            "!(has(self.model) && has(self.model.initFrom)) || "
            "(has(self.data.vocab) && has(self.data.vocab.file))",
            "spec.data.vocab.file: model.initFrom continues an existing model, which needs its own "
            "vocabulary: set file to its vocab.txt",
            field_path=".data.vocab.file",
        ),
    ]


# The rules across spec's objects, carried by JobSpec (validation.problems and what it calls).
JOB_RULES = validations(*_job_rules())
