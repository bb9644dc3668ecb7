"""bertjob_api.jobfile.dump writes the same text whichever emitter it picks: libyaml's (fast) for the
documents where it writes what PyYAML's does, PyYAML's for the rest (a differential comparison)."""

import random

import yaml

from bertjob_api import jobfile
from bertjob_api.spec import parse_job, to_document
from bertjob_api.validation import cluster_job
from bertjob_testing.jobs import valid_job

# Pieces that YAML treats specially, so that random strings hit quoting, simple keys and folding.
PIECES = [" ", "  ", ":", ": ", "#", " #", "-", "- ", "'", '"', "?", "{", "}", "[", "]", ",", "!", "*", "&"]
PIECES += ["|", ">", "%", "@", "`", "\\", "0", "1.5", "1e3", "0x1F", "4:16", "y", "null", "~", ".inf"]
PIECES += ["x" * 30]
PIECES += ["", "\n", "\t", "é", "\u2028", "\x85", "\x00", "\U0001f600", "\ufeff"]


def python_dump(document):
    """The text PyYAML's own emitter writes: what dump() must write for every document."""
    return yaml.dump(document, Dumper=jobfile._Dumper, sort_keys=False)


def random_string(rng):
    if rng.random() < 0.5:
        return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))
    alphabet = [chr(code) for code in range(0x20, 0x7F)] + ["\n", "é"]
    return "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 1, 5, 40, 90, 130, 300, 600])))


def test_the_demo_job_takes_libyaml_and_reads_the_same():
    document = to_document(cluster_job(parse_job(valid_job())))
    assert jobfile._emitted_alike(document)
    assert jobfile.dump(document) == python_dump(document)


def test_random_documents_are_written_as_pythons_emitter_writes_them():
    rng = random.Random(16)
    fast = 0
    for _ in range(1500):
        text = random_string(rng)
        key = random_string(rng)
        for document in (
            {"k": text},
            [text],
            {key: 1},
            {"a": {key: [text, {"c": text, "n": None, "b": True, "f": 1.5}]}},
            {"deep": {"deeper": {"deepest": [[{key: text}]]}}},
        ):
            fast += jobfile._emitted_alike(document)
            assert jobfile.dump(document) == python_dump(document), document
    # Both branches ran, many times.
    assert 1500 < fast < 7000
