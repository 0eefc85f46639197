"""Autotune's progress while it searches: log lines, a bar or nothing, following the Trainer's progress bar."""

from __future__ import annotations

import lightning.pytorch as pl
from helpers import IndexData, RecordingModel, trainer_kwargs

from lightning_dataperf import SearchTuning, autotune_loader
from lightning_dataperf.testing import SleepingLoaderDataset


def test_progress_lines_appear_and_can_be_silenced(tmp_path, capsys):
    autotune_loader(SleepingLoaderDataset(512), 16, time_budget=1.0, cache_path=tmp_path / "a.json", progress="log")
    err = capsys.readouterr().err
    assert "DataPerf autotune: trial 1/~" in err and "batches/s" in err and "done in" in err
    autotune_loader(SleepingLoaderDataset(512), 16, time_budget=1.0, cache_path=tmp_path / "b.json", progress=False)
    captured = capsys.readouterr()
    assert "DataPerf autotune" not in captured.err + captured.out
    autotune_loader(SleepingLoaderDataset(512), 16, time_budget=1.0, cache_path=tmp_path / "c.json", progress="bar")
    assert "DataPerf autotune" in capsys.readouterr().err


def test_datamodule_progress_follows_the_trainer_and_can_be_silenced(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LIGHTNING_DATAPERF_CACHE", str(tmp_path / "cache.json"))

    def fit(**options):
        datamodule = IndexData(length=64, seed=3, autotune=SearchTuning(time_budget=1.0, **options), verbose=False)
        kwargs = dict(trainer_kwargs(tmp_path), enable_progress_bar=False)
        pl.Trainer(max_epochs=1, logger=False, **kwargs).fit(RecordingModel(), datamodule=datamodule)
        captured = capsys.readouterr()
        return captured.out + captured.err, datamodule.autotune_result

    shown, result = fit(force=True)
    assert "DataPerf autotune: trial 1/~" in shown and result.transfer == "host"
    assert result.elapsed_s > 0 and result.ended_at > 0
    silent, _ = fit(force=True, progress=False)
    assert "DataPerf autotune" not in silent
