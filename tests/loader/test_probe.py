"""Inside the loader: per-batch fetch/collate/pin/hand-over figures from the workers, batches unchanged."""

from __future__ import annotations

import dataclasses
import time

import lightning.pytorch as pl
import pytest
import torch
from helpers import SleepyModel, scalar_tags, trainer_kwargs
from torch.utils.data import DataLoader, Dataset, IterableDataset

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.loader.probe import BatchTiming, LoaderProbe, TimedBatch, instrument
from lightning_dataperf.loader.stats import LoaderStats
from lightning_dataperf.loader.wrapping import add_iterator_wrapper


class SleepPerSample(Dataset):
    """Each sample costs ``sample_s`` in __getitem__; the collate costs ``collate_s`` per batch."""

    def __init__(self, length: int, sample_s: float) -> None:
        self.length, self.sample_s = length, sample_s

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.sample_s)
        return torch.full((8,), float(index))


class SlowCollate:
    def __init__(self, collate_s: float) -> None:
        self.collate_s = collate_s

    def __call__(self, samples):
        time.sleep(self.collate_s)
        return torch.stack(samples)


class Counting(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(16, dtype=torch.float32).reshape(8, 2))


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_are_unchanged_and_their_inside_is_measured(workers):
    loader = DataLoader(SleepPerSample(24, 0.01), batch_size=4, num_workers=workers, collate_fn=SlowCollate(0.02))
    plain = [batch.clone() for batch in DataLoader(SleepPerSample(24, 0.0), batch_size=4)]
    probe = instrument(loader)
    assert probe.blind is None and isinstance(loader, DataLoader)
    seen = list(loader)
    assert all(type(batch) is torch.Tensor for batch in seen), "training_step must get the batch, not a wrapper"
    assert [batch.tolist() for batch in seen] == [batch.tolist() for batch in plain]  # same batches, same order
    stats = LoaderStats.of(probe.completed())
    assert stats.batches == 6 and stats.samples == 4
    # sleeps are lower bounds of the measured times (a loaded machine only adds)
    assert stats.fetch_s >= 4 * 0.01 and stats.collate_s >= 0.02
    assert stats.fetch_s < 4 * 0.01 + 0.5 and stats.collate_s < 0.02 + 0.5
    assert stats.workers == workers
    if workers:
        assert stats.busy_fraction is not None and 0.5 < stats.busy_fraction <= 1.0, "workers never sit idle here"
    else:
        assert stats.busy_fraction is None  # the training process is no worker
        assert stats.worker_wait_s == pytest.approx(stats.wait_s - stats.handover_s)
    assert instrument(loader) is probe, "a loader processed twice keeps one probe"


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true but no accelerator:UserWarning")
def test_pinned_batches_count_the_pin_thread():
    loader = DataLoader(SleepPerSample(8, 0.0), batch_size=4, num_workers=1, pin_memory=True)
    probe = instrument(loader)
    batches = list(loader)
    records = probe.completed()
    assert len(records) == 2 and all(type(batch) is torch.Tensor for batch in batches)
    if torch.cuda.is_available():
        assert all(batch.is_pinned() for batch in batches) and all(record.pin_s > 0 for record in records)
    assert all(record.wait_s == pytest.approx(record.worker_wait_s + record.handover_s, abs=1e-6) for record in records)


def test_what_cannot_be_seen_is_named_and_left_alone():
    iterable = DataLoader(Counting(), batch_size=4)
    probe = instrument(iterable)
    assert "IterableDataset" in probe.blind
    assert [batch.tolist() for batch in iterable] == [
        [[0, 1], [2, 3], [4, 5], [6, 7]],
        [[8, 9], [10, 11], [12, 13], [14, 15]],
    ]
    assert "not a torch DataLoader" in instrument([torch.ones(2)]).blind


def test_iterator_wrappers_compose_inner_first():
    loader = DataLoader(list(range(6)), batch_size=2)
    order = []

    def tag(name):
        def wrap(iterator):
            order.append(name)
            return iterator

        return wrap

    add_iterator_wrapper(loader, tag("outer"))
    add_iterator_wrapper(loader, tag("inner"), inner=True)
    assert isinstance(loader, DataLoader) and [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]
    assert order == ["inner", "outer"]


def test_unwrapped_records_keep_every_worker_field_and_add_the_main_process_ones():
    made = BatchTiming(3, 4, 0.5, 0.25, 2.0, 8.0, 100.0, work_cpu_s=0.125, pid=4321)
    probe = LoaderProbe()
    items = iter([TimedBatch("first", made, pin_s=0.0625), "not timed", TimedBatch("third", made)])
    assert list(probe.unwrap(items)) == ["first", "not timed", "third"]
    first, third = probe.completed()
    assert 0 < first.requested_at <= first.received_at <= third.requested_at <= third.received_at
    received = {"requested_at": 0.0, "received_at": 0.0}
    assert dataclasses.replace(first, **received) == dataclasses.replace(made, pin_s=0.0625, index=0)
    assert dataclasses.replace(third, **received) == dataclasses.replace(made, index=2)
    assert probe.completed() == []


