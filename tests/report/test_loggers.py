"""DataPerf's metrics reach every logger; TensorBoard gets one event per log point with the same tags."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from lightning_dataperf.report.loggers import log_metrics

METRICS = {"Time/DataLoading": 0.25, "Time/Compute": 0.5, "Usage/cpu_percent_mean": 40.0}


def _scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.mark.parametrize("prefix", ["", "run1"])
def test_tensorboard_tags_match_log_metrics(tmp_path, prefix):
    ours = TensorBoardLogger(tmp_path / "ours", name="", version="", prefix=prefix)
    stock = TensorBoardLogger(tmp_path / "stock", name="", version="", prefix=prefix)
    for step in (10, 20):
        log_metrics([ours], {tag: value * step for tag, value in METRICS.items()}, step=step)
        stock.log_metrics({tag: value * step for tag, value in METRICS.items()}, step=step)
    ours.finalize("success")
    stock.finalize("success")
    assert _scalars(ours.log_dir) == _scalars(stock.log_dir)
    assert len(_scalars(ours.log_dir)) == len(METRICS)


def test_tensorboard_writes_one_event_per_call(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="", version="")
    log_metrics([logger], METRICS, step=1)
    log_metrics([logger], METRICS, step=2)
    logger.finalize("success")
    (event_file,) = Path(logger.log_dir).glob("events.out.tfevents.*")
    summaries = [event for event in EventFileLoader(str(event_file)).Load() if event.HasField("summary")]
    assert [event.step for event in summaries] == [1, 2]
    assert all(len(event.summary.value) == len(METRICS) for event in summaries)


def test_closed_tensorboard_writer_falls_back_to_log_metrics(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="", version="")
    logger.experiment.close()  # file_writer is None until the next add_*; log_metrics reopens it
    log_metrics([logger], METRICS, step=3)
    logger.finalize("success")
    assert _scalars(logger.log_dir)["Time/Compute"] == [(3, 0.5)]


def test_other_loggers_get_log_metrics(tmp_path):
    tensorboard = TensorBoardLogger(tmp_path / "tb", name="", version="")
    table = CSVLogger(tmp_path / "csv", name="", version="")
    log_metrics([tensorboard, table], METRICS, step=7)
    log_metrics([tensorboard, table], {}, step=8)  # nothing to log: no empty rows or events
    table.finalize("success")
    tensorboard.finalize("success")
    with open(f"{table.log_dir}/metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 1 and rows[0]["step"] == "7" and float(rows[0]["Time/DataLoading"]) == 0.25
    assert _scalars(tensorboard.log_dir)["Time/DataLoading"] == [(7, 0.25)]
