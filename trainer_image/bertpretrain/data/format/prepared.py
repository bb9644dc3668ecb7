"""What the data stage hands to training: where it put the vocabulary and each phase's shards."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PreparedData:
    """Where the data stage put its output.

    ``vocab_dir`` holds ``vocab.txt`` and ``tokenizer.json``; ``vocab_size`` is the number of
    token ids (the model's embedding rows); ``phase_dirs[k]`` holds the shards of
    ``spec.phases[k]``.
    """

    vocab_dir: Path
    vocab_size: int
    phase_dirs: list[Path]
