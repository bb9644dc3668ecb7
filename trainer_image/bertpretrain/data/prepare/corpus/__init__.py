"""The corpus: read a job's sources as raw documents, and split documents into sentences.

Reading and splitting are two steps: :func:`.sources.read_source` and :func:`.sources.read_corpus`
run in one process and yield :class:`.raw.RawDocument` objects (text plus how to split it), and
:func:`.splitting.sentences` turns one document into sentences; the data pipeline runs it in worker
processes, so it is a pure function of the document.

Formats (``SourceSpec.format``)
-------------------------------
``python-docs`` (path ``builtin:python-docs``)
    English text shipped with the running interpreter, so that a job runs with no download:
    the docstrings of each standard-library module (module, classes and functions, in source
    order; found with :mod:`ast`, nothing is imported) as one document per module, then each
    topic of the language reference in ``pydoc_data.topics`` as one document per topic.
    Paragraphs that are code rather than prose (doctests, code examples, grammar, tables) are
    dropped. On CPython 3.11: about 490 documents, 22,000 sentences, 1.8 MB of text. The
    documents hold their sentences one per line, already split (kind ``lines``: a line that still
    holds a sentence end followed by a space is split again with BlingFire).
``bert``
    Google's BERT input format: one sentence per line, a blank line between documents. Each line
    is one sentence, exactly as Google's and NVIDIA's ``create_pretraining_data.py`` take it: a
    line holding several sentences is not split (splitting is for ``text`` and the other formats
    of prose).
``text``
    Raw prose, one document per file (a book, an article): lines are joined, blank lines
    separate paragraphs, and paragraphs are split into sentences.
``jsonl``
    JSON Lines, optionally ``.gz`` or ``.bz2`` compressed: one document per record, its text
    (prose, blank lines separating paragraphs) in the field ``SourceSpec.field``.
``parquet``
    Parquet, or Arrow IPC (file or stream format, which is also what Feather v2 is), read with
    pyarrow one record batch at a time: one document per row of the column ``SourceSpec.field``.
    Which of the three a file is comes from its first bytes, not its name.
``wikipedia``
    A MediaWiki XML dump (``.xml``, ``.xml.bz2`` or ``.xml.gz``) read page by page with
    ``mwxml``. Only articles are kept: pages outside the main namespace, redirects and
    disambiguation pages are skipped and counted. The markup is stripped in :func:`.splitting.sentences`
    (in the workers) with ``mwparserfromhell``; see :func:`.wikitext.wikitext_to_prose` for what
    is kept. Stubs are not skipped: how many sentences a page has is known only after stripping.
``pubmed``
    A PubMed baseline file (gzip-compressed XML, ``.xml.gz``) read with ``pubmed_parser``: one
    document per article, its title then its abstract; articles without an abstract are skipped
    and counted. The labels of structured abstracts (``BACKGROUND``, ``METHODS``) are dropped.
``auto``
    By file name: ``builtin:python-docs``; ``.txt`` (also ``.txt.gz``/``.txt.bz2``) is ``bert`` when
    at least 80% of its first 1000 non-blank lines end like a sentence, ``text`` otherwise;
    ``.jsonl``, ``.json`` (also ``.gz``/``.bz2``) ``jsonl``; ``.parquet``, ``.arrow``, ``.feather``
    ``parquet``; ``.xml``, ``.xml.bz2`` ``wikipedia``; ``.xml.gz`` ``pubmed``. In a directory,
    files of other types are skipped and counted; a single file of another type is an error.

A directory is searched recursively and read in sorted path order; names starting with a dot
(``.git``, Kubernetes' ``..data`` links) are ignored. With an explicit format, every file of a
directory is read in that format. ``.gz`` and ``.bz2`` files are decompressed as they are read.

Memory is bounded by one document (plus one record batch for Parquet/Arrow), never a file:
text is read line by line, XML with streaming parsers. One exception: ``pubmed_parser`` clears
each article once parsed but keeps an empty element per article until the file ends, so its
memory grows with the number of articles in one file (about 30,000 in a baseline file), not
with their text.

Bad input
---------
Every problem either stops the job with an error that names the file, or skips and counts:

* skipped, counted, and one warning line per file on stderr: empty files, binary files (a NUL
  byte in the first 8 KiB), files of unknown type in a directory;
* counted without a warning, as they are routine: redirects, pages outside the main namespace,
  disambiguation pages, articles without abstract, records without the text field or with
  empty text;
* bytes that are not UTF-8: the *document* holding them is skipped and counted, and the rest of
  the file is still read, so that one bad record does not cost a whole dump; one warning per
  file names the line and byte offset of the first bad byte. For ``text`` the document is the
  whole file;
* errors (``ValueError`` naming the file): truncated or corrupt ``.gz``/``.bz2`` data, XML that
  is not well formed or not a MediaWiki dump/PubMed set, a JSON Lines line that is not JSON
  (``file:line``), a Parquet/Arrow file without the text column (naming the columns it has) or
  that is not Parquet/Arrow at all. A job should not quietly train on half of a dump.
* a missing path, or a directory with no file that could be read: ``FileNotFoundError``.

Sentences are found with BlingFire's ``text_to_sentences`` (rule based, no model). Line and
paragraph breaks are handed to it as U+2029 (paragraph separator), after which it always ends
a sentence, so that one call splits a whole document.

Modules: :mod:`.sources` (the entry points below), :mod:`.files` (finding, opening, sniffing),
:mod:`.readers` (one per format), :mod:`.wikitext` (markup stripper), :mod:`.pydocs`
(``builtin:python-docs``), :mod:`.splitting` (sentences), :mod:`.raw` (:class:`.raw.RawDocument`).
This ``__init__`` imports none of them (docs/design.md, "What counts as an import"): import the
module that holds a name.
"""
