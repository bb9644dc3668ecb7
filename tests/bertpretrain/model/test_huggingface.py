"""The Hugging Face export and import.

Export: transformers loads the directory cleanly (``BertForPreTraining``, ``AutoModelForMaskedLM``,
the fill-mask pipeline, ``AutoTokenizer``) and computes what our model computes. Import: the
checkpoints transformers writes for ``BertForPreTraining``, ``BertForMaskedLM`` and ``BertModel``
load into our model, which then computes what transformers computes, and every way a directory
can fail to fit is reported with the file and the field.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, cast

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from bertjob_api.files import DiskFullError
from bertpretrain.common import files
from bertpretrain.model.bert import IGNORE_INDEX, BertForPreTraining, pretraining_loss
from bertpretrain.model.config import BertConfig, CheckpointError
from bertpretrain.model.huggingface import (
    clean_staging,
    fill_mask,
    load_hf_weights,
    read_hf_config,
    save_hf,
)
from bertpretrain.training.checkpoint import save_checkpoint
from bertpretrain.training.export import export_hf

pytestmark = pytest.mark.usefixtures("one_thread")

# fp32 on the CPU: the two implementations differ only in the order of their float operations.
TOLERANCE = 1e-5
HEADLESS = [  # our parameters that a BertModel checkpoint has no weights for, in the model's order
    "cls.predictions.bias",
    "cls.predictions.transform.dense.weight",
    "cls.predictions.transform.dense.bias",
    "cls.predictions.transform.LayerNorm.weight",
    "cls.predictions.transform.LayerNorm.bias",
    "cls.seq_relationship.weight",
    "cls.seq_relationship.bias",
]
NO_POOLER_NO_NSP = [  # and a BertForMaskedLM checkpoint none for these
    "bert.pooler.dense.weight",
    "bert.pooler.dense.bias",
    "cls.seq_relationship.weight",
    "cls.seq_relationship.bias",
]


def _perturb(model: torch.nn.Module, seed: int) -> None:
    """Move every parameter off its initialisation (biases and LayerNorms included), so that a
    weight loaded into the wrong place or left out shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn(parameter.shape, generator=generator))


def _save(model: BertForPreTraining, root: Path, step: int, keep: int = 1) -> Path:
    """A training checkpoint of ``model`` after ``step`` steps (optimizer state irrelevant here)."""
    optimizer = torch.optim.AdamW(model.parameters())
    return save_checkpoint(
        root,
        0,
        step,
        model=model,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        keep=keep,
    )


def _inputs(vocab_size: int, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, token_type_ids, attention_mask)`` [2, 20]: two segments, the second row padded."""
    ids = torch.randint(5, vocab_size, (2, 20), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    types = (torch.arange(20) >= 8).long().expand(2, -1) * mask
    return ids, types, mask


def _hf_model(cls: type[transformers.PreTrainedModel], config: BertConfig, seed: int = 1) -> Any:
    """A transformers model of ``cls`` with our ``config``, perturbed, in eval mode."""
    torch.manual_seed(seed)
    model = cls(transformers.BertConfig(**config.to_hf_dict()))
    _perturb(model, seed)
    return model.eval()


def _save_hf(model: Any, directory: Path, file_format: str) -> Path:
    """``save_pretrained``; for ``"bin"`` the weights go to ``pytorch_model.bin`` instead, as
    transformers before 5 wrote them (5 always writes safetensors)."""
    model.save_pretrained(directory)
    if file_format == "bin":
        (directory / "model.safetensors").unlink()
        torch.save(model.state_dict(), directory / "pytorch_model.bin")
    return directory


def _naming(path: Path, text: str) -> str:
    """A ``pytest.raises`` pattern: a message that starts with ``path`` and contains ``text``."""
    return f"^{re.escape(str(path))}: .*{re.escape(text)}"


def _fresh(config: BertConfig, seed: int = 99) -> BertForPreTraining:
    """A newly initialised model to import into, its initialisation unlike any other here."""
    torch.manual_seed(seed)
    return BertForPreTraining(config).eval()


@pytest.fixture
def trained(tmp_path: Path, tiny_config: BertConfig) -> tuple[BertForPreTraining, Path]:
    """A model with non-trivial weights (biases included) and its checkpoint."""
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config)
    _perturb(model, 0)
    return model.eval(), _save(model, tmp_path / "checkpoints", 7)


@pytest.fixture
def hf_dir(tmp_path: Path, tiny_config: BertConfig) -> Path:
    """A transformers BertForPreTraining of the tiny config, saved with ``save_pretrained``."""
    return _save_hf(
        _hf_model(transformers.BertForPreTraining, tiny_config), tmp_path / "hf-in", "safetensors"
    )


# Export.


def test_files(trained: tuple[BertForPreTraining, Path], vocab_dir: Path, tmp_path: Path) -> None:
    out = export_hf(trained[1], vocab_dir, tmp_path / "hf", lowercase=True)
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForPreTraining"]
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is True
    # No staging directory left behind, only the lock that exports to hf hold.
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".hf")] == [".hf.lock"]


def test_a_model_exports_as_its_checkpoint_does(
    trained: tuple[BertForPreTraining, Path], vocab_dir: Path, tmp_path: Path
) -> None:
    """The model stage's export takes weights and config, no training checkpoint; the training
    stage's reads the checkpoint and hands them over. Both write the same files."""
    model, checkpoint = trained
    ours = save_hf(model.state_dict(), model.config, vocab_dir, tmp_path / "model", lowercase=True)
    theirs = export_hf(checkpoint, vocab_dir, tmp_path / "checkpoint", lowercase=True)
    names = sorted(path.name for path in theirs.iterdir())
    assert sorted(path.name for path in ours.iterdir()) == names
    for name in names:
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name


