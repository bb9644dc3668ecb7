"""The WordPiece vocabulary: trained on the corpus or taken from a file, and tokenization with it.

The tokenizer is BERT's (Devlin et al. 2019; google-research/bert ``tokenization.py``) as Hugging
Face ``tokenizers`` builds it: ``BertNormalizer`` (clean-up, CJK spacing, and lower-casing with
accent stripping for uncased models), ``BertPreTokenizer`` (split on whitespace and punctuation)
and a ``WordPiece`` model with ``##`` continuation pieces and ``[UNK]``. A vocabulary directory
holds ``vocab.txt`` (one token per line, the line number is the id; Google's format) and
``tokenizer.json`` (the whole pipeline, with BERT's ``[CLS] A [SEP] B [SEP]`` post-processor so
that it serves as is after export). Trained vocabularies start with ``[PAD] [UNK] [CLS] [SEP]
[MASK]`` at ids 0-4.

Training is not bit-for-bit reproducible: ``tokenizers`` (0.23) breaks ties between equally
frequent merges in hash-map order (huggingface/tokenizers#1794), so two trainings on the same text
can differ in a few of the rarest tokens. The vocabulary is therefore trained once and kept with
the shards; everything made from a given vocabulary is deterministic.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tqdm import tqdm

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
VOCAB_FILE = "vocab.txt"
TOKENIZER_FILE = "tokenizer.json"
_ENCODE_BATCH = 8192


@dataclass(frozen=True)
class SpecialIds:
    """Ids of BERT's five special tokens in one vocabulary."""

    pad: int
    unk: int
    cls: int
    sep: int
    mask: int

    @classmethod
    def of(cls, tokenizer: Tokenizer, source: str | Path) -> SpecialIds:
        """Read the ids from ``tokenizer``'s WordPiece vocabulary (not its added tokens).

        Raises:
            ValueError: the vocabulary lacks one of ``[PAD] [UNK] [CLS] [SEP] [MASK]``; the message
                names ``source`` (the file it came from) and the token.
        """
        vocab = tokenizer.get_vocab(with_added_tokens=False)
        for token in SPECIAL_TOKENS:
            if token not in vocab:
                raise ValueError(f"{source}: the vocabulary has no {token} token, which BERT needs")
        return cls(*(vocab[token] for token in SPECIAL_TOKENS))


def train_vocab(documents: Iterable[list[str]], size: int, lowercase: bool, out_dir: Path) -> Path:
    """Train a WordPiece vocabulary of at most ``size`` tokens and save it into ``out_dir``.

    ``documents`` are lists of sentences (as :func:`bertpretrain.corpus.documents` yields them).
    Uses ``tokenizers``' ``WordPieceTrainer`` (which, like Google's vocabularies, counts the
    five special tokens within ``size``); a small corpus may give fewer than ``size`` tokens.
    Writes ``vocab.txt`` and ``tokenizer.json`` (under temporary names, then renamed) and returns
    ``out_dir``.
    """
    tokenizer = _bert_pipeline(models.WordPiece(unk_token="[UNK]"), lowercase)
    trainer = trainers.WordPieceTrainer(
        vocab_size=size, special_tokens=list(SPECIAL_TOKENS), show_progress=False
    )
    tokenizer.train_from_iterator((s for document in documents for s in document), trainer=trainer)
    _save(_with_special_tokens(tokenizer), out_dir, "trained vocabulary")
    return out_dir


def import_vocab(file: Path, lowercase: bool, out_dir: Path) -> Path:
    """Copy an existing ``vocab.txt`` or ``tokenizer.json`` into ``out_dir`` as both files.

    ``lowercase`` applies to a ``vocab.txt`` (which does not record it); a ``tokenizer.json``
    keeps its own normalizer. Returns ``out_dir``.

    Raises:
        FileNotFoundError: ``file`` does not exist.
        ValueError: ``file`` is not a WordPiece vocabulary, or lacks a special token.
    """
    _save(load_tokenizer(file, lowercase), out_dir, str(file))
    return out_dir


