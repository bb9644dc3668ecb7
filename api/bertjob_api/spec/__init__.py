"""The BertPretrainJob API: one typed tree shared by the CRD schema, the CLI and the trainer.

Field names are snake_case in Python and camelCase in YAML/JSON (``max_seq_length`` <->
``maxSeqLength``), as Kubeflow's SDK does; the conversion is mechanical, so one set of names
serves the custom resource, the job file read by the CLI, and the trainer's configuration.
Each field's ``description`` is what ``kubectl explain bertpretrainjob.spec`` shows: the CRD in
``manifests/`` is generated from these classes (``python -m bertjob_api.crd``).

Checks that involve one object live here (types, ranges, enums); checks across objects live in
:mod:`bertjob_api.validation`, and defaults that depend on other fields in :mod:`bertjob_api.defaults`.

The classes are grouped by area, one module each, and every public name is re-exported here, so
``from bertjob_api.spec import JobSpec`` is the way in:

- :mod:`~bertjob_api.spec.base`: the strict model they all derive from, the shared field types
  (quantities, int32/int64, object names) and :class:`SpecError`;
- :mod:`~bertjob_api.spec.job`: ``spec`` itself with its topology and model, the whole resource,
  and the parsers (:func:`parse_job`, :func:`parse_spec`, :func:`to_document`);
- :mod:`~bertjob_api.spec.data`: the corpus, vocabulary and shards;
- :mod:`~bertjob_api.spec.phases`: the phases, the optimizer, checkpoints, export, evaluation, logs;
- :mod:`~bertjob_api.spec.cluster`: the pods, volumes, run policy and the launchers' settings;
- :mod:`~bertjob_api.spec.finetune`: the downstream tasks.
"""

from __future__ import annotations

from bertjob_api.contract import API_VERSION, GROUP, KIND, PLURAL, VERSION
from bertjob_api.spec.base import (
    MAX_PROBLEMS_SHOWN,
    DnsSubdomain,
    Int32,
    Int64,
    KubernetesObject,
    LabelValue,
    Quantity,
    SpecError,
)
from bertjob_api.spec.cluster import (
    DEFAULT_RUNTIMES,
    DeepSpeedSpec,
    DistributedSpec,
    ElasticSpec,
    MlPolicy,
    MpiSpec,
    PodSpec,
    PrepareResourcesSpec,
    PrepareSpec,
    ResourcesSpec,
    RunPolicySpec,
    RuntimeRefSpec,
    SchedulingPolicySpec,
    TrainJobSpec,
    VolumeSpec,
)
from bertjob_api.spec.data import DataSpec, SourceFormat, SourceSpec, VocabSpec
from bertjob_api.spec.finetune import (
    TASK_METRICS,
    BuiltinTask,
    FinetuneTaskSpec,
    TaskFormat,
    TaskMetric,
    TaskType,
)
from bertjob_api.spec.job import (
    Accelerator,
    BertPretrainJob,
    JobSpec,
    LauncherName,
    ModelPreset,
    ModelSpec,
    ObjectMeta,
    Precision,
    Topology,
    parse_job,
    parse_spec,
    to_document,
)
from bertjob_api.spec.phases import (
    BudgetSpec,
    CheckpointSpec,
    EvaluationSpec,
    ExportSpec,
    LoggingSpec,
    OptimizerSpec,
    PhaseSpec,
)

__all__ = [
    "API_VERSION",
    "DEFAULT_RUNTIMES",
    "GROUP",
    "KIND",
    "MAX_PROBLEMS_SHOWN",
    "PLURAL",
    "TASK_METRICS",
    "VERSION",
    "Accelerator",
    "BertPretrainJob",
    "BudgetSpec",
    "BuiltinTask",
    "CheckpointSpec",
    "DataSpec",
    "DeepSpeedSpec",
    "DistributedSpec",
    "DnsSubdomain",
    "ElasticSpec",
    "EvaluationSpec",
    "ExportSpec",
    "FinetuneTaskSpec",
    "Int32",
    "Int64",
    "JobSpec",
    "KubernetesObject",
    "LabelValue",
    "LauncherName",
    "LoggingSpec",
    "MlPolicy",
    "ModelPreset",
    "ModelSpec",
    "MpiSpec",
    "ObjectMeta",
    "OptimizerSpec",
    "PhaseSpec",
    "PodSpec",
    "Precision",
    "PrepareResourcesSpec",
    "PrepareSpec",
    "Quantity",
    "ResourcesSpec",
    "RunPolicySpec",
    "RuntimeRefSpec",
    "SchedulingPolicySpec",
    "SourceFormat",
    "SourceSpec",
    "SpecError",
    "TaskFormat",
    "TaskMetric",
    "TaskType",
    "Topology",
    "TrainJobSpec",
    "VocabSpec",
    "VolumeSpec",
    "parse_job",
    "parse_spec",
    "to_document",
]
