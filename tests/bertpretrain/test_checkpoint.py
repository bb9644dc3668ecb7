"""Checkpoint files: layout, atomic writes, pruning, loading and the errors that name the file."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from bertpretrain.checkpoint import (
    CheckpointError,
    ResumePoint,
    latest,
    load_model_weights,
    load_training_state,
    phase_dir,
    read_checkpoint,
    rng_states,
    save_checkpoint,
)
from bertpretrain.model import BertConfig, BertForPreTraining
from bertpretrain.optimizer import Lamb, param_groups
from bertpretrain.schedule import poly_warmup_schedule

pytestmark = pytest.mark.usefixtures("one_thread")


class Training:
    """A model with its optimizer, schedule and scaler, a few steps into training."""

    def __init__(self, config: BertConfig, steps: int = 0, seed: int = 0):
        torch.manual_seed(seed)
        self.model = BertForPreTraining(config)
        self.optimizer = Lamb(param_groups(self.model, 0.01), lr=1e-2)
        self.scheduler = poly_warmup_schedule(self.optimizer, 100, 0.1)
        self.scaler = torch.amp.GradScaler("cpu", enabled=False)
        ids = torch.randint(5, config.vocab_size, (2, 8))
        for _ in range(steps):
            mlm, nsp = self.model(ids, torch.zeros_like(ids), torch.ones_like(ids))
            (mlm.square().mean() + nsp.square().mean()).backward()
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()

    def save(
        self, root: Path, step: int, keep: int = 3, phase_index: int = 0, rng: list | None = None
    ) -> Path:
        return save_checkpoint(
            root,
            phase_index,
            step,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            scaler=self.scaler,
            keep=keep,
            data_position={"epoch": 0, "shard": "shard_0001.hdf5", "sample": 3, "sequences": 8 * step},
            rng=rng,
        )

    def resume(self, path: Path, rank: int = 0) -> ResumePoint:
        return load_training_state(path, self.model, self.optimizer, self.scheduler, self.scaler, rank)


def test_layout_and_pruning(tmp_path: Path, tiny_config: BertConfig) -> None:
    training = Training(tiny_config)
    paths = [training.save(tmp_path, step, keep=2, phase_index=1) for step in (5, 10, 15)]
    assert paths[2] == tmp_path / "phase2" / "step_000015.pt"
    assert sorted(p.name for p in (tmp_path / "phase2").iterdir()) == ["step_000010.pt", "step_000015.pt"]
    assert latest(phase_dir(tmp_path, 1)) == paths[2]
    assert latest(phase_dir(tmp_path, 0)) is None


def test_latest_orders_by_step_and_ignores_temporary_files(tmp_path: Path, tiny_config: BertConfig) -> None:
    training = Training(tiny_config)
    training.save(tmp_path, 999)
    newest = training.save(tmp_path, 1000)
    (newest.parent / ".step_002000.pt.tmp123").write_bytes(b"half a file")
    assert latest(newest.parent) == newest


def test_contents(tmp_path: Path, tiny_config: BertConfig) -> None:
    training = Training(tiny_config, steps=2)
    state = read_checkpoint(training.save(tmp_path, 2))
    assert state["step"] == 2 and state["phase_index"] == 0
    assert state["config"] == tiny_config.to_dict()
    assert set(state["model"]) == set(training.model.state_dict())
    assert {"optimizer", "scheduler", "scaler", "rng"} <= state.keys()
    assert state["data_position"] == {"epoch": 0, "shard": "shard_0001.hdf5", "sample": 3, "sequences": 16}


def test_resume_restores_everything(tmp_path: Path, tiny_config: BertConfig) -> None:
    original = Training(tiny_config, steps=3, seed=0)
    torch.manual_seed(42)
    random.seed(42)
    path = original.save(tmp_path, 3)
    expected_draw = (torch.rand(3), random.random())

    resumed = Training(tiny_config, steps=0, seed=1)
    assert resumed.resume(path) == ResumePoint(step=3, sequences=24)
    assert torch.equal(torch.rand(3), expected_draw[0])
    assert random.random() == expected_draw[1]
    for name, tensor in original.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], tensor, rtol=0, atol=0)
    assert resumed.optimizer.param_groups[0]["step"] == 3
    assert resumed.scheduler.last_epoch == 3
    assert resumed.optimizer.param_groups[0]["lr"] == original.optimizer.param_groups[0]["lr"]
    first = next(iter(original.optimizer.state.values()))["exp_avg"]
    torch.testing.assert_close(next(iter(resumed.optimizer.state.values()))["exp_avg"], first)


def test_each_rank_resumes_its_own_random_draws(tmp_path: Path, tiny_config: BertConfig) -> None:
    training = Training(tiny_config)
    states, draws = [], []
    for seed in (10, 11):  # two ranks whose dropout differs
        torch.manual_seed(seed)
        states.append(rng_states())
        draws.append(torch.rand(3))
    path = training.save(tmp_path, 1, rng=states)
    for rank in (0, 1, 2):
        training.resume(path, rank)
        assert torch.equal(torch.rand(3), draws[rank % 2])


def test_checkpoint_without_training_state_cannot_resume(tmp_path: Path, tiny_config: BertConfig) -> None:
    training = Training(tiny_config)
    path = training.save(tmp_path, 1)
    state = torch.load(path, weights_only=True)
    del state["data_position"]
    torch.save(state, path)
    with pytest.raises(
        CheckpointError, match=r"step_000001\.pt: cannot resume from it: KeyError\('data_position'"
    ):
        training.resume(path)


def test_weights_of_another_model_are_refused(tmp_path: Path, tiny_config: BertConfig) -> None:
    path = Training(tiny_config).save(tmp_path, 1)
    wider = BertForPreTraining(
        BertConfig(**{**tiny_config.to_dict(), "hidden_size": 64, "intermediate_size": 128})
    )
    with pytest.raises(
        CheckpointError, match=r"step_000001.pt: checkpoint is of another model: hidden_size 32"
    ):
        load_model_weights(path, wider)


def test_weights_that_do_not_fit_are_refused(tmp_path: Path, tiny_config: BertConfig) -> None:
    path = Training(tiny_config).save(tmp_path, 1)
    state = torch.load(path, weights_only=True)
    state["model"]["cls.seq_relationship.weight"] = torch.zeros(3, 32)
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=r"step_000001\.pt: weights do not fit the model"):
        load_model_weights(path, BertForPreTraining(tiny_config))


def test_dropout_may_differ(tmp_path: Path, tiny_config: BertConfig) -> None:
    path = Training(tiny_config).save(tmp_path, 1)
    load_model_weights(
        path, BertForPreTraining(BertConfig(**{**tiny_config.to_dict(), "hidden_dropout_prob": 0.0}))
    )


def test_unreadable_files_are_named(tmp_path: Path, tiny_config: BertConfig) -> None:
    model = BertForPreTraining(tiny_config)
    with pytest.raises(CheckpointError, match=r"absent\.pt: checkpoint does not exist"):
        load_model_weights(tmp_path / "absent.pt", model)
    (tmp_path / "garbage.pt").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match=r"garbage\.pt: not a readable checkpoint"):
        load_model_weights(tmp_path / "garbage.pt", model)
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match=r"other\.pt: not a training checkpoint"):
        load_model_weights(tmp_path / "other.pt", model)