def test_transformers_loads_it_without_missing_keys_and_agrees(
    trained: tuple[BertForPreTraining, Path], vocab_dir: Path, tmp_path: Path
) -> None:
    model, checkpoint = trained
    out = export_hf(checkpoint, vocab_dir, tmp_path / "hf", lowercase=True)
    loaded, info = cast(
        tuple[transformers.BertForPreTraining, dict[str, Any]],
        transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True),
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert not info["error_msgs"]
    loaded.eval()
    assert (
        loaded.cls.predictions.decoder.weight.data_ptr()
        == loaded.bert.embeddings.word_embeddings.weight.data_ptr()
    )

    ids, types, mask = _inputs(model.config.vocab_size)
    with torch.no_grad():
        mlm, nsp = model(ids, types, mask)
        expected = loaded(input_ids=ids, token_type_ids=types, attention_mask=mask)
    assert (mlm - expected.prediction_logits).abs().max() <= TOLERANCE
    assert (nsp - expected.seq_relationship_logits).abs().max() <= TOLERANCE


def test_auto_model_for_masked_lm_loads_it_and_agrees(
    trained: tuple[BertForPreTraining, Path], vocab_dir: Path, tmp_path: Path
) -> None:
    model, checkpoint = trained
    out = export_hf(checkpoint, vocab_dir, tmp_path / "hf", lowercase=True)
    loaded, info = transformers.AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert isinstance(loaded, transformers.BertForMaskedLM)
    assert not info["missing_keys"] and not info["mismatched_keys"] and not info["error_msgs"]
    loaded.eval()
    ids, types, mask = _inputs(model.config.vocab_size, seed=4)
    with torch.no_grad():
        mlm, _ = model(ids, types, mask)
        expected = loaded(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
    assert mlm.dtype == expected.dtype == torch.float32
    assert (mlm - expected).abs().max() <= TOLERANCE


def test_tokenizer_and_fill_mask_agree_with_our_model(
    trained: tuple[BertForPreTraining, Path], vocab_dir: Path, tmp_path: Path
) -> None:
    model, checkpoint = trained
    out = export_hf(checkpoint, vocab_dir, tmp_path / "hf", lowercase=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    encoded = tokenizer("The cat", "was here")
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    assert tokens == ["[CLS]", "the", "cat", "[SEP]", "was", "here", "[SEP]"]
    assert encoded["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1]
    assert tokenizer.mask_token == "[MASK]" and tokenizer.mask_token_id == 4

    text = "the [MASK] was here ."
    predictions = fill_mask(out, text, top_k=3)
    batch = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        mlm, _ = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    position = int((batch["input_ids"][0] == tokenizer.mask_token_id).nonzero())
    top = mlm[0, position].softmax(-1).topk(3)
    assert [token for token, _ in predictions] == [tokenizer.decode([int(i)]) for i in top.indices]
    assert torch.allclose(torch.tensor([score for _, score in predictions]), top.values, atol=TOLERANCE)


def test_export_of_an_intermediate_checkpoint(
    tmp_path: Path, tiny_config: BertConfig, vocab_dir: Path
) -> None:
    """A checkpoint that training went on from exports its own weights, not the later ones."""
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids, types, mask = _inputs(tiny_config.vocab_size)
    labels = torch.where(mask.bool(), ids, IGNORE_INDEX)

    def train(steps: int) -> None:
        for _ in range(steps):
            mlm, nsp = model(ids, types, mask)
            pretraining_loss(mlm, labels, nsp, torch.tensor([0, 1]))[0].backward()
            optimizer.step()
            optimizer.zero_grad()

    root = tmp_path / "checkpoints"
    train(3)
    intermediate = _save(model, root, 3, keep=2)
    at_step_3 = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    train(3)
    last = _save(model, root, 6, keep=2)
    assert intermediate.exists() and last.exists()

    out = export_hf(intermediate, vocab_dir, tmp_path / "hf", lowercase=True)
    loaded = transformers.BertForPreTraining.from_pretrained(out).state_dict()
    assert all(torch.equal(loaded[name], tensor) for name, tensor in at_step_3.items())
    assert not torch.equal(loaded["bert.pooler.dense.weight"], model.state_dict()["bert.pooler.dense.weight"])


def test_export_replaces_an_earlier_one(
    trained: tuple[BertForPreTraining, Path], vocab_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "hf"
    out.mkdir()
    (out / "stale.bin").write_bytes(b"old")
    export_hf(trained[1], vocab_dir, out, lowercase=False)
    assert not (out / "stale.bin").exists()
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is False


def test_export_errors(trained: tuple[BertForPreTraining, Path], tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no vocab\.txt"):
        export_hf(trained[1], tmp_path, tmp_path / "hf", lowercase=True)
    with pytest.raises(ValueError, match="exactly one"):
        fill_mask(tmp_path, "no mask here")


@pytest.mark.parametrize(
    ("umask", "directory_mode", "file_mode"), [(0o022, 0o755, 0o644), (0o027, 0o750, 0o640)]
)
def test_the_export_is_readable_as_the_umask_allows(
    trained: tuple[BertForPreTraining, Path], vocab_dir: Path, tmp_path: Path,
    umask: int, directory_mode: int, file_mode: int,
) -> None:  # fmt: skip
    previous = os.umask(umask)
    try:
        out = export_hf(trained[1], vocab_dir, tmp_path / "hf", lowercase=True)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(out.stat().st_mode) == directory_mode
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in out.iterdir()}
    assert "model.safetensors" in modes and modes == dict.fromkeys(modes, file_mode)


def _leftovers(parent: Path, names: list[str]) -> list[Path]:
    """Directories as killed exports leave them."""
    for name in names:
        (parent / name).mkdir()
        (parent / name / "model.safetensors").write_bytes(b"partial")
    return sorted(parent / name for name in names)


def test_what_killed_exports_left_is_removed(
    trained: tuple[BertForPreTraining, Path], vocab_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "hf"
    # Staging directories of tempfile.mkdtemp (earlier versions) and of this one, and the old
    # export moved aside while a new one replaces it.
    names = [".hf.ab3_x9zq", ".hf.partial-0a1b2c3d", ".hf.old"]
    others = _leftovers(tmp_path, [".hf-notes", ".hfx.abcdefgh", ".hf.backup"])
    leftovers = _leftovers(tmp_path, names)
    assert clean_staging(out) == leftovers  # as a run does when it starts
    assert all(path.exists() for path in others)
    assert clean_staging(tmp_path / "absent" / "hf") == []

    _leftovers(tmp_path, names)
    export_hf(trained[1], vocab_dir, out, lowercase=True)
    hidden = sorted(path.name for path in tmp_path.iterdir() if path.name.startswith(".hf"))
    assert hidden == [".hf-notes", ".hf.backup", ".hf.lock", ".hfx.abcdefgh"]


def test_a_live_export_keeps_its_staging_directory(tmp_path: Path) -> None:
    staging = _leftovers(tmp_path, [".hf.partial-0a1b2c3d"])
    with files.lock(tmp_path / ".hf.lock") as state:  # an export in progress holds it
        assert state == "held"
        assert clean_staging(tmp_path / "hf") == []
    assert staging[0].exists()


def test_the_rename_of_an_export_is_made_durable(
    trained: tuple[BertForPreTraining, Path],
    vocab_dir: Path,
    tmp_path: Path,
    file_events: list[tuple[str, str]],
) -> None:
    events = file_events
    out = export_hf(trained[1], vocab_dir, tmp_path / "hf", lowercase=True)
    renamed = events.index(("rename", str(out)))
    assert ("fsync", str(tmp_path)) in events[renamed + 1 :], events
    synced = [path for kind, path in events[:renamed] if kind == "fsync"]
    for name in (path.name for path in out.iterdir()):  # each file, in the staging directory
        assert any(path.endswith(f"/{name}") for path in synced), (name, events)


def test_a_full_disk_during_the_export_is_reported_and_leaves_nothing(
    trained: tuple[BertForPreTraining, Path], vocab_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsync = os.fsync

    def full(descriptor: int) -> None:
        if stat.S_ISREG(os.fstat(descriptor).st_mode):  # as NFS reports it: when the data is sent
            raise OSError(errno.ENOSPC, "No space left on device")
        fsync(descriptor)

    monkeypatch.setattr(os, "fsync", full)
    out = tmp_path / "exports" / "hf"
    with pytest.raises(DiskFullError, match=rf"^{out}: no space left on the device: .* free, .* needed"):
        export_hf(trained[1], vocab_dir, out, lowercase=True)
    assert sorted(path.name for path in out.parent.iterdir()) == [".hf.lock"]


# Import.


def test_round_trip_through_an_export(
    trained: tuple[BertForPreTraining, Path], vocab_dir: Path, tmp_path: Path
) -> None:
    model, checkpoint = trained
    out = export_hf(checkpoint, vocab_dir, tmp_path / "hf", lowercase=True)
    assert read_hf_config(out) == model.config
    fresh = _fresh(read_hf_config(out))
    assert load_hf_weights(out, fresh) == []
    expected = model.state_dict()
    assert all(torch.equal(tensor, expected[name]) for name, tensor in fresh.state_dict().items())
    assert fresh.cls.predictions.decoder.weight is fresh.bert.embeddings.word_embeddings.weight


@pytest.mark.parametrize("file_format", ["safetensors", "bin"])
@pytest.mark.parametrize(
    ("cls", "kept"),
    [
        (transformers.BertForPreTraining, []),
        (transformers.BertForMaskedLM, NO_POOLER_NO_NSP),
        (transformers.BertModel, HEADLESS),
    ],
    ids=["BertForPreTraining", "BertForMaskedLM", "BertModel"],
)
def test_import_from_transformers(
    cls: type[transformers.PreTrainedModel],
    kept: list[str],
    file_format: str,
    tiny_config: BertConfig,
    tmp_path: Path,
) -> None:
    hf = _hf_model(cls, tiny_config)
    directory = _save_hf(hf, tmp_path / "hf", file_format)
    model = _fresh(tiny_config)
    initial = {name: tensor.clone() for name, tensor in model.state_dict().items()}

    assert load_hf_weights(directory, model) == kept

    ours = model.state_dict()
    for name, tensor in hf.state_dict().items():
        assert torch.equal(ours[name if name in ours else f"bert.{name}"], tensor), name
    assert all(torch.equal(ours[name], initial[name]) for name in kept)
    ids, types, mask = _inputs(tiny_config.vocab_size)
    with torch.no_grad():
        mlm, nsp = model(ids, types, mask)
        hidden, pooled = model.bert(ids, types, mask)
        expected = hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
    if cls is transformers.BertForPreTraining:
        assert (mlm - expected.prediction_logits).abs().max() <= TOLERANCE
        assert (nsp - expected.seq_relationship_logits).abs().max() <= TOLERANCE
    elif cls is transformers.BertForMaskedLM:
        assert (mlm - expected.logits).abs().max() <= TOLERANCE
    else:
        assert (hidden - expected.last_hidden_state).abs().max() <= TOLERANCE
        assert (pooled - expected.pooler_output).abs().max() <= TOLERANCE


def test_import_of_old_names_from_pytorch_model_bin(hf_dir: Path, tiny_config: BertConfig) -> None:
    """transformers 2's files: LayerNorm.gamma/beta, the tied decoder saved as well, and the
    position_ids buffer, which is no parameter."""
    weights = load_file(hf_dir / "model.safetensors")
    old = {
        name.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        ): tensor
        for name, tensor in weights.items()
    }
    assert sum(".gamma" in name for name in old) == 2 * tiny_config.num_hidden_layers + 2
    old["cls.predictions.decoder.weight"] = weights["bert.embeddings.word_embeddings.weight"]
    old["cls.predictions.decoder.bias"] = weights["cls.predictions.bias"]
    old["bert.embeddings.position_ids"] = torch.arange(tiny_config.max_position_embeddings)[None]
    (hf_dir / "model.safetensors").unlink()
    torch.save(old, hf_dir / "pytorch_model.bin")

    model = _fresh(tiny_config)
    assert load_hf_weights(hf_dir, model) == []
    ours = model.state_dict()
    assert all(torch.equal(ours[name], tensor) for name, tensor in weights.items())


def test_import_casts_half_precision_to_the_models_dtype(tiny_config: BertConfig, tmp_path: Path) -> None:
    hf = _hf_model(transformers.BertForMaskedLM, tiny_config).half()
    directory = _save_hf(hf, tmp_path / "hf", "safetensors")
    model = _fresh(tiny_config)
    load_hf_weights(directory, model)
    ours = model.state_dict()
    assert all(tensor.dtype == torch.float32 for tensor in ours.values())
    for name, tensor in hf.state_dict().items():
        assert tensor.dtype == torch.float16 and torch.equal(ours[name], tensor.float()), name


def test_safetensors_is_read_before_pytorch_model_bin(hf_dir: Path, tiny_config: BertConfig) -> None:
    (hf_dir / "pytorch_model.bin").write_bytes(b"not a pickle")
    load_hf_weights(hf_dir, _fresh(tiny_config))


def test_read_hf_config_of_a_config_without_model_type(tmp_path: Path) -> None:
    """Google's bert_config.json, which BioBERT's first Hugging Face upload also has."""
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "attention_probs_dropout_prob": 0.1,
                "hidden_act": "gelu",
                "hidden_dropout_prob": 0.1,
                "hidden_size": 768,
                "initializer_range": 0.02,
                "intermediate_size": 3072,
                "max_position_embeddings": 512,
                "num_attention_heads": 12,
                "num_hidden_layers": 12,
                "type_vocab_size": 2,
                "vocab_size": 28996,
            }
        )
    )
    config = read_hf_config(tmp_path)
    assert config == BertConfig(
        vocab_size=28996,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "roberta"}, "model_type is 'roberta', not a BERT"),
        ({"hidden_act": "gelu_new"}, "hidden_act 'gelu_new'"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type 'relative_key'"),
        ({"is_decoder": True}, "is_decoder True"),
        ({"add_cross_attention": True}, "add_cross_attention True"),
        ({"tie_word_embeddings": False}, "tie_word_embeddings False"),
        ({"vocab_size": None}, "vocab_size"),
        ({"num_attention_heads": 5}, "not a multiple of num_attention_heads 5"),
    ],
)
def test_read_hf_config_errors_name_the_file_and_field(
    hf_dir: Path, change: dict[str, Any], message: str
) -> None:
    path = hf_dir / "config.json"
    config = json.loads(path.read_text())
    config.update(change)
    path.write_text(json.dumps({name: value for name, value in config.items() if value is not None}))
    with pytest.raises(CheckpointError, match=_naming(path, message)):
        read_hf_config(hf_dir)


