"""Checkpoint files: layout, atomic writes, pruning, loading and the errors that name the file."""

from __future__ import annotations

import errno
import os
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from bertjob_api.files import DiskFullError
from bertjob_api.plan import phase_dir
from bertpretrain.common import files
from bertpretrain.model.bert import BertForPreTraining
from bertpretrain.model.config import BertConfig
from bertpretrain.training.checkpoint import (
    CheckpointError,
    ResumePoint,
    clean_temporaries,
    latest,
    load_model_weights,
    load_training_state,
    newest_resumable,
    read_checkpoint,
    rng_states,
    save_checkpoint,
)
from bertpretrain.training.optimizer import Lamb, param_groups
from bertpretrain.training.schedule import poly_warmup_schedule

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

    def resume(self, path: Path, rank: int = 0, state: dict[str, Any] | None = None) -> ResumePoint:
        return load_training_state(
            path, self.model, self.optimizer, self.scheduler, self.scaler, rank, state=state
        )


def test_layout_and_pruning(tmp_path: Path, tiny_config: BertConfig) -> None:
    training = Training(tiny_config)
    paths = [training.save(tmp_path, step, keep=2, phase_index=1) for step in (5, 10, 15)]
    assert paths[2] == tmp_path / "phase2" / "step_000015.pt"
    kept = [".lock", "step_000010.pt", "step_000015.pt"]  # and the lock its writers hold
    assert sorted(p.name for p in (tmp_path / "phase2").iterdir()) == kept
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


def test_a_checkpoint_that_cannot_be_read_is_skipped_for_an_older_one(
    tmp_path: Path, tiny_config: BertConfig
) -> None:
    training = Training(tiny_config, steps=1)
    older = training.save(tmp_path, 5)
    newest = training.save(tmp_path, 10)
    newest.write_bytes(newest.read_bytes()[:1000])  # a write cut short by a power cut
    found = newest_resumable(newest.parent)
    assert found is not None and found.path == older and found.state["step"] == 5
    assert len(found.skipped) == 1 and found.skipped[0].startswith(f"{newest}: not a readable checkpoint")
    assert Training(tiny_config).resume(found.path, state=found.state) == ResumePoint(5, 40)


def test_a_checkpoint_without_training_state_is_skipped(tmp_path: Path, tiny_config: BertConfig) -> None:
    training = Training(tiny_config)
    older = training.save(tmp_path, 1)
    newest = training.save(tmp_path, 2)
    state = torch.load(newest, weights_only=True)
    del state["optimizer"]
    torch.save(state, newest)
    found = newest_resumable(newest.parent)
    assert found is not None and found.path == older
    assert found.skipped == [f"{newest}: no training state to resume from (optimizer missing)"]


def test_no_readable_checkpoint_at_all_is_an_error_naming_them(
    tmp_path: Path, tiny_config: BertConfig
) -> None:
    assert newest_resumable(tmp_path / "phase1") is None
    training = Training(tiny_config)
    for step in (1, 2):
        training.save(tmp_path, step).write_bytes(b"torn")
    with pytest.raises(
        CheckpointError,
        match=r"phase1: no checkpoint can be read: .*step_000002\.pt: not a readable checkpoint .*"
        r"step_000001\.pt: not a readable checkpoint .*; delete them to start the phase again",
    ):
        newest_resumable(tmp_path / "phase1")


def _leftover(directory: Path, name: str) -> Path:
    """A temporary as a writer killed halfway leaves it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(b"half a checkpoint")
    return directory / name


def test_temporaries_of_dead_writers_are_removed(tmp_path: Path, tiny_config: BertConfig) -> None:
    directory = phase_dir(tmp_path, 0)
    old_style = _leftover(directory, ".step_000010.pt.tmp4242")
    new_style = _leftover(directory, ".step_000020.pt.tmp7.0a1b2c3d")
    kept = [_leftover(directory, "notes.txt"), _leftover(directory, ".step_000010.pt.swp")]
    assert clean_temporaries(directory) == sorted([old_style, new_style])
    assert sorted(directory.iterdir()) == sorted([*kept, directory / ".lock"])
    assert clean_temporaries(tmp_path / "absent") == []

    # A save removes them too, before it writes (one crash loop's leftovers could fill the disk).
    leftover = _leftover(directory, ".step_000030.pt.tmp99")
    Training(tiny_config).save(tmp_path, 40)
    assert not leftover.exists()


def test_the_temporaries_of_a_live_writer_are_kept(tmp_path: Path, tiny_config: BertConfig) -> None:
    directory = phase_dir(tmp_path, 0)
    leftover = _leftover(directory, ".step_000010.pt.tmp4242")
    # Another process in the middle of a save holds the directory's lock (flock locks belong to
    # an open file, so a second open in this process conflicts like another process would).
    with files.lock(directory / files.LOCK_FILE) as state:
        assert state == "held"
        assert clean_temporaries(directory) == []
    assert leftover.exists()


def test_without_file_locks_only_old_temporaries_are_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_locks(_descriptor: int, _operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(files.fcntl, "flock", no_locks)
    directory = phase_dir(tmp_path, 0)
    fresh = _leftover(directory, ".step_000010.pt.tmp1")
    stale = _leftover(directory, ".step_000020.pt.tmp2")
    an_hour_ago = time.time() - files.STALE_SECONDS - 1
    os.utime(stale, (an_hour_ago, an_hour_ago))
    assert clean_temporaries(directory) == [stale]
    assert fresh.exists()


def test_the_rename_of_a_checkpoint_is_made_durable(
    tmp_path: Path, tiny_config: BertConfig, file_events: list[tuple[str, str]]
) -> None:
    events = file_events
    path = Training(tiny_config).save(tmp_path, 5)
    renamed = events.index(("rename", str(path)))
    assert ("fsync", str(path.parent)) in events[renamed + 1 :], events


def test_a_full_disk_is_reported_and_leaves_no_partial_file(
    tmp_path: Path, tiny_config: BertConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    save = torch.save

    def fills_the_disk(state: Any, file: Any) -> None:
        file.write(b"\0" * 100_000)  # what fit
        file.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    training = Training(tiny_config)
    monkeypatch.setattr(torch, "save", fills_the_disk)
    with pytest.raises(DiskFullError) as error:
        training.save(tmp_path, 5)
    message = str(error.value)
    assert re.fullmatch(
        rf"{tmp_path}/phase1/step_000005\.pt: no space left on the device: [\d.]+ [KMGT]iB free, "
        r"[\d.]+ [KM]iB needed \(the partial file was removed\)",
        message,
    ), message
    assert list((tmp_path / "phase1").iterdir()) == [tmp_path / "phase1" / ".lock"]
    monkeypatch.setattr(torch, "save", save)
    # The size needed is what the checkpoint takes, within its zip and pickle overhead.
    assert error.value.needed is not None
    written = training.save(tmp_path, 5).stat().st_size
    assert 0.5 * written < error.value.needed <= written