def test_timed_batches_survive_the_worker_queue():
    loader = DataLoader(SleepPerSample(4, 0.0), batch_size=2, num_workers=1, collate_fn=lambda s: torch.stack(s))
    instrument(loader)
    inner = DataLoader.__iter__(loader)  # the loader's own iterator, before unwrapping
    try:
        assert type(next(inner)) is TimedBatch
    finally:
        inner._shutdown_workers()


def test_callback_reports_the_loader_inside_for_a_plain_dataloader(tmp_path):
    perf = DataPerfCallback(print_summary=False, telemetry=False)
    model = SleepyModel(step_s=0.005)
    trainer = pl.Trainer(max_epochs=2, callbacks=[perf], log_every_n_steps=2, **trainer_kwargs(tmp_path))
    loader = DataLoader(SleepPerSample(32, 0.002), batch_size=4, num_workers=2, persistent_workers=True)
    trainer.fit(model, loader)
    assert torch.cat(model.seen).tolist() == [float(i) for i in range(32)] * 2
    for summary in perf.summaries:
        # the epoch's first batch is start-up (left out, as in the step figures): 7 of the 8
        assert summary.loader is not None and summary.loader.batches == 7 and summary.loader.workers == 2
        assert summary.loader.fetch_s >= 4 * 0.002
    logged = scalar_tags(trainer.logger.log_dir).Tags()["scalars"]
    for tag in ("Workers/fetch_s", "Workers/collate_s", "Workers/handover_s", "Workers/busy_fraction"):
        assert tag in logged, tag


def test_the_loader_figures_add_up_to_the_measured_wait(tmp_path):
    perf = DataPerfCallback(print_summary=False, telemetry=False)
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], log_every_n_steps=4, **trainer_kwargs(tmp_path))
    loader = DataLoader(SleepPerSample(4 * 24, 0.0), batch_size=4, collate_fn=SlowCollate(0.03))  # 30 ms a batch
    trainer.fit(SleepyModel(), loader)
    summary = perf.last_summary
    wait = summary.timings["DataLoading"].mean
    assert summary.loader.batches == summary.timings["DataLoading"].count == 23  # the same batches
    # within 10%, plus 3 ms for a loaded 2-core machine (one batch preempted for ~70 ms moves a 23-batch mean by 3 ms)
    assert summary.loader.wait_s == pytest.approx(wait, rel=0.1, abs=0.003)
    parts = summary.loader.worker_wait_s + summary.loader.handover_s
    assert parts == pytest.approx(summary.loader.wait_s, rel=1e-6)
    # the wait is the collate's: its 30 ms sleep at least (the ground truth), never more than the wait it is part of
    assert 0.03 <= summary.loader.collate_s <= wait + 0.001


class Batched(Dataset):
    """A dataset that builds whole batches itself (``__getitems__``), used with an identity collate."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        return torch.tensor([float(index)])

    def __getitems__(self, indices):
        return {"x": torch.tensor([[float(index)] for index in indices])}


def test_getitems_results_and_attribute_writes_reach_the_users_dataset():
    loader = DataLoader(Batched(), batch_size=4, collate_fn=lambda batch: batch)
    instrument(loader)
    assert [batch["x"].flatten().tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    loader.dataset.difficulty = 3  # e.g. a curriculum callback, or a worker_init_fn opening a handle
    assert loader.dataset.dataset.difficulty == 3 and loader.dataset.difficulty == 3


def test_a_loader_lightning_rebuilds_from_an_instrumented_one_yields_plain_batches(tmp_path):
    perf = DataPerfCallback(print_summary=False, telemetry=False)
    model = SleepyModel()
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], **trainer_kwargs(tmp_path))
    loader = DataLoader(SleepPerSample(16, 0.0), batch_size=4)
    trainer.fit(model, loader)
    predictions = trainer.predict(model, loader)  # Lightning re-creates the loader for prediction
    assert len(predictions) == 4 and all(isinstance(value, torch.Tensor) for value in predictions)
    again = pl.Trainer(max_epochs=1, callbacks=[perf], **trainer_kwargs(tmp_path))
    again.fit(model, loader)  # training again on the same loader: one probe, each batch counted once
    assert perf.last_summary.stage == "train" and perf.last_summary.loader.batches == 3
    assert perf.last_summary.loader.samples == 4
