"""TunedDataModule.from_loaders builds each loader again with every argument the user set (issue 47, item 1)."""

from __future__ import annotations

import inspect
import multiprocessing

import lightning.pytorch as pl
import pytest
import torch
from helpers import IndexedDataset, trainer_kwargs
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

from lightning_dataperf import TunedDataModule
from lightning_dataperf.loader.rebuild import loader_arguments

SAMPLING_ARGUMENTS = {"batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"}
PARAMETERS = [name for name in inspect.signature(DataLoader.__init__).parameters if name not in {"self", "kwargs"}]


def _init(worker_id):
    pass


def _collate(samples):
    return torch.stack(samples)


class Numbers(IterableDataset):
    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):
        return iter(torch.tensor([float(index)]) for index in range(self.length))


def every_argument_set() -> dict:
    """A non-default value for every argument of ``DataLoader.__init__`` that a map-style loader takes at once."""
    dataset = IndexedDataset(12)
    generator = torch.Generator().manual_seed(3)
    return {
        "dataset": dataset,
        "batch_size": 3,
        "shuffle": None,
        "sampler": RandomSampler(dataset, replacement=True, num_samples=7, generator=generator),
        "batch_sampler": None,
        "num_workers": 2,
        "collate_fn": _collate,
        "pin_memory": True,
        "drop_last": True,
        "timeout": 5.0,
        "worker_init_fn": _init,
        "multiprocessing_context": "spawn",
        "generator": generator,
        "prefetch_factor": 3,
        "persistent_workers": True,
        "pin_memory_device": "cpu",
        "in_order": False,
    }


def read_back(loader: DataLoader) -> dict:
    """What a loader does, per argument of ``DataLoader.__init__``."""
    values = {name: getattr(loader, name) for name in PARAMETERS if name not in SAMPLING_ARGUMENTS}
    batches = loader.batch_sampler
    values["batch_sampler"] = (type(batches), getattr(batches, "batch_size", None), getattr(batches, "drop_last", None))
    values.update(batch_size=loader.batch_size, drop_last=loader.drop_last, sampler=type(loader.sampler))
    return values


def rebuilt(loader: DataLoader) -> DataLoader:
    return DataLoader(**loader_arguments(loader))


def test_every_dataloader_argument_has_a_value_here():
    # a new torch argument fails here: give it a non-default value above and make loader_arguments read it back
    assert set(every_argument_set()) == set(PARAMETERS)


def test_every_argument_the_user_set_comes_back():
    arguments = every_argument_set()
    loader = DataLoader(**arguments)
    again = rebuilt(loader)
    assert read_back(again) == read_back(loader)
    assert again.sampler is arguments["sampler"] and again.generator is arguments["generator"]
    assert again.multiprocessing_context.get_start_method() == "spawn"
    assert (again.in_order, again.pin_memory_device, again.persistent_workers) == (False, "cpu", True)


def test_a_plain_batch_sampler_stays_the_users():
    dataset = IndexedDataset(10)
    batches = BatchSampler(SequentialSampler(dataset), batch_size=4, drop_last=False)
    loader = DataLoader(dataset, batch_sampler=batches)
    again = rebuilt(loader)
    assert again.batch_sampler is batches and again.batch_size is None
    assert [len(batch) for batch in again] == [4, 4, 2]


def test_an_iterable_dataset_gets_no_sampler_back():
    loader = DataLoader(Numbers(10), batch_size=4, drop_last=True)
    again = rebuilt(loader)
    assert read_back(again) == read_back(loader)
    assert [batch[:, 0].tolist() for batch in again] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_shuffle_and_sequential_come_back_as_they_were_made():
    dataset = IndexedDataset(10)
    shuffled = loader_arguments(DataLoader(dataset, batch_size=2, shuffle=True))
    assert shuffled.get("shuffle") is True and "sampler" not in shuffled
    plain = loader_arguments(DataLoader(dataset, batch_size=2))
    assert "shuffle" not in plain and "sampler" not in plain
    unbatched = DataLoader(dataset, batch_size=None)
    assert read_back(rebuilt(unbatched)) == read_back(unbatched)


def test_a_defaulted_argument_is_left_out_and_the_loaders_own_are_kept():
    arguments = loader_arguments(DataLoader(IndexedDataset(4), batch_size=2))
    assert not {"multiprocessing_context", "generator", "in_order", "pin_memory_device"} & set(arguments)
    # the policy must not replace what the loader had: its worker count stays even at 0
    assert arguments["num_workers"] == 0 and arguments["pin_memory"] is False


def test_the_context_a_user_chose_is_kept():
    context = multiprocessing.get_context("spawn")
    loader = DataLoader(IndexedDataset(4), num_workers=1, multiprocessing_context=context)
    assert loader_arguments(loader)["multiprocessing_context"] is context


class Summing(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)
        self.seen: list[list[float]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch[:, 0].tolist())
        return self.layer(batch[:, :1]).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


@pytest.mark.parametrize("kind", ["batch_sampler", "iterable"])
def test_fit_runs_with_the_loader_rebuilt(tmp_path, kind):
    if kind == "batch_sampler":
        dataset = IndexedDataset(10)
        loader = DataLoader(dataset, batch_sampler=BatchSampler(SequentialSampler(dataset), 4, drop_last=False))
        expected = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    else:
        loader = DataLoader(Numbers(10), batch_size=4)
        expected = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    model = Summing()
    trainer = pl.Trainer(max_epochs=1, logger=False, **trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=TunedDataModule.from_loaders(loader, seed=1, verbose=False))
    assert model.seen == expected


def test_a_user_generator_is_kept_and_the_plan_says_what_seeds_the_order():
    generator = torch.Generator().manual_seed(7)
    loader = DataLoader(IndexedDataset(8), batch_size=2, shuffle=True, generator=generator)
    datamodule = TunedDataModule.from_loaders(loader, seed=5, verbose=False)
    assert datamodule.train_dataloader().generator is generator
    plan = datamodule.loader_plans["train"][0]
    assert "seed=5" in plan.sampler and "your generator= stays on the loader, but this seed orders" in plan.sampler
    assert "generator=" in plan.format()