def test_read_hf_config_of_a_missing_or_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    with pytest.raises(CheckpointError, match=_naming(path, "no such file")):
        read_hf_config(tmp_path)
    path.write_text("{not json")
    with pytest.raises(CheckpointError, match=_naming(path, "not a readable JSON file")):
        read_hf_config(tmp_path)
    path.write_text("[]")
    with pytest.raises(CheckpointError, match=_naming(path, "not a config")):
        read_hf_config(tmp_path)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("vocab_size", 40),
        ("hidden_size", 48),
        ("num_hidden_layers", 3),
        ("num_attention_heads", 4),  # changes no tensor's shape: only the config can tell
        ("intermediate_size", 48),
        ("max_position_embeddings", 64),
        ("type_vocab_size", 3),
    ],
)
def test_a_model_of_another_shape_is_refused_naming_the_field(
    hf_dir: Path, tiny_config: BertConfig, field: str, value: int
) -> None:
    model = _fresh(dataclasses.replace(tiny_config, **{field: value}))
    found = getattr(tiny_config, field)
    with pytest.raises(
        CheckpointError, match=_naming(hf_dir / "config.json", f"{field} {found} (the model has {value})")
    ):
        load_hf_weights(hf_dir, model)


def test_a_tensor_of_another_shape_is_refused_naming_it(hf_dir: Path, tiny_config: BertConfig) -> None:
    path = hf_dir / "model.safetensors"
    weights = load_file(path)
    weights["bert.pooler.dense.weight"] = weights["bert.pooler.dense.weight"][:, :-1].contiguous()
    save_file(weights, path)
    with pytest.raises(CheckpointError, match=_naming(path, "bert.pooler.dense.weight has shape [32, 31]")):
        load_hf_weights(hf_dir, _fresh(tiny_config))


