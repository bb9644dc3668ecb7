"""The job resolved for the world that runs it: batch split, model dimensions and paths, made once.

The trainer makes a :class:`Plan` from the checked spec (:func:`bertjob_api.validation.checked`)
and the world size it detected, and hands it down to the training loop, which reads every derived
value from it instead of recomputing it. The world size may differ from ``spec.topology``'s: an
elastic job runs on as many nodes as it has, and ``bertjob run`` in one process. The micro-batch
then stays what the spec (or its default for ``spec.topology``) says, and the gradient accumulation
steps absorb the difference, so that the global batch, and with it the optimisation, is the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bertjob_api.defaults import (
    ModelDims,
    gradient_accumulation_steps,
    micro_batch_size,
    resolve_model,
    with_defaults,
)
from bertjob_api.spec import JobSpec


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
    steps: int  # optimizer steps

    @property
    def number(self) -> int:
        """1-based, as logs and checkpoint directories name the phase."""
        return self.index + 1


@dataclass(frozen=True)
class Paths:
    """Where the job reads and writes (as written in the spec: absolute in a pod, possibly
    relative to the working directory for ``bertjob run``)."""

    shards: Path  # spec.data.shards: the vocabulary and every phase's shards
    checkpoints: Path  # spec.checkpoint.path: phase<n>/ of each phase
    logs: Path  # spec.logging.path (default <checkpoints>/logs)
    export: Path  # spec.export.path (default <checkpoints>/hf)


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
            )
            for index, phase in enumerate(spec.phases)
        )
        # with_defaults sets both; the asserts tell mypy.
        assert spec.logging.path is not None and spec.export.path is not None
        paths = Paths(
            shards=Path(spec.data.shards),
            checkpoints=Path(spec.checkpoint.path),
            logs=Path(spec.logging.path),
            export=Path(spec.export.path),
        )
        return cls(spec, world, resolve_model(spec.model), phases, paths)

    def for_world(self, world_size: int) -> Plan:
        """This plan on ``world_size`` processes (itself when it is already for them): after an
        elastic Horovod reset, which changes the world inside the process.

        Raises:
            ValueError: as :meth:`resolve`.
        """
        if world_size == self.world_size:
            return self
        return Plan.resolve(self.spec, world_size)

    def describe(self) -> str:
        """One readable line: the world, the model, each phase's batch split and length, the paths;
        e.g. ``world size 1; bert-tiny: 2 layers, hidden 128, 2 heads; phase 1: seq 128, global
        batch 64 = 1 x 16 x 4 accumulation, 600 steps; ...``."""
        model = self.model
        parts = [
            f"world size {self.world_size}",
            f"{self.spec.model.preset}: {model.num_hidden_layers} layers, hidden {model.hidden_size}, "
            f"{model.num_attention_heads} heads",
        ]
        parts += [
            f"phase {phase.number}: seq {phase.max_seq_length}, global batch {phase.global_batch_size} = "
            f"{self.world_size} x {phase.micro_batch_size} x {phase.accumulation_steps} accumulation, "
            f"{phase.steps} steps"
            for phase in self.phases
        ]
        paths = self.paths
        parts.append(
            f"shards {paths.shards}, checkpoints {paths.checkpoints}, logs {paths.logs}, "
            f"export {paths.export}"
        )
        return "; ".join(parts)
