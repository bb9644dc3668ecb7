"""The whole job: the rendered PyTorchJob's own command under torchrun, and ``bertjob run``."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from pydoc_data.topics import topics
from typing import Any

import pytest
import yaml
from safetensors.torch import load_file

from bertjob.cli import main as bertjob_main
from bertjob.render import render
from bertjob.spec import parse_job
from bertpretrain.run import main as bertpretrain_main
from jobs import valid_job, with_value

CONFIG_IN_POD = "/etc/bertjob/job.yaml"


def _small_job(tmp_path: Path, processes: int, **data: Any) -> dict[str, Any]:
    """A two-phase job on real text (40 topics of the language reference) that runs in seconds."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in sorted(topics)[:40]:
        (corpus / f"{name}.txt").write_text(topics[name], encoding="utf-8")
    document = valid_job()
    changes = {
        "spec.accelerator": "xeon-cpu",
        "spec.precision": "fp32",
        "spec.topology": {"nodes": 1, "processesPerNode": processes},
        "spec.model": {"preset": "bert-tiny", "numHiddenLayers": 1},
        "spec.data": {
            "sources": [{"path": str(corpus), "format": "text"}],
            "shards": str(tmp_path / "data"),
            "vocab": {"trainSize": 600},
            "numShards": 2,
            "workers": 1,
            **data,
        },
        "spec.phases": [
            {
                "maxSeqLength": 64,
                "maxPredictionsPerSeq": 10,
                "globalBatchSize": 16,
                "microBatchSize": 4,
                "learningRate": 0.01,
                "warmupProportion": 0.1,
                "steps": 30,
            },
            {
                "maxSeqLength": 128,
                "maxPredictionsPerSeq": 20,
                "globalBatchSize": 8,
                "learningRate": 0.004,
                "steps": 4,
            },
        ],
        "spec.checkpoint": {"path": str(tmp_path / "checkpoints"), "everySteps": 10, "keep": 2},
        "spec.logging": {"everySteps": 5},
    }
    for field, value in changes.items():
        document = with_value(document, field, value)
    return document


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _mlm_losses(output: str, phase: int) -> list[float]:
    return [float(v) for v in re.findall(rf"phase {phase}/2 step \d+/\d+ .*?\(mlm ([\d.]+)", output)]


@pytest.mark.slow
def test_rendered_pytorchjob_command_trains_two_ranks(tmp_path: Path) -> None:
    document = _small_job(tmp_path, processes=2)
    config_map, pytorchjob = render(parse_job(document))
    master = pytorchjob["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    config = tmp_path / "job.yaml"
    config.write_text(config_map["data"]["job.yaml"])
    command = [str(config) if arg == CONFIG_IN_POD else arg for arg in master["command"]]
    # What the training operator injects into a single-node PyTorchJob's Master pod.
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PET_NNODES": "1",
        "PET_NPROC_PER_NODE": pytorchjob["spec"]["nprocPerNode"],
        "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(_free_port()),
        "OMP_NUM_THREADS": "1",
    }
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    losses = _mlm_losses(result.stdout, 1)
    assert len(losses) == 6 and losses[-1] < losses[0], result.stdout
    assert "world size 2" in result.stdout
    weights = load_file(tmp_path / "checkpoints" / "hf" / "model.safetensors")
    assert weights["bert.embeddings.word_embeddings.weight"].shape == (600, 128)
    assert (tmp_path / "checkpoints" / "phase2" / "step_000004.pt").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "masking", [{}, {"masking": "dynamic", "wholeWordMask": True}], ids=["static", "dynamic-whole-word"]
)
def test_bertjob_run_trains_exports_and_fills_masks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], masking: dict[str, Any]
) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(_small_job(tmp_path, processes=1, **masking)))
    assert bertjob_main(["run", str(job_file)]) == 0
    output = capsys.readouterr().out
    losses = _mlm_losses(output, 1)
    assert losses[-1] < losses[0] - 0.5, output
    assert _mlm_losses(output, 2), output
    predictions = re.findall(r"^\s+(\d\.\d{3})\s+(\S+)$", output.split("fill-mask", 1)[1], re.MULTILINE)
    assert len(predictions) == 5
    scores = [float(score) for score, _ in predictions]
    assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1.0001
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json"):
        assert (tmp_path / "checkpoints" / "hf" / name).exists(), name


def test_prepare_command_makes_the_data_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = _small_job(tmp_path, processes=1, packing="nnlshp")
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(document))
    # Packing is refused for training but fine for the data stage alone.
    assert bertpretrain_main(["run", "--config", str(job_file)]) == 2
    assert bertpretrain_main(["prepare", "--config", str(job_file)]) == 0
    assert sorted(p.name for p in (tmp_path / "data").glob("seq_len_*")) == [
        "seq_len_128_max_pred_20_packed_nnlshp",
        "seq_len_64_max_pred_10_packed_nnlshp",
    ]
    assert not (tmp_path / "checkpoints").exists()
    document["spec"]["data"]["sources"] = [{"path": str(tmp_path / "missing")}]
    job_file.write_text(yaml.safe_dump(document))
    capsys.readouterr()
    assert bertpretrain_main(["prepare", "--config", str(job_file)]) == 1
    assert "missing" in capsys.readouterr().err