def test_a_file_without_bert_weights_is_refused(hf_dir: Path, tiny_config: BertConfig) -> None:
    path = hf_dir / "model.safetensors"
    save_file({"roberta.embeddings.word_embeddings.weight": torch.zeros(3, 2)}, path)
    with pytest.raises(CheckpointError, match=_naming(path, "none of its 1 tensors")):
        load_hf_weights(hf_dir, _fresh(tiny_config))


def test_an_incomplete_encoder_is_refused(hf_dir: Path, tiny_config: BertConfig) -> None:
    path = hf_dir / "model.safetensors"
    weights = load_file(path)
    del weights["bert.encoder.layer.1.output.dense.bias"]
    save_file(weights, path)
    with pytest.raises(
        CheckpointError, match=_naming(path, "no weights for bert.encoder.layer.1.output.dense.bias") + "$"
    ):
        load_hf_weights(hf_dir, _fresh(tiny_config))


@pytest.mark.parametrize("tied", ["cls.predictions.decoder.weight", "cls.predictions.decoder.bias"])
def test_an_untied_decoder_is_refused(hf_dir: Path, tiny_config: BertConfig, tied: str) -> None:
    path = hf_dir / "model.safetensors"
    weights = load_file(path)
    source = "bert.embeddings.word_embeddings.weight" if tied.endswith("weight") else "cls.predictions.bias"
    weights[tied] = weights[source] + 1
    save_file(weights, path)
    model = _fresh(tiny_config)
    with pytest.raises(CheckpointError, match=_naming(path, f"{tied} differs from {source}")):
        load_hf_weights(hf_dir, model)


def test_missing_or_unreadable_weights_are_refused(hf_dir: Path, tiny_config: BertConfig) -> None:
    path = hf_dir / "model.safetensors"
    path.write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match=_naming(path, "not a readable weights file")):
        load_hf_weights(hf_dir, _fresh(tiny_config))
    path.unlink()
    with pytest.raises(
        CheckpointError, match=_naming(hf_dir, "neither model.safetensors nor pytorch_model.bin")
    ):
        load_hf_weights(hf_dir, _fresh(tiny_config))
    pickled = hf_dir / "pytorch_model.bin"
    torch.save({"bert.pooler.dense.bias": [0.0] * 32}, pickled)
    with pytest.raises(CheckpointError, match=_naming(pickled, "not a state_dict")):
        load_hf_weights(hf_dir, _fresh(tiny_config))