def load_tokenizer(path: Path, lowercase: bool = True) -> Tokenizer:
    """Load a BERT tokenizer from a vocabulary directory, a ``tokenizer.json`` or a ``vocab.txt``.

    A directory is read through its ``tokenizer.json``, or its ``vocab.txt`` when it has none. A
    ``vocab.txt`` gets BERT's pipeline with ``lowercase`` (Google's ``do_lower_case``).

    Raises:
        FileNotFoundError: nothing to load at ``path``.
        ValueError: the file is not a WordPiece vocabulary, or lacks one of the special tokens.
    """
    path = Path(path)
    if path.is_dir():
        path = path / TOKENIZER_FILE if (path / TOKENIZER_FILE).is_file() else path / VOCAB_FILE
    if not path.is_file():
        raise FileNotFoundError(f"vocabulary {path}: no such file")
    if path.suffix == ".json":
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as error:  # tokenizers raises a bare Exception for a bad file
            raise ValueError(f"{path}: not a tokenizers JSON file: {error}") from None
        if not isinstance(tokenizer.model, models.WordPiece):
            raise ValueError(f"{path}: a {type(tokenizer.model).__name__} tokenizer, BERT needs WordPiece")
        SpecialIds.of(tokenizer, path)
        return tokenizer
    try:
        model = models.WordPiece.from_file(str(path), unk_token="[UNK]")
    except Exception as error:
        raise ValueError(f"{path}: not a vocab.txt (one token per line): {error}") from None
    SpecialIds.of(Tokenizer(model), path)
    return _with_special_tokens(_bert_pipeline(model, lowercase))


def tokenize_documents(tokenizer: Tokenizer, documents: Sequence[list[str]]) -> list[list[list[int]]]:
    """Token ids of every sentence: ``result[document][sentence] -> list[int]``.

    No special tokens are added (instances add ``[CLS]``/``[SEP]`` themselves), and text that
    spells a special token (``"[MASK]"``) is tokenized as ordinary text, as Google's tokenizer
    does, so that ``[CLS]``/``[SEP]``/``[MASK]`` ids only ever come from instance creation.
    Sentences with no token are dropped, then documents with no sentence (as Google does).
    Sentences are encoded in parallel batches by ``tokenizers`` (Rust threads).
    """
    sentences = [s for document in documents for s in document]
    saved = tokenizer.encode_special_tokens
    tokenizer.encode_special_tokens = True
    try:
        ids: list[list[int]] = []
        with tqdm(total=len(sentences), desc="tokenizing", unit="sentence") as progress:
            for start in range(0, len(sentences), _ENCODE_BATCH):
                batch = sentences[start : start + _ENCODE_BATCH]
                ids.extend(e.ids for e in tokenizer.encode_batch(batch, add_special_tokens=False))
                progress.update(len(batch))
    finally:
        tokenizer.encode_special_tokens = saved
    result = []
    position = 0
    for document in documents:
        tokenized = [s for s in ids[position : position + len(document)] if s]
        position += len(document)
        if tokenized:
            result.append(tokenized)
    return result


def _bert_pipeline(model: models.Model, lowercase: bool) -> Tokenizer:
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


def _with_special_tokens(tokenizer: Tokenizer) -> Tokenizer:
    """Register the special tokens (never split, skipped when decoding) and BERT's post-processor."""
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    vocab = tokenizer.get_vocab()
    tokenizer.post_processor = processors.BertProcessing(("[SEP]", vocab["[SEP]"]), ("[CLS]", vocab["[CLS]"]))
    return tokenizer


def _save(tokenizer: Tokenizer, out_dir: Path, source: str) -> None:
    """Write ``vocab.txt`` and ``tokenizer.json`` into ``out_dir`` through a temporary directory."""
    if not isinstance(tokenizer.model, models.WordPiece):
        raise ValueError(f"{source}: a {type(tokenizer.model).__name__} tokenizer, BERT needs WordPiece")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".tmp-vocab-") as tmp:
        tokenizer.model.save(tmp)
        tokenizer.save(os.path.join(tmp, TOKENIZER_FILE))
        for name in (VOCAB_FILE, TOKENIZER_FILE):
            os.replace(os.path.join(tmp, name), out_dir / name)
