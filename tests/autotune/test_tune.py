"""autotune_loader end to end: the budget, fixed knobs, the training order it leaves alone, rank zero's search
under DDP, the first epoch's start-up without it, the share of the budget the choice keeps."""

from __future__ import annotations

import json

import lightning.pytorch as pl
import pytest
from autotune_fakes import SlowSamples
from helpers import IndexData, RecordingModel, run_two_ranks, trainer_kwargs

from lightning_dataperf import SearchTuning, autotune_loader
from lightning_dataperf.testing import SleepingLoaderDataset


def test_budget_respected_and_result_is_measured(tmp_path):
    # Unbounded, this search (latency: more workers keep gaining) takes ~6 s on a quiet 2-core VM; with a
    # 2 s budget it must stop for the budget and say so. A trial stops at the deadline, but a loader's
    # start-up and shutdown cannot be cut (on a loaded 2-core VM ~2-3 s past the budget): the time bound
    # is loose, the stop reason is the check.
    result = autotune_loader(SlowSamples(2000), 16, time_budget=2.0, cache_path=tmp_path / "cache.json")
    assert result.stop_reason == "time budget", result.stop_detail
    assert result.search_seconds < 2.0 + 8.0
    measured = [trial for trial in result.trials if trial.refused is None]
    assert measured and all(trial.batches >= 2 for trial in measured)
    chosen = next(trial for trial in measured if trial.config[:1] == (result.settings.num_workers,))
    assert result.chosen_batches_per_sec >= 0.95 * (1 - 0.05) * result.best_batches_per_sec
    assert chosen.batches_per_sec > 0
    assert "DataPerf autotune" in result.format()


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
        datamodule = IndexData(length=64, seed=3, autotune=SearchTuning(**options) if autotune else None, verbose=False)
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


def test_first_epoch_start_up_excludes_the_search_and_the_verdict_quotes_it(tmp_path, monkeypatch):
    from lightning_dataperf import DataPerfCallback

    monkeypatch.setenv("LIGHTNING_DATAPERF_CACHE", str(tmp_path / "cache.json"))
    # precision no trial reaches, no batch cap, and enough samples that no trial's slice of the dataset runs
    # out: trials end at their time cap or once decided, so the search takes long enough (about its 2.5 s
    # budget) to tell apart from the start-up (256 samples let trials end on their data, searches of 0.8 s)
    options = dict(time_budget=2.5, batch_budget=100_000, precision=1e-4, progress=False, force=True)
    datamodule = IndexData(length=16_384, seed=3, autotune=SearchTuning(**options), verbose=False)
    perf = DataPerfCallback(print_summary=False, telemetry=False)
    kwargs = trainer_kwargs(tmp_path, limit_train_batches=16)
    trainer = pl.Trainer(max_epochs=1, logger=False, callbacks=[perf], **kwargs)
    trainer.fit(RecordingModel(), datamodule=datamodule)
    result = datamodule.autotune_result
    first = perf.summaries[0]
    # the search ran inside train_dataloader(), after the epoch began: counted, it would be the start-up
    assert result.elapsed_s >= 0.5 and first.epoch_start is not None
    assert first.epoch_start < result.elapsed_s, (first.epoch_start, result.elapsed_s)
    text = perf.last_diagnosis.format()
    assert "autotune=True" not in text and "try autotune" not in text


def test_the_climb_leaves_a_share_of_the_budget_for_the_choice(tmp_path, monkeypatch):
    import time

    from lightning_dataperf.autotune import tune as autotune
    from lightning_dataperf.autotune.choice import CHOICE_RESERVE
    from lightning_dataperf.autotune.search import Search

    def greedy_climb(self, best):  # a climb that spends every second it is given
        while self.runner.remaining > 0:
            time.sleep(0.01)
        self.compare.stop("time budget", "spent")
        return best

    seen = []
    choose = autotune.choose

    def recorded(compare, floor, choose_within, **options):
        seen.append(compare.runner.remaining)
        return choose(compare, floor, choose_within, **options)

    monkeypatch.setattr(Search, "climb_workers", greedy_climb)
    monkeypatch.setattr(autotune, "choose", recorded)
    autotune_loader(SlowSamples(2000), 16, time_budget=3.0, cache_path=tmp_path / "c.json", progress=False)
    (remaining,) = seen
    assert remaining > 0.5 * CHOICE_RESERVE * 3.0  # what the climb had to leave (trials after it may eat into it)
