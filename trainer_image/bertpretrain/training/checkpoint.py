"""Training checkpoints: ``<root>/phase<n>/step_<step:06d>.pt``, n counting phases from 1.

A checkpoint holds the model's ``state_dict`` under Hugging Face's parameter names, the
optimizer, schedule and gradient-scaler states, the phase index and optimizer step, the model
config, the data position (epoch, shard, row and sequences read, see
``bertpretrain.data.load.loader.DataPosition``), how the learning rate was scaled
(``bertjob_api.plan.Plan.learning_rate``) and the RNG states of every rank, all loadable with
``torch.load(weights_only=True)``. Each is written
under a temporary name and renamed into place, the directory synced after the rename
(:func:`bertjob_api.files.write_atomically`), so a reader never sees half a file, and only the
newest ``keep`` of a phase are kept. A save first removes the temporaries that writers killed
halfway left (:mod:`bertpretrain.common.files` tells them from a live writer's).

A phase resumes from its newest checkpoint that can be read (:func:`newest_resumable`): one cut
short (a power cut before the rename reached the disk, a volume that lost data) is skipped for
the one before, and the phase repeats the steps in between. ``evaluation.json`` in a phase's
directory records its last held-out evaluation, so that a run stopped after a checkpoint but
before the evaluation of that step makes it when resumed.

:mod:`bertpretrain.training.export` turns a checkpoint into a Hugging Face model directory or
NVIDIA DeepLearningExamples' files. :func:`load_initial_weights` tells the formats a job can start
from apart (these two and our own checkpoints) and refuses anything else, saying what it found.
:class:`CheckpointError` is the model stage's too (:mod:`bertpretrain.model.config`): a Hugging
Face directory that does not fit the model raises it as well.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertjob_api.files import TEMPORARY, write_atomically
from bertjob_api.plan import phase_dir
from bertpretrain.common import files
from bertpretrain.model.bert import BertForPreTraining
from bertpretrain.model.config import BertConfig, CheckpointError, shape_differences
from bertpretrain.model.huggingface import CONFIG_FILE as HF_CONFIG_FILE
from bertpretrain.model.huggingface import load_hf_weights
from bertpretrain.model.nvidia import CONFIG_FILE as NVIDIA_CONFIG_FILE
from bertpretrain.model.nvidia import (
    find_nvidia_checkpoint,
    is_bert_state_dict,
    is_nvidia_state_dict,
    load_nvidia_weights,
)
from bertpretrain.runtime.sharding import whole_parameters

_NAME = re.compile(r"^step_(\d+)\.pt$")
EVALUATION_FILE = "evaluation.json"
_MAGIC_BYTES = 16
_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_PROTO = b"\x80"
# What resuming reads besides the weights and config.
_TRAINING_STATE = ("optimizer", "scheduler", "scaler", "step", "data_position", "rng")


def checkpoint_path(root: Path, phase_index: int, step: int) -> Path:
    """Where the checkpoint of phase ``phase_index`` (0-based) after ``step`` optimizer steps goes."""
    return phase_dir(root, phase_index) / f"step_{step:06d}.pt"


def latest(directory: Path) -> Path | None:
    """The checkpoint with the highest step in a phase directory, or None if there is none."""
    found = _by_step(directory)
    return found[-1] if found else None


def _by_step(directory: Path) -> list[Path]:
    """The checkpoints in ``directory``, oldest step first; none if it does not exist."""
    if not directory.is_dir():
        return []
    found = [(int(match[1]), path) for path in directory.iterdir() if (match := _NAME.match(path.name))]
    return [path for _, path in sorted(found)]


def save_checkpoint(
    root: Path,
    phase_index: int,
    step: int,
    *,
    model: BertForPreTraining,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
    keep: int,
    data_position: dict[str, Any] | None = None,
    rng: list[dict[str, Any]] | None = None,
    learning_rate: dict[str, Any] | None = None,
    budget_seconds: float | None = None,
) -> Path:
    """Write the training state after ``step`` optimizer steps; delete all but the newest ``keep``.

    ``data_position`` is rank 0's (``DataPosition.to_dict()``); ``rng`` holds every rank's
    :func:`rng_states` in rank order (default: this process's alone); ``learning_rate`` says how
    the phase's learning rate was made (:meth:`bertjob_api.plan.Plan.learning_rate`: the rate used,
    the spec's, the scaling and its reference batch), stored as ``learning_rate``; under
    ``spec.budget``, ``budget_seconds`` is the phase's training time by the clock at this step
    (wall-clock seconds, its calibration included), from which a resumed run goes on counting.

    Returns:
        The path written, ``root/phase<n>/step_<step:06d>.pt``.
    """
    path = checkpoint_path(root, phase_index, step)
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "phase_index": phase_index,
        "step": step,
        "config": model.config.to_dict(),
        "data_position": data_position or {},
        "rng": rng if rng is not None else [rng_states()],
        "learning_rate": learning_rate or {},
    }
    if budget_seconds is not None:
        state["budget_seconds"] = budget_seconds
    with files.writing(path.parent, TEMPORARY):
        write_atomically(path, lambda file: torch.save(state, file), _tensor_bytes(state))
        _prune(path.parent, keep)
    return path


def _tensor_bytes(value: Any) -> int:
    """The bytes of the tensors in ``value`` (nested dicts, lists, tuples): about what
    ``torch.save`` writes, less its small zip and pickle overhead."""
    if isinstance(value, torch.Tensor):
        return value.untyped_storage().nbytes()
    if isinstance(value, dict):
        return sum(_tensor_bytes(item) for item in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(item) for item in value)
    return 0


def clean_temporaries(directory: Path) -> list[Path]:
    """Remove the temporaries that killed writers left in the phase directory ``directory``; none
    while a live writer holds it (:func:`bertpretrain.common.files.remove_stale`). Returns them."""
    return files.remove_stale(directory, TEMPORARY)


def _prune(directory: Path, keep: int) -> None:
    for path in _by_step(directory)[:-keep]:
        path.unlink(missing_ok=True)


def rng_states() -> dict[str, Any]:
    """This process's random number generator states: torch (CPU, and CUDA when present) and
    Python's ``random``. The loader's shuffling and masking draw from their own seeded
    generators, so these are all that a resumed rank needs to draw what it would have drawn."""
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def read_checkpoint(path: Path) -> dict[str, Any]:
    """The contents of a checkpoint file, tensors on the CPU.

    Raises:
        CheckpointError: the file is missing, is not a checkpoint, or lacks model and config.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: checkpoint does not exist") from None
    except Exception as error:
        # torch's first line says what is wrong; the rest is advice on saving checkpoints.
        reason = str(error).strip().split("\n", 1)[0].split(". ", 1)[0]
        raise CheckpointError(f"{path}: not a readable checkpoint ({reason})") from None
    if not isinstance(state, dict) or not {"model", "config"} <= state.keys():
        raise CheckpointError(f"{path}: not a training checkpoint (no model state or config)")
    return state


@dataclass(frozen=True)
class Resumable:
    """The checkpoint a phase resumes from: its file and contents, and ``"<file>: <why>"`` for each
    newer checkpoint that could not be read, newest first."""

    path: Path
    state: dict[str, Any]
    skipped: list[str]


def newest_resumable(directory: Path) -> Resumable | None:
    """The newest checkpoint in the phase directory ``directory`` that can be read and holds a
    training state; None when there is no checkpoint at all.

    A checkpoint of another model is not skipped (:func:`load_model_weights` refuses it): every
    checkpoint of the phase would be, and the job's model is what must change.

    Raises:
        CheckpointError: there are checkpoints, but none can be read; it names each and why.
    """
    skipped = []
    for path in reversed(_by_step(directory)):
        try:
            state = read_checkpoint(path)
        except CheckpointError as error:
            skipped.append(str(error))
            continue
        missing = [key for key in _TRAINING_STATE if key not in state]
        if missing:
            skipped.append(f"{path}: no training state to resume from ({', '.join(missing)} missing)")
            continue
        return Resumable(path, state, skipped)
    if skipped:
        listed = "; ".join(skipped)
        raise CheckpointError(
            f"{directory}: no checkpoint can be read: {listed}; delete them to start the phase again"
        )
    return None


# What a model trained with NSP has and one trained on masked LM alone has not (BertForPreTraining
# against BertForMaskedLM).
_NSP_PARTS = ("bert.pooler.", "cls.seq_relationship.")


def load_model_weights(
    path: Path, model: BertForPreTraining, state: dict[str, Any] | None = None, nsp_optional: bool = False
) -> dict[str, Any]:
    """Load a checkpoint's weights into ``model``; returns the whole checkpoint. ``state``: its
    contents, when already read. With ``nsp_optional``, the pooler and NSP classifier may be in one
    and not the other: a masked-LM-only checkpoint leaves ``model``'s at their initialisation, and
    an NSP checkpoint's are ignored by a model without them (starting a job from another
    objective's weights, or fine-tuning after ``objective: mlm``).

    Raises:
        CheckpointError: naming the file, when it cannot be read or its model has another shape.
    """
    state = state if state is not None else read_checkpoint(path)
    differences = shape_differences(BertConfig(**state["config"]), model.config)
    if differences:
        raise CheckpointError(f"{path}: checkpoint is of another model: {', '.join(differences)}")
    try:
        if not nsp_optional:
            model.load_state_dict(state["model"])
            return state
        ours = model.state_dict().keys()
        weights = {
            name: tensor
            for name, tensor in state["model"].items()
            if name in ours or not name.startswith(_NSP_PARTS)
        }
        result = model.load_state_dict(weights, strict=False)
    except RuntimeError as error:
        raise CheckpointError(f"{path}: weights do not fit the model: {error}") from None
    misfits = [name for name in result.missing_keys if not name.startswith(_NSP_PARTS)]
    misfits += result.unexpected_keys
    if misfits:
        raise CheckpointError(f"{path}: weights do not fit the model: {', '.join(misfits)}")
    return state


@dataclass(frozen=True)
class Initialised:
    """Where :func:`load_initial_weights` took a model's weights from: ``origin`` describes the
    file and its format (for the log), ``kept`` names the parameters it had no weights for, which
    keep their initialisation."""

    origin: str
    kept: list[str]


def load_initial_weights(source: Path, model: BertForPreTraining) -> Initialised:
    """Load the weights a job starts from (``spec.model.initFrom``) into ``model``, whichever of the
    formats below ``source`` is in; the format is told by what the files hold, not their names:

    - a training checkpoint of this trainer (a ``.pt`` with ``model`` and ``config``), see
      :func:`load_model_weights`;
    - a Hugging Face model directory (one with ``config.json``), see
      :func:`bertpretrain.model.huggingface.load_hf_weights`;
    - an NVIDIA DeepLearningExamples checkpoint: a ``.pt`` whose ``model`` entry (or the file
      itself) is a state dict in NVIDIA's names, with ``bert_config.json`` beside it; or a
      directory with ``bert_config.json`` and ``ckpt_<step>.pt`` files, the highest step taken
      (see :mod:`bertpretrain.model.nvidia`);
    - the same in Hugging Face's names: pytorch-pretrained-BERT's ``pytorch_model.bin`` (or any
      ``.pt`` of a BERT state dict) beside a ``bert_config.json``, as BioBERT's and Google's
      converted checkpoints come.

    Files are read with ``torch.load(weights_only=True)``: a checkpoint that pickles other Python
    objects than tensors and containers (``run_pretraining.py`` can store its data loader) is
    refused rather than run.

    Raises:
        CheckpointError: naming ``source``, when it is none of these formats (saying what it holds:
            the directory's entries, the file's top-level keys, or why it is no PyTorch file) or
            its weights do not fit the model (see each format's loader).
    """
    if source.is_dir():
        if (source / HF_CONFIG_FILE).is_file():
            return Initialised(f"{source} (Hugging Face)", load_hf_weights(source, model))
        if (source / NVIDIA_CONFIG_FILE).is_file():
            found = find_nvidia_checkpoint(source)
            if found is None:
                raise CheckpointError(
                    f"{source}: {NVIDIA_CONFIG_FILE} but neither ckpt_<step>.pt (NVIDIA "
                    f"DeepLearningExamples) nor pytorch_model.bin beside it; it holds {_listing(source)}"
                )
            source = found
        else:
            raise CheckpointError(
                f"{source}: a directory of no format this trainer reads: no {HF_CONFIG_FILE} (Hugging "
                f"Face) and no {NVIDIA_CONFIG_FILE} with ckpt_<step>.pt (NVIDIA DeepLearningExamples); "
                f"it holds {_listing(source)}"
            )
    state = _load(source)
    if isinstance(state, dict) and {"model", "config"} <= state.keys():
        load_model_weights(source, model, state, nsp_optional=True)
        kept = [name for name, _ in model.named_parameters() if name not in state["model"]]
        return Initialised(f"{source} (training checkpoint)", kept)
    weights = state.get("model") if isinstance(state, dict) and "model" in state else state
    config_file = source.parent / NVIDIA_CONFIG_FILE
    if is_nvidia_state_dict(weights):
        kept = load_nvidia_weights(source, weights, model, config_file)
        return Initialised(f"{source} (NVIDIA DeepLearningExamples)", kept)
    if is_bert_state_dict(weights) and config_file.is_file():
        # The same format in Hugging Face's names (BioBERT's and Google's converted checkpoints).
        kept = load_nvidia_weights(source, weights, model, config_file)
        return Initialised(f"{source} (pytorch-pretrained-BERT, {NVIDIA_CONFIG_FILE})", kept)
    if is_bert_state_dict(weights):
        raise CheckpointError(
            f"{source}: a BERT state dict ({_describe(state)}) without {config_file.name} beside it "
            "to say the model's shape"
        )
    raise CheckpointError(
        f"{source}: a PyTorch file of no format this trainer reads: {_describe(state)}; expected a "
        "training checkpoint (model and config), an NVIDIA DeepLearningExamples checkpoint (model: "
        "a state dict with dense_act layers), a BERT state dict with bert_config.json beside it, or a "
        "Hugging Face directory"
    )


def _load(path: Path) -> Any:
    """The unpickled contents of ``path``, tensors on the CPU (``torch.load(weights_only=True)``)."""
    try:
        with path.open("rb") as file:
            head = file.read(_MAGIC_BYTES)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file or directory") from None
    except OSError as error:
        raise CheckpointError(f"{path}: cannot be read ({error})") from None
    # torch.save writes a zip archive; torch before 1.6 and pickle.dump a pickle (protocol 2+).
    if not (head.startswith(_ZIP_MAGIC) or head[:1] == _PICKLE_PROTO):
        raise CheckpointError(
            f"{path}: not a PyTorch file (neither a zip archive nor a pickle; it begins {head[:16]!r})"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        text = str(error)
        unsafe = re.search(r"Unsupported global: GLOBAL (\S+)", text)
        if unsafe:
            # Allow-listing the global, as torch's message advises, would run the file's code.
            # run_pretraining.py's checkpoints before the last hold its DataLoader.
            reason = (
                f"it pickles Python objects besides tensors, such as {unsafe[1]}, which are not "
                "loaded; if you trust the file, save its weights alone, e.g. torch.save({'model': "
                "torch.load(path, weights_only=False)['model']}, new_path)"
            )
        else:
            reason = text.strip().split("\n", 1)[0] or type(error).__name__
        raise CheckpointError(
            f"{path}: not a PyTorch file of tensors that can be read safely ({reason})"
        ) from None


def _describe(state: object) -> str:
    """What an unpickled file holds, in a few words: a dict's first keys (and its ``model``
    entry's), or the type."""
    if not isinstance(state, dict):
        return f"a {type(state).__name__}"
    keys = _first(state)
    model = state.get("model")
    if isinstance(model, dict):
        return f"keys {keys}, model keys {_first(model)}"
    return f"keys {keys}"


def _first(mapping: dict[Any, Any], count: int = 6) -> str:
    keys = [repr(key) for key in list(mapping)[:count]]
    more = f", ... ({len(mapping)} in all)" if len(mapping) > count else ""
    return f"[{', '.join(keys)}{more}]"


def _listing(directory: Path, count: int = 10) -> str:
    names = sorted(path.name for path in directory.iterdir())
    if not names:
        return "nothing"
    more = f", ... ({len(names)} in all)" if len(names) > count else ""
    return ", ".join(names[:count]) + more


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed phase continues: after ``step`` optimizer steps, with ``sequences`` rows
    (instances, or packed rows) already read by each rank; under ``spec.budget``, with
    ``budget_seconds`` of the phase's time spent (None in a checkpoint without it)."""

    step: int
    sequences: int
    budget_seconds: float | None = None


def load_training_state(
    path: Path,
    model: BertForPreTraining,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
    rank: int = 0,
    state: dict[str, Any] | None = None,
) -> ResumePoint:
    """Restore model, optimizer, schedule, gradient scaler and this rank's RNG states from the
    checkpoint ``path`` (``state``: its contents, when already read).

    A checkpoint written by fewer ranks than there are now gives the extra ranks the states of
    rank ``rank % saved ranks``.

    Returns:
        The step and data position to continue from.

    Raises:
        CheckpointError: see :func:`load_model_weights`; also a checkpoint without training state.
    """
    # Under ZeRO-3 each rank holds slices of the parameters: rank 0's whole weights reach them all.
    with whole_parameters(model, modifier_rank=0):
        state = load_model_weights(path, model, state)
    try:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        rng = state["rng"][rank % len(state["rng"])]
        sequences = int(state["data_position"]["sequences"])
    except (KeyError, ValueError, RuntimeError, TypeError, ZeroDivisionError) as error:
        raise CheckpointError(f"{path}: cannot resume from it: {error!r}") from None
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    seconds = state.get("budget_seconds")
    return ResumePoint(int(state["step"]), sequences, None if seconds is None else float(seconds))


def record_evaluation(root: Path, phase_index: int, step: int, values: dict[str, float]) -> None:
    """Record that phase ``phase_index`` (0-based) was evaluated after ``step`` optimizer steps,
    with ``values`` (the figures by name), in ``<phase dir>/evaluation.json``."""
    document = json.dumps({"step": step, "values": values}, indent=2, sort_keys=True) + "\n"
    directory = phase_dir(root, phase_index)
    with files.writing(directory, TEMPORARY):
        write_atomically(directory / EVALUATION_FILE, lambda file: file.write(document.encode()))


def evaluated_step(root: Path, phase_index: int) -> int:
    """The step of the last evaluation :func:`record_evaluation` recorded for the phase; 0 when
    there is none (or the record cannot be read: the evaluation is then made again)."""
    try:
        step = json.loads((phase_dir(root, phase_index) / EVALUATION_FILE).read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    return step if isinstance(step, int) else 0
