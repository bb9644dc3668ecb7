"""Data-preparation throughput: raw text -> HDF5 shards, with one worker and with all cores.

    python benchmarks/data_prep.py                  # 16 MB and 64 MB corpora, seq 128, dupe factor 5
    python benchmarks/data_prep.py --mb 256 --seq 512 --max-predictions 80

For each corpus size and worker count it runs ``python -m bertpretrain prepare`` in a fresh
process (an existing vocabulary, as NVIDIA's ``create_pretraining_data.py`` takes one) and prints
instances/s, MB of raw text/s and the peak resident memory of the main process and of the largest
worker. The reference figure: NVIDIA's script makes about 640 instances/s on one core of a
2-core x86 machine at seq 128, dupe factor 5 (the figure given in issue 3), so the target of 50x
is 32,000 instances/s per core.

The corpus is the Python documentation (``builtin:python-docs``, 1.8 MB of English) written in
BERT's format (a sentence per line, a blank line between documents), repeated with the documents
in a new random order each time until it reaches the size asked for. Repetition does not help the
pipeline: every copy is split, tokenized and cut into instances anew. The vocabulary is trained on
that text (``--vocab-size`` tokens).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from bertjob_api.spec import SourceSpec
from bertpretrain.data import corpus
from bertpretrain.data.vocab import train_vocab

NVIDIA_INSTANCES_PER_SECOND = 640.0
COLUMNS = (
    "corpus MB", "workers", "instances", "seconds", "instances/s", "per worker", "x NVIDIA per core",
    "MB/s", "peak RSS main MB", "peak RSS worker MB",
)  # fmt: skip


def python_docs() -> list[list[str]]:
    """The built-in corpus's documents, as lists of sentences."""
    source = SourceSpec(path=corpus.BUILTIN_PYTHON_DOCS)
    return [corpus.sentences(document) for document in corpus.read_source(source, collections.Counter())]


def write_corpus(path: Path, megabytes: float, seed: int = 0) -> float:
    """Write the BERT-format corpus of about ``megabytes`` MB to ``path``; returns its size in MB."""
    documents = python_docs()
    rng = random.Random(seed)
    written = 0
    with path.open("w", encoding="utf-8") as file:
        while written < megabytes * 1e6:
            rng.shuffle(documents)
            for document in documents:
                text = "\n".join(document) + "\n\n"
                file.write(text)
                written += len(text.encode("utf-8"))
    return written / 1e6


def job(corpus_file: Path, out: Path, vocab_file: Path, args: argparse.Namespace, workers: int) -> dict:
    """The job file for one run."""
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
                "maxShardMB": args.shard_mb,
                "workers": workers,
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


def run_once(job_file: Path) -> tuple[float, dict[str, float]]:
    """Run the data stage in a new process; returns (seconds, peak RSS in MB of main and workers)."""
    code = (
        "import resource, sys, json\n"
        "from bertpretrain.run import main\n"
        "status = main(['prepare', '--config', sys.argv[1]])\n"
        "peak = {'main': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,\n"
        "        'worker': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}\n"
        "print('PEAK ' + json.dumps(peak))\n"
        "sys.exit(status)\n"
    )
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", code, str(job_file)], capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - started
    if result.returncode:
        sys.exit(f"prepare failed:\n{result.stdout}\n{result.stderr}")
    peak = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("PEAK "))[5:])
    for line in result.stdout.splitlines():
        if line.startswith("data: ") and ("documents:" in line or "instances" in line):
            print("    " + line)
    return seconds, peak


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=float, nargs="+", default=[16, 64], help="corpus sizes in MB")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, len(os.sched_getaffinity(0))])
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--max-predictions", type=int, default=20)
    parser.add_argument("--dupe-factor", type=int, default=5)
    parser.add_argument("--shard-mb", type=float, default=4.0, help="maxShardMB of the job")
    parser.add_argument("--vocab-size", type=int, default=30522)
    args = parser.parse_args(argv)

    print(f"cpu: {os.cpu_count()} cores; python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="data-prep-") as tmp:
        root = Path(tmp)
        vocab_dir = root / "vocab"
        train_vocab((s for d in python_docs() for s in d), args.vocab_size, True, vocab_dir)
        rows = []
        for megabytes in args.mb:
            corpus_file = root / f"corpus-{megabytes:g}mb.txt"
            size = write_corpus(corpus_file, megabytes)
            for workers in args.workers:
                out = root / f"out-{megabytes:g}-{workers}"
                job_file = root / "job.yaml"
                job_file.write_text(
                    yaml.safe_dump(job(corpus_file, out, vocab_dir / "vocab.txt", args, workers))
                )
                print(f"  {size:.1f} MB, {workers} worker(s):")
                seconds, peak = run_once(job_file)
                metadata = json.loads(next(out.glob("seq_len_*/metadata.json")).read_text())
                instances = metadata["instances"] + metadata["heldout"]["instances"]
                rows.append((size, workers, instances, seconds, peak))
        print(
            f"\nseq {args.seq}, max predictions {args.max_predictions}, dupe factor {args.dupe_factor}, "
            f"vocabulary {args.vocab_size}; wall time of the whole `prepare` process, start-up included"
        )
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + " --- |" * len(COLUMNS))
        for size, workers, instances, seconds, peak in rows:
            rate = instances / seconds
            cells = [
                f"{size:.1f}", str(workers), str(instances), f"{seconds:.1f}", f"{rate:,.0f}",
                f"{rate / workers:,.0f}", f"{rate / workers / NVIDIA_INSTANCES_PER_SECOND:.1f}",
                f"{size / seconds:.2f}", f"{peak['main']:.0f}", f"{peak['worker']:.0f}",
            ]  # fmt: skip
            print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
