"""The whole job: the rendered PyTorchJob's own command under torchrun, and ``bertjob run``."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file

import bertpretrain.run
from bertjob.cli import main as bertjob_main
from bertjob.render import render
from bertjob.spec import parse_job
from bertpretrain.loader import ShardError
from bertpretrain.preemption import Preempted
from bertpretrain.run import main as bertpretrain_main
from bertpretrain.train import DivergenceError
from jobs import small_training_job, with_value

CONFIG_IN_POD = "/etc/bertjob/job.yaml"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _mlm_losses(output: str, phase: int) -> list[float]:
    return [float(v) for v in re.findall(rf"phase {phase}/2 step \d+/\d+ .*?\(mlm ([\d.]+)", output)]


@pytest.mark.slow
def test_rendered_pytorchjob_command_trains_two_ranks(tmp_path: Path) -> None:
    document = small_training_job(tmp_path, processes=2)
    # In a pod, tmp_path would be a volume: the job writes its shards and checkpoints there.
    document["spec"]["volumes"] = [{"name": "work", "mountPath": str(tmp_path)}]
    rendered = render(parse_job(document))
    config_map, pytorchjob = rendered[0], rendered[-1]
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
    "data",
    [{}, {"masking": "dynamic", "wholeWordMask": True, "heldoutFraction": 0.1}, {"packing": "nnlshp"}],
    ids=["static", "dynamic-whole-word-heldout", "packed"],
)
def test_bertjob_run_trains_exports_and_fills_masks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: dict[str, Any]
) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(small_training_job(tmp_path, processes=1, **data)))
    assert bertjob_main(["run", str(job_file)]) == 0
    output = capsys.readouterr().out
    if "heldoutFraction" in data:
        assert re.search(r"phase 2/2 step 4/4 held-out: mlm_acc 0\.\d{4}", output), output
    losses = _mlm_losses(output, 1)
    assert losses[-1] < losses[0] - 0.5, output
    assert _mlm_losses(output, 2), output
    predictions = re.findall(r"^\s+(\d\.\d{3})\s+(\S+)$", output.split("fill-mask", 1)[1], re.MULTILINE)
    assert len(predictions) == 5
    scores = [float(score) for score, _ in predictions]
    assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1.0001
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json"):
        assert (tmp_path / "checkpoints" / "hf" / name).exists(), name


@pytest.mark.slow
def test_export_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = small_training_job(tmp_path, processes=1)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(with_value(document, "spec.phases", document["spec"]["phases"][:1])))
    assert bertpretrain_main(["export", "--config", str(job_file)]) == 1
    assert "no checkpoint under" in capsys.readouterr().err
    assert bertpretrain_main(["run", "--config", str(job_file)]) == 0

    checkpoints = tmp_path / "checkpoints" / "phase1"
    middle = checkpoints / "step_000020.pt"
    out = tmp_path / "step20"
    assert (
        bertpretrain_main(
            ["export", "--config", str(job_file), "--checkpoint", str(middle), "--out", str(out)]
        )
        == 0
    )
    exported = load_file(out / "model.safetensors")
    trained = torch.load(middle, weights_only=True)["model"]
    assert all(torch.equal(exported[name], trained[name]) for name in exported)
    assert (out / "vocab.txt").read_text() == (tmp_path / "data" / "vocab" / "vocab.txt").read_text()
    # By default: the newest checkpoint, to spec.export.path.
    assert bertpretrain_main(["export", "--config", str(job_file)]) == 0
    final = torch.load(checkpoints / "step_000030.pt", weights_only=True)["model"]
    default = load_file(tmp_path / "checkpoints" / "hf" / "model.safetensors")
    assert all(torch.equal(default[name], final[name]) for name in default)


@pytest.mark.parametrize(
    ("error", "code", "message"),
    [
        (ShardError("/data/shard_0001.hdf5: not a readable HDF5 file"), 1, "shard_0001.hdf5: not a readable"),
        (DivergenceError("phase 1/2 step 7: loss is nan"), 1, "step 7: loss is nan"),
        (Preempted(signal.SIGTERM, 12, Path("/ckpt/phase1/step_000012.pt")), 143, "stopped after step 12"),
    ],
)
def test_run_exit_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    error: Exception, code: int, message: str,
) -> None:  # fmt: skip
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(small_training_job(tmp_path, processes=1)))

    def fail(_spec: Any) -> None:
        raise error

    monkeypatch.setattr(bertpretrain.run, "run_job", fail)
    assert bertpretrain_main(["run", "--config", str(job_file)]) == code
    captured = capsys.readouterr()
    assert message in captured.err + captured.out


def test_prepare_command_makes_the_data_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = small_training_job(tmp_path, processes=1, packing="nnlshp")
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(document))
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
