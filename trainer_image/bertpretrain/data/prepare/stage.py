"""The data stage of a BertPretrainJob: corpus -> vocabulary -> documents -> instances -> shards.

Everything goes under ``spec.data.shards``::

    vocab/vocab.txt, vocab/tokenizer.json         the WordPiece vocabulary (bertpretrain.data.format.vocab)
    vocab/parameters.json                         what made it, written last
    documents/piece_{i:06d}.npz                   the corpus, tokenized, in ~1 MB pieces
    documents/manifest.json                       counts per piece, written last
    <dataset>/shard_{i:05d}.hdf5                  training shards of a phase (bertpretrain.data.format.shards)
    <dataset>/heldout_{i:05d}.hdf5                held-out shards, when heldoutFraction > 0
    <dataset>/metadata.json                       parameters and counts, written last

``<dataset>`` is ``seq_len_{L}_max_pred_{P}`` as NVIDIA names it, with ``_dynamic`` or
``_packed_{algorithm}`` appended for those modes; every one of these paths is named once, in
:class:`bertjob_api.plan.Paths`.

Two passes, each spread over ``workers`` processes:

1. *Documents.* The main process reads the corpus (:mod:`.corpus`) and cuts it into pieces of
   about ``PIECE_BYTES`` of text; workers split sentences and tokenize each piece
   (:mod:`.documents`). Both phases use these pieces.
2. *Shards.* The pieces (cut into finer units when there are fewer pieces than shards) are
   dealt to the shards in a seeded random order, so every shard draws from all over the corpus.
   A worker makes each shard from its units alone: sentence pairs (:mod:`.instances`), masks
   (``bertpretrain.data.format.masking``), optional packing (:mod:`.packing`), one HDF5 file
   (:mod:`.shard_writer`).

Memory is bounded by a piece in the main process and, in a worker, by a shard's tokenized documents
and sentence pairs (about 4 bytes a token and 20 a pair); its instances are assembled, masked and
written :data:`~.make_shards.BLOCK_ROWS` at a time (packed shards excepted: packing sees the whole shard).
What is made depends only on the corpus, the vocabulary, the parameters and the seed, not on the
number of workers: pieces are cut by bytes, and each shard's draws come from a generator seeded
with ``(seed, max_seq_length, max_predictions_per_seq, split, shard index)``.

Reusing and resuming: each stage has a *key*, everything that made its output (the corpus's files
by path, size and modification time, the vocabulary settings or file, the vocabulary's SHA-256,
seed, held-out fraction, instance parameters, ``SHARD_FORMAT``), recorded in a file written last
and only on success (``vocab/parameters.json``, ``documents/manifest.json``,
``<dataset>/metadata.json``). A re-run reuses a stage whose recorded key matches and otherwise
makes it again, printing why. Every file is written under a temporary name and renamed, and the
pieces' and shards' directories record their key in ``parameters.json`` first, so that a re-run
after an interruption keeps the files made with the same key and makes only what is missing.
Workers die with the main process (``bertpretrain.data.prepare.pool``).

This module is the orchestration and the vocabulary's reuse; the rest is in :mod:`.vocab` (training
or importing it), :mod:`.pieces` (pass 1), :mod:`.make_shards` (pass 2), :mod:`.pool` (the worker
processes), :mod:`.cache` (keys, records, resuming) and :mod:`.messages` (progress lines). What the
training loop reads of the output is in :mod:`bertpretrain.data.format` and
:mod:`bertpretrain.data.load`.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import time
from pathlib import Path

from bertjob_api.files import TEMPORARY
from bertjob_api.plan import Paths
from bertjob_api.spec import DataSpec, JobSpec
from bertpretrain.common.cpus import available_cpus
from bertpretrain.common.files import check_writable, writing
from bertpretrain.common.progress import ProgressBar
from bertpretrain.data.format import vocab
from bertpretrain.data.format.prepared import PreparedData
from bertpretrain.data.prepare import cache
from bertpretrain.data.prepare.cache import METADATA_FILE, PARAMETERS_FILE, read_json, reuse, write_json
from bertpretrain.data.prepare.corpus import sources, splitting
from bertpretrain.data.prepare.make_shards import make_dataset
from bertpretrain.data.prepare.messages import NO_TEXT, report, skips
from bertpretrain.data.prepare.pieces import make_documents
from bertpretrain.data.prepare.vocab import import_vocab, train_vocab


def prepare(spec: JobSpec) -> PreparedData:
    """Make (or find already made) the vocabulary and every phase's shards for ``spec``.

    Prints progress (bars on a terminal, lines in a log: :mod:`bertpretrain.common.progress`)
    and a report (documents, sentences, tokens, instances, padding, seconds) per stage.

    Raises:
        FileNotFoundError: a corpus source or the vocabulary file does not exist.
        PermissionError: ``spec.data.shards`` cannot be written.
        ValueError: a corpus file is unreadable (the message names it), or the vocabulary lacks
            a special token.
    """
    data, paths = spec.data, Paths.of(spec)
    check_writable("spec.data.shards", paths.shards)
    vocab_dir = paths.vocab
    phase_dirs = list(paths.datasets)
    with contextlib.ExitStack() as held:
        # This process is the writer of each directory until it is done (workers die with it):
        # temporaries that killed writers left are removed, and no other run removes ours.
        for directory in [vocab_dir, paths.documents, *phase_dirs]:
            for path in held.enter_context(writing(directory, TEMPORARY)):
                report(f"removed {path}, left by a writer that was stopped")
        corpus = sources.identity(data.sources)
        _make_vocab(spec, corpus, vocab_dir)
        tokenizer = vocab.load_tokenizer(vocab_dir)
        special = vocab.SpecialIds.of(tokenizer, vocab_dir / vocab.VOCAB_FILE)
        vocab_size = tokenizer.get_vocab_size(with_added_tokens=False)
        report(f"vocabulary: {vocab_size} tokens, lowercase={vocab.has_lowercase(tokenizer)}")

        documents_key = cache.documents_key(spec, corpus, vocab_dir)
        documents_dir = paths.documents
        # A dataset's key holds the documents' key; the documents' listing names the files changed.
        listings = (cache.read_listing(documents_dir), corpus.listing)
        pending = {}
        for phase, directory in zip(spec.phases, phase_dirs, strict=True):
            key = cache.dataset_key(spec, phase, documents_key, vocab_size)
            if not reuse(
                str(directory), read_json(directory / METADATA_FILE).get("parameters"), key, None, listings
            ):
                pending[directory] = key
        if pending:
            pieces = make_documents(spec, tokenizer, documents_key, corpus, documents_dir, _workers(data))
            for directory, parameters in pending.items():
                make_dataset(directory, documents_dir, parameters, pieces, special, tokenizer, _workers(data))
    return PreparedData(vocab_dir, vocab_size, phase_dirs)


def _workers(data: DataSpec) -> int:
    return data.workers or available_cpus()


# Vocabulary -------------------------------------------------------------------------------------


def _make_vocab(spec: JobSpec, corpus: sources.CorpusIdentity, vocab_dir: Path) -> None:
    """Train, copy or reuse the vocabulary (padded to ``padToMultipleOf`` when asked).

    ``vocab/parameters.json`` records what made the vocabulary there; it is written last, so a
    vocabulary without one (an interrupted or failed run) is never reused.
    """
    data = spec.data
    key = cache.vocab_key(spec, corpus)
    record = vocab_dir / PARAMETERS_FILE
    made = all((vocab_dir / name).is_file() for name in (vocab.VOCAB_FILE, vocab.TOKENIZER_FILE))
    listings = (cache.read_listing(vocab_dir), corpus.listing)
    if reuse("vocabulary", read_json(record) if made else None, key, vocab_dir, listings):
        return
    record.unlink(missing_ok=True)
    pad = data.vocab.pad_to_multiple_of
    if data.vocab.file is not None:
        import_vocab(Path(data.vocab.file), data.lowercase, vocab_dir, pad)
        report(f"vocabulary: {data.vocab.file} copied to {vocab_dir}")
        write_json(record, key)
        return
    assert data.vocab.train_size is not None  # VocabSpec holds exactly one of the two
    report(f"vocabulary: training {data.vocab.train_size} tokens")
    started = time.perf_counter()
    skipped: collections.Counter[str] = collections.Counter()
    # Sentence splitting runs here, in one process: training needs one pass over the text, and
    # tokenizers' trainer holds word counts, not the corpus.
    raw_documents = sources.read_corpus(data.sources, spec.seed, skipped)
    documents_read = ProgressBar(raw_documents, desc="data: vocabulary", unit="documents")
    sentences = (s for document in documents_read for s in splitting.sentences(document))
    first = next(sentences, None)
    if first is None:
        # Trained on nothing, the vocabulary would hold the special tokens alone: all text [UNK].
        raise ValueError(f"data.sources: {NO_TEXT}{skips(skipped)}")
    train_vocab(itertools.chain([first], sentences), data.vocab.train_size, data.lowercase, vocab_dir, pad)
    cache.write_listing(vocab_dir, corpus)
    write_json(record, key)
    report(f"vocabulary: trained in {time.perf_counter() - started:.1f} s -> {vocab_dir}{skips(skipped)}")
