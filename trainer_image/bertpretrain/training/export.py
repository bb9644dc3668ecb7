"""The export: a training checkpoint to a Hugging Face model directory and NVIDIA's files.

The formats are the model stage's (:mod:`bertpretrain.model.huggingface` maps our parameters to
Hugging Face's names and writes the directory, :mod:`bertpretrain.model.nvidia` to NVIDIA
DeepLearningExamples'); this module reads the checkpoint that training wrote
(:mod:`bertpretrain.training.checkpoint`) and hands its weights and config to them. Where the
export goes is the plan's (:class:`bertjob_api.plan.Paths`), NVIDIA's files in its
``NVIDIA_EXPORT_DIR``.
"""

from __future__ import annotations

from pathlib import Path

from bertjob_api.plan import NVIDIA_EXPORT_DIR, Plan
from bertpretrain.model.config import BertConfig
from bertpretrain.model.huggingface import architecture, save_hf
from bertpretrain.model.nvidia import save_nvidia
from bertpretrain.training.checkpoint import latest, read_checkpoint


def export(plan: Plan, checkpoint: Path, out_dir: Path | None = None) -> Path:
    """Export the model of ``checkpoint`` with the job's vocabulary to ``out_dir`` (default the
    plan's export directory) as a Hugging Face model directory and, with ``spec.export.nvidia``, in
    NVIDIA DeepLearningExamples' format in ``out_dir/nvidia`` (written after the Hugging Face
    export, which replaces ``out_dir`` whole).

    Returns:
        ``out_dir``.

    Raises:
        See :func:`export_hf` and :func:`export_nvidia`.
    """
    paths = plan.paths
    target = out_dir or paths.export
    export_hf(checkpoint, paths.vocab, target, plan.spec.data.lowercase)
    if plan.spec.export.nvidia:
        export_nvidia(checkpoint, paths.vocab, target / NVIDIA_EXPORT_DIR)
    return target


def newest_checkpoint(plan: Plan) -> Path | None:
    """The newest checkpoint of the last phase that has one, or None before the first save."""
    for directory in reversed(plan.paths.phase_checkpoints):
        found = latest(directory)
        if found is not None:
            return found
    return None


def export_hf(checkpoint: Path, vocab_dir: Path, out_dir: Path, lowercase: bool) -> Path:
    """Write the model of ``checkpoint`` and the vocabulary of ``vocab_dir`` to ``out_dir`` as a
    Hugging Face model directory (:func:`bertpretrain.model.huggingface.save_hf`, which says how).

    ``checkpoint`` is any training checkpoint, not only a phase's last; its weights are written as
    they are stored. ``lowercase`` is the tokenizer's ``do_lower_case``.

    Returns:
        ``out_dir``.

    Raises:
        bertpretrain.model.config.CheckpointError: the checkpoint cannot be read.
        FileNotFoundError: ``vocab_dir`` has no ``vocab.txt``.
        bertjob_api.files.DiskFullError: the export does not fit; nothing of it is left.
    """
    state = read_checkpoint(checkpoint)
    return save_hf(state["model"], BertConfig(**state["config"]), vocab_dir, out_dir, lowercase)


def export_nvidia(checkpoint: Path, vocab_dir: Path, out_dir: Path) -> Path:
    """Write the model of ``checkpoint`` and the vocabulary of ``vocab_dir`` to ``out_dir`` in NVIDIA
    DeepLearningExamples' format (:func:`bertpretrain.model.nvidia.save_nvidia`:
    ``ckpt_<step>.pt`` named by the checkpoint's step in its phase, ``bert_config.json``,
    ``vocab.txt``).

    Returns:
        ``out_dir``.

    Raises:
        bertpretrain.model.config.CheckpointError: the checkpoint cannot be read.
        FileNotFoundError: ``vocab_dir`` has no ``vocab.txt``.
        ValueError: the model cannot be written in NVIDIA's format (see
            :func:`bertpretrain.model.nvidia.config_to_nvidia`), or has no NSP head (``objective:
            mlm``), which NVIDIA's fine-tuning scripts load.
        bertjob_api.files.DiskFullError: the export does not fit; nothing of it is left.
    """
    state = read_checkpoint(checkpoint)
    if architecture(state["model"]) != "BertForPreTraining":
        raise ValueError(
            f"{checkpoint}: NVIDIA's format needs the NSP head, which objective mlm does not train"
        )
    step = int(state.get("step", 0))
    return save_nvidia(state["model"], BertConfig(**state["config"]), vocab_dir, out_dir, step)
