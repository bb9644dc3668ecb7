"""What a corpus reader yields: a raw document (text plus how to split it), and the skip counter."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Literal

DocumentKind = Literal["sentences", "lines", "prose", "wikitext"]


@dataclass(frozen=True, slots=True)
class RawDocument:
    """A document as read, before sentence splitting; picklable (sent to worker processes).

    ``kind`` says how :func:`~bertpretrain.data.prepare.corpus.splitting.sentences` splits ``text``:
    ``sentences`` holds exactly one sentence per line (BERT's format: never split further);
    ``lines`` holds a sentence per line, where a line may still hold several, which are split
    further (the built-in corpus);
    ``prose`` holds paragraphs separated by blank lines; ``wikitext`` is MediaWiki markup,
    stripped first, then prose.
    ``origin`` says where the document came from, for messages (``file.jsonl:123``).
    """

    text: str
    kind: DocumentKind
    origin: str


# Why files and documents were skipped ("empty file", "redirect"...), and how many of each.
Skipped = collections.Counter[str]
