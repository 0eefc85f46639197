"""The hang watchdog reports a silent loader and never interrupts training."""

from __future__ import annotations

import time

import lightning.pytorch as pl
import pytest
import torch
from helpers import SleepyModel, trainer_kwargs
from torch.utils.data import DataLoader

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.telemetry.watchdog import HangWatchdog
from lightning_dataperf.testing import SleepingLoaderDataset


def test_reports_once_per_timeout_and_stops_when_a_batch_arrives():
    reports = []
    watchdog = HangWatchdog(timeout=10.0, report=reports.append, workers=list)
    assert watchdog.check(time.monotonic() + 100) is None, "not waiting: nothing to report"
    watchdog.batch_arrived(batch_index=4)
    watchdog.fetch_started()
    start = time.monotonic()
    assert watchdog.check(start + 5) is None
    report = watchdog.check(start + 11)
    assert report is not None and report.last_batch_index == 4 and report.waited >= 10
    assert "no loader worker processes are alive" in report.format()
    assert watchdog.check(start + 12) is None, "the next report waits another timeout"
    assert watchdog.check(start + 22) is not None
    watchdog.batch_arrived(batch_index=5)
    assert watchdog.check(start + 100) is None
    watchdog.fetch_started()  # a new wait is timed from its own start, not the previous one's
    again = time.monotonic()
    assert watchdog.check(again + 5) is None
    assert watchdog.check(again + 11).last_batch_index == 5
    assert len(reports) == 3
    with pytest.raises(ValueError, match="timeout"):
        HangWatchdog(timeout=0, report=print)


class StallOnce:
    """A collate that stalls once, like a worker stuck on a slow file."""

    def __init__(self, stall_s: float) -> None:
        self.stall_s = stall_s

    def __call__(self, samples):
        batch = torch.utils.data.default_collate(samples)
        if int(batch[0, 0]) == 12:
            time.sleep(self.stall_s)
        return batch


def test_silent_loader_is_reported_with_worker_states_and_training_finishes(tmp_path, capsys):
    perf = DataPerfCallback(print_summary=False, telemetry_interval=0.05, hang_timeout=0.4)
    loader = DataLoader(SleepingLoaderDataset(24, features=8), batch_size=4, num_workers=1, collate_fn=StallOnce(1.5))
    model = SleepyModel()
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], logger=False, **trainer_kwargs(tmp_path))
    trainer.fit(model, loader)
    assert perf.hang_reports, "a 1.5 s stall with a 0.4 s timeout must be reported"
    report = perf.hang_reports[0]
    assert report.last_batch_index == 2, "batches 0-2 arrived before the stalled one"
    assert len(report.workers) == 1 and report.workers[0].status in {"sleeping", "running", "disk-sleep"}
    assert "no batch from the loader" in capsys.readouterr().err
    seen = torch.cat(model.seen).tolist()
    assert seen == [float(index) for index in range(24)], "no batch lost or reordered"
