"""TunedDataModule: user values win, policy fills the rest, seeded and resume-exact order, worker seeds."""

from __future__ import annotations

import dataclasses
import random
import warnings

import lightning.pytorch as pl
import numpy
import pytest
import torch
from helpers import (
    DrawingData,
    DrawingModel,
    IndexData,
    IndexedDataset,
    RecordingModel,
    fake_hardware,
    trainer_kwargs,
)
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader

from lightning_dataperf import TunedDataModule, recommend_loader_settings
from lightning_dataperf.loader import article_settings, in_process
from lightning_dataperf.loader.policy import check_loader_kwargs
from lightning_dataperf.loader.sampler import EpochAwareDistributedSampler, LoaderResumeState
from lightning_dataperf.loader.seeding import worker_seed
from lightning_dataperf.telemetry.hardware import StorageInfo

NOT_RESUMABLE = "your dataloader is not resumable"


def fit(tmp_path, datamodule, epochs=3, ckpt_path=None, every_n_train_steps=None, model=None, callbacks=()):
    model = RecordingModel() if model is None else model
    callbacks = list(callbacks)
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


def test_user_values_win_and_the_policy_fills_the_rest(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(in_process, "HANDOVER_FLOOR_S", 0.0)  # no batch loads "fast": the policy's workers
    datamodule = ExplicitData(seed=3)
    fit(tmp_path, datamodule, epochs=1)
    (train,) = datamodule.loader_plans["train"]
    assert train.explicit["num_workers"] == 0 and "num_workers" not in train.chosen
    assert "prefetch_factor" not in train.chosen and "persistent_workers" not in train.chosen
    (val,) = datamodule.loader_plans["val"]
    assert val.chosen["num_workers"] == datamodule.loader_settings.num_workers
    assert val.chosen["pin_memory"] is False  # no CUDA here
    printed = capsys.readouterr().out
    assert "TunedDataModule [train]" in printed and "num_workers=0: each batch is fetched with" in printed
    assert not val.notes, "evaluation loaders are left unseeded"
    # called outside a Trainer nothing recorded your arguments: a value other than DataLoader's default is yours
    loader = datamodule.train_dataloader()
    assert loader.num_workers == datamodule.loader_settings.num_workers and loader.pin_memory is False


def test_bad_input_in_a_hook_names_the_fix(tmp_path):
    class Broken(TunedDataModule):
        def train_dataloader(self):
            return DataLoader(IndexedDataset(8), batch_size=2, num_workers=0, prefetch_factor=2)

    # PyTorch refuses it as the loader is built, naming the fix
    with pytest.raises(ValueError, match="num_workers > 0"):
        Broken().train_dataloader()


@pytest.mark.parametrize("workers", [0, 2])
def test_new_order_each_epoch_and_identical_rerun(tmp_path, workers):
    first = fit(tmp_path / "a", IndexData(workers=workers, seed=11, verbose=False))
    again = fit(tmp_path / "b", IndexData(workers=workers, seed=11, verbose=False))
    other = fit(tmp_path / "c", IndexData(workers=workers, seed=12, verbose=False))
    assert sorted(order(first, 0)) == list(range(30)), "every sample exactly once per epoch"
    assert order(first, 0) != order(first, 1) != order(first, 2)
    assert [row[:3] for row in first.rows] == [row[:3] for row in again.rows], "same seed: same order"
    assert first.rows == again.rows, "same seed: same draws (workers or main process)"
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
    assert draws(resumed, 2) == draws(full, 2), "streams are keyed by epoch (and batch), not by history"
    if not workers:  # workers restart their round-robin at the resumed batch (README, Limitations)
        assert draws(resumed, 1) == draws(full, 1)[4 * done_in_epoch_1 :], "main-process batches are seeded"


class StopAtStep(Callback):
    """Stops the run (as a crash would) before the batch that would make ``step`` optimizer steps + 1."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError("stopped mid-epoch")


def test_main_process_draws_after_a_mid_epoch_resume_are_the_uninterrupted_ones(tmp_path):
    """num_workers=0: random, torch and NumPy draws in __getitem__ are exact after a resume."""
    full = fit(tmp_path / "full", DrawingData(seed=5, verbose=False), epochs=2, model=DrawingModel())
    stopped = DrawingModel()
    with pytest.raises(RuntimeError, match="stopped mid-epoch"):
        fit(tmp_path / "stopped", DrawingData(seed=5, verbose=False), 2, None, 1, stopped, [StopAtStep(13)])
    random.random(), torch.rand(3), numpy.random.random()  # the resumed process's generators differ anyway
    resumed = fit(
        tmp_path / "resumed",
        DrawingData(seed=5, verbose=False),
        epochs=2,
        ckpt_path=tmp_path / "stopped" / "ckpt" / "epoch=1-step=13.ckpt",
        model=DrawingModel(),
    )
    assert len(stopped.rows) == 8 * 4 - 2 + 5 * 4, "stopped after 5 of epoch 1's 8 batches"
    assert stopped.rows + resumed.rows == full.rows, "the same (epoch, index, draws) for every sample"
    assert len({row[2] for row in full.rows}) == len(full.rows), "every batch and sample draws anew"


def test_main_process_seeding_leaves_the_training_generators_alone(tmp_path):
    """The model's own draws do not depend on what the dataset draws."""
    pl.seed_everything(7)
    drawing = fit(tmp_path / "a", DrawingData(seed=5, verbose=False), epochs=2, model=DrawingModel())
    pl.seed_everything(7)
    quiet = fit(tmp_path / "b", DrawingData(seed=5, draws=False, verbose=False), epochs=2, model=DrawingModel())
    assert drawing.model_draws == quiet.model_draws
    assert [row[:2] for row in drawing.rows] == [row[:2] for row in quiet.rows]


def resume_warnings(tmp_path, datamodule):
    fit(tmp_path / "full", datamodule, epochs=2, every_n_train_steps=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(tmp_path / "resumed", datamodule, epochs=2, ckpt_path=tmp_path / "full" / "ckpt" / "epoch=1-step=13.ckpt")
    return [str(warning.message) for warning in caught]


class PlainData(pl.LightningDataModule):
    def train_dataloader(self):
        return DataLoader(IndexedDataset(30), batch_size=4, shuffle=True)


@pytest.mark.parametrize("workers", [0, 2])
def test_lightning_does_not_call_a_tuned_loader_unresumable(tmp_path, workers):
    messages = resume_warnings(tmp_path, IndexData(workers=workers, seed=5, verbose=False))
    assert not [message for message in messages if NOT_RESUMABLE in message]
    assert not [message for message in messages if "lightning_dataperf" in message]


def test_lightning_still_warns_for_a_plain_loader_resumed_mid_epoch(tmp_path):
    messages = resume_warnings(tmp_path, PlainData())
    assert [message for message in messages if NOT_RESUMABLE in message]


def test_resuming_with_a_different_loader_says_what_changed(tmp_path):
    fit(tmp_path / "full", IndexData(workers=0, seed=5, verbose=False), epochs=2, every_n_train_steps=1)
    with pytest.warns(UserWarning, match=r"seed 5 -> 6, dataset_length 30 -> 31\), so the order after the resume"):
        fit(
            tmp_path / "resumed",
            IndexData(length=31, workers=0, seed=6, verbose=False),
            epochs=2,
            ckpt_path=tmp_path / "full" / "ckpt" / "epoch=1-step=13.ckpt",
        )
    state = LoaderResumeState(EpochAwareDistributedSampler(list(range(10)), num_replicas=1, rank=0), 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state.load_state_dict(state.state_dict())


def test_worker_streams_are_still_keyed_by_seed_epoch_rank_and_worker(tmp_path):
    model = fit(tmp_path, IndexData(workers=2, seed=5, verbose=False), epochs=1)
    streams = [random.Random(worker_seed(5, 0, 0, worker)) for worker in (0, 1)]
    expected = [streams[(position // 4) % 2].random() for position in range(30)]  # batches go round-robin
    assert draws(model, 0) == torch.tensor(expected).tolist()  # the samples are float32


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


def test_the_order_message_says_what_shuffle_does():
    class Ordered(IndexData):
        def train_dataloader(self):
            return DataLoader(IndexedDataset(self.length), batch_size=self.batch_size, shuffle=False)

    module = Ordered(length=8, verbose=False)
    module.train_dataloader()
    (plan,) = module.loader_plans["train"]
    assert "the same order every epoch (shuffle=False)" in plan.sampler and "new order" not in plan.sampler
    shuffled = IndexData(length=8, verbose=False)
    shuffled.train_dataloader()
    assert "new order each epoch" in shuffled.loader_plans["train"][0].sampler


def test_the_loaders_a_hook_returns_are_planned_and_no_other():
    import threading

    built_elsewhere = []

    class Several(TunedDataModule):
        def train_dataloader(self):
            # a loader another thread builds meanwhile is not the hook's: it stays as built
            thread = threading.Thread(target=lambda: built_elsewhere.append(DataLoader(IndexedDataset(4))))
            thread.start()
            thread.join()
            return {
                "a": DataLoader(IndexedDataset(8), batch_size=2),
                "b": [DataLoader(IndexedDataset(4), num_workers=0)],
            }

    datamodule = Several(seed=1, verbose=False)
    loaders = datamodule.train_dataloader()
    assert len(datamodule.loader_plans["train"]) == 2
    assert isinstance(loaders["a"].sampler, EpochAwareDistributedSampler)
    assert isinstance(loaders["b"][0].sampler, EpochAwareDistributedSampler)
    assert not isinstance(built_elsewhere[0].sampler, EpochAwareDistributedSampler)
    assert (
        "DataLoader.__init__" not in vars(DataLoader) or DataLoader.__init__.__module__ == "torch.utils.data.dataloader"
    )


def test_the_arguments_you_passed_are_read_from_the_loader_a_hook_returns():
    from lightning.fabric.utilities.data import _replace_dunder_methods

    from lightning_dataperf.datamodule.hooks import explicit_arguments

    dataset = IndexedDataset(8)
    built = DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2, prefetch_factor=3, pin_memory=False)
    # no Trainer recorded them: what differs from DataLoader's defaults is yours
    assert explicit_arguments(built) == {
        "dataset": dataset,
        "batch_size": 4,
        "shuffle": True,
        "num_workers": 2,
        "prefetch_factor": 3,
    }
    custom = torch.utils.data.SubsetRandomSampler([0, 1])
    assert explicit_arguments(DataLoader(dataset, sampler=custom))["sampler"] is custom
    with _replace_dunder_methods(DataLoader, "dataset"):  # as Lightning asks a hook for its loaders
        recorded = DataLoader(dataset, 4, num_workers=0, pin_memory=False)
    assert explicit_arguments(recorded) == {"dataset": dataset, "batch_size": 4, "num_workers": 0, "pin_memory": False}


class _LoadersMixin:
    """Loader hooks from a mixin placed before TunedDataModule in the bases."""

    def train_dataloader(self):
        return DataLoader(list(range(16)), batch_size=4)


class MixedInData(_LoadersMixin, TunedDataModule):
    pass


def test_loader_hooks_from_a_mixin_before_tuned_data_module_get_the_plan(tmp_path):
    datamodule = MixedInData(seed=0, verbose=False)
    loader = datamodule.train_dataloader()
    (plan,) = datamodule.loader_plans["train"]
    assert plan.chosen["num_workers"] == datamodule.loader_settings.num_workers == loader.num_workers
    assert type(loader.sampler) is EpochAwareDistributedSampler, "seeded, resumable sampling"
