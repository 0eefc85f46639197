"""Autotuning: budget, cache, memory guard, untouched training order, rank-zero search under DDP."""

from __future__ import annotations

import dataclasses
import json
import threading

import lightning.pytorch as pl
import pytest
import torch
from helpers import IndexData, RecordingModel, fake_hardware, run_two_ranks, trainer_kwargs

from lightning_dataperf import autotune_loader
from lightning_dataperf.autotune import AutotuneResult
from lightning_dataperf.autotune_trials import Trial, confirmation_candidates
from lightning_dataperf.testing import SleepingLoaderDataset


class SlowSamples(SleepingLoaderDataset):
    """I/O-like samples: a short sleep each, so more workers help."""

    def __getitem__(self, index):
        threading.Event().wait(0.002)
        return super().__getitem__(index)


def test_budget_respected_and_result_is_measured(tmp_path):
    result = autotune_loader(SlowSamples(2000), 16, time_budget=3.0, cache_path=tmp_path / "cache.json")
    assert result.search_seconds < 3.0 + 1.5
    measured = [trial for trial in result.trials if trial.refused is None]
    assert len(measured) >= 2 and all(trial.batches >= 2 for trial in measured)
    chosen = next(trial for trial in measured if trial.config[:1] == (result.settings.num_workers,))
    assert result.chosen_batches_per_sec >= 0.95 * (1 - 0.05) * result.best_batches_per_sec
    assert chosen.batches_per_sec > 0
    assert "DataPerf autotune" in result.format()


def test_cache_hit_skips_the_search_and_changes_invalidate_it(tmp_path):
    cache = tmp_path / "cache.json"
    dataset = SleepingLoaderDataset(512)
    first = autotune_loader(dataset, 16, time_budget=1.5, cache_path=cache)
    again = autotune_loader(dataset, 16, time_budget=1.5, cache_path=cache)
    assert not first.cached and again.cached and again.settings == first.settings
    assert again.trials == first.trials
    assert not autotune_loader(SleepingLoaderDataset(513), 16, time_budget=1.0, cache_path=cache).cached
    assert not autotune_loader(dataset, 32, time_budget=1.0, cache_path=cache).cached
    assert not autotune_loader(dataset, 16, time_budget=1.0, cache_path=cache, force=True).cached
    assert len(json.loads(cache.read_text())) == 3
    assert AutotuneResult.from_dict(first.to_dict()) == first


def test_memory_guard_refuses_oversized_configurations(tmp_path):
    class BigSamples(SleepingLoaderDataset):
        def __getitem__(self, index):
            return torch.zeros(256, 1024)  # 1 MB per sample, 16 MB per batch

    cramped = fake_hardware(usable_cpus=8, shm_free_mb=40.0, ram_available_mb=40.0, accelerator="cpu")
    result = autotune_loader(BigSamples(256), 16, hardware=cramped, time_budget=3.0, cache_path=tmp_path / "c.json")
    refused = [trial for trial in result.trials if trial.refused]
    assert refused and all("over 50% of free" in trial.refused for trial in refused)
    assert result.settings.num_workers * (result.settings.prefetch_factor or 0) * 16 <= 20


def test_user_fixed_knobs_are_not_searched(tmp_path):
    result = autotune_loader(
        SleepingLoaderDataset(512), 16, {"num_workers": 0}, time_budget=1.0, cache_path=tmp_path / "c.json"
    )
    assert {trial.num_workers for trial in result.trials} == {0} and result.settings.num_workers == 0


def test_bad_budget_is_refused():
    with pytest.raises(ValueError, match="time_budget"):
        autotune_loader(SleepingLoaderDataset(8), 2, time_budget=0)


def test_training_order_is_the_same_with_and_without_autotune(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTNING_DATAPERF_CACHE", str(tmp_path / "cache.json"))

    def fit(autotune):
        pl.seed_everything(3)
        model = RecordingModel()
        options = dict(time_budget=2.0, batch_budget=20)
        datamodule = IndexData(length=64, seed=3, autotune=autotune, autotune_options=options, verbose=False)
        trainer = pl.Trainer(max_epochs=2, logger=False, **trainer_kwargs(tmp_path))
        trainer.fit(model, datamodule=datamodule)
        return model, datamodule

    tuned, tuned_module = fit(True)
    plain, _ = fit(False)
    assert [row[:3] for row in tuned.rows] == [row[:3] for row in plain.rows]
    assert tuned_module.autotune_result is not None and not tuned_module.autotune_result.cached
    (plan,) = tuned_module.loader_plans["train"]
    assert plan.chosen["num_workers"] == tuned_module.autotune_result.settings.num_workers
    assert "measured" in plan.reasons["num_workers"]


@pytest.mark.slow
def test_rank_zero_searches_and_broadcasts(tmp_path):
    run_two_ranks("ddp_sampling_script.py", tmp_path, "autotune")
    rank0, rank1 = (json.loads((tmp_path / f"autotune_rank{rank}.json").read_text()) for rank in (0, 1))
    assert rank0["searches"] == 1 and rank1["searches"] == 0
    assert rank0["autotune"] == rank1["autotune"] and rank0["autotune"]["trials"]
    assert rank0["chosen"] == rank1["chosen"]


def test_result_round_trips_through_its_dict():
    result = AutotuneResult(
        settings=dataclasses.replace(
            __import__("lightning_dataperf").recommend_loader_settings(fake_hardware()), reasons={"a": "b"}
        ),
        trials=(Trial(4, 2, True, 12.5, 0.3, 40, 64.0), Trial(32, 2, True, refused="needs ~9000 MB")),
        search_seconds=1.0,
        baseline_batches_per_sec=2.0,
        best_batches_per_sec=4.0,
        chosen_batches_per_sec=4.0,
        key="abc",
    )
    again = AutotuneResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again == result
    assert result.speedup_over_start == 2.0


def test_confirmation_remeasures_the_fastest_and_the_cheapest_near_them():
    rates = {(4, 2, False): 100.0, (8, 2, False): 98.0, (2, 2, False): 97.0, (1, 2, False): 40.0}
    rates[(0, None, False)] = 75.0  # loading in the main process, measured once and unluckily low
    trials = [Trial(*config, batches_per_sec=rate, batches=10) for config, rate in rates.items()]
    chosen = [trial.config for trial in confirmation_candidates(trials, count=3, band=0.7)]
    assert chosen == [(4, 2, False), (8, 2, False), (2, 2, False), (0, None, False)]
    fastest_only = [trial.config for trial in confirmation_candidates(trials, count=3, band=0.9)]
    assert fastest_only == [(4, 2, False), (8, 2, False), (2, 2, False)], "(2, 2) is already the cheapest near"
    assert confirmation_candidates([], count=3) == []
