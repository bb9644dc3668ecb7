"""benchmarks/train_step.py on CPU at bert-tiny, as CI runs it: the FLOP count against a hand count,
the table's rows and columns, the time budget, the compiled row, and the trainer's two real runs."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from bertpretrain.model.config import BertConfig

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# Every run here: bert-tiny at seq 128, 4 sequences, 3 timed steps; no GPU.
COLUMNS = ["preset", "seq", "micro-batch", "mode", "seq/s", "TFLOP/s", "% of GEMM", "LAMB ms", "peak MiB",
           "vs hf", "compile s"]  # fmt: skip
TINY = ["--device", "cpu", "--presets", "bert-tiny", "--seq", "128", "--micro-batch", "4", "--steps", "3"]


@pytest.fixture(scope="module")
def train_step() -> ModuleType:
    """The benchmark as a module; it imports its neighbour ``throughput`` as a script does."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("train_step")


def _table(output: str) -> list[dict[str, str]]:
    """The Markdown table's rows, by column."""
    lines = [line for line in output.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    header, *rows = ([cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines)
    assert header == COLUMNS, header
    assert all(len(row) == len(header) for row in rows), rows
    return [dict(zip(header, row, strict=True)) for row in rows]


def _number(cell: str) -> float:
    return float(cell.replace(",", ""))


def test_train_flops_per_sequence_is_the_hand_count(train_step: ModuleType) -> None:
    config = BertConfig(
        hidden_size=4, num_hidden_layers=2, num_attention_heads=2, intermediate_size=8, vocab_size=10
    )
    # L = 3 tokens, P = 2 masked positions. Per layer: 3 x (4*4*4 + 2*4*8) = 384 for the Linear
    # layers, 2 * 3^2 * 4 = 72 for QK^T and PV: 456, so 912 for 2 layers. Heads: 2 x (4*4 + 4*10)
    # = 112 for the MLM transform and decoder, 16 for the pooler, 8 for NSP. Forward: 2 x 1048
    # multiply-adds = 2096 FLOPs; a training step 3 x 2096.
    assert train_step.train_flops_per_sequence(config, 3, 2) == 6288
    # bert-base at seq 128: about 6 x the encoder's 85M matrix parameters x 128 tokens, plus
    # attention's products and the head on 20 positions.
    base = BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                      vocab_size=30522)  # fmt: skip
    flops = train_step.train_flops_per_sequence(base, 128, 20)
    assert flops == pytest.approx(6 * (12 * 12 * 768**2 * 128 + 12 * 2 * 128**2 * 768 + 20 * 768 * 31290
                                       + 768**2 + 2 * 768))  # fmt: skip
    assert 65e9 < flops < 75e9  # about 70 GFLOP per sequence


def test_micro_batches_default_per_device_and_preset_and_are_settable(train_step: ModuleType) -> None:
    default = train_step._micro_batches([])
    assert [train_step.micro_batch_for(default, "cuda", "bert-large", seq) for seq in (128, 512)] == [128, 32]
    assert [train_step.micro_batch_for(default, "cuda", "bert-base", seq) for seq in (128, 512)] == [256, 64]
    assert [train_step.micro_batch_for(default, "cpu", "bert-tiny", seq) for seq in (128, 512)] == [32, 8]
    chosen = train_step._micro_batches(["16", "bert-large:512=4"])
    assert train_step.micro_batch_for(chosen, "cuda", "bert-large", 512) == 4
    assert train_step.micro_batch_for(chosen, "cuda", "bert-large", 128) == 16
    with pytest.raises(ValueError, match="PRESET:SEQ=N"):
        train_step._micro_batches(["bert-huge:128=4"])


def test_fp8_is_gone(train_step: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    """No fp8 mode, flag or import of bertpretrain.runtime.fp8 or torchao (the module may be gone)."""
    assert train_step.MODES == ("hf eager", "ours eager", "ours compiled")
    for flag in ("--no-fp8", "--fp8-emulate", "--fp8-loss-check", "--fp8-loss-steps=5"):
        with pytest.raises(SystemExit):
            train_step._parse(["--device", "cpu", flag])
        assert "unrecognized arguments" in capsys.readouterr().err, flag
    source = Path(train_step.__file__).read_text()
    assert "runtime.fp8" not in source and "import torchao" not in source


def test_logged_rate_is_the_median_after_the_first_interval(train_step: ModuleType, tmp_path: Path) -> None:
    log = tmp_path / "train.jsonl"
    lines: list[dict[str, Any]] = [{"type": "PARAMETER", "step": "PARAMETER", "data": {"phase": 1}}]
    for step, rate in ((5, 30.0), (10, 100.0), (15, 120.0), (20, 90.0)):
        lines.append(
            {"type": "LOG", "step": [1, step], "data": {"split": "train", "sequences_per_second": rate}}
        )
    lines.append({"type": "LOG", "step": [1, 20], "data": {"split": "eval", "mlm_accuracy": 0.1}})
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert train_step.logged_rate(log) == (100.0, 3)
    assert train_step.logged_rate(tmp_path / "absent.jsonl") == (None, 0)


def test_the_cpu_table(train_step: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """hf eager and ours eager measured, in that order, and nothing else; sane figures."""
    out = tmp_path / "figures.json"
    assert train_step.main([*TINY, "--no-compiled", "--no-local", "--no-torchrun", "--json", str(out)]) == 0
    output = capsys.readouterr().out
    gemm = [line for line in output.splitlines() if line.startswith("GEMM ceiling: ")]
    assert len(gemm) == 1 and float(gemm[0].split()[2]) > 0, output
    rows = _table(output)
    assert [row["mode"] for row in rows] == ["hf eager", "ours eager"], output
    figures = json.loads(out.read_text())
    flops = train_step.train_flops_per_sequence(
        BertConfig.from_dims(train_step.MODEL_PRESETS["bert-tiny"], train_step.VOCAB_SIZE), 128, 20
    )
    assert len(figures["rows"]) == 2, figures["rows"]
    for row, measured in zip(rows, figures["rows"], strict=True):
        assert (row["preset"], row["seq"], row["micro-batch"]) == ("bert-tiny", "128", "4")
        seq_per_s = _number(row["seq/s"])
        assert seq_per_s > 0 and _number(row["LAMB ms"]) > 0 and _number(row["peak MiB"]) > 100, row
        assert 0 < _number(row["% of GEMM"]) < 100, row
        assert row["compile s"] == "-"
        assert measured["train_flops_per_sequence"] == flops
        assert _number(row["TFLOP/s"]) == pytest.approx(flops * measured["seq_per_s"] / 1e12, rel=0.01)
        assert measured["gemm_share"] == pytest.approx(measured["tflops"] / figures["gemm"]["tflops"])
        assert measured["step_ms"] > measured["lamb_ms"] > 0
    assert rows[0]["vs hf"] == "1.00"
    # Hugging Face's MLM decoder runs on all 128 tokens, ours on the 20 masked ones: at bert-tiny
    # that is most of the work.
    assert _number(rows[1]["vs hf"]) > 1.2, output
    # Same weights, same batch, the same loss before training.
    hf, ours = (measured["initial_loss"] for measured in figures["rows"])
    assert hf == pytest.approx(ours, rel=1e-5)
    # FP8 left the benchmark (0.86x the compiled bf16 step on an H200): no row, check or flag.
    assert "fp8" not in output.lower(), output
    assert not figures["skipped"], figures["skipped"]
    assert "fp8_unavailable" not in figures["gemm"] and "fp8_loss_check" not in figures, figures


def test_the_time_budget_skips_what_is_left(
    train_step: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "figures.json"
    assert train_step.main([*TINY, "--time-budget", "0", "--json", str(out)]) == 0
    output = capsys.readouterr().out
    rows = _table(output)
    assert [row["mode"] for row in rows] == ["hf eager", "ours eager", "ours compiled"]
    assert all(row["seq/s"] == "skipped: --time-budget 0 s spent" for row in rows), output
    assert "skipped local run: --time-budget 0 s spent" in output
    assert "skipped torchrun run: --time-budget 0 s spent" in output
    assert json.loads(out.read_text())["gemm"]["tflops"] > 0


@pytest.mark.slow
def test_the_compiled_row(train_step: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    """The trainer's compile path (compiling.compile_regions, LAMB compiled) runs and is timed."""
    args = [*TINY, "--no-hf", "--no-local", "--no-torchrun"]
    assert train_step.main(args) == 0
    output = capsys.readouterr().out
    rows = _table(output)
    assert [row["mode"] for row in rows] == ["ours eager", "ours compiled"], output
    compiled = rows[1]
    assert _number(compiled["seq/s"]) > 0 and 0 < _number(compiled["% of GEMM"]) < 100, compiled
    assert _number(compiled["compile s"]) > 1, compiled
    assert "bert-tiny seq 128 ours compiled: 4 regions compiled" in output, output
    assert "LAMB eager" not in output, output


@pytest.mark.slow
def test_the_local_and_torchrun_runs(
    train_step: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m bertpretrain local` and torchrun of a tiny job: both succeed and their seq/s,
    read from train.jsonl, is printed beside the benchmark's row."""
    out = tmp_path / "figures.json"
    args = [*TINY, "--no-hf", "--no-compiled", "--local-steps", "4", "--json", str(out)]
    assert train_step.main(args) == 0
    output = capsys.readouterr().out
    local = [line for line in output.splitlines() if line.startswith("local run (")]
    assert len(local) == 1 and "succeeded, exit 0" in local[0], output
    assert "seq/s (median of 3 logging interval(s) after the first) vs the benchmark's ours eager" in local[0]
    torchrun = [line for line in output.splitlines() if line.startswith("torchrun run (")]
    assert len(torchrun) == 1 and "succeeded, exit 0" in torchrun[0], output
    assert "world: started by torchrun, rank 0 of 1" in output, output
    figures = json.loads(out.read_text())
    for key in ("local", "torchrun"):
        assert figures[key]["ok"] and figures[key]["seq_per_s"] > 0, figures[key]
        assert figures[key]["job"]["spec"]["phases"][0]["microBatchSize"] == 4
