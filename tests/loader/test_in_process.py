"""CPU training's measured default: a batch timed in the training process before the policy hands loading to workers."""

from __future__ import annotations

import random
import time

import lightning.pytorch as pl
import numpy
import pytest
import torch
from helpers import IndexData, IndexedDataset, RecordingModel, trainer_kwargs
from torch.utils.data import Dataset, IterableDataset

from lightning_dataperf import OnlineTuning
from lightning_dataperf.loader import in_process
from lightning_dataperf.loader.in_process import in_process_workers, time_in_process


class Drawing(Dataset):
    """Draws from every generator and opens a "file" lazily, as datasets that open theirs in the worker do."""

    def __init__(self, length: int = 16) -> None:
        self.length, self.handle, self.fetched = length, None, []

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.handle is None:
            self.handle = object()
        self.fetched.append(index)
        return torch.tensor([torch.rand(()).item(), random.random(), numpy.random.rand()])


class Batched(IndexedDataset):
    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.calls: list[list[int]] = []

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        self.calls.append(list(indices))
        return [self[index] for index in indices]


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(8))


class Broken(IndexedDataset):
    def __getitem__(self, index: int) -> torch.Tensor:
        raise OSError("file gone")


def test_a_batch_under_the_budget_is_timed_on_two_batches_and_one_over_it_is_cut():
    fast = time_in_process(IndexedDataset(16), batch_size=4, budget_s=10.0)
    assert fast is not None and not fast.cut and fast.batches == 2 and 0 < fast.batch_s < 10.0
    dataset = Drawing()
    slow = time_in_process(dataset, batch_size=4, budget_s=0.0)
    assert slow is not None and slow.cut and slow.batches == 0 and slow.batch_s > 0
    assert dataset.fetched == [0], "one sample (through the copy, which shares the list), then the cut"


class Waiting(IndexedDataset):
    """Sleeps in every fetch, as a read from a slow disk or the network waits."""

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.004)
        return super().__getitem__(index)


def test_loading_that_waits_reads_blocked_and_gets_two_workers_a_core(monkeypatch):
    load = time_in_process(Waiting(16), batch_size=4)
    assert load is not None and load.blocked_share > in_process.WAITING_SHARE, "asleep, neither computing nor queued"
    assert load.cpu_share < 0.5
    workers, why = in_process_workers({"dataset": Waiting(16), "batch_size": 4}, cpus=3)
    assert workers == 6 and "on storage or the network" in why and "num_workers=N" in why
    monkeypatch.setattr(in_process, "WAITING_SHARE", 1.0)  # nothing "waits": the policy's count stands
    assert in_process_workers({"dataset": Waiting(16), "batch_size": 4}, cpus=3) is None


class Computing(IndexedDataset):
    """Busy on a CPU in every fetch, as a decode or a tokeniser is."""

    def __getitem__(self, index: int) -> torch.Tensor:
        began = time.process_time()
        while time.process_time() - began < 0.004:
            pass
        return super().__getitem__(index)


def test_loading_that_computes_is_not_taken_for_waiting():
    load = time_in_process(Computing(16), batch_size=4)
    # on a loaded machine the wait for a core is queued time (schedstat), not blocked
    assert load is not None and load.blocked_share < in_process.WAITING_SHARE
    assert in_process_workers({"dataset": Computing(16), "batch_size": 4}, cpus=3) is None


def test_timing_draws_nothing_from_the_generators_and_leaves_the_dataset_as_it_was():
    torch.manual_seed(1), random.seed(1), numpy.random.seed(1)
    expected = (torch.rand(3), random.random(), numpy.random.rand())
    torch.manual_seed(1), random.seed(1), numpy.random.seed(1)
    dataset = Drawing()
    load = time_in_process(dataset, batch_size=4, budget_s=10.0)
    assert load is not None and not load.cut
    got = (torch.rand(3), random.random(), numpy.random.rand())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:], "the run's streams unchanged"
    assert dataset.handle is None, "a lazily opened file stays out of the dataset the workers inherit"


def test_a_dataset_with_getitems_is_fetched_as_the_loader_would_and_wraps_past_its_end():
    dataset = Batched(6)
    assert time_in_process(dataset, batch_size=4, budget_s=10.0) is not None
    assert dataset.calls == [[0, 1, 2, 3], [4, 5, 0, 1]]


