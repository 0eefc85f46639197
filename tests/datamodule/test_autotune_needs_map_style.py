"""Autotune over an IterableDataset (issue 39): no crash inside the search; training goes on with the policy's
settings and a warning says why and what to do; ``autotune_loader`` itself refuses with a clear error."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from helpers import trainer_kwargs
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from lightning_dataperf import TunedDataModule, autotune_loader


class Stream(IterableDataset):
    """Samples that come one after another, with no index and no length."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __iter__(self):
        return iter(torch.full((4,), float(index)) for index in range(self.count))


class StreamData(TunedDataModule):
    def train_dataloader(self):
        return DataLoader(Stream(64), batch_size=8)


class CountingModel(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.batches = 0

    def training_step(self, batch, batch_idx):
        self.batches += 1
        return self.layer(batch).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_autotune_over_an_iterable_dataset_warns_and_trains_with_the_policy(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTNING_DATAPERF_CACHE", str(tmp_path / "cache.json"))
    # the deprecated spelling (kept for one release): SearchTuning(time_budget=1.0), refused the same way
    with pytest.warns(DeprecationWarning, match=r"autotune=SearchTuning\(time_budget=1\.0\)"):
        datamodule = StreamData(autotune=True, autotune_options={"time_budget": 1.0}, verbose=False)
    model = CountingModel()
    trainer = pl.Trainer(max_epochs=1, logger=False, **trainer_kwargs(tmp_path))
    with pytest.warns(UserWarning, match="autotune needs a map-style dataset") as caught:
        trainer.fit(model, datamodule=datamodule)
    text = str(next(w.message for w in caught if "map-style" in str(w.message)))
    assert "Stream, an IterableDataset" in text and "Training goes on with the policy's settings" in text
    assert model.batches == 8  # every batch trained
    assert datamodule.autotune_result is None  # nothing was measured: none claimed
    plan = datamodule.loader_plans["train"][0]
    assert plan.chosen["num_workers"] == min(1, datamodule.loader_settings.num_workers), "one, as for any stream"
    assert f"num_workers={plan.chosen['num_workers']}," in text, "the warning names the count training goes on with"


@pytest.mark.parametrize("dataset", [Stream(8), {"not": "indexable"}.values()])
def test_autotune_loader_refuses_a_dataset_it_cannot_index(tmp_path, dataset):
    with pytest.raises(ValueError, match="autotune needs a map-style dataset") as error:
        autotune_loader(dataset, 4, time_budget=0.5, cache_path=tmp_path / "c.json", progress=False)
    assert type(dataset).__name__ in str(error.value) and "set num_workers" in str(error.value)


def _fit_stream(tmp_path, datamodule):
    from helpers import fake_hardware

    datamodule._hardware = fake_hardware(usable_cpus=4)  # the policy's pick there: 3 workers
    model = StreamModel()
    pl.Trainer(max_epochs=1, logger=False, **trainer_kwargs(tmp_path)).fit(model, datamodule=datamodule)
    return model, datamodule.loader_plans["train"][0]


class StreamModel(CountingModel):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[float] = []

    def training_step(self, batch, batch_idx):
        self.seen += batch[:, 0].tolist()
        return super().training_step(batch, batch_idx)


def test_an_unsplit_iterable_dataset_gets_one_worker_so_no_sample_is_trained_twice(tmp_path):
    model, plan = _fit_stream(tmp_path, StreamData(verbose=False))
    assert sorted(model.seen) == [float(index) for index in range(64)], "each sample once"
    assert plan.chosen["num_workers"] == 1 and "IterableDataset" in plan.reasons["num_workers"]
    assert "get_worker_info" in plan.reasons["num_workers"], "the reason says what a dataset that splits does"


class SplitStreamData(TunedDataModule):
    def train_dataloader(self):
        return DataLoader(SplitStream(64), batch_size=8, num_workers=3)


class SplitStream(Stream):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        mine = range(self.count) if info is None else range(info.id, self.count, info.num_workers)
        return iter(torch.full((4,), float(index)) for index in mine)


def test_workers_set_on_an_iterable_loader_are_kept(tmp_path):
    model, plan = _fit_stream(tmp_path, SplitStreamData(verbose=False))
    assert sorted(model.seen) == [float(index) for index in range(64)]
    assert "num_workers" not in plan.chosen, "the user's 3 workers stay: the dataset splits its own stream"
