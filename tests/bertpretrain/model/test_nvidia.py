"""NVIDIA DeepLearningExamples' checkpoints in and out, and what ``model.initFrom`` refuses.

The NVIDIA state dicts here are built by the tests from our tiny model's weights under the names
NVIDIA's ``modeling.py`` gives them (``dense_act`` for the three layers fused with their
activation, no decoder bias, vocabulary rows padded to a multiple of 8, ``module.`` from DDP),
written as ``run_pretraining.py`` writes ``ckpt_<step>.pt`` (``model`` beside optimizer, phase and
files) with a ``bert_config.json`` in Google's fields. No real NVIDIA checkpoint can be downloaded
here; the names were read from their ``modeling.py``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
import yaml

from bertjob_testing.jobs import small_training_job, with_value
from bertpretrain.model.bert import BertForPreTraining
from bertpretrain.model.config import BertConfig, CheckpointError
from bertpretrain.run import main as bertpretrain_main
from bertpretrain.training.checkpoint import (
    load_initial_weights,
    read_checkpoint,
    save_checkpoint,
)
from bertpretrain.training.export import export_hf, export_nvidia
from tests.bertpretrain.conftest import VOCAB, VOCAB_SIZE
from tests.bertpretrain.training.test_phase import init_from, train_phase

pytestmark = pytest.mark.usefixtures("one_thread")

PADDED = -(-VOCAB_SIZE // 8) * 8
# NVIDIA's names of the fused layers, written out as their modeling.py has them.
FUSED = {
    "bert.encoder.layer.0.intermediate.dense.": "bert.encoder.layer.0.intermediate.dense_act.",
    "bert.encoder.layer.1.intermediate.dense.": "bert.encoder.layer.1.intermediate.dense_act.",
    "bert.pooler.dense.": "bert.pooler.dense_act.",
    "cls.predictions.transform.dense.": "cls.predictions.transform.dense_act.",
}
ROWS = ("bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight", "cls.predictions.bias")


def _model(config: BertConfig, seed: int) -> BertForPreTraining:
    """A model with every parameter moved off its initialisation (biases and LayerNorms too)."""
    torch.manual_seed(seed)
    model = BertForPreTraining(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def _saved(model: BertForPreTraining, root: Path, phase_index: int, step: int) -> Path:
    """A checkpoint of this trainer holding ``model`` (with a throw-away optimizer and schedule)."""
    optimizer = torch.optim.SGD(model.parameters())
    return save_checkpoint(
        root,
        phase_index,
        step,
        model=model,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        keep=1,
    )


def _logits(model: BertForPreTraining) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, VOCAB_SIZE, (3, 16), generator=generator)
    token_type_ids = (torch.arange(16) >= 8).long().expand(3, 16)
    attention_mask = torch.ones(3, 16, dtype=torch.long)
    attention_mask[1, 12:] = 0
    with torch.no_grad():
        return model.eval()(input_ids, token_type_ids, attention_mask)


def _nvidia_names(
    model: BertForPreTraining, prefix: str = "", decoder: bool = True, padded: bool = True
) -> dict[str, torch.Tensor]:
    """``model``'s weights as NVIDIA's BertForPreTraining names them in its state dict."""
    weights: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if name == "cls.predictions.decoder.bias" or (
            name == "cls.predictions.decoder.weight" and not decoder
        ):
            continue
        for ours, theirs in FUSED.items():
            name = name.replace(ours, theirs)
        if padded and name in ROWS:
            # NVIDIA's padding rows are trained like any other: random here, not zero.
            tensor = torch.cat([tensor, torch.randn(PADDED - VOCAB_SIZE, *tensor.shape[1:])])
        weights[prefix + name] = tensor.clone()
    if decoder and padded:
        weights[prefix + ROWS[1]] = weights[prefix + ROWS[0]]
    return weights


def _nvidia_config(config: BertConfig, vocab_size: int = VOCAB_SIZE) -> dict[str, object]:
    """A bert_config.json as NVIDIA ships them: Google's fields, no model_type."""
    fields = config.to_dict()
    names = ["attention_probs_dropout_prob", "hidden_dropout_prob", "hidden_size", "initializer_range"]
    names += ["intermediate_size", "max_position_embeddings", "num_attention_heads", "num_hidden_layers"]
    return {"hidden_act": "gelu", "type_vocab_size": 2, "vocab_size": vocab_size} | {
        name: fields[name] for name in names
    }


