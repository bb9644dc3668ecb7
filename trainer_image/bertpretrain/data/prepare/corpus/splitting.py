"""Split a raw document into sentences with BlingFire, a pure function run in the worker processes.

Line and paragraph breaks are handed to BlingFire as U+2029 (paragraph separator), after which it
always ends a sentence, so that one call splits a whole document.
"""

from __future__ import annotations

import re

import blingfire

from bertpretrain.data.prepare.corpus.raw import RawDocument
from bertpretrain.data.prepare.corpus.wikitext import wikitext_to_prose

# The version of each kind's splitting. Bump a kind's number by hand whenever sentences() gives
# other sentences for the same document (a new rule, another BlingFire, another whitespace rule):
# the vocabulary's and the documents' cache keys hold these numbers (sources.code_versions), so that
# a corpus split by older code is split again instead of reused.
SPLITTER_VERSIONS: dict[str, int] = {"sentences": 1, "lines": 1, "prose": 1, "wikitext": 1}

# A line that ends like a sentence (also how ``auto`` tells ``bert`` files from ``text``).
SENTENCE_END = re.compile(r"""[.!?:;]['"’”)\]]*$""")

# U+2029 (paragraph separator) ends a sentence for BlingFire whatever precedes it, unlike "\n",
# which it reads as a space. The space after it matters: BlingFire ends a sentence after
# "\u2029Mr." but not after "\u2029 Mr.".
_BREAK_CHAR = "\u2029"
_BREAK = "\u2029 "
# A sentence end (., !, ?, an ellipsis, CJK full stops) followed by a space: where BlingFire splits.
_MAY_HOLD_SENTENCES = re.compile(r"[.!?\u2026\u3002\uff01\uff1f]\S*\s")
BLANK_LINES = re.compile(r"\n[^\S\n]*\n\s*")


def sentences(document: RawDocument) -> list[str]:
    """The document's sentences, stripped and non-empty, found with BlingFire.

    ``sentences`` (BERT's format): each line is one sentence, exactly as Google's and NVIDIA's
    ``create_pretraining_data.py`` take it, never split further; ``lines`` (the built-in corpus):
    every line break ends a sentence and a line may be split further; ``prose``: blank lines end
    paragraphs and single line breaks are spaces; ``wikitext``: the markup is stripped with
    mwparserfromhell first, then as prose. Runs of whitespace inside a sentence become one space.
    A pure function: it runs in worker processes.

    Raises:
        ValueError: an unknown ``kind``.
    """
    if document.kind == "sentences":
        return [s for s in (" ".join(line.split()) for line in document.text.split("\n")) if s]
    if document.kind == "lines":
        return _lines(document.text)
    if document.kind == "prose":
        text = _prose_breaks(document.text)
    elif document.kind == "wikitext":
        text = _prose_breaks(wikitext_to_prose(document.text))
    else:
        raise ValueError(f"{document.origin}: unknown document kind {document.kind!r}")
    return _split(text)


def _split(text: str) -> list[str]:
    """Sentences of text whose line breaks are U+2029 (which always ends a sentence)."""
    if not text or text.isspace():
        return []
    split = blingfire.text_to_sentences(text)
    if split.count(_BREAK_CHAR) != text.count(_BREAK_CHAR):
        # Never seen, but cheap to check: the breaks must survive, or lines would be joined.
        return [s for part in text.split(_BREAK_CHAR) for s in split_sentences(part)]
    # Whitespace is collapsed per sentence: a regular expression over the whole text is slower.
    parts = split.replace(_BREAK_CHAR, "\n").split("\n")
    return [s for s in (" ".join(part.split()) for part in parts) if s]


def _lines(text: str) -> list[str]:
    """A sentence per line, each line that may hold several (a sentence end followed by a space
    within it) split further with BlingFire: the built-in corpus's documents (BERT's format is
    ``sentences``, never split). Most lines hold one sentence, and BlingFire costs more than the
    test; on the built-in corpus, no line without such an end is split by it.
    The lines to split go to BlingFire in one call, joined by U+2029 (which always ends a sentence).
    """
    lines = [" ".join(line.split()) for line in text.split("\n")]
    flagged = [i for i, line in enumerate(lines) if _MAY_HOLD_SENTENCES.search(line)]
    if not flagged:
        return [line for line in lines if line]
    split = blingfire.text_to_sentences(_BREAK.join(lines[i] for i in flagged)).split(_BREAK_CHAR)
    if len(split) != len(flagged):
        # Never seen, but cheap to check: the breaks must survive, or lines would be joined.
        split = ["\n".join(split_sentences(lines[i])) for i in flagged]
    groups: list[str | list[str]] = list(lines)
    for i, group in zip(flagged, split, strict=True):
        groups[i] = [s for s in (" ".join(part.split()) for part in group.split("\n")) if s]
    return [s for group in groups for s in ([group] if isinstance(group, str) else group) if s]


def split_sentences(text: str) -> list[str]:
    """Split one paragraph of prose into sentences with BlingFire; whitespace is collapsed."""
    text = " ".join(text.split())
    if not text:
        return []
    sentences = (s.strip() for s in blingfire.text_to_sentences(text).split("\n"))
    return [s for s in sentences if s]


def _prose_breaks(text: str) -> str:
    """Prose with paragraph breaks as U+2029 and line breaks within paragraphs as spaces."""
    return BLANK_LINES.sub(_BREAK, text.strip()).replace("\n", " ")
