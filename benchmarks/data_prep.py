"""Data preparation on one core, side by side with NVIDIA's ``create_pretraining_data.py``.

    # once: the documentation of Debian's linux-doc-6.1 and python3.11-doc is the corpus
    apt-get update && apt-get install -y linux-doc-6.1 python3.11-doc
    # NVIDIA's create_pretraining_data.py and tokenization.py (DeepLearningExamples,
    # PyTorch/LanguageModeling/BERT) in a directory of their own, outside this repository
    python benchmarks/data_prep.py --nvidia /tmp/nvidia-bert            # 21 MB, both sides, twice each
    python benchmarks/data_prep.py --scale 4 --repeats 1          # ours alone, the 21 MB written 4 times

*The corpus.* Real English prose written in BERT's format (a sentence per line, a blank line between
documents), built from documentation that Debian packages ship: each reStructuredText file of the
Linux kernel's documentation (``linux-doc-6.1``, ``/usr/share/doc/linux-doc-6.1/Documentation``) and
of the Python 3.11 manual (``python3.11-doc``, ``/usr/share/doc/python3.11/html/_sources``) is one
document; its prose paragraphs are kept (literal blocks, directives, tables, headings and lists of
symbols are dropped) and split into sentences with BlingFire. Files are taken in sorted order until
the corpus reaches ``--mb`` (``--paragraphs``: a paragraph per line instead, unsplit, so that most
lines hold several sentences, which both sides must take as one); ``--scale k`` then writes the
documents ``k`` times, in a new random order each time (for the memory check on a larger
corpus). The vocabulary (``--vocab-size`` WordPiece tokens) is trained on that corpus by our
trainer and given to both sides, as NVIDIA's script takes an existing one.

*The two sides*, each a fresh process pinned with ``taskset -c CPU`` to the same core, run in turn
(ours, NVIDIA's, ours, NVIDIA's...) so that whatever else the machine does falls on both alike:

* ours: ``python -m bertpretrain prepare`` with ``workers: 1, numShards: 1`` (one process, one shard
  file), the same seq length, predictions, dupe factor, masked-LM and short-sequence probabilities
  (``--data-only``: ``bertpretrain.data.prepare.stage.prepare`` called directly, without the trainer's
  imports);
* NVIDIA's: ``python create_pretraining_data.py --input_file CORPUS --bert_model VOCAB ...`` from the
  directory given by ``--nvidia`` (their code is never part of this repository).

Each line gives instances (read back from the HDF5 files), wall seconds of the whole process
(start-up included), instances/s and the peak resident memory of the process (``wait4``'s
``ru_maxrss``, which covers any worker it waited for); the summary gives the median of each side
and the ratio of the medians.

Then the two sides' output side by side (the fidelity check: both take a line as a sentence, so
the shares should agree within a point), read back from the last run's HDF5 files: sentences
(ours: what the documents stage counted, ``documents/manifest.json``; NVIDIA's: the corpus's
non-blank lines, each of which its script takes as a sentence), instances, the share of
full-length instances (``maxSeqLength`` real tokens, ``input_mask`` summed), the share of short
ones (fewer than half of ``maxSeqLength``) and the mean real tokens per instance (``[CLS]`` and
``[SEP]`` included).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import blingfire
import h5py
import numpy as np
import yaml

DOC_ROOTS = (
    Path("/usr/share/doc/linux-doc-6.1/Documentation"),
    Path("/usr/share/doc/python3.11/html/_sources"),
)
# A line of reStructuredText markup rather than prose: directives and comments, section
# underlines, table borders, field lists, bullets of symbols.
_MARKUP = re.compile(r"^(\.\. |::|[=\-~^\"'`#*+_]{3,}\s*$|\+[-=+]+|\|)")
_LETTERS = re.compile(r"[A-Za-z]")
_BULLET = re.compile(r"^(?:[-*+]|#\.|\(?\w{1,3}[.)]) +")


def _doc_files() -> list[Path]:
    files: list[Path] = []
    for root in DOC_ROOTS:
        if not root.is_dir():
            sys.exit(f"{root} is missing: apt-get install -y linux-doc-6.1 python3.11-doc")
        files += sorted(p for p in root.rglob("*") if re.search(r"\.(rst|rst\.gz|rst\.txt|txt\.gz)$", p.name))
    return files


def _read(path: Path) -> str:
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return data.decode("utf-8", errors="replace")


def _prose_paragraphs(text: str) -> Iterator[str]:
    """The paragraphs of an RST file that read as prose: not a literal block (indented by a tab or
    four spaces), no markup line, mostly letters; list bullets are removed."""
    for paragraph in re.split(r"\n\s*\n", text):
        lines = paragraph.splitlines()
        if (
            not lines
            or lines[0].startswith(("\t", "    "))
            or any(_MARKUP.match(line.strip()) for line in lines)
        ):
            continue
        joined = _BULLET.sub("", " ".join(line.strip() for line in lines))
        if len(joined.split()) < 6 or len(_LETTERS.findall(joined)) < 0.6 * len(joined):
            continue
        yield joined


def document_sentences(path: Path, paragraphs: bool = False) -> list[str]:
    """One documentation file as a document: its prose split into sentences with BlingFire, or with
    ``paragraphs`` its paragraphs unsplit (lines that hold several sentences each)."""
    if paragraphs:
        return list(_prose_paragraphs(_read(path)))
    sentences = []
    for paragraph in _prose_paragraphs(_read(path)):
        sentences += [s.strip() for s in blingfire.text_to_sentences(paragraph).split("\n") if s.strip()]
    return sentences


def build_corpus(
    path: Path, megabytes: float, scale: int, seed: int = 0, paragraphs: bool = False
) -> tuple[float, int]:
    """Write the BERT-format corpus to ``path`` (a line per paragraph with ``paragraphs``); returns
    (MB written, documents written)."""
    documents = []
    size = 0
    for file in _doc_files():
        sentences = document_sentences(file, paragraphs)
        if len(sentences) < 2:
            continue
        text = "\n".join(sentences) + "\n\n"
        documents.append(text)
        size += len(text.encode("utf-8"))
        if size >= megabytes * 1e6:
            break
    rng = random.Random(seed)
    written = 0
    with path.open("w", encoding="utf-8") as out:
        for copy in range(scale):
            if copy:
                rng.shuffle(documents)
            for text in documents:
                out.write(text)
                written += len(text.encode("utf-8"))
    return written / 1e6, len(documents) * scale


def _job(corpus_file: Path, out: Path, vocab_file: Path, args: argparse.Namespace) -> dict:
    return {
        "apiVersion": "bertjob.dev/v1alpha1",
        "kind": "BertPretrainJob",
        "metadata": {"name": "data-prep-benchmark"},
        "spec": {
            "image": "unused",
            "data": {
                "sources": [{"path": str(corpus_file), "format": "bert"}],
                "shards": str(out),
                "vocab": {"file": str(vocab_file)},
                "dupeFactor": args.dupe_factor,
                "numShards": 1,
                "workers": 1,
            },
            "phases": [
                {
                    "maxSeqLength": args.seq,
                    "maxPredictionsPerSeq": args.max_predictions,
                    "globalBatchSize": 8,
                    "learningRate": 1e-4,
                    "steps": 1,
                }
            ],
            "checkpoint": {"path": str(out / "checkpoints")},
        },
    }


# The data stage without bertpretrain.run's command-line handling. Before commit e58812a, run.py
# imported torch and the training modules (about 2 s and 190 MB) even for `prepare`; since then the
# two modes differ by little.
_DATA_ONLY = (
    "import sys\n"
    "from bertjob_api.jobfile import load_job\n"
    "from bertpretrain.data.prepare.stage import prepare\n"
    "prepare(load_job(sys.argv[1]).spec)\n"
)


def _run(command: list[str], cwd: Path | None, log: Path) -> tuple[float, float]:
    """Run ``command``; returns (wall seconds, peak RSS in MB of it and the children it waited for)."""
    started = time.perf_counter()
    with log.open("w") as output:
        process = subprocess.Popen(command, cwd=cwd, stdout=output, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        sys.exit(f"{' '.join(command)} failed ({process.returncode}):\n{log.read_text()[-3000:]}")
    return seconds, usage.ru_maxrss / 1024


@dataclass(frozen=True)
class Output:
    """What one side made: ``sentences`` it read, ``instances``, and their real tokens (``lengths``,
    int [instances], ``input_mask`` summed per row)."""

    sentences: int
    lengths: np.ndarray

    @property
    def instances(self) -> int:
        return len(self.lengths)

    def shares(self, seq: int) -> dict[str, float]:
        """Full-length share and short share (under ``seq / 2`` real tokens), in percent, and the
        mean real tokens per instance."""
        return {
            "full": 100 * float(np.mean(self.lengths == seq)),
            "short": 100 * float(np.mean(self.lengths < seq / 2)),
            "tokens": float(np.mean(self.lengths)),
        }


def _lengths(files: Sequence[Path]) -> np.ndarray:
    lengths = []
    for file in files:
        with h5py.File(file, "r") as f:
            lengths.append(f["input_mask"][:].sum(axis=1, dtype=np.int64))
    return np.concatenate(lengths)


def run_ours(
    corpus_file: Path, vocab_file: Path, work: Path, args: argparse.Namespace
) -> tuple[Output, float, float]:
    """One run of our ``prepare``; returns (its output, seconds, peak RSS MB)."""
    out = work / "ours"
    shutil.rmtree(out, ignore_errors=True)
    job_file = work / "job.yaml"
    job_file.write_text(yaml.safe_dump(_job(corpus_file, out, vocab_file, args)))
    entry = ["-m", "bertpretrain", "prepare", "--config", str(job_file)]
    if args.data_only:
        entry = ["-c", _DATA_ONLY, str(job_file)]
    seconds, peak = _run([*_pin(args), sys.executable, *entry], None, work / "ours.log")
    manifest = json.loads((out / "documents" / "manifest.json").read_text())
    sentences = sum(sum(piece["sentences"]) for piece in manifest["pieces"])
    return Output(sentences, _lengths(sorted(out.glob("seq_len_*/*.hdf5")))), seconds, peak


def run_nvidia(
    corpus_file: Path, vocab_file: Path, work: Path, args: argparse.Namespace
) -> tuple[Output, float, float]:
    """One run of NVIDIA's script; returns (its output, seconds, peak RSS MB)."""
    output = work / "nvidia.hdf5"
    output.unlink(missing_ok=True)
    command = [
        *_pin(args), sys.executable, str(args.nvidia / "create_pretraining_data.py"),
        f"--input_file={corpus_file}", f"--output_file={output}", f"--vocab_file={vocab_file}",
        f"--bert_model={vocab_file}", "--do_lower_case", f"--max_seq_length={args.seq}",
        f"--max_predictions_per_seq={args.max_predictions}", "--masked_lm_prob=0.15",
        "--short_seq_prob=0.1", f"--dupe_factor={args.dupe_factor}", "--random_seed=12345",
    ]  # fmt: skip
    seconds, peak = _run(command, args.nvidia, work / "nvidia.log")
    with corpus_file.open(encoding="utf-8") as lines:
        sentences = sum(1 for line in lines if line.strip())
    return Output(sentences, _lengths([output])), seconds, peak