@pytest.mark.parametrize(
    "dataset", [Stream(), IndexedDataset(0), Broken(8), object()], ids=["iterable", "empty", "raises", "no-len"]
)
def test_what_cannot_be_timed_leaves_the_policy_alone(dataset):
    assert time_in_process(dataset, batch_size=2, budget_s=10.0) is None
    assert in_process_workers({"dataset": dataset, "batch_size": 2}, cpus=2) is None


def test_a_batch_sampler_of_yours_is_not_timed():
    sampler = [[0, 1], [2, 3]]
    assert in_process_workers({"dataset": IndexedDataset(4), "batch_sampler": sampler}, cpus=2) is None


def _fit(tmp_path, datamodule, epochs=2):
    model = RecordingModel()
    options = trainer_kwargs(tmp_path, max_epochs=epochs, logger=False)
    pl.Trainer(**options).fit(model, datamodule=datamodule)
    return model


def test_cpu_training_at_the_defaults_keeps_a_fast_loader_in_the_training_process(tmp_path, monkeypatch):
    monkeypatch.setattr(in_process, "HANDOVER_FLOOR_S", 10.0)  # every batch "fast": no timing in the assertion
    monkeypatch.setattr(in_process, "TIMING_BUDGET_S", 20.0)
    datamodule = IndexData(length=30, seed=3, verbose=False)
    model = _fit(tmp_path, datamodule)
    (plan,) = datamodule.loader_plans["train"]
    assert plan.chosen["num_workers"] == 0 and "below a worker's hand-over" in plan.reasons["num_workers"]
    assert "prefetch_factor" not in plan.chosen and "persistent_workers" not in plan.chosen
    for epoch in (0, 1):
        assert sorted(row[1] for row in model.rows if row[0] == epoch) == list(range(30)), "each sample once"


def test_a_slow_loader_and_explicit_workers_keep_the_policys_count(tmp_path, monkeypatch):
    monkeypatch.setattr(in_process, "HANDOVER_FLOOR_S", 0.0)  # every batch "slow" and computing
    monkeypatch.setattr(in_process, "WAITING_SHARE", 1.0)
    slow = IndexData(length=16, seed=3, verbose=False)
    _fit(tmp_path / "slow", slow, epochs=1)
    (plan,) = slow.loader_plans["train"]
    assert plan.chosen["num_workers"] == slow.loader_settings.num_workers >= 1
    assert "loaded in this process" not in plan.reasons["num_workers"]

    calls = []
    monkeypatch.setattr(in_process, "in_process_workers", lambda explicit, cpus: calls.append(cpus) or (0, ""))
    _fit(tmp_path / "explicit", IndexData(length=16, workers=1, seed=3, verbose=False), epochs=1)
    assert calls == [], "your num_workers is not timed over"


def test_the_loop_starts_from_the_measured_workers_on_one_rank_and_from_the_policys_under_ddp(tmp_path, monkeypatch):
    monkeypatch.setattr(in_process, "HANDOVER_FLOOR_S", 10.0)  # every batch "fast"
    monkeypatch.setattr(in_process, "TIMING_BUDGET_S", 20.0)
    online = IndexData(length=64, seed=3, verbose=False, autotune=OnlineTuning())
    _fit(tmp_path / "one", online, epochs=1)
    (plan,) = online.loader_plans["train"]
    assert plan.chosen["num_workers"] == 0 and "hand-over" in plan.reasons["num_workers"]
    assert online.online_result is not None and online._online.current.num_workers == 0, "the loop starts there"
    # every rank starts from the same count: the hardware policy's, untimed
    calls = []
    monkeypatch.setattr(in_process, "in_process_workers", lambda explicit, cpus: calls.append(cpus) or (0, ""))
    ranked = IndexData(length=64, seed=3, verbose=False, autotune=OnlineTuning())
    monkeypatch.setattr(type(ranked), "_ranks", lambda self: (0, 2))
    ranked.trainer = pl.Trainer(**trainer_kwargs(tmp_path / "ddp", logger=False))
    plan, _ = ranked.plan_loader("train", {"dataset": IndexedDataset(64), "batch_size": 4})
    assert calls == [] and plan.chosen["num_workers"] == ranked.loader_settings.num_workers