def _write_nvidia(directory: Path, weights: dict[str, torch.Tensor], config: dict[str, object]) -> Path:
    """``directory/ckpt_8601.pt`` as run_pretraining.py saves one, and its bert_config.json."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "ckpt_8601.pt"
    torch.save(
        {
            "model": weights,
            "optimizer": {"state": {}, "param_groups": []},
            "phase": 1,
            "files": [3, "a.hdf5"],
        },
        path,
    )
    (directory / "bert_config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("padded", [True, False], ids=["padded-vocab", "exact-vocab"])
@pytest.mark.parametrize("decoder", [True, False], ids=["decoder", "tied-no-decoder"])
@pytest.mark.parametrize("prefix", ["", "module."], ids=["plain", "ddp"])
def test_an_nvidia_checkpoint_loads_with_identical_logits(
    tiny_config: BertConfig, tmp_path: Path, prefix: str, decoder: bool, padded: bool
) -> None:
    source = _model(tiny_config, seed=1)
    weights = _nvidia_names(source, prefix, decoder, padded)
    assert f"{prefix}bert.encoder.layer.1.intermediate.dense_act.weight" in weights
    path = _write_nvidia(tmp_path / "nvidia", weights, _nvidia_config(tiny_config))
    target = _model(tiny_config, seed=2)

    loaded = load_initial_weights(path, target)

    assert loaded.origin == f"{path} (NVIDIA DeepLearningExamples)"
    assert loaded.kept == []
    for ours, theirs in zip(_logits(target), _logits(source), strict=True):
        assert torch.equal(ours, theirs)
    assert target.cls.predictions.decoder.weight is target.bert.embeddings.word_embeddings.weight


def test_the_directory_of_an_nvidia_checkpoint_loads_its_newest(
    tiny_config: BertConfig, tmp_path: Path
) -> None:
    source = _model(tiny_config, seed=1)
    path = _write_nvidia(tmp_path / "nvidia", _nvidia_names(source), _nvidia_config(tiny_config))
    # An older checkpoint of other weights: ckpt_900 sorts after ckpt_8601 by name, not by step.
    torch.save({"model": _nvidia_names(_model(tiny_config, seed=3))}, tmp_path / "nvidia" / "ckpt_900.pt")
    target = _model(tiny_config, seed=2)
    assert load_initial_weights(tmp_path / "nvidia", target).origin == f"{path} (NVIDIA DeepLearningExamples)"
    assert torch.equal(_logits(target)[0], _logits(source)[0])


def test_gamma_and_beta_from_a_converted_tensorflow_checkpoint(
    tiny_config: BertConfig, tmp_path: Path
) -> None:
    source = _model(tiny_config, seed=1)
    weights = {
        name.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        ): tensor
        for name, tensor in _nvidia_names(source).items()
    }
    path = _write_nvidia(tmp_path / "nvidia", weights, _nvidia_config(tiny_config))
    target = _model(tiny_config, seed=2)
    load_initial_weights(path, target)
    assert torch.equal(_logits(target)[0], _logits(source)[0])


def test_a_pytorch_pretrained_bert_directory_loads(tiny_config: BertConfig, tmp_path: Path) -> None:
    """BioBERT's and Google's converted checkpoints: bert_config.json and pytorch_model.bin, a bare
    state dict in Hugging Face's names with TensorFlow's gamma and beta, no decoder."""
    source = _model(tiny_config, seed=1)
    weights = {
        name.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        ): tensor
        for name, tensor in source.state_dict().items()
        if not name.startswith("cls.predictions.decoder.")
    }
    directory = tmp_path / "biobert"
    directory.mkdir()
    torch.save(weights, directory / "pytorch_model.bin")
    (directory / "bert_config.json").write_text(json.dumps(_nvidia_config(tiny_config)))
    target = _model(tiny_config, seed=2)
    loaded = load_initial_weights(directory, target)
    assert loaded.origin == f"{directory}/pytorch_model.bin (pytorch-pretrained-BERT, bert_config.json)"
    assert all(torch.equal(a, b) for a, b in zip(_logits(target), _logits(source), strict=True))


def test_export_to_nvidia_and_back(tiny_config: BertConfig, vocab_dir: Path, tmp_path: Path) -> None:
    source = _model(tiny_config, seed=1)
    checkpoint = save_checkpoint(
        tmp_path / "checkpoints",
        1,
        40,
        model=source,
        optimizer=(optimizer := torch.optim.SGD(source.parameters())),
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        keep=1,
    )
    out = export_nvidia(checkpoint, vocab_dir, tmp_path / "hf" / "nvidia")

    assert sorted(path.name for path in out.iterdir()) == ["bert_config.json", "ckpt_40.pt", "vocab.txt"]
    assert (out / "vocab.txt").read_text() == "\n".join(VOCAB) + "\n"
    config = json.loads((out / "bert_config.json").read_text())
    assert config == _nvidia_config(tiny_config)  # the unpadded size: NVIDIA's scripts pad it
    written = torch.load(out / "ckpt_40.pt", weights_only=True)
    assert list(written) == ["model"]
    # What NVIDIA's BertForPreTraining's state dict holds, padded rows and all.
    expected = _nvidia_names(source)
    assert list(written["model"]) == list(expected)
    for name, tensor in written["model"].items():
        assert tensor.shape == expected[name].shape, name
        rows = VOCAB_SIZE if name in ROWS else tensor.shape[0]
        assert torch.equal(tensor[:rows], expected[name][:rows]), name
    assert written["model"][ROWS[1]].data_ptr() == written["model"][ROWS[0]].data_ptr()  # one storage

    target = _model(tiny_config, seed=2)
    assert load_initial_weights(out, target).kept == []
    assert all(torch.equal(a, b) for a, b in zip(_logits(target), _logits(source), strict=True))


def test_our_checkpoint_and_a_hugging_face_directory_are_told_apart(
    tiny_config: BertConfig, vocab_dir: Path, tmp_path: Path
) -> None:
    source = _model(tiny_config, seed=1)
    checkpoint = _saved(source, tmp_path / "checkpoints", phase_index=0, step=5)
    target = _model(tiny_config, seed=2)
    assert load_initial_weights(checkpoint, target).origin == f"{checkpoint} (training checkpoint)"
    assert torch.equal(_logits(target)[0], _logits(source)[0])
    hf = export_hf(checkpoint, vocab_dir, tmp_path / "hf", lowercase=True)
    target = _model(tiny_config, seed=2)
    assert load_initial_weights(hf, target).origin == f"{hf} (Hugging Face)"
    assert torch.equal(_logits(target)[0], _logits(source)[0])


def _refusal_cases(tmp_path: Path, config: BertConfig) -> dict[str, tuple[Path, str]]:
    """Each thing initFrom refuses, and a pattern of what the refusal must say about it."""
    model = _model(config, seed=1)
    other = tmp_path / "other.pt"
    torch.save({"weights": model.state_dict(), "step": 3}, other)
    random_file = tmp_path / "random.bin"
    random_file.write_bytes(
        torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0)).byte().numpy().tobytes()
    )
    lonely = tmp_path / "lonely" / "ckpt_1.pt"
    lonely.parent.mkdir()
    torch.save({"model": _nvidia_names(model)}, lonely)
    pickled = _write_nvidia(tmp_path / "pickled", _nvidia_names(model), _nvidia_config(config))
    torch.save({"model": _nvidia_names(model), "args": argparse.Namespace(seed=1)}, pickled)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("x")
    bad_vocab = _write_nvidia(
        tmp_path / "vocab", _nvidia_names(model), _nvidia_config(config, VOCAB_SIZE + 9)
    )
    narrow = _write_nvidia(
        tmp_path / "narrow", _nvidia_names(model), _nvidia_config(config) | {"hidden_size": 64}
    )
    bare = tmp_path / "bare" / "pytorch_model.bin"
    bare.parent.mkdir()
    torch.save(model.bert.state_dict(), bare)
    return {
        "no-config": (
            bare,
            rf"{bare}: a BERT state dict \(keys \['embeddings.word_embeddings.weight', .*\) "
            "without bert_config.json beside it",
        ),
        "other-keys": (other, rf"{other}: a PyTorch file of no format .*: keys \['weights', 'step'\]"),
        "random-file": (
            random_file,
            rf"{random_file}: not a PyTorch file \(neither a zip archive nor a pickle",
        ),
        "no-bert-config": (lonely, rf"{lonely.parent}/bert_config.json: no such file"),
        "python-objects": (
            pickled,
            rf"{pickled}: not a PyTorch file .*such as argparse\.Namespace, which are not loaded; "
            "if you trust the file",
        ),
        "other-directory": (empty, rf"{empty}: a directory of no format .*; it holds notes\.txt$"),
        "missing": (tmp_path / "nowhere", rf"{tmp_path}/nowhere: no such file or directory"),
        "vocab": (bad_vocab, rf"{bad_vocab}: vocab_size 53 in bert_config\.json, {PADDED} rows"),
        "shape": (
            narrow,
            r"narrow/bert_config\.json: a model of another shape: hidden_size 64 \(the model has 32\)",
        ),
    }


REFUSALS = ["no-config", "other-keys", "random-file", "no-bert-config", "python-objects"]
REFUSALS += ["other-directory", "missing", "vocab", "shape"]


@pytest.mark.parametrize("case", REFUSALS)
def test_what_fits_no_format_is_refused_saying_what_was_found(
    tiny_config: BertConfig, tmp_path: Path, case: str
) -> None:
    path, message = _refusal_cases(tmp_path, tiny_config)[case]
    with pytest.raises(CheckpointError, match=message):
        load_initial_weights(path, _model(tiny_config, seed=2))


def test_a_phase_starts_from_an_nvidia_checkpoint(
    make_spec, make_phase, shard_dir: Path, vocab_size: int, tiny_config: BertConfig, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    source = _model(tiny_config, seed=1)
    path = _write_nvidia(tmp_path / "nvidia", _nvidia_names(source, "module."), _nvidia_config(tiny_config))
    spec = init_from(make_spec([make_phase(steps=1, learningRate=1e-12)]), path)
    final = read_checkpoint(train_phase(spec, 0, shard_dir, vocab_size))["model"]
    assert f"from {path} (NVIDIA DeepLearningExamples) at step 0" in capsys.readouterr().out
    name = "bert.encoder.layer.1.intermediate.dense.weight"
    torch.testing.assert_close(final[name], source.state_dict()[name], atol=1e-6, rtol=0)


def test_the_export_command_writes_nvidia_files_with_export_nvidia(
    tiny_config: BertConfig, tmp_path: Path
) -> None:
    document = with_value(small_training_job(tmp_path), "spec.export", {"nvidia": True})
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(document))
    vocab = tmp_path / "data" / "vocab"
    vocab.mkdir(parents=True)
    (vocab / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    source = _model(tiny_config, seed=1)
    checkpoint = _saved(source, tmp_path / "checkpoints", phase_index=1, step=4)
    assert bertpretrain_main(["export", "--config", str(job_file), "--checkpoint", str(checkpoint)]) == 0
    export = tmp_path / "checkpoints" / "hf"
    assert (export / "model.safetensors").is_file()
    assert sorted(path.name for path in (export / "nvidia").iterdir()) == [
        "bert_config.json",
        "ckpt_4.pt",
        "vocab.txt",
    ]
    target = _model(tiny_config, seed=2)
    load_initial_weights(export / "nvidia", target)
    assert torch.equal(_logits(target)[0], _logits(source)[0])