def _pin(args: argparse.Namespace) -> list[str]:
    return ["taskset", "-c", str(args.cpu)] if args.cpu is not None else []


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=float, default=21.0, help="MB of distinct documentation text")
    parser.add_argument("--scale", type=int, default=1, help="write the documents this many times")
    parser.add_argument("--corpus", type=Path, help="an existing BERT-format corpus instead of building one")
    parser.add_argument("--nvidia", type=Path, help="directory of NVIDIA's create_pretraining_data.py")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each side, alternating")
    parser.add_argument("--cpu", type=int, default=1, help="the core both sides are pinned to")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--max-predictions", type=int, default=20)
    parser.add_argument("--dupe-factor", type=int, default=5)
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument(
        "--data-only",
        action="store_true",
        help="ours: call bertpretrain.data.prepare.stage.prepare instead of `python -m bertpretrain prepare`",
    )
    parser.add_argument(
        "--paragraphs",
        action="store_true",
        help="write a paragraph per line, unsplit: each side must take each line as one sentence",
    )
    parser.add_argument("--keep", type=Path, help="keep the corpus and vocabulary in this directory")
    args = parser.parse_args(argv)
    if args.nvidia is not None:
        args.nvidia = args.nvidia.resolve()
        if not (args.nvidia / "create_pretraining_data.py").is_file():
            sys.exit(f"--nvidia: no create_pretraining_data.py in {args.nvidia}")

    from bertpretrain.data.prepare.vocab import train_vocab

    print(f"cpu: {os.cpu_count()} cores, pinned to {args.cpu}; python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="data-prep-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        corpus_file = args.corpus or work / "corpus.txt"
        vocab_dir = work / "vocab"
        if args.corpus is None and not corpus_file.is_file():
            megabytes, documents = build_corpus(corpus_file, args.mb, args.scale, paragraphs=args.paragraphs)
            print(f"corpus: {megabytes:.1f} MB, {documents} documents -> {corpus_file}")
        if not (vocab_dir / "vocab.txt").is_file():
            with corpus_file.open(encoding="utf-8") as lines:
                train_vocab((line for line in lines if line.strip()), args.vocab_size, True, vocab_dir)
        text = corpus_file.read_bytes()
        documents = text.count(b"\n\n")
        sentences = sum(1 for line in text.splitlines() if line.strip())
        print(
            f"corpus {corpus_file}: {len(text) / 1e6:.1f} MB, {documents} documents, "
            f"{sentences} sentences; seq {args.seq}, "
            f"max predictions {args.max_predictions}, dupe factor {args.dupe_factor}, "
            f"vocabulary {args.vocab_size}"
        )
        del text
        sides = {"ours": run_ours}
        if args.nvidia is not None:
            sides["NVIDIA"] = run_nvidia
        results: dict[str, list[tuple[int, float, float]]] = {side: [] for side in sides}
        outputs: dict[str, Output] = {}
        print("| run | side | instances | seconds | instances/s | peak RSS MB |")
        print("| --- | --- | --- | --- | --- | --- |")
        for repeat in range(args.repeats):
            for side, run in sides.items():
                output, seconds, peak = run(corpus_file, vocab_dir / "vocab.txt", work, args)
                outputs[side] = output
                instances = output.instances
                results[side].append((instances, seconds, peak))
                print(
                    f"| {repeat + 1} | {side} | {instances} | {seconds:.1f} | {instances / seconds:,.0f} "
                    f"| {peak:.0f} |",
                    flush=True,
                )
        rates = {side: statistics.median(i / s for i, s, _ in runs) for side, runs in results.items() if runs}
        for side, runs in results.items():
            if not runs:
                continue
            print(
                f"{side}: median {rates[side]:,.0f} instances/s on one core, "
                f"peak RSS {max(p for _, _, p in runs):.0f} MB"
            )
        if "NVIDIA" in rates:
            print(f"ratio ours / NVIDIA (medians): {rates['ours'] / rates['NVIDIA']:.2f}x")
        _print_outputs(outputs, args.seq)
    return 0


def _print_outputs(outputs: dict[str, Output], seq: int) -> None:
    """The sides' outputs side by side, and ours less NVIDIA's in points (shares) and tokens."""
    print(
        f"\n| side | sentences | instances | full-length % | short (< {seq // 2} tokens) % "
        "| tokens/instance |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for side, output in outputs.items():
        shares = output.shares(seq)
        print(
            f"| {side} | {output.sentences:,} | {output.instances:,} | {shares['full']:.1f} "
            f"| {shares['short']:.1f} | {shares['tokens']:.1f} |"
        )
    if "NVIDIA" in outputs:
        ours, theirs = outputs["ours"].shares(seq), outputs["NVIDIA"].shares(seq)
        print(
            f"ours - NVIDIA: full-length {ours['full'] - theirs['full']:+.1f} points, short "
            f"{ours['short'] - theirs['short']:+.1f} points, "
            f"{ours['tokens'] - theirs['tokens']:+.1f} tokens/instance"
        )


if __name__ == "__main__":
    raise SystemExit(main())
