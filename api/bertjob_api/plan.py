"""The job resolved for the world that runs it: batch split, model dimensions and paths, made once.

The trainer makes a :class:`Plan` from the checked spec (:func:`bertjob_api.validation.checked`)
and the world size it detected, and hands it down to the training loop, which reads every derived
value from it instead of recomputing it. The world size may differ from ``spec.topology``'s: an
elastic job runs on as many nodes as it has, and ``bertjob run`` in one process. The micro-batch
then stays what the spec (or its default for ``spec.topology``) says, and the gradient accumulation
steps absorb the difference, so that the global batch, and with it the optimisation, is the same.

Each phase's learning rate is also resolved here, once: ``spec.optimizer.lrScaling`` ``linear``
multiplies the phase's ``learningRate`` by (``globalBatchSize`` / ``referenceGlobalBatchSize``)
(Goyal et al. 2017, "Accurate, Large Minibatch SGD"), ``sqrt`` by its square root (Krizhevsky
2014, "One weird trick"; Intel's Model Zoo BERT scales by the square root of its MPI process
count), ``none`` leaves it as written. The scale is of the global batch, not of the world size:
an elastic job that runs on fewer processes keeps its global batch, so keeps its learning rate.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from bertjob_api.contract import FINETUNE_DIR
from bertjob_api.defaults import (
    ModelDims,
    gradient_accumulation_steps,
    micro_batch_size,
    resolve_model,
    with_defaults,
)
from bertjob_api.spec import DataSpec, JobSpec, OptimizerSpec, PhaseSpec


@dataclass(frozen=True)
class PhasePlan:
    """One phase's batch split and length, for one world size.

    ``global_batch_size`` = ``world_size`` x ``micro_batch_size`` x ``accumulation_steps``
    sequences (rows, when packed) per optimizer step.
    """

    index: int  # 0-based, as in spec.phases
    max_seq_length: int  # tokens per sequence
    max_predictions_per_seq: int
    global_batch_size: int  # sequences per optimizer step, over all processes
    micro_batch_size: int  # sequences per process per forward/backward pass
    accumulation_steps: int  # forward/backward passes per optimizer step on each process
    # Optimizer steps; None with spec.budget until the phase fixes them (Plan.with_steps).
    steps: int | None
    written_learning_rate: float  # the phase's learningRate as the spec writes it
    lr_scale: float  # what spec.optimizer.lrScaling multiplies it by (1 with none)
    learning_rate: float  # the peak learning rate used: written_learning_rate x lr_scale

    @property
    def number(self) -> int:
        """1-based, as logs and checkpoint directories name the phase."""
        return self.index + 1


def lr_scale(optimizer: OptimizerSpec, global_batch_size: int) -> float:
    """The factor ``optimizer.lrScaling`` applies to the learning rate of a phase whose global
    batch is ``global_batch_size`` sequences: 1 (``none``), global / reference (``linear``,
    Goyal et al. 2017) or its square root (``sqrt``, Krizhevsky 2014).

    Raises:
        ValueError: ``linear`` or ``sqrt`` without ``referenceGlobalBatchSize`` (the spec's
            validator refuses this already).
    """
    if optimizer.lr_scaling == "none":
        return 1.0
    reference = optimizer.reference_global_batch_size
    if reference is None:
        raise ValueError(
            f"optimizer.lrScaling {optimizer.lr_scaling} needs optimizer.referenceGlobalBatchSize"
        )
    ratio = global_batch_size / reference
    return ratio if optimizer.lr_scaling == "linear" else math.sqrt(ratio)


# The directory names below spec.data.shards, spec.checkpoint.path and spec.export.path.
VOCAB_DIR = "vocab"  # the WordPiece vocabulary (bertpretrain.data's vocab module)
DOCUMENTS_DIR = "documents"  # the corpus, tokenized, in pieces
NVIDIA_EXPORT_DIR = "nvidia"  # spec.export.nvidia's files, below the export


def dataset_dir_name(phase: PhaseSpec, data: DataSpec) -> str:
    """Name of a phase's dataset directory: NVIDIA's ``seq_len_{L}_max_pred_{P}``, plus the mode
    (``_dynamic``, or ``_packed_{algorithm}``)."""
    name = f"seq_len_{phase.max_seq_length}_max_pred_{phase.max_predictions_per_seq}"
    if data.masking == "dynamic":
        return name + "_dynamic"
    if data.packing != "none":
        return f"{name}_packed_{data.packing}"
    return name


def phase_dir(root: Path, phase_index: int) -> Path:
    """The checkpoint directory of phase ``phase_index`` (0-based) under ``root``:
    ``root/phase<index + 1>``."""
    return root / f"phase{phase_index + 1}"


@dataclass(frozen=True)
class Paths:
    """Where the job reads and writes (as written in the spec: absolute in a pod, possibly
    relative to the working directory for ``bertjob run``); every path below ``spec.data.shards``,
    ``spec.checkpoint.path`` and ``spec.export.path`` is named here, once. Make one with
    :meth:`of`."""

    shards: Path  # spec.data.shards: the vocabulary and every phase's shards
    vocab: Path  # <shards>/vocab: vocab.txt, tokenizer.json
    documents: Path  # <shards>/documents: the tokenized corpus
    datasets: tuple[Path, ...]  # <shards>/seq_len_<L>_max_pred_<P>[...]: each phase's shards
    checkpoints: Path  # spec.checkpoint.path: phase<n>/ of each phase
    phase_checkpoints: tuple[Path, ...]  # <checkpoints>/phase<n>: each phase's checkpoints
    logs: Path  # spec.logging.path (default <checkpoints>/logs)
    export: Path  # spec.export.path (default <checkpoints>/hf)
    finetune: Path  # <checkpoints>/finetune: finetune.json, and builtin tasks' files

    @classmethod
    def of(cls, spec: JobSpec) -> Paths:
        """The paths of ``spec`` (with :func:`bertjob_api.defaults.with_defaults` applied here if it
        was not)."""
        spec = with_defaults(spec)
        # with_defaults sets both; the asserts tell mypy.
        assert spec.logging.path is not None and spec.export.path is not None
        shards, checkpoints = Path(spec.data.shards), Path(spec.checkpoint.path)
        export = Path(spec.export.path)
        return cls(
            shards=shards,
            vocab=shards / VOCAB_DIR,
            documents=shards / DOCUMENTS_DIR,
            datasets=tuple(shards / dataset_dir_name(phase, spec.data) for phase in spec.phases),
            checkpoints=checkpoints,
            phase_checkpoints=tuple(phase_dir(checkpoints, index) for index in range(len(spec.phases))),
            logs=Path(spec.logging.path),
            export=export,
            finetune=checkpoints / FINETUNE_DIR,
        )

    def outputs(self) -> list[tuple[str, Path]]:
        """Each directory the job writes, with its field: the data, the checkpoints, the log and the
        export."""
        return [
            ("spec.data.shards", self.shards),
            ("spec.checkpoint.path", self.checkpoints),
            ("spec.logging.path", self.logs),
            ("spec.export.path", self.export),
        ]


@dataclass(frozen=True)
class Plan:
    """The job as it runs on ``world_size`` processes: the spec with its defaults, and every value
    derived from it. Make one with :meth:`resolve`."""

    spec: JobSpec  # with bertjob_api.defaults.with_defaults applied
    world_size: int
    model: ModelDims
    phases: tuple[PhasePlan, ...]
    paths: Paths

    @classmethod
    def resolve(cls, spec: JobSpec, world_size: int | None = None) -> Plan:
        """The plan of ``spec`` (checked, see :func:`bertjob_api.validation.checked`; its defaults
        are applied here if they were not) on ``world_size`` processes (default: the topology's).

        Raises:
            ValueError: a phase's global batch does not split into whole micro-batches over
                ``world_size`` processes (validation refuses this for the topology's world size;
                an elastic job can meet another one).
        """
        spec = with_defaults(spec)
        world = spec.topology.world_size if world_size is None else world_size
        if world < 1:
            raise ValueError(f"world size {world}: at least one process must train")
        scales = [lr_scale(spec.optimizer, phase.global_batch_size) for phase in spec.phases]
        phases = tuple(
            PhasePlan(
                index=index,
                max_seq_length=phase.max_seq_length,
                max_predictions_per_seq=phase.max_predictions_per_seq,
                global_batch_size=phase.global_batch_size,
                # with_defaults chose the micro-batch for spec.topology's world size; it stays.
                micro_batch_size=micro_batch_size(phase, world),
                accumulation_steps=gradient_accumulation_steps(phase, world),
                steps=phase.steps,
                written_learning_rate=phase.learning_rate,
                lr_scale=scale,
                learning_rate=phase.learning_rate * scale,
            )
            for (index, phase), scale in zip(enumerate(spec.phases), scales, strict=True)
        )
        return cls(spec, world, resolve_model(spec.model), phases, Paths.of(spec))

    def for_world(self, world_size: int) -> Plan:
        """This plan on ``world_size`` processes (itself when it is already for them): after an
        elastic Horovod reset, which changes the world inside the process.

        Raises:
            ValueError: as :meth:`resolve`.
        """
        if world_size == self.world_size:
            return self
        return Plan.resolve(self.spec, world_size)

    def with_steps(self, index: int, steps: int) -> Plan:
        """This plan with phase ``index``'s (0-based) optimizer steps fixed at ``steps``: what a
        phase under ``spec.budget`` trains with once it has calibrated."""
        phases = list(self.phases)
        phases[index] = dataclasses.replace(phases[index], steps=steps)
        return dataclasses.replace(self, phases=tuple(phases))

    def learning_rate(self, index: int) -> dict[str, float | int | str | None]:
        """How phase ``index`` (0-based) got its learning rate, for checkpoints and logs:
        ``learning_rate`` (used), ``written_learning_rate`` (the spec's), ``lr_scaling``,
        ``reference_global_batch_size`` (None with ``none``), ``global_batch_size`` and
        ``lr_scale``."""
        phase, optimizer = self.phases[index], self.spec.optimizer
        return {
            "learning_rate": phase.learning_rate,
            "written_learning_rate": phase.written_learning_rate,
            "lr_scaling": optimizer.lr_scaling,
            "reference_global_batch_size": optimizer.reference_global_batch_size,
            "global_batch_size": phase.global_batch_size,
            "lr_scale": phase.lr_scale,
        }

    def describe(self) -> str:
        """One readable line: the world, the model, each phase's batch split, length and learning
        rate, the paths; e.g. ``world size 1; bert-tiny: 2 layers, hidden 128, 2 heads; phase 1:
        seq 128, global batch 64 = 1 x 16 x 4 accumulation, 600 steps, lr 0.002 = 0.001 x sqrt(64 /
        16); ...``. A world size other than the topology's says that the global batches, and so the
        learning rates, are kept."""
        model = self.model
        world = f"world size {self.world_size}"
        written = self.spec.topology.world_size
        if self.world_size != written:
            world += (
                f" (the topology's is {written}: each phase keeps its global batch, and so its learning "
                f"rate; the gradient accumulation steps absorb the difference)"
            )
        parts = [
            world,
            f"{self.spec.model.preset}: {model.num_hidden_layers} layers, hidden {model.hidden_size}, "
            f"{model.num_attention_heads} heads",
        ]
        parts += [
            f"phase {phase.number}: seq {phase.max_seq_length}, global batch {phase.global_batch_size} = "
            f"{self.world_size} x {phase.micro_batch_size} x {phase.accumulation_steps} accumulation, "
            f"{'steps from the budget' if phase.steps is None else f'{phase.steps} steps'}, "
            f"lr {self._describe_lr(phase)}"
            for phase in self.phases
        ]
        paths = self.paths
        parts.append(
            f"shards {paths.shards}, checkpoints {paths.checkpoints}, logs {paths.logs}, "
            f"export {paths.export}"
        )
        return "; ".join(parts)

    def _describe_lr(self, phase: PhasePlan) -> str:
        optimizer = self.spec.optimizer
        if optimizer.lr_scaling == "none":
            return f"{phase.learning_rate:g}"
        ratio = f"{phase.global_batch_size} / {optimizer.reference_global_batch_size}"
        factor = f"sqrt({ratio})" if optimizer.lr_scaling == "sqrt" else ratio
        return f"{phase.learning_rate:g} = {phase.written_learning_rate:g} x {factor}"
