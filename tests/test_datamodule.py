"""TunedDataModule: user values win, policy fills the rest, seeded and resume-exact order, worker seeds."""

from __future__ import annotations

import dataclasses
import warnings

import lightning.pytorch as pl
import pytest
from helpers import IndexData, IndexedDataset, RecordingModel, fake_hardware, trainer_kwargs
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from lightning_dataperf import TunedDataModule, article_settings, recommend_loader_settings
from lightning_dataperf.hardware import StorageInfo
from lightning_dataperf.policy import check_loader_kwargs


def fit(tmp_path, datamodule, epochs=3, ckpt_path=None, every_n_train_steps=None):
    model = RecordingModel()
    callbacks = []
    if every_n_train_steps:
        callbacks.append(ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=every_n_train_steps, save_top_k=-1))
    options = trainer_kwargs(tmp_path, enable_checkpointing=bool(every_n_train_steps), num_sanity_val_steps=0)
    trainer = pl.Trainer(max_epochs=epochs, callbacks=callbacks, logger=False, **options)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return model


def order(model, epoch):
    return [row[1] for row in model.rows if row[0] == epoch]


def draws(model, epoch):
    return [row[3] for row in model.rows if row[0] == epoch]


def test_policy_corrects_the_article():
    box = fake_hardware(usable_cpus=16, local_world_size=2, accelerator="cuda")
    settings = recommend_loader_settings(box, max_epochs=10)
    assert settings.num_workers == 7 and "2 local rank(s)" in settings.reasons["num_workers"]
    assert settings.pin_memory and settings.persistent_workers and settings.prefetch_factor == 2
    assert settings.as_kwargs()["prefetch_factor"] == 2
    nfs = dataclasses.replace(box, storage=StorageInfo("/data", "nfs4", network=True))
    assert recommend_loader_settings(nfs).prefetch_factor == 4
    tight = dataclasses.replace(box, shm_free_mb=64.0)
    bounded = recommend_loader_settings(tight, batch_bytes=8 * 2**20)
    assert bounded.prefetch_factor == 1 and "bounded by memory" in bounded.reasons["prefetch_factor"]
    single = recommend_loader_settings(fake_hardware(usable_cpus=1, accelerator="cpu"), max_epochs=1)
    assert single.num_workers == 1 and not single.pin_memory and not single.persistent_workers
    # The article: 16 cores -> 8 workers whatever the ranks, no pinning above batch 16, persistent only > 100 epochs.
    article = article_settings(cpu_cores=16, batch_size=64, ddp=True, epochs=10)
    facts = (article.num_workers, article.pin_memory, article.persistent_workers, article.prefetch_factor)
    assert facts == (8, False, False, 4)


def test_bad_loader_arguments_are_refused_or_warned():
    box = fake_hardware(usable_cpus=4, accelerator="cpu")
    with pytest.raises(ValueError, match="num_workers=-1"):
        check_loader_kwargs({"num_workers": -1}, box)
    with pytest.raises(ValueError, match="prefetch_factor needs worker processes"):
        check_loader_kwargs({"num_workers": 0, "prefetch_factor": 4}, box)
    with pytest.warns(UserWarning, match="pin_memory=True.*without a CUDA device"):
        check_loader_kwargs({"pin_memory": True}, box)
    with pytest.warns(UserWarning, match="more than the 4 CPUs"):
        check_loader_kwargs({"num_workers": 9}, box)


class ExplicitData(TunedDataModule):
    def train_dataloader(self):
        return DataLoader(IndexedDataset(12), batch_size=4, num_workers=0, pin_memory=False)

    def val_dataloader(self):
        return DataLoader(IndexedDataset(8), 4, False)  # positional: dataset, batch_size, shuffle


def test_user_values_win_and_the_policy_fills_the_rest(tmp_path, capsys):
    datamodule = ExplicitData(seed=3)
    fit(tmp_path, datamodule, epochs=1)
    (train,) = datamodule.loader_plans["train"]
    assert train.explicit["num_workers"] == 0 and "num_workers" not in train.chosen
    assert "prefetch_factor" not in train.chosen and "persistent_workers" not in train.chosen
    (val,) = datamodule.loader_plans["val"]
    assert val.chosen["num_workers"] == datamodule.loader_settings.num_workers
    assert val.chosen["pin_memory"] is False  # no CUDA here
    assert "TunedDataModule [train]" in capsys.readouterr().out
    loader = datamodule.train_dataloader()
    assert loader.num_workers == 0 and loader.pin_memory is False


def test_bad_input_in_a_hook_names_the_fix(tmp_path):
    class Broken(TunedDataModule):
        def train_dataloader(self):
            return DataLoader(IndexedDataset(8), batch_size=2, num_workers=0, prefetch_factor=2)

    with pytest.raises(ValueError, match="drop prefetch_factor or set num_workers > 0"):
        Broken().train_dataloader()


@pytest.mark.parametrize("workers", [0, 2])
def test_new_order_each_epoch_and_identical_rerun(tmp_path, workers):
    first = fit(tmp_path / "a", IndexData(workers=workers, seed=11, verbose=False))
    again = fit(tmp_path / "b", IndexData(workers=workers, seed=11, verbose=False))
    other = fit(tmp_path / "c", IndexData(workers=workers, seed=12, verbose=False))
    assert sorted(order(first, 0)) == list(range(30)), "every sample exactly once per epoch"
    assert order(first, 0) != order(first, 1) != order(first, 2)
    assert [row[:3] for row in first.rows] == [row[:3] for row in again.rows], "same seed: same order"
    if workers:  # in the main process the draws are the user's RNG (seed_everything), not ours
        assert first.rows == again.rows, "same seed: same augmentation draws in the workers"
    assert order(first, 0) != order(other, 0)
    assert [row[2] for row in first.rows] == [row[0] for row in first.rows], "the dataset knows the epoch"


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(("checkpoint", "done_in_epoch_1"), [("epoch=0-step=8.ckpt", 0), ("epoch=1-step=13.ckpt", 5)])
def test_resume_yields_the_uninterrupted_order(tmp_path, workers, checkpoint, done_in_epoch_1):
    full = fit(tmp_path / "full", IndexData(workers=workers, seed=5, verbose=False), every_n_train_steps=1)
    resumed = fit(
        tmp_path / "resumed",
        IndexData(workers=workers, seed=5, verbose=False),
        ckpt_path=tmp_path / "full" / "ckpt" / checkpoint,
    )
    assert order(resumed, 1) == order(full, 1)[4 * done_in_epoch_1 :], "remaining batches, not a replay"
    assert order(resumed, 2) == order(full, 2)
    if workers:
        assert draws(resumed, 2) == draws(full, 2), "worker streams are keyed by epoch, not by history"


def test_workers_never_share_a_random_stream(tmp_path):
    model = fit(tmp_path, IndexData(length=64, workers=2, seed=1, verbose=False), epochs=2)
    values = [row[3] for row in model.rows]
    assert len(set(values)) == len(values), "two workers (or two epochs) drew the same augmentation"


def test_recommendation_without_lightning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settings = recommend_loader_settings()
    loader = DataLoader(IndexedDataset(8), batch_size=2, **settings.as_kwargs())
    assert loader.num_workers == settings.num_workers
    assert "num_workers" in settings.explain()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.num_workers = 3
