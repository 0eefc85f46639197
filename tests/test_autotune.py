"""Autotuning: budget, cache, memory guard, untouched training order, rank-zero search under DDP."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import threading
import weakref

import lightning.pytorch as pl
import pytest
import torch
from helpers import IndexData, RecordingModel, fake_hardware, run_two_ranks, trainer_kwargs

from lightning_dataperf import autotune_loader
from lightning_dataperf.autotune.bounds import Resources
from lightning_dataperf.autotune.trial import Trial, confirmation_candidates, steady_rate
from lightning_dataperf.autotune.tune import AutotuneResult
from lightning_dataperf.loader.sharing import FAST_HANDOVER, process_strategy
from lightning_dataperf.testing import SleepingLoaderDataset


class BusySamples(SleepingLoaderDataset):
    """CPU-bound samples: 1 ms of busy loop each."""

    def __getitem__(self, index):
        import time

        until = time.thread_time() + 0.001
        while time.thread_time() < until:
            pass
        return super().__getitem__(index)


class SlowSamples(SleepingLoaderDataset):
    """I/O-like samples: a short sleep each, so more workers help."""

    def __getitem__(self, index):
        threading.Event().wait(0.002)
        return super().__getitem__(index)


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
    assert all("over 50% of free" in trial.refused for trial in refused)
    assert result.stop_reason in {"/dev/shm", "memory guard"} and "/dev/shm" in result.bounds
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
        trials=(
            Trial(4, 2, True, 12.5, 0.3, 40, 64.0),
            Trial(4, 2, True, 14.0, 0.3, 40, 64.0, sharing="file_system"),  # the same settings, sent by file name
            Trial(32, 2, True, refused="needs ~9000 MB"),
        ),
        search_seconds=1.0,
        baseline_batches_per_sec=2.0,
        best_batches_per_sec=4.0,
        chosen_batches_per_sec=4.0,
        key="abc",
        sharing_strategy="file_system",
    )
    again = AutotuneResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again == result
    assert result.speedup_over_start == 2.0
    settings = dataclasses.replace(result.settings, num_workers=4, prefetch_factor=2, pin_memory=True)
    assert dataclasses.replace(result, settings=settings).chosen_trial.batches_per_sec == 14.0  # the way it was sent
    plain = dataclasses.replace(result, settings=settings, sharing_strategy=None)
    assert plain.chosen_trial.batches_per_sec == 12.5 and "file_system" in plain.format().splitlines()[-2]


def test_confirmation_remeasures_the_fastest_and_the_cheapest_near_them():
    rates = {(4, 2, False): 100.0, (8, 2, False): 98.0, (2, 2, False): 97.0, (1, 2, False): 40.0}
    rates[(0, None, False)] = 75.0  # loading in the main process, measured once and unluckily low
    trials = [Trial(*config, batches_per_sec=rate, batches=10) for config, rate in rates.items()]
    chosen = [trial.config for trial in confirmation_candidates(trials, count=3, band=0.7)]
    assert chosen == [(4, 2, False), (8, 2, False), (2, 2, False), (0, None, False)]
    fastest_only = [trial.config for trial in confirmation_candidates(trials, count=3, band=0.9)]
    assert fastest_only == [(4, 2, False), (8, 2, False), (2, 2, False)], "(2, 2) is already the cheapest near"
    assert confirmation_candidates([], count=3) == []


# ---------------------------------------------------------------------------------------------- issue 18
class FakeRunner:
    """Stands in for TrialRunner: rates from a function of the configuration, no processes, no clocks."""

    def __init__(self, rate, bounds=None, busy=0.05, sharing_rate=None):
        self.rate, self.bounds, self.busy = rate, bounds or {}, busy
        self.sharing_rate = sharing_rate or rate  # the rates when the workers send by file name
        self.trials, self.remaining, self.measured, self.remeasured, self.scales = {}, 100.0, [], [], []
        self.timing = {}  # workers -> (work_s, main_s) the fake trials report
        self.sharing, self.shared, self.earlier = None, [], []
        self.wait_share = None  # the main thread's wait share the fake trials report
        self._held, self.released = [], []

    def _rate(self, key, sharing):
        return (self.sharing_rate if sharing else self.rate)(*key)

    def measure(self, workers, prefetch, pin, against=None):
        key = (workers, prefetch if workers else None, pin)
        if key not in self.trials:
            self.measured.append(key)
            work_s, main_s = self.timing.get(workers, (None, None))
            rate = self._rate(key, self.sharing)
            self.trials[key] = Trial(*key, rate, batches=20, worker_busy=self.busy, work_s=work_s, main_s=main_s,
                                     sharing=self.sharing, wait_share=self.wait_share)  # fmt: skip
        return self.trials[key]

    def measure_sharing(self, trial, strategy):
        self.shared.append(trial.config)
        other = Trial(*trial.config, self._rate(trial.config, strategy), batches=20, worker_busy=self.busy,
                      sharing=strategy)  # fmt: skip
        self.earlier.append(other)
        return other

    def latest(self, trial):
        if trial.sharing == self.sharing:
            return self.trials.get(trial.config, trial)
        return next((kept for kept in reversed(self.earlier) if kept.measured_as == trial.measured_as), trial)

    def adopt(self, trial):
        self.earlier = [kept for kept in self.earlier if kept is not trial] + list(self.trials.values())
        self.trials, self.sharing = {trial.config: trial}, trial.sharing

    def remeasure(self, trial, cap_scale=1.0, against=None):
        self.remeasured.append(trial.config)
        self.scales.append(cap_scale)
        again = dataclasses.replace(trial, batches_per_sec=self._rate(trial.config, trial.sharing), measurements=2)
        if trial.sharing == self.sharing:  # stored where TrialRunner stores it
            self.trials[trial.config] = again
        else:
            self.earlier = [again if kept.measured_as == trial.measured_as else kept for kept in self.earlier]
        return again

    def worker_bounds(self, prefetch, pin):
        return dict(self.bounds)

    def release(self, seconds):  # as TrialRunner: the innermost reserve is given back early, once
        given = min(seconds, self._held[-1] if self._held else 0.0)
        if self._held:
            self._held[-1] -= given
        self.remaining += given
        self.released.append(given)

    @contextlib.contextmanager
    def reserved(self, seconds):
        self.remaining -= seconds
        self._held.append(seconds)
        try:
            yield
        finally:
            self.remaining += self._held.pop()


def _search_with(runner, cpus=2, min_workers=1):
    from lightning_dataperf.autotune.search import Search
    from lightning_dataperf.autotune.trial import Limits

    limits = Limits(30.0, 200, 0.03, 0.5, None, min_workers)
    return Search(runner, {}, (False,), limits)


def test_io_latency_climb_goes_past_twice_the_cpus_and_says_why_it_stopped():
    # 20 ms of latency per batch per worker, no CPU: the rate grows with workers until 1,000 batches/s.
    runner = FakeRunner(lambda workers, prefetch, pin: min(50.0 * workers, 1000.0))
    search = _search_with(runner)
    best = search.climb_workers(runner.measure(1, 2, False))
    assert best.num_workers >= 20 > 2 * 2  # twice the 2 CPUs was the old ceiling
    assert search.compare.stop_reason == "gain" and "more gave nothing" in search.compare.stop_detail


@pytest.mark.skipif(process_strategy() == FAST_HANDOVER, reason="this platform already sends by file name")
def test_where_the_hand_over_limited_the_gain_the_climb_goes_on_sending_by_file_name():
    # the main thread takes at most 300 batches/s over connections per tensor, 600 by file name; 20 ms a batch
    runner = FakeRunner(lambda w, p, pin: min(50.0 * w, 300.0), sharing_rate=lambda w, p, pin: min(50.0 * w, 600.0))
    search = _search_with(runner)
    best = search.climb_workers(runner.measure(1, 2, False))
    ((plateau, _, _),) = runner.shared  # one hand-over trial, where the default way stopped gaining
    assert best.sharing == runner.sharing == FAST_HANDOVER and best.num_workers > plateau
    assert best.batches_per_sec > 300.0 * 1.03 and search.handover.detail.startswith("file_system sharing measured +")
    assert search.compare.stop_reason == "gain" and all(trial.sharing is None for trial in runner.earlier)
    same = FakeRunner(lambda w, p, pin: min(50.0 * w, 300.0))  # the hand-over was not the limit: one trial, kept apart
    best = _search_with(same).climb_workers(same.measure(1, 2, False))
    assert best.sharing is None and same.sharing is None and len(same.shared) == 1


@pytest.mark.skipif(process_strategy() == FAST_HANDOVER, reason="this platform already sends by file name")
def test_the_hand_over_is_tried_as_soon_as_idle_workers_make_much_more_than_arrives():
    # as above, and each trial says what its workers could make (20 ms a batch each) and that the main thread
    # waited: the first count whose workers make a sixth more than arrives is tried by file name at once
    runner = FakeRunner(lambda w, p, pin: min(50.0 * w, 300.0), sharing_rate=lambda w, p, pin: min(50.0 * w, 1200.0))
    runner.timing = {workers: (0.02, 0.001) for workers in range(1, 200)}
    runner.wait_share = 0.9
    search = _search_with(runner)
    search.handover.reserve = 4.0
    best = search.climb_workers(runner.measure(1, 2, False))
    ((at, _, _),) = runner.shared
    assert 50.0 * at > 300.0 * 1.15 and max(trial.num_workers for trial in runner.earlier) == at  # none past it
    assert best.sharing == FAST_HANDOVER and best.num_workers > at
    assert runner.released == [4.0] and runner.remaining == 100.0  # the reserve went back to the climb, once


def test_no_deeper_queue_is_tried_where_the_main_thread_waited_too_little_to_show_a_gain():
    runner = FakeRunner(lambda w, p, pin: 100.0 * p)
    search = _search_with(runner)
    # the workers could make 180 batches/s and 100 arrived, but the main thread waited only 9% of the time:
    # a deeper queue gives back at most +10%, inside this trial's 14% gap
    best = Trial(18, 2, False, 100.0, batches=100, precision=0.067, wait_share=0.09, work_s=0.1, worker_busy=0.9)
    assert search.tune_prefetch(best) is best and not runner.measured
    assert search.tune_prefetch(dataclasses.replace(best, wait_share=0.5)).prefetch_factor > 2 and runner.measured


def test_a_step_that_ties_brackets_the_peak_and_the_climb_halves_the_bracket():
    # mostly idle workers (the climb doubles them): the rate peaks at 48 workers, and 32 and 64 read the same
    def rate(workers, prefetch, pin):
        return 10.0 * workers if workers <= 48 else 480.0 - 10.0 * (workers - 48)

    runner = FakeRunner(rate)
    search = _search_with(runner)
    best = search.climb_workers(runner.measure(1, 2, False))
    assert best.num_workers == 48 and search.compare.stop_reason == "gain"
    assert max(workers for workers, _, _ in runner.measured) == 64  # nothing past the bracket's top
    assert [workers for workers, _, _ in runner.measured][-2:] == [48, 56]  # the middle, then the upper half's
    # the peak at 56: the bracket is halved twice (48, then 56), and once more above it (60)
    runner = FakeRunner(lambda workers, prefetch, pin: 10.0 * workers if workers <= 56 else 560 - 30.0 * (workers - 56))
    best = _search_with(runner).climb_workers(runner.measure(1, 2, False))
    assert best.num_workers == 56 and [workers for workers, _, _ in runner.measured][-3:] == [64, 48, 56]
    assert (60, 2, False) not in runner.measured  # 56 -> 64 lost, but is less than a step (68): not halved
    # no middle past a bound the step's own trial set (here: 40 workers), nor one cut short
    capped = FakeRunner(rate)
    capped.worker_bounds = lambda prefetch, pin: {"memory": 40} if (64, 2, False) in capped.trials else {}
    best = _search_with(capped).climb_workers(capped.measure(1, 2, False))
    assert best.num_workers == 32 and (48, 2, False) not in capped.measured

    # a middle faster by the noise but not beyond the two trials' error is measured again, and kept still so
    def unsure_rate(w, p, pin):
        return 333.0 if w == 48 else min(10.0 * w, 320.0)

    # (the hand-over sending by file name reads half: not a tie, so not measured again)
    unsure = FakeRunner(unsure_rate, sharing_rate=lambda *config: 0.5 * unsure_rate(*config))
    best = _search_with(unsure).climb_workers(unsure.measure(1, 2, False))
    assert best.num_workers == 48 and best.measurements == 2 and unsure.remeasured == [(48, 2, False)]
    # a step that lost, one step above the best (15 -> 18, capped by a bound): the middle is tried all the same,
    # but not the next (16 -> 18 is less than a step)
    rates = {15: 36.0, 16: 40.0, 18: 28.0}
    lost = FakeRunner(lambda w, p, pin: rates.get(w, 10.0), bounds={"memory": 18}, busy=0.9)
    best = _search_with(lost).climb_workers(lost.measure(15, 2, False))
    assert best.num_workers == 16 and [w for w, _, _ in lost.measured] == [15, 18, 16]  # not 17: within one step
    # the budget ran out with the first middle: the next is not measured, and the stop says the budget, not the gain
    spent = FakeRunner(rate)
    measure_spent = spent.measure

    def measure_until_48(workers, prefetch, pin, against=None):
        trial = measure_spent(workers, prefetch, pin)
        spent.remaining = 0.0 if workers == 48 else spent.remaining
        return trial

    spent.measure = measure_until_48
    search = _search_with(spent)
    assert search.climb_workers(spent.measure(1, 2, False)).num_workers == 48 and (56, 2, False) not in spent.trials
    assert (
        search.compare.stop_reason == "time budget"
        and "before 56 workers, between 48 (best) and 64" in search.compare.stop_detail
    )
    rough = FakeRunner(rate)
    measure = rough.measure
    rough.measure = lambda w, p, pin, against=None: dataclasses.replace(measure(w, p, pin), rough=w == 48)
    assert _search_with(rough).climb_workers(rough.measure(1, 2, False)).num_workers == 32
    flat = FakeRunner(lambda workers, prefetch, pin: min(10.0 * workers, 320.0))  # flat past 32: 48 ties too
    best = _search_with(flat).climb_workers(flat.measure(1, 2, False))
    assert best.num_workers == 32 and [workers for workers, _, _ in flat.measured][-2:] == [64, 48]


def test_climb_stops_at_the_smallest_bound_and_names_it():
    runner = FakeRunner(lambda workers, prefetch, pin: 50.0 * workers, bounds={"file descriptors": 24, "dataset": 99})
    search = _search_with(runner)
    best = search.climb_workers(runner.measure(1, 2, False))
    assert best.num_workers == 24 and max(config[0] for config in runner.measured) == 24
    assert search.compare.stop_reason == "file descriptors" and "24 workers" in search.compare.stop_detail


def test_cpu_bound_loader_climbs_down_when_fewer_workers_are_as_fast():
    # 2 CPUs: 8 workers share them (each busy 25% of its time, 10 ms of CPU per batch), 2 make as much
    runner = FakeRunner(lambda workers, prefetch, pin: min(100.0 * workers, 200.0), busy=0.25)
    search = _search_with(runner, min_workers=0)
    best = search.climb_workers(runner.measure(8, 2, False))
    assert best.num_workers == 2 and search.compare.stop_reason == "fewer"


def test_a_slow_trial_at_the_end_of_the_climb_is_measured_again_before_it_stops_the_search():
    seen = set()

    def rate(workers, prefetch, pin):
        if workers == 8 and workers not in seen:  # start-up artefact: measured once at 2.5 batches/s
            seen.add(workers)
            return 2.5
        return 50.0 * min(workers, 16)

    runner = FakeRunner(rate)
    best = _search_with(runner).climb_workers(runner.measure(4, 2, False))
    assert (8, 2, False) in runner.remeasured and best.num_workers == 16

    # a loss of 12% is taken as measured (more workers contend): not repeated, the middle is measured instead
    def contended(workers, prefetch, pin):
        return 50.0 * workers if workers <= 16 else 800 - 6.25 * (workers - 16)

    runner = FakeRunner(contended, sharing_rate=lambda *config: 0.5 * contended(*config))  # no hand-over tie
    best = _search_with(runner).climb_workers(runner.measure(4, 2, False))
    assert best.num_workers == 16 and not runner.remeasured and runner.measured[-2:] == [(32, 2, False), (24, 2, False)]


def test_outliers_against_their_neighbours_are_repeated():
    rates = {1: 50.0, 2: 100.0, 4: 30.0, 8: 400.0, 16: 420.0}
    runner = FakeRunner(lambda workers, prefetch, pin: rates[workers])
    for workers in rates:
        runner.measure(workers, 2, False)
    from lightning_dataperf.autotune.runner import repeat_outliers

    repeat_outliers(runner)
    assert runner.remeasured == [(4, 2, False)]


def test_steady_rate_excludes_start_up_and_the_first_round():
    # 4 workers: start-up ends at t=5 s, the first round arrives at once, then one round of 4 every 0.1 s.
    arrivals = [5.0, 5.0001, 5.0002, 5.0003]
    for round_index in range(1, 6):
        arrivals += [5.0003 + 0.1 * round_index + 0.0001 * k for k in range(4)]
    rate, error, counted = steady_rate(arrivals, 4)
    assert rate == pytest.approx(40.0, rel=0.01) and counted == 20 and error < 0.01
    assert steady_rate(arrivals[:5], 4)[2] == 0  # not one whole round yet: no rate


def test_made_rate_does_not_count_a_deep_queue_made_before_the_window():
    from lightning_dataperf.autotune.trial import made_rate

    # 4 workers x prefetch 8: 32 batches in flight. Start-up ends at t=1 with 32 batches made (skipped);
    # the window starts at t=1; 30 more were made before it (t=0.9) and arrive at once, then the workers
    # make one batch every 20 ms (50 batches/s), each arriving as it is made
    skip, in_flight = 31, 32
    arrivals = [1.0 + 1e-4 * k for k in range(skip + 1)]
    made_at = [0.9] * 30
    arrivals += [1.01 + 1e-4 * k for k in range(30)]
    for k in range(1, 201):
        made_at.append(1.02 + 0.02 * k)
        arrivals.append(1.02 + 0.02 * k + 1e-3)
    burst = steady_rate(arrivals, 4, skip)[0]
    made = made_rate(made_at, arrivals, skip, in_flight)
    assert made == pytest.approx(50.0, rel=0.05)  # what the workers make
    assert burst > 1.1 * made  # the arrivals' rate counts the 30 made before the window
    # every batch made before the window's end was received: the end is in_flight arrivals before the last
    assert made_rate(made_at, arrivals[:-in_flight], skip, in_flight) == pytest.approx(50.0, rel=0.05)
    # too short a window (fewer than MIN_STEADY_BATCHES made inside it): no figure
    assert made_rate(made_at[:40], arrivals[: skip + 1 + 40], skip, in_flight) is None
    assert made_rate([], arrivals[: skip + 2], skip, in_flight) is None


def test_a_trial_is_never_faster_than_its_workers_can_make_batches():
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    # each batch of 4 waits >= 4 x 2 ms in its worker: 3 workers make at most 375 batches/s, however deep the
    # queue they filled during start-up (a loaded machine only makes them slower)
    limits = Limits(60.0, 200, 0.03, 0.5, None, 0, trial_seconds=2.0)
    runner = TrialRunner(SlowSamples(20000), 4, {}, fake_hardware(usable_cpus=2), TransferPath(), limits)
    runner.learn_batch_size()
    try:
        trial = runner.run(3, 16, False)
    finally:
        runner.close()
    assert 0 < trial.batches_per_sec <= 3 / 0.008 * 1.05, trial


def test_the_search_freezes_what_exists_even_under_a_freeze_made_earlier():
    import gc

    from lightning_dataperf.autotune.measures import gc_frozen

    if gc.get_freeze_count():
        pytest.skip("something in this process froze objects already")

    class Cycle:
        def __init__(self):
            self.me = self

    try:
        gc.freeze()  # a training script's own freeze before forking its workers
        made_after = [[index] for index in range(1000)]  # imported or built since: not frozen
        garbage = weakref.ref(Cycle())  # cyclic garbage made since, not yet collected
        before = gc.get_freeze_count()
        with gc_frozen():
            # the objects made since the earlier freeze are frozen too: a collection after a trial skips them
            assert gc.get_freeze_count() >= before + len(made_after)
            assert garbage() is None  # collected first, not frozen for good
        assert gc.get_freeze_count() >= before + len(made_after)  # the freeze in place stays
    finally:
        gc.unfreeze()
    with gc_frozen():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0  # a freeze of its own is undone at exit


class ThreadsSeen(torch.utils.data.Dataset):
    def __init__(self):
        self.seen = []

    def __len__(self):
        return 64

    def __getitem__(self, index):
        self.seen.append(torch.get_num_threads())
        return torch.zeros(2)


def test_the_batch_loaded_in_this_process_uses_no_more_threads_than_the_ranks_cpus():
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    # a thread count from the whole machine (an affinity set after start-up, a CPU quota): the one batch autotune
    # loads in this process runs on the rank's CPUs, and the process's own count is left as it was
    before = torch.get_num_threads()
    dataset = ThreadsSeen()
    torch.set_num_threads(3)
    try:
        limits = Limits(10.0, 100, 0.03, 0.5, None, 0)
        TrialRunner(dataset, 4, {}, fake_hardware(usable_cpus=1), TransferPath(), limits).learn_batch_size()
        assert dataset.seen == [1] * 4
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


class SlowStart(SleepingLoaderDataset):
    def __getitem__(self, index):
        threading.Event().wait(0.005)
        return super().__getitem__(index)


def _slow_worker_start(worker_id):
    threading.Event().wait(1.0)


def test_worker_start_up_is_reported_apart_and_not_ranked_on():
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    limits = Limits(20.0, 400, 0.03, 0.5, None, 1, trial_seconds=10.0)
    runner = TrialRunner(
        SlowStart(4000), 4, {"worker_init_fn": _slow_worker_start}, fake_hardware(), TransferPath(), limits
    )
    runner.learn_batch_size()
    trial = runner.measure(2, 2, False)
    assert trial.startup_s >= 0.95 and trial.seconds >= trial.startup_s
    # Steady: 2 workers x 4 samples x 5 ms = 100 batches/s. With the >= 1 s start-up counted it would read
    # batches / seconds; without it about batches / (seconds - start-up): at least half of it is left out,
    # however long the trial ran (a loaded machine measures longer)
    with_start_up = trial.batches / trial.seconds
    assert trial.batches_per_sec > 30.0
    assert trial.batches_per_sec > with_start_up / (1 - 0.5 * trial.startup_s / trial.seconds)


def test_real_io_loader_goes_past_twice_the_cpus_and_stops_at_the_shm_bound(tmp_path):
    # Latency, almost no CPU: 10 ms per sample, 1 KB samples, so 11 workers (80 ms per batch each: ~140
    # batches/s) need ~0.2 of one core even when the machine is loaded. With 64 KB samples and 5 ms the
    # workers' and the main thread's share-memory hand-over took the core a loaded VM leaves (measured
    # with the test pinned to one core: 4 and 11 workers both ~58 batches/s), so stopping at 4 was right.
    class Latency(SleepingLoaderDataset):
        def __getitem__(self, index):
            threading.Event().wait(0.010)
            return torch.zeros(256)  # 1 KB per sample, 8 KB per batch of 8

    # /dev/shm for 24 batches at 50%: (24 - 2) // prefetch 2 = 11 workers
    small = fake_hardware(
        logical_cpus=2, physical_cpus=2, usable_cpus=2, shm_free_mb=0.375, ram_available_mb=32_000, accelerator="cpu"
    )
    result = autotune_loader(
        Latency(4000), 8, hardware=small, time_budget=20.0, cache_path=tmp_path / "c.json", progress=False
    )
    assert result.settings.num_workers > 4, result.format()
    assert result.stop_reason in {"/dev/shm", "gain"}, result.format()
    assert result.bounds["/dev/shm"] == 11 and result.stop_detail
    assert str(result.settings.num_workers) in result.summary_line()


def test_cpu_share_bound_reads_the_busy_share_at_the_most_workers():
    # Measured on 2 cores (the I/O-latency loader): one worker busy 10% of its time, 41 workers 3% each
    # (queues full, waiting on the main thread). The busiest share bounded the climb at 42 workers where the
    # grid's best had 64; the share at the most workers is what more workers would each use.
    resources = Resources(fake_hardware(usable_cpus=2, logical_cpus=2, physical_cpus=2), 0.5)
    latency = [
        Trial(1, 2, False, 11.4, batches=40, worker_busy=0.10),
        Trial(41, 2, False, 280.6, batches=400, worker_busy=0.03),
    ]
    assert resources.worker_bounds(2, False, latency)["CPU share"] == 133  # 2 x 2 CPUs / 3%
    # a refused trial measured nothing (counted, its 50% at 64 workers would give 8); under 2% counts as 2%
    idle = [
        Trial(1, 2, False, 9.0, batches=9, worker_busy=0.01),
        Trial(8, 2, False, 70.0, batches=90, worker_busy=0.01),
    ]
    idle.append(Trial(64, 2, False, refused="needs too much memory", worker_busy=0.5))
    assert resources.worker_bounds(2, False, idle)["CPU share"] == 200


def test_cpu_share_bound_still_binds_cpu_bound_workers():
    # CPU-bound workers on 2 CPUs: each one's share falls as they outnumber the CPUs (together 1.9, 2.0, 2.0
    # CPUs), so the share at the most workers would allow twice as many again at every step; once their CPU
    # stopped growing the busiest share is read: twice the CPUs
    resources = Resources(fake_hardware(usable_cpus=2, logical_cpus=2, physical_cpus=2), 0.5)
    saturated = [
        Trial(workers, 2, False, 20.0, batches=40, worker_busy=busy)
        for workers, busy in ((2, 0.95), (4, 0.5), (8, 0.25))
    ]
    assert resources.worker_bounds(2, False, saturated)["CPU share"] == 4  # 2 x 2 / 95%, not 2 x 2 / 25% = 16
    # measured on 2 cores (the CPU-heavy loader, session 11): 1 worker 100% busy, 3 workers 63%, 4 workers 47%
    heavy = [
        Trial(1, 2, False, 10.6, batches=40, worker_busy=1.0),
        Trial(3, 2, False, 20.6, batches=40, worker_busy=0.63),
    ]
    heavy.append(Trial(4, 2, False, 20.7, batches=40, worker_busy=0.47))
    assert resources.worker_bounds(2, False, heavy)["CPU share"] == 4
    # still growing (1 -> 3 workers: 1.0 -> 1.9 CPUs): the share at the most workers
    assert resources.worker_bounds(2, False, heavy[:2])["CPU share"] == 6  # 2 x 2 / 63%


def test_unwritable_cache_warns_once_naming_the_path(tmp_path):
    blocker = tmp_path / "not_a_directory"
    blocker.write_text("x")
    cache = blocker / "cache.json"
    with pytest.warns(UserWarning, match="cannot (read|write) its cache") as caught:
        for _ in range(2):
            autotune_loader(SleepingLoaderDataset(256), 16, time_budget=0.5, cache_path=cache, progress=False)
    messages = [str(warning.message) for warning in caught if "its cache" in str(warning.message)]
    assert len(messages) == 1 and str(cache) in messages[0]


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
        datamodule = IndexData(
            length=64, seed=3, autotune=True, autotune_options=dict(time_budget=1.0, **options), verbose=False
        )
        kwargs = dict(trainer_kwargs(tmp_path), enable_progress_bar=False)
        pl.Trainer(max_epochs=1, logger=False, **kwargs).fit(RecordingModel(), datamodule=datamodule)
        captured = capsys.readouterr()
        return captured.out + captured.err, datamodule.autotune_result

    shown, result = fit(force=True)
    assert "DataPerf autotune: trial 1/~" in shown and result.transfer == "host"
    assert result.elapsed_s > 0 and result.ended_at > 0
    silent, _ = fit(force=True, progress=False)
    assert "DataPerf autotune" not in silent


def test_pinning_and_cache_key_follow_the_transfer_path():
    from lightning_dataperf.autotune.cache import cache_key
    from lightning_dataperf.autotune.consumer import TransferPath

    cuda = torch.device("cuda", 0)
    assert TransferPath(device=cuda, side_stream=True).pin_choices() == (True,)
    assert TransferPath(device=cuda).pin_choices() == (True, False)
    assert TransferPath().pin_choices() == (False,)
    hardware, dataset = fake_hardware(), SleepingLoaderDataset(64)
    keys = {
        cache_key(hardware, dataset, 8, {}, path.describe())
        for path in (
            TransferPath(device=cuda),
            TransferPath(device=cuda, side_stream=True),
            TransferPath(device=cuda, side_stream=True, device_transform=torch.nn.functional.relu),
            TransferPath(device=cuda, step_seconds=0.01),
        )
    }
    assert len(keys) == 4

    class WithTransform(SleepingLoaderDataset):
        def __init__(self, length, transform):
            super().__init__(length)
            self.transform = transform

    assert cache_key(hardware, WithTransform(64, abs), 8, {}, "x") != cache_key(
        hardware, WithTransform(64, round), 8, {}, "x"
    )
    assert cache_key(hardware, dataset, 8, {}, "x") != cache_key(fake_hardware(usable_cpus=4), dataset, 8, {}, "x")


def test_a_busy_step_bounds_the_rate_on_the_host():
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    limits = Limits(10.0, 60, 0.03, 0.5, None, 0, trial_seconds=2.0)
    path = TransferPath(step_seconds=0.02)  # 20 ms of main-thread work per batch: at most 50 batches/s
    runner = TrialRunner(SleepingLoaderDataset(4000), 4, {}, fake_hardware(), path, limits)
    runner.learn_batch_size()
    assert 0 < runner.measure(0, None, False).batches_per_sec <= 50.0 * 1.02


def test_a_bound_read_from_the_best_trial_itself_is_said_as_such():
    # 2-core VM, I/O-latency loader: 77 workers measured fastest, and their CPU time together had not grown
    # over 52's, so the CPU-share bound read from them fell to 67, below the best measured
    runner = FakeRunner(lambda workers, prefetch, pin: 10.0 * workers, bounds={"CPU share": 67, "memory": 1081})
    search = _search_with(runner)
    best = search.climb_workers(runner.measure(52, 2, False))
    assert best.num_workers == 67 and search.compare.stop_reason == "CPU share"
    assert search.compare.stop_detail.endswith("(CPU share 67, memory 1081)")  # the climb reached the bound itself
    search = _search_with(runner)
    runner.measure(77, 2, False)
    best = search.climb_workers(runner.trials[(77, 2, False)])
    assert best.num_workers == 77 and search.compare.stop_detail.endswith("; 77 were measured before it")


def test_summary_line_quotes_the_measurement_and_the_stop():
    result = AutotuneResult(
        settings=__import__("lightning_dataperf").LoaderSettings(16, True, True, 2),
        trials=(Trial(16, 2, True, 29.8, 0.4, 100, 64.0), Trial(24, 2, True, 29.5, 0.6, 100, 96.0)),
        search_seconds=12.0,
        baseline_batches_per_sec=28.0,
        best_batches_per_sec=29.8,
        chosen_batches_per_sec=29.77,
        batch_size=128,
        stop_reason="gain",
        stop_detail="more gave nothing (24 workers: -1%)",
        bounds={"CPU share": 17},
    )
    assert result.summary_line() == (
        "autotune measured 16 workers (prefetch 2, pinned) at 3,811 samples/s; more gave nothing (24 workers: -1%)"
    )
    assert AutotuneResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result
    assert "stopped: more gave nothing" in result.format()
    cached = dataclasses.replace(result, cached=True).summary_line()
    assert cached.startswith("autotune (in an earlier run, from the cache) measured 16 workers")


def test_the_verdict_learns_the_most_autotune_measured_above_its_pick():
    from lightning_dataperf.callback.run_evidence import more_workers_measured
    from lightning_dataperf.diagnosis.evidence import MoreWorkersMeasured

    result = AutotuneResult(
        settings=__import__("lightning_dataperf").LoaderSettings(10, True, False, 2),
        trials=(
            Trial(10, 2, False, 180.0, 0.2, 100, 10.0),
            Trial(16, 2, False, 156.6, 0.3, 100, 16.0),  # -13%
            Trial(20, 2, False, 99.0, 0.4, 100, 20.0),
            Trial(64, 2, False, refused="needs ~9000 MB"),
            Trial(4, 2, False, 110.3, 0.1, 100, 4.0),
        ),
        search_seconds=2.6,
        baseline_batches_per_sec=60.0,
        best_batches_per_sec=180.0,
        chosen_batches_per_sec=180.0,
    )
    assert more_workers_measured(result) == MoreWorkersMeasured(10, 16, pytest.approx(-0.13))
    assert more_workers_measured(dataclasses.replace(result, trials=result.trials[::3])) is None  # none rated above
    assert more_workers_measured(None) is None


def test_trials_take_the_strategys_path_side_stream_pinned_only():
    from types import SimpleNamespace

    from lightning_dataperf.datamodule.tuning import transfer_path_of
    from lightning_dataperf.transfer.strategies import SideStreamTransferMixin

    class FakeSideStream(SideStreamTransferMixin):
        root_device = torch.device("cuda", 0)
        side_stream_active = True

    def transform(batch):
        return batch

    strategy = FakeSideStream.__new__(FakeSideStream)
    strategy.pin, strategy.min_bytes, strategy.device_transform = True, 1024, transform
    path = transfer_path_of(SimpleNamespace(strategy=strategy), {"step_seconds": 0.011})
    assert path.side_stream and path.pin_choices() == (True,) and path.min_bytes == 1024
    assert path.device_transform is transform and path.step_seconds == 0.011
    stock = SimpleNamespace(root_device=torch.device("cuda", 0))
    assert transfer_path_of(SimpleNamespace(strategy=stock), {}).pin_choices() == (True, False)
    host = SimpleNamespace(root_device=torch.device("cpu"))
    assert transfer_path_of(SimpleNamespace(strategy=host), {}).describe() == "host"


def test_first_epoch_start_up_excludes_the_search_and_the_verdict_quotes_it(tmp_path, monkeypatch):
    from lightning_dataperf import DataPerfCallback

    monkeypatch.setenv("LIGHTNING_DATAPERF_CACHE", str(tmp_path / "cache.json"))
    # precision no trial reaches, no batch cap, and enough samples that no trial's slice of the dataset runs
    # out: trials end at their time cap or once decided, so the search takes long enough (about its 2.5 s
    # budget) to tell apart from the start-up (256 samples let trials end on their data, searches of 0.8 s)
    options = dict(time_budget=2.5, batch_budget=100_000, precision=1e-4, progress=False, force=True)
    datamodule = IndexData(length=16_384, seed=3, autotune=True, autotune_options=options, verbose=False)
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


def test_cost_model_predicts_the_worker_count_instead_of_doubling():
    from lightning_dataperf.autotune.model import MAX_JUMP, next_workers

    latency = Trial(4, 2, False, 50.0, batches=40, work_s=0.08, cpu_s=0.001, main_s=0.002, wait_share=0.9)
    assert next_workers(latency, limit=1000, cpus=2) == 4 * MAX_JUMP  # 500 batches/s x 80 ms: capped jump
    assert next_workers(latency, limit=10, cpus=2) == 10  # never past the bound
    near = Trial(10, 2, False, 100.0, batches=40, work_s=0.08, cpu_s=0.001, main_s=0.002, wait_share=0.9)
    assert next_workers(near, limit=11, cpus=2) == 11  # the 20% floor (12) is not allowed past the bound either
    # CPU-bound workers: 0.3 s of CPU per batch on 16 CPUs, the main thread busy 60%: ~51 batches/s at most,
    # x 0.3 s per batch x 1.15 headroom = 17.7 -> 18 workers (the old x1.5 step would have tried 15)
    compute = Trial(10, 2, True, 30.0, batches=60, work_s=0.3, cpu_s=0.3, main_s=0.009, wait_share=0.4)
    assert next_workers(compute, limit=100, cpus=16) == 18
    assert next_workers(Trial(4, 2, False, 50.0, worker_busy=0.9), limit=100) == 6  # no in-loader timing: x1.5


def test_a_start_the_training_path_limits_does_not_climb():
    runner = FakeRunner(lambda workers, prefetch, pin: 100.0)
    runner.trials[(8, 2, False)] = Trial(8, 2, False, 100.0, batches=40, work_s=0.02, main_s=0.01, wait_share=0.01)
    search = _search_with(runner, min_workers=1)
    best = search.climb_workers(runner.trials[(8, 2, False)])
    assert search.compare.stop_reason == "path" and "training path is the limit" in search.compare.stop_detail
    assert all(config[0] <= 8 for config in runner.measured)  # never more workers
    assert best.num_workers == 3  # 100 batches/s x 20 ms x 1.15 = 2.3 -> 3 workers, as fast


def test_a_repeat_of_the_last_trial_reuses_its_workers(tmp_path):
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    limits = Limits(30.0, 200, 0.03, 0.5, None, 1, trial_seconds=3.0)
    runner = TrialRunner(
        SlowStart(4000), 4, {"worker_init_fn": _slow_worker_start}, fake_hardware(), TransferPath(), limits
    )
    runner.learn_batch_size()
    first = runner.measure(2, 2, False)
    again = runner.run(2, 2, False)  # the same configuration next: its workers are still alive
    assert again.startup_s == -1.0 and again.batches_per_sec > 30.0  # no start-up paid, steady rate measured
    merged = runner.remeasure(first)
    assert merged.measurements == 2 and merged.startup_s == first.startup_s >= 0.95
    runner.close()
    fresh = runner.run(2, 2, False)
    runner.close()
    assert fresh.startup_s >= 0.95 and again.work_s is not None and again.wait_share is not None


def test_after_a_gaining_climb_zero_workers_are_tried_when_the_main_thread_limits():
    # tiny batches + 2 ms of host work per step on 2 cores: 1 -> 2 workers gains, 3 loses, and loading in
    # the main thread (no hand-over, no workers competing for the 2 cores) is fastest
    rates = {0: 300.0, 1: 125.0, 2: 185.0, 3: 125.0}
    runner = FakeRunner(lambda workers, prefetch, pin: rates[workers], busy=0.3)
    runner.timing = {workers: (0.001, 0.003) for workers in (1, 2, 3)}  # 1 / (3 ms + 1 ms) = 250 batches/s
    search = _search_with(runner, min_workers=0)
    start = runner.measure(1, 2, False)
    best = search.probe_fewer(search.climb_workers(start), start)
    assert best.num_workers == 0 and (0, None, False) in runner.measured
    assert "main thread limits" in search.compare.stop_detail
    from lightning_dataperf.autotune.choice import choose

    assert choose(search.compare, start, 0.02).num_workers == 0


def test_zero_workers_are_not_tried_when_the_model_says_the_main_thread_cannot_keep_up():
    rates = {1: 10.0, 2: 19.0, 3: 27.0, 4: 27.0}
    runner = FakeRunner(lambda workers, prefetch, pin: rates.get(workers, 27.0), busy=0.9)
    runner.timing = {workers: (0.1, 0.004) for workers in rates}  # the main thread alone: < 10 batches/s
    search = _search_with(runner, min_workers=0)
    start = runner.measure(1, 2, False)
    search.probe_fewer(search.climb_workers(start), start)
    assert all(config[0] > 0 for config in runner.measured)


def test_no_fewer_workers_are_tried_after_a_first_step_up_that_gained():
    # the H200 side-stream shape: 15 -> 18 workers gains 8% (beyond the 3% noise), 22 gains nothing; the rate
    # was still rising at 15, so 7 workers (what a loader-capacity model might suggest) would only lose
    rates = {15: 36.0, 18: 39.0, 22: 39.2}
    runner = FakeRunner(lambda workers, prefetch, pin: rates.get(workers, 2.4 * workers), busy=0.45)
    runner.timing = {workers: (0.2, 0.025) for workers in rates}  # the main thread takes 40 batches/s at most
    search = _search_with(runner, min_workers=1)
    start = runner.measure(15, 2, False)
    best = search.probe_fewer(search.climb_workers(start), start)
    assert best.num_workers == 18 and search.compare.stop_reason == "gain"
    assert all(config[0] >= 15 for config in runner.measured), runner.measured


def test_fewer_workers_than_the_cpu_a_batch_costs_allows_are_not_tried():
    from lightning_dataperf.autotune.model import CONTENTION_SLACK, fewer_capacity

    # the H200 side-stream row: 15 workers busy 98% (CPU from the OS) at 34.8 batches/s; 7 measured 17.2
    busy = Trial(15, 2, True, 34.8, batches=100, worker_busy=0.98)
    assert fewer_capacity(busy, 7) == pytest.approx(7 * 34.8 / (0.98 * 15) / (1 - CONTENTION_SLACK))
    assert 17.2 < fewer_capacity(busy, 7) < 0.9 * 34.8  # above what 7 made, below a tie with 15
    assert math.isinf(fewer_capacity(Trial(15, 2, True, 34.8, batches=100), 7))  # busy unknown: try

    # a step up within noise: the climb would go down, but 7 workers cannot make 15's rate: no trial
    def rate(workers, prefetch, pin):
        return 36.0 if workers == 15 else 36.5 if workers > 15 else 2.3 * workers

    runner = FakeRunner(rate, busy=0.98)
    search = _search_with(runner, min_workers=1)
    start = runner.measure(15, 2, False)
    best = search.probe_fewer(search.climb_workers(start), start)
    # (18: halfway, and a step above 15 itself, tried where 22 tied)
    assert best.num_workers == 15 and runner.measured == [(15, 2, False), (22, 2, False), (18, 2, False)]
    assert "7 workers cannot be as fast" in search.compare.stop_detail
    # mostly idle workers (a latency loader) could be over-provisioned: fewer are measured
    runner = FakeRunner(lambda workers, prefetch, pin: 36.0, busy=0.05)
    search = _search_with(runner, min_workers=1)
    search.climb_workers(runner.measure(15, 2, False))
    assert (7, 2, False) in runner.measured and search.compare.stop_reason == "fewer"


def test_the_policys_pinning_is_kept_on_a_tie_and_changed_only_when_the_other_is_faster():
    from lightning_dataperf.autotune.choice import choose

    # the H200 pick check: 15 workers pinned (the policy) 38.2 batches/s, unpinned 37.6: a tie, which does not
    # take the policy's pinning away (unpinned re-measured 14% slower there)
    rates = {True: 38.2, False: 37.6}
    runner = FakeRunner(lambda workers, prefetch, pin: rates[pin])
    search = _search_with(runner)
    policy = runner.measure(15, 2, True)
    runner.measure(15, 2, False)
    assert choose(search.compare, policy, 0.02).config == (15, 2, True)
    # faster beyond noise (session 9's call: +21% unpinned): the other pinning wins
    rates[False] = 46.2
    runner = FakeRunner(lambda workers, prefetch, pin: rates[pin])
    search = _search_with(runner)
    policy = runner.measure(15, 2, True)
    runner.measure(15, 2, False)
    assert choose(search.compare, policy, 0.02).config == (15, 2, False)
    # a tie with fewer workers still goes to the cheaper setting, pinning and all
    runner = FakeRunner(lambda workers, prefetch, pin: 38.0)
    search = _search_with(runner)
    policy = runner.measure(15, 2, True)
    runner.measure(12, 2, False)
    assert choose(search.compare, policy, 0.02).config == (12, 2, False)


def test_a_close_call_that_is_only_the_other_pinning_keeps_the_policys_unmeasured_where_workers_pin():
    from lightning_dataperf.autotune.choice import choose

    def chosen(workers, rates, looks=2):
        # the H200 cpu row (session 18): 5 workers pinned (the policy's pinning) read 53.9 over two looks, unpinned
        # 56.1 once (+4%, within the two trials' 5% errors)
        runner = FakeRunner(lambda w, prefetch, pin: rates[w, pin])
        search = _search_with(runner)
        policy = runner.measure(3, 2, True)
        for pin in (True, False):
            trial = runner.measure(workers, 2, pin)
            runner.trials[trial.config] = dataclasses.replace(trial, precision=0.05, measurements=looks if pin else 1)
        return choose(search.compare, policy, 0.02), runner

    rates = {(3, True): 37.2, (5, True): 53.9, (5, False): 56.1}
    pick, runner = chosen(5, rates)
    assert pick.config == (5, 2, True) and runner.remeasured == []  # not re-measured, not raced
    pick, runner = chosen(5, rates, looks=1)  # one look each: not raced either
    assert pick.config == (5, 2, True) and runner.remeasured == []
    # faster beyond noise, the other pinning is taken as before
    pick, runner = chosen(5, {**rates, (5, False): 70.0})
    assert pick.config == (5, 2, False) and runner.remeasured == []
    # without workers the main thread pins each batch: the same call is measured again, and the means decide
    zero = {(3, True): 37.2, (0, True): 53.9, (0, False): 56.1}
    pick, runner = chosen(0, zero)
    assert (0, None, False) in runner.remeasured and (0, None, True) in runner.remeasured
    assert pick.config == (0, None, False)


def test_a_rough_trial_is_neither_ranked_nor_taken():
    import io

    from lightning_dataperf.autotune.choice import choose
    from lightning_dataperf.autotune.progress import LogProgress
    from lightning_dataperf.autotune.trial import rated

    # replayed from the 2-core io row: 52 workers at prefetch 2 made 438 batches/s; at prefetch 4 the budget ran
    # out before one steady round and the 8 batches of the start-up burst read 1,950/s
    runner = FakeRunner(lambda workers, prefetch, pin: 438.0)
    search = _search_with(runner)
    best = runner.measure(52, 2, False)
    burst = Trial(52, 4, False, 1949.6, batches=8, rough=True)
    runner.trials[burst.config] = burst
    assert not search.compare.better(burst, best) and not search.compare.as_fast(burst, best)
    assert rated([best, burst]) == [best]
    assert choose(search.compare, best, 0.02).config == (52, 2, False)
    log = io.StringIO()
    LogProgress(log).finished(burst)
    assert "1949.6 batches/s rough (cut before one steady round: not ranked)" in log.getvalue()
    result = AutotuneResult(
        settings=__import__("lightning_dataperf").recommend_loader_settings(fake_hardware()),
        trials=(best, burst), search_seconds=1.0,
        baseline_batches_per_sec=438.0, best_batches_per_sec=438.0, chosen_batches_per_sec=438.0,
    )  # fmt: skip
    assert "1950 rough" in result.format()
    # the floor itself rough, no budget left to look again: a steady trial is taken over its burst
    runner = FakeRunner(lambda workers, prefetch, pin: 438.0)
    runner.remaining = 0.0
    search = _search_with(runner)
    floor = Trial(52, 2, False, 1949.6, batches=8, rough=True)
    runner.trials[floor.config] = floor
    runner.measure(26, 2, False)
    assert choose(search.compare, floor, 0.02).config == (26, 2, False)
    # only the rough floor: it is the answer, and says it is rough
    lone = dataclasses.replace(result, trials=(burst,), settings=dataclasses.replace(result.settings, num_workers=52,
                               prefetch_factor=4, pin_memory=False))  # fmt: skip
    assert "(rough: cut before one steady round)" in lone.summary_line()


class RoughAbove(FakeRunner):
    """A dataset that runs out before one steady round of more than 8 workers."""

    def measure(self, workers, prefetch, pin, against=None):
        trial = super().measure(workers, prefetch, pin, against)
        if workers > 8 and not trial.rough:
            trial = self.trials[trial.config] = dataclasses.replace(trial, batches=6, rough=True)
        return trial

    def remeasure(self, trial, cap_scale=1.0, against=None):
        if trial.rough:  # as TrialRunner: a repeat cut before one steady round measures nothing (the trial itself)
            self.remeasured.append(trial.config)
            return trial
        return super().remeasure(trial, cap_scale, against)


def test_a_rough_step_up_ends_the_climb_without_a_figure():
    runner = RoughAbove(lambda workers, prefetch, pin: 50.0 * workers)
    search = _search_with(runner)
    best = search.climb_workers(runner.measure(1, 2, False))
    assert best.num_workers <= 8 and not best.rough
    assert (
        search.compare.stop_reason == "cut short"
        and "cut before one steady round (not ranked)" in search.compare.stop_detail
    )
    assert "%" not in search.compare.stop_detail  # no gain or loss quoted from a burst


def test_the_policys_pick_is_the_floor_and_ties_go_to_fewer_workers():
    from lightning_dataperf.autotune.choice import choose

    # within noise (3%) of each other: the policy's 2 workers stay, although 6 measured 2% faster
    runner = FakeRunner(lambda workers, prefetch, pin: {2: 100.0, 6: 102.0}[workers])
    search = _search_with(runner)
    policy = runner.measure(2, 2, False)
    runner.measure(6, 2, False)
    assert choose(search.compare, policy, 0.02).num_workers == 2
    # a configuration faster beyond noise replaces it
    runner = FakeRunner(lambda workers, prefetch, pin: {2: 100.0, 6: 130.0}[workers])
    search = _search_with(runner)
    policy = runner.measure(2, 2, False)
    runner.measure(6, 2, False)
    assert choose(search.compare, policy, 0.02).num_workers == 6
    # a cheaper one as fast replaces it too (ties go to fewer workers)
    runner = FakeRunner(lambda workers, prefetch, pin: {1: 100.0, 2: 101.0}[workers])
    search = _search_with(runner)
    policy = runner.measure(2, 2, False)
    runner.measure(1, 2, False)
    assert choose(search.compare, policy, 0.02).num_workers == 1


def test_a_close_call_is_measured_again_longer_and_interleaved():
    from lightning_dataperf.autotune.choice import REFINE_ROUNDS, choose

    runner = FakeRunner(lambda workers, prefetch, pin: {4: 100.0, 8: 97.5}[workers])
    search = _search_with(runner)
    policy = runner.measure(4, 2, False)
    cheaper = runner.measure(8, 2, False)
    # 8 workers are not cheaper: make the cheap one the slower one by swapping which is the policy
    runner.trials[(8, 2, False)] = dataclasses.replace(cheaper, batches_per_sec=100.0)
    runner.trials[(4, 2, False)] = dataclasses.replace(policy, batches_per_sec=97.5)
    runner.rate = lambda workers, prefetch, pin: {4: 97.5, 8: 100.0}[workers]
    chosen = choose(search.compare, runner.trials[(4, 2, False)], 0.02)
    assert runner.remeasured[:2] in ([(4, 2, False), (8, 2, False)], [(8, 2, False), (4, 2, False)])
    assert len(runner.remeasured) == 2 * REFINE_ROUNDS and min(runner.scales) >= 2.0
    # still within noise after the longer looks, but 2.5% apart (more than choose_within): the re-measured
    # means decide, and the policy's 4 workers, one side of the close call, are not the floor then
    assert chosen.num_workers == 8


def test_a_close_call_that_differs_only_in_the_queues_depth_goes_to_the_faster_unmeasured():
    from lightning_dataperf.autotune.choice import choose

    def measured(rates):  # trials with a 6% standard error: 10% apart is within noise
        runner = FakeRunner(lambda workers, prefetch, pin: rates[workers, prefetch])
        for config in rates:
            trial = runner.measure(*config, False)
            runner.trials[trial.config] = dataclasses.replace(trial, precision=0.06)
        return runner, _search_with(runner), runner.trials[(1, 2, False)]

    # the 2-core profile: 66 workers, prefetch 2 (511.8) against 4 (563.7), within noise; re-measuring them
    # took 9.6 s of a 28-s search, to save a little memory
    runner, search, policy = measured({(1, 2): 11.5, (66, 2): 511.8, (66, 4): 563.7})
    assert choose(search.compare, policy, 0.02).config == (66, 4, False) and runner.remeasured == []
    # fewer workers within noise are still a close call, measured again
    runner, search, policy = measured({(1, 2): 11.5, (43, 2): 511.8, (66, 4): 563.7})
    choose(search.compare, policy, 0.02)
    assert (43, 2, False) in runner.remeasured
    # the policy's pick itself the shallower queue: the faster still wins, unmeasured
    runner, search, _ = measured({(1, 2): 11.5, (66, 2): 511.8, (66, 4): 563.7})
    assert (
        choose(search.compare, runner.trials[(66, 2, False)], 0.02).config == (66, 4, False) and runner.remeasured == []
    )


def test_a_costlier_rival_one_look_cannot_order_is_raced_once():
    from lightning_dataperf.autotune.choice import choose

    # the H200 stock row (session 14): one trial each read 15 workers 41.4 and 18 workers 40.9 batches/s
    # (6% errors); ten fresh trials each put 18 at 38.0 and 15 at 35.2. Measured again, the means decide.
    looks = {15: [41.4, 35.2], 18: [40.9, 38.0], 7: [20.0]}

    def measured(rates, remaining=100.0):
        # each look the next rate listed, the last one from then on
        runner = FakeRunner(
            lambda workers, prefetch, pin: rates[workers].pop(0) if len(rates[workers]) > 1 else rates[workers][0]
        )
        for workers in rates:
            trial = runner.measure(workers, 2, True)
            runner.trials[trial.config] = dataclasses.replace(trial, precision=0.06)
        runner.remaining = remaining
        return runner, _search_with(runner), runner.trials[(15, 2, True)]

    runner, search, policy = measured({key: list(value) for key, value in looks.items()})
    assert choose(search.compare, policy, 0.02).num_workers == 18
    # one round, interleaved and twice as long; then the means decide (not the close call's further rounds)
    assert runner.remeasured in ([(15, 2, True), (18, 2, True)], [(18, 2, True), (15, 2, True)])
    assert runner.scales == [2.0, 2.0]
    # the same looks again on re-measurement: 15 stays (a tie goes to fewer workers)
    runner, search, policy = measured({15: [41.4, 41.4], 18: [40.9, 40.9]})
    assert choose(search.compare, policy, 0.02).num_workers == 15 and len(runner.remeasured) == 2
    # no time left for it: one look each, the tie goes to fewer workers
    runner, search, policy = measured({key: list(value) for key, value in looks.items()}, remaining=0.0)
    assert choose(search.compare, policy, 0.02).num_workers == 15 and runner.remeasured == []
    # a costlier one that read beyond noise below (5%) is not raced; nor one measured twice already
    runner, search, policy = measured({15: [41.4], 18: [39.3]})
    assert choose(search.compare, policy, 0.02).num_workers == 15 and runner.remeasured == []
    runner, search, policy = measured({15: [41.4], 18: [40.9]})
    runner.trials[(18, 2, True)] = dataclasses.replace(runner.trials[(18, 2, True)], measurements=2)
    assert choose(search.compare, policy, 0.02).num_workers == 15 and runner.remeasured == []


def test_a_repeat_still_ahead_within_noise_has_the_best_measured_again_too():
    # the 2-core io row (session 15): 64 workers read 697 batches/s once the default way (the grid: 551-579);
    # sent by file name they read 729, then 705 measured twice: +1% against the one high look, not kept
    def confirmed(best_looks, repeat):
        default = iter(best_looks)
        runner = FakeRunner(lambda workers, prefetch, pin: next(default), sharing_rate=lambda *config: repeat)
        search = _search_with(runner)
        best = runner.measure(64, 2, False)
        runner.trials[best.config] = best = dataclasses.replace(best, precision=0.05)
        trial = Trial(64, 2, False, 729.2, batches=20, precision=0.05, sharing="file_system")
        runner.earlier.append(trial)
        return runner, search.compare.confirmed(trial, best)

    runner, (again, faster) = confirmed([697.2, 570.0], 705.1)
    assert faster and again.batches_per_sec == 705.1
    assert runner.remeasured == [(64, 2, False), (64, 2, False)]  # the new trial, then the best
    runner, (again, faster) = confirmed([697.2, 690.0], 705.1)  # the best holds: within noise, not faster
    assert not faster and len(runner.remeasured) == 2
    runner, (again, faster) = confirmed([697.2], 680.0)  # the repeat fell behind: the best is not measured again
    assert not faster and runner.remeasured == [(64, 2, False)]


class AveragingRunner(FakeRunner):
    """Looks from a list per worker count (the last one from then on); a repeat averages as TrialRunner's does."""

    def __init__(self, looks, **options):
        self.looks = {workers: list(values) for workers, values in looks.items()}
        super().__init__(self._look, sharing_rate=lambda *config: 10.0, **options)

    def _look(self, workers, prefetch, pin):
        values = self.looks[workers]
        return values.pop(0) if len(values) > 1 else values[0]

    def remeasure(self, trial, cap_scale=1.0, against=None):
        self.remeasured.append(trial.config)
        count = trial.measurements
        mean = (trial.batches_per_sec * count + self._rate(trial.config, trial.sharing)) / (count + 1)
        again = dataclasses.replace(trial, batches_per_sec=mean, measurements=count + 1)
        self.trials[trial.config] = again
        return again


def test_the_climb_goes_on_from_the_best_as_measured_again_not_its_first_look():
    # 16 workers read 100, then 110 when 32's repeat (104, 101) stayed ahead within noise: 16 is 105 over two
    # looks. The middle, 24, read 103.5: within noise of 105, not a step up; the stop quotes 32 against 105
    looks = {16: [100.0, 110.0, 95.0], 32: [104.0, 101.0], 24: [103.5, 101.5], 28: [90.0]}
    runner = AveragingRunner({**looks, **{workers: [50.0] for workers in range(1, 16)}})
    search = _search_with(runner)
    best = search.climb_workers(runner.measure(16, 2, False))
    assert best.num_workers == 16 and (best.batches_per_sec, best.measurements) == (105.0, 2)
    assert runner.remeasured == [(32, 2, False), (16, 2, False)]  # 16 once, its two looks kept
    assert search.compare.stop_detail == "more gave nothing (32 workers: -2%)"


def test_a_close_call_the_budget_left_no_time_to_measure_again_goes_to_fewer():
    from lightning_dataperf.autotune.choice import choose

    runner = FakeRunner(lambda workers, prefetch, pin: {4: 97.5, 8: 100.0}[workers])
    search = _search_with(runner)
    policy = runner.measure(4, 2, False)
    runner.measure(8, 2, False)
    runner.remaining = 0.0
    assert choose(search.compare, policy, 0.02).num_workers == 4 and runner.remeasured == []


def test_a_close_call_takes_at_most_the_seconds_it_is_given():
    from lightning_dataperf.autotune.choice import choose

    runner = FakeRunner(lambda workers, prefetch, pin: {4: 97.5, 8: 100.0}[workers])
    search = _search_with(runner)
    policy = runner.measure(4, 2, False)
    runner.measure(8, 2, False)
    # 100 s of budget left, none of it given to the close call: nothing re-measured, the tie goes to fewer
    assert choose(search.compare, policy, 0.02, seconds=0.0).num_workers == 4 and runner.remeasured == []
    assert runner.remaining == 100.0  # the rest is given back
    assert choose(search.compare, policy, 0.02, seconds=50.0).num_workers == 8 and runner.remeasured


def test_a_close_call_the_budget_cannot_fit_at_twice_the_cap_measures_both_sides_shorter_or_neither():
    from lightning_dataperf.autotune.choice import _pair_scale, choose

    runner = FakeRunner(lambda workers, prefetch, pin: {15: 97.5, 18: 100.0}[workers])
    search = _search_with(runner)
    policy = runner.measure(15, 2, False)
    runner.measure(18, 2, False)
    for key, (startup, seconds) in {(15, 2, False): (0.8, 3.6), (18, 2, False): (1.0, 4.0)}.items():
        runner.trials[key] = dataclasses.replace(runner.trials[key], startup_s=startup, seconds=seconds)
    # each side: its start-up plus a steady 2.8 and 3.0 s a trial's cap; 9 s left cannot hold both at twice
    # the cap (13.4 s): both are measured at the scale that fits, (9 - 1.8) / 5.8, not one at 2 and the other cut
    pair = (runner.trials[(15, 2, False)], runner.trials[(18, 2, False)])
    runner.remaining = 9.0
    chosen = choose(search.compare, policy, 0.02, refine=1)
    assert sorted(runner.remeasured) == [(15, 2, False), (18, 2, False)]
    assert runner.scales == [pytest.approx(7.2 / 5.8)] * 2
    assert chosen.num_workers == 18  # both measured again: the means decide, 2.5% apart
    # not even one cap each: no half pair, the tie goes to the cheaper
    assert _pair_scale(7.0, pair, 2.0) is None  # 1.8 s of start-up + 5.8 s at one cap each > 7 s
    assert _pair_scale(0.0, pair, 2.0) is None
    assert _pair_scale(13.4, pair, 2.0) == 2.0


def test_a_close_call_counts_as_measured_again_only_when_it_was():
    from lightning_dataperf.autotune.choice import choose

    runner = FakeRunner(lambda workers, prefetch, pin: {4: 97.5, 8: 100.0}[workers])
    search = _search_with(runner)
    policy = runner.measure(4, 2, False)
    runner.measure(8, 2, False)

    def spent(trial, cap_scale=1.0, against=None):  # the first repeat finds the budget gone: nothing measured
        runner.remaining = 0.0
        return trial

    runner.remeasure = spent
    # single measurements within noise: the tie goes to the policy's (cheaper) 4, not to the faster mean
    assert choose(search.compare, policy, 0.02).num_workers == 4


def test_a_repeat_that_measured_nothing_is_said_so_not_shown_as_a_new_trial(monkeypatch):
    import io

    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.progress import LogProgress
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    # the H200 side-stream row: 22 workers' repeat was cut by the budget, and the log showed trial 4 twice
    stream = io.StringIO()
    limits = Limits(100.0, 60, 0.03, 0.5, None, 0)
    runner = TrialRunner(SlowSamples(100), 4, {}, fake_hardware(), TransferPath(), limits, listener=LogProgress(stream))
    first = Trial(22, 2, True, 48.3, batches=137, precision=0.05)
    runner.trials[first.config] = first
    cut = Trial(22, 2, True, 60.0, batches=3, rough=True)  # the burst's rate: not averaged in
    monkeypatch.setattr(runner, "run", lambda *config, **options: cut)
    assert runner.remeasure(first) is first
    assert stream.getvalue() == (
        "DataPerf autotune: trial 1/~8 workers=22 prefetch=2 pin=yes: measured nothing more (the time budget ran "
        "out before one steady round); kept at 48.3 batches/s\n"
    )


def test_a_rough_first_measurement_is_replaced_by_a_steady_repeat(monkeypatch):
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    limits = Limits(100.0, 60, 0.03, 0.5, None, 0)
    runner = TrialRunner(SlowSamples(100), 4, {}, fake_hardware(), TransferPath(), limits)
    rough = Trial(18, 2, True, 80.0, batches=3, rough=True)  # a climb trial cut by the budget: the burst's rate
    runner.trials[rough.config] = rough
    steady = Trial(18, 2, True, 37.7, batches=60, precision=0.02, tree_cpu_s=0.3)
    monkeypatch.setattr(runner, "run", lambda *config, **options: steady)
    again = runner.remeasure(rough)
    assert again.batches_per_sec == 37.7 and not again.rough and runner.trials[rough.config] is again


def _busy_trial(samples, batch_budget):
    """One 2-worker trial on CPU-bound samples (1 ms each, batches of 4), read to precision or the batch cap."""
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    limits = Limits(60.0, batch_budget, 0.03, 0.5, None, 0, precision=1e-6, trial_seconds=30.0)
    runner = TrialRunner(BusySamples(samples), 4, {}, fake_hardware(), TransferPath(), limits)
    runner.learn_batch_size()
    try:
        return runner.measure(2, 2, False)
    finally:
        runner.close()


def test_an_iterator_that_ran_out_reports_no_worker_cpu():
    # 160 samples, 40 batches: the trial reads to the end, and the loader shuts its workers down at
    # StopIteration, before their CPU time could be read (it read 1.4 ms per batch against 4.6 in-loader)
    trial = _busy_trial(160, 400)
    assert trial.refused is None and trial.batches >= 2
    assert trial.tree_cpu_s is None and trial.worker_busy is None


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


def test_a_repeat_the_budget_cut_before_a_steady_round_is_not_averaged_in(monkeypatch):
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    limits = Limits(100.0, 60, 0.03, 0.5, None, 0)
    runner = TrialRunner(SlowSamples(100), 4, {}, fake_hardware(), TransferPath(), limits)
    measured = Trial(18, 2, True, 37.7, batches=80, measurements=2, precision=0.02)
    runner.trials[measured.config] = measured
    # the budget ran out during the queued burst: 36 batches at once, a rate of the queue, not the workers
    rough = Trial(18, 2, True, 13.4, batches=3, rough=True)
    monkeypatch.setattr(runner, "run", lambda *config, **options: rough)
    again = runner.remeasure(measured)
    assert again.batches_per_sec == 37.7 and again.measurements == 2
    steady = dataclasses.replace(rough, batches_per_sec=35.0, batches=60, rough=False)
    monkeypatch.setattr(runner, "run", lambda *config, **options: steady)
    assert runner.remeasure(measured).measurements == 3  # a steady one is


def test_reserved_keeps_budget_back_and_gives_it_back():
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    limits = Limits(100.0, 60, 0.03, 0.5, None, 0)
    runner = TrialRunner(SlowSamples(100), 4, {}, fake_hardware(), TransferPath(), limits)
    before = runner.remaining
    with runner.reserved(30.0):
        assert before - 31.0 < runner.remaining < before - 29.0
        with runner.reserved(10.0):
            assert runner.remaining < before - 39.0
            runner.release(10.0)  # given back early
            assert before - 31.0 < runner.remaining < before - 29.0
        assert runner.remaining > before - 31.0
    assert runner.remaining > before - 1.0


def test_a_tie_never_spans_more_than_the_tie_band_however_noisy_the_trials():
    from lightning_dataperf.autotune.choice import choose
    from lightning_dataperf.autotune.search import TIE_BAND

    runner = FakeRunner(lambda workers, prefetch, pin: {1: 11.0, 14: 88.0, 17: 131.0}[workers])
    search = _search_with(runner)
    policy = runner.measure(1, 2, False)
    for workers in (14, 17):
        runner.measure(workers, 2, False)
    for config, trial in list(runner.trials.items()):  # each rate known only within 30% (a loaded VM)
        runner.trials[config] = dataclasses.replace(trial, precision=0.3)
    near = Trial(16, 2, False, 131.0 * (1 - TIE_BAND / 2), batches=20, precision=0.3)
    assert search.compare.as_fast(near, runner.trials[(17, 2, False)])  # within the band and the noise: a tie
    assert not search.compare.as_fast(runner.trials[(14, 2, False)], runner.trials[(17, 2, False)])
    assert choose(search.compare, policy, 0.02).num_workers == 17


def test_a_trial_stops_once_it_is_decided_against_the_best_so_far():
    from lightning_dataperf.autotune.trial import decided

    slow = Trial(4, 2, False, 40.0, batches=20, precision=0.05)
    assert decided(10.0, 0.1, slow, 0.03), "a quarter of the best so far: lost"
    assert not decided(150.0, 0.1, slow, 0.03), "far faster: it becomes the reference, measured to its precision"
    assert not decided(44.0, 0.02, slow, 0.03), "within the tie band: measured to its precision"
    assert not decided(80.0, 0.5, slow, 0.03), "too noisy to tell yet"
    assert not decided(10.0, 0.1, dataclasses.replace(slow, precision=None), 0.03), "the reference's error unknown"
    assert not decided(10.0, 0.1, None, 0.03)


def test_a_real_trial_against_a_far_faster_one_stops_before_its_precision(tmp_path):
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import MIN_STEADY_BATCHES, Limits

    # a precision no trial reaches and a cap far away: alone, the trial runs to its 60-batch cap
    limits = Limits(120.0, 60, 0.03, 0.5, None, 0, precision=1e-6, trial_seconds=60.0)
    runner = TrialRunner(SlowSamples(4000), 4, {}, fake_hardware(usable_cpus=2), TransferPath(), limits)
    runner.learn_batch_size()
    alone = runner.run(0, None, False)
    assert alone.batches >= 60
    sprint = Trial(0, None, False, alone.batches_per_sec * 20, batches=20, precision=0.01)
    raced = runner.run(0, None, False, against=sprint)
    assert MIN_STEADY_BATCHES <= raced.batches < alone.batches / 2
    crawl = dataclasses.replace(sprint, batches_per_sec=alone.batches_per_sec / 20)
    assert runner.run(0, None, False, against=crawl).batches >= 60, "far faster than the reference: not cut short"
    runner.close()


def test_the_climb_stops_where_the_cost_model_says_the_cpus_are_spent():
    from lightning_dataperf.autotune.search import Search
    from lightning_dataperf.autotune.trial import Limits

    # 3 workers on 2 CPUs, each batch 80 ms of a worker's CPU, the main thread busy 13%: (2 - 0.13) / 0.08
    # = 23.4 batches/s is all the CPUs can make, and 24 were measured
    timing = dict(worker_busy=0.6, work_s=0.12, cpu_s=0.08, main_s=0.006, wait_share=0.87)
    start = Trial(3, 2, False, 24.0, batches=40, **timing)
    runner = FakeRunner(lambda workers, prefetch, pin: 24.0)
    runner.trials[start.config] = start
    search = Search(runner, {}, (False,), Limits(30.0, 200, 0.03, 0.5, None, 1), cpus=2)
    assert search.climb_workers(start) is start and search.compare.stop_reason == "CPUs"
    assert "23.4 batches/s" in search.compare.stop_detail and runner.measured == []
    # half the CPU per batch: the CPUs could make twice as much, so it climbs
    runner = FakeRunner(lambda workers, prefetch, pin: 24.0)
    search = Search(runner, {}, (False,), Limits(30.0, 200, 0.03, 0.5, None, 1), cpus=2)
    search.climb_workers(dataclasses.replace(start, cpu_s=0.04))
    assert runner.measured and runner.measured[0][0] > 3


def test_the_climb_stops_where_the_whole_path_spends_the_cpus_though_the_workers_only_wait():
    from lightning_dataperf.autotune.search import Search
    from lightning_dataperf.autotune.trial import Limits

    # a latency loader: each worker waits 80 ms per batch and computes 1 ms of it (in-loader), so the
    # in-loader model sees no CPU limit; but the OS says the path spent 8.3 ms of CPU per batch at 48
    # workers (the hand-over of their batches, the main thread) and 8.4 at 16: 2 CPUs / 8.3 ms = 241
    # batches/s at most, with 240 measured
    timing = dict(worker_busy=0.1, work_s=0.08, cpu_s=0.001, main_s=0.002, wait_share=0.5)
    start = Trial(48, 2, False, 240.0, batches=400, tree_cpu_s=0.0083, **timing)
    below = Trial(16, 2, False, 180.0, batches=200, tree_cpu_s=0.0084, **timing)

    def climb(*trials):
        runner = FakeRunner(lambda workers, prefetch, pin: 240.0)
        runner.trials.update({trial.config: trial for trial in trials})
        search = Search(runner, {}, (False,), Limits(30.0, 200, 0.03, 0.5, None, 1), cpus=2)
        return search, runner, search.climb_workers(trials[0])

    search, runner, best = climb(start, below)
    # (the hand-over's trial after the stop reads the same: raced, so 48 is measured again; no climb trial)
    assert best.config == start.config and search.compare.stop_reason == "CPUs", search.compare.stop_detail
    assert "241.0 batches/s" in search.compare.stop_detail and runner.measured == []
    # fewer workers made cheaper batches (16: 7.0 ms, as on the 2-core VM): more workers will not be cheaper
    # than 48's own 8.3 ms, so the CPUs are spent all the same
    search, runner, best = climb(start, dataclasses.replace(below, tree_cpu_s=0.0070))
    assert best.config == start.config and search.compare.stop_reason == "CPUs" and runner.measured == []
    # more workers measured cheaper (96: 7.0 ms, as on the H200: 18 workers 10% below 15), the CPUs might
    # make 286 batches/s; one point alone, or another prefetch depth, proves nothing: it climbs
    for trials in (
        (start, below, Trial(96, 2, False, 230.0, batches=200, tree_cpu_s=0.0070, **timing)),
        (start,),
        (start, Trial(16, 4, False, 180.0, batches=200, tree_cpu_s=0.0084, **timing)),
    ):
        search, runner, _ = climb(*trials)
        assert runner.measured and runner.measured[0][0] > 48, search.compare.stop_detail
    # without the OS figure (psutil missing): the in-loader model sees no CPU limit and climbs
    search, runner, _ = climb(dataclasses.replace(start, tree_cpu_s=None), below)
    assert runner.measured and runner.measured[0][0] > 48


def test_a_bound_less_than_one_step_away_ends_the_climb_without_a_trial():
    # 20 workers gaining; the smallest bound allows 22: +10%, less than the 20% a trial can resolve
    runner = FakeRunner(lambda workers, prefetch, pin: 10.0 * workers, bounds={"CPU share": 22})
    search = _search_with(runner)
    start = Trial(20, 2, False, 200.0, batches=200)
    runner.trials[start.config] = start
    assert search.climb_workers(start) is start and runner.measured == []
    assert search.compare.stop_reason == "CPU share" and "less than one step above 20" in search.compare.stop_detail


def test_worker_cpu_counts_only_children_alive_at_the_end():
    import subprocess
    import sys
    import time

    from lightning_dataperf.autotune.measures import WorkerCpu

    # a plain child (multiprocessing's spawn would leave its resource tracker behind, a child of pytest)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        cpu = WorkerCpu()
        deadline = time.monotonic() + 60
        while child.pid not in (before := cpu.seconds()) or before[child.pid] <= 0:  # the spawn's imports
            assert time.monotonic() < deadline, "the child never showed CPU time"
            time.sleep(0.05)
    finally:
        child.terminate()
        child.wait()
    # a previous trial's worker that exited in between: summed naively, its CPU time is subtracted
    after = cpu.seconds()
    assert child.pid not in after
    naive = sum(after.values()) - sum(before.values())
    assert cpu.since(before) - naive == pytest.approx(before[child.pid], abs=0.05)


def test_a_trial_reads_the_cpu_of_the_workers_and_this_process_per_batch():
    trial = _busy_trial(4000, 60)
    assert trial.tree_cpu_s is not None and trial.cpu_s is not None
    # the workers' whole CPU time (their dataset's busy loop, collate, hand-over) and this process's:
    # at least what the in-loader clock saw inside the dataset, and not the start-up's (bounded loosely:
    # CPU time, not wall, but a loaded VM's steal can inflate it)
    assert 3 * trial.cpu_s > trial.tree_cpu_s >= 0.8 * trial.cpu_s > 0, (trial.tree_cpu_s, trial.cpu_s)


def test_reading_the_workers_memory_is_not_counted_in_the_trials_rate(monkeypatch):
    import time

    from lightning_dataperf.autotune import runner as autotune_trials
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.drain import drain
    from lightning_dataperf.autotune.measures import WorkerCpu
    from lightning_dataperf.autotune.trial import Limits

    read_at = []
    unique_mb = WorkerCpu.unique_mb

    def recorded(self):  # reading /proc/<pid>/smaps of every worker took 0.05-0.4 s on a 2-core VM
        read_at.append(time.perf_counter())
        return unique_mb(self)

    monkeypatch.setattr(WorkerCpu, "unique_mb", recorded)
    limits = Limits(60.0, 24, 0.03, 0.5, None, 0, precision=1e-6, trial_seconds=30.0)
    runner = autotune_trials.TrialRunner(SlowSamples(4000), 4, {}, fake_hardware(), TransferPath(), limits)
    runner.learn_batch_size()
    iterator = iter(runner._loader(2, 2, False))
    try:
        drained = drain(runner, iterator, time.perf_counter(), 2, 3, 4, 1.0, None)  # 2 workers x prefetch 2
    finally:
        autotune_trials.shutdown_loader_iterator(iterator)
    assert read_at and drained.worker_mb is not None
    assert drained.arrivals[-1] <= read_at[0], "the last batch's time must be taken before the memory is read"


def test_a_trials_worker_memory_is_read_from_a_spread_sample_of_its_workers(monkeypatch):
    from types import SimpleNamespace

    from lightning_dataperf.autotune.measures import MEMORY_SAMPLE, WorkerCpu

    read = []

    def child(index):
        def memory_full_info():
            read.append(index)
            return SimpleNamespace(uss=(100 + index) * 2**20)

        return SimpleNamespace(pid=1000 + index, memory_full_info=memory_full_info)

    cpu = WorkerCpu()
    monkeypatch.setattr(cpu, "_children", lambda: [child(index) for index in range(64)])
    assert cpu.unique_mb() == 148.0  # the largest of those read: 0, 16, 32, 48
    assert read == [0, 16, 32, 48] and MEMORY_SAMPLE == 4
    read.clear()
    monkeypatch.setattr(cpu, "_children", lambda: [child(index) for index in range(3)])
    assert cpu.unique_mb() == 102.0 and read == [0, 1, 2]  # fewer than the sample: every one


def test_each_trial_reads_its_own_slice_of_one_permutation_of_the_dataset():
    from lightning_dataperf.autotune.order import TrialOrder, coprime_stride

    for length in (1, 2, 3, 10, 12, 97, 1000):
        order = list(TrialOrder(length, 5, coprime_stride(length)))
        assert sorted(order) == list(range(length)), length
    stride = coprime_stride(1000)
    first, second = list(TrialOrder(1000, 0, stride))[:40], list(TrialOrder(1000, 40, stride))[:40]
    assert not set(first) & set(second) and max(first) - min(first) > 500  # disjoint, spread over the dataset


def test_a_trial_with_fewer_than_two_batches_says_whether_the_budget_or_the_dataset_ran_out():
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import BUDGET_REFUSAL, DATASET_REFUSAL, Limits

    limits = Limits(120.0, 60, 0.03, 0.5, None, 0, trial_seconds=60.0)
    runner = TrialRunner(SlowSamples(3), 4, {}, fake_hardware(usable_cpus=2), TransferPath(), limits)
    runner.learn_batch_size()
    assert runner.run(0, None, False).refused == DATASET_REFUSAL  # 3 samples: one batch, then the end
    runner.deadline = 0.0  # a deadline long past: the budget ran out before a second batch
    assert runner.run(0, None, False).refused == BUDGET_REFUSAL
    runner.close()


def test_the_way_down_compares_with_the_start_as_measured_again_not_its_first_look():
    # 16 workers read 100, then 110 when 32's repeat (104, 101) stayed ahead within noise: 16 is 105 over two
    # looks, the middle (24) gains nothing, and the way down starts. 8 workers read 98.5: as fast as 16's first
    # look (100), but 6% below 16 as measured twice: 8 is not taken
    looks = {16: [100.0, 110.0], 32: [104.0, 101.0], 24: [103.5, 101.5], 8: [98.5], 4: [50.0]}
    runner = AveragingRunner(looks)
    search = _search_with(runner)
    best = search.climb_workers(runner.measure(16, 2, False))
    assert best.num_workers == 16 and (best.batches_per_sec, best.measurements) == (105.0, 2)
    assert (8, 2, False) in runner.trials  # the way down was measured, and lost
    assert search.compare.stop_reason == "gain"


def _looked(runner, workers, precision, looks=1):
    trial = dataclasses.replace(runner.measure(workers, 2, False), precision=precision)
    runner.trials[trial.config] = trial
    for _ in range(looks - 1):
        trial = runner.remeasure(trial)
    return trial


def test_a_gain_the_climb_confirmed_is_not_lost_to_the_floors_one_look():
    from lightning_dataperf.autotune.choice import choose

    # the H200 side stream: 18 workers read 39.3 and 41.1 (6% error), the policy's 15 read 36.0 once (3%): +12%,
    # within the two rates' combined error (13%). The floor is measured again (35.0): the means decide, 18
    runner = AveragingRunner({15: [36.0, 35.0], 18: [39.3, 41.1]})
    search = _search_with(runner)
    policy, eighteen = _looked(runner, 15, 0.03), _looked(runner, 18, 0.06, looks=2)
    assert eighteen.batches_per_sec == pytest.approx(40.2) and not search.compare.better(eighteen, policy)
    assert choose(search.compare, policy, 0.02).num_workers == 18
    assert runner.remeasured[-1] == (15, 2, False)
    # the floor's second look (44.0) brings its mean to 40.0: within 2% of 18's, the policy's 15 stays
    runner = AveragingRunner({15: [36.0, 44.0], 18: [39.3, 41.1]})
    search = _search_with(runner)
    policy, _ = _looked(runner, 15, 0.03), _looked(runner, 18, 0.06, looks=2)
    assert choose(search.compare, policy, 0.02).num_workers == 15 and runner.remeasured[-1] == (15, 2, False)
    # a repeat that measured nothing (cut before one steady round: the trial itself comes back): the floor stays
    runner = AveragingRunner({15: [36.0, 35.0], 18: [39.3, 41.1]})
    search = _search_with(runner)
    policy, _ = _looked(runner, 15, 0.03), _looked(runner, 18, 0.06, looks=2)
    averaged = runner.remeasure
    runner.remeasure = lambda trial, cap_scale=1.0, against=None: trial if trial.num_workers == 15 else averaged(trial)
    assert choose(search.compare, policy, 0.02).num_workers == 15
    # a cheaper pick as fast as the floor is taken as it is: the floor is not measured again for it
    runner = AveragingRunner({15: [36.0, 35.0], 8: [39.3, 41.1]})
    search = _search_with(runner)
    policy, _ = _looked(runner, 15, 0.03), _looked(runner, 8, 0.06, looks=2)
    assert choose(search.compare, policy, 0.02).num_workers == 8 and runner.remeasured == [(8, 2, False)]
    # no time left for the look: the floor stays, nothing measured
    runner = AveragingRunner({15: [36.0, 35.0], 18: [39.3, 41.1]})
    search = _search_with(runner)
    policy, _ = _looked(runner, 15, 0.03), _looked(runner, 18, 0.06, looks=2)
    runner.remaining = 0.0
    assert choose(search.compare, policy, 0.02).num_workers == 15 and runner.remeasured == [(18, 2, False)]


class PinnedLooks(AveragingRunner):
    """Looks keyed by (workers, pin)."""

    def _look(self, workers, prefetch, pin):
        values = self.looks[(workers, pin)]
        return values.pop(0) if len(values) > 1 else values[0]


def test_the_other_pinning_at_the_floors_workers_must_still_beat_it_by_the_noise():
    from lightning_dataperf.autotune.choice import choose

    def pick(floor_looks):
        runner = PinnedLooks({(15, False): floor_looks, (15, True): [37.0, 38.0]})
        search = _search_with(runner)
        policy = dataclasses.replace(runner.measure(15, 2, False), precision=0.03)
        runner.trials[policy.config] = policy
        pinned = dataclasses.replace(runner.measure(15, 2, True), precision=0.08)
        runner.trials[pinned.config] = pinned
        runner.remeasure(pinned)  # 37.5 over two looks
        return choose(search.compare, policy, 0.02), runner

    chosen, runner = pick([33.0, 40.0])  # the floor's mean 36.5: pinned +2.7%, within the noise (3%)
    assert not chosen.pin_memory and runner.remeasured[-1] == (15, 2, False)
    chosen, _ = pick([33.0, 38.0])  # 35.5: pinned +5.6%
    assert chosen.pin_memory and chosen.num_workers == 15


def test_the_stop_is_told_against_the_answer_when_the_choice_took_fewer_workers():
    # a newcomer's run: the climb stopped at 4 workers (80.2), 12 read 100.2 ("+25%", within its noise), and the
    # choice took the middle, 8 (108.7): the stop said "more gave nothing (12 workers: +25%)" next to "8 workers"
    runner = FakeRunner(lambda workers, prefetch, pin: {4: 80.2, 8: 108.7, 12: 100.2}[workers])
    search = _search_with(runner)
    four, twelve, eight = (runner.measure(workers, 2, False) for workers in (4, 12, 8))
    search.compare.stop("gain", "more gave nothing (12 workers: +25%); 2 workers cannot be as fast")
    search.gained_nothing = twelve, "more gave nothing (12 workers: +25%)"
    search.stop_against(four)  # the answer is the best at the stop: its words stand
    assert search.compare.stop_detail.startswith("more gave nothing (12 workers: +25%)")
    search.stop_against(eight)
    assert search.compare.stop_detail == "more gave nothing (12 workers: -8%); 2 workers cannot be as fast"
    search.stop_against(twelve)  # not fewer workers than the step: unchanged
    assert search.compare.stop_detail == "more gave nothing (12 workers: -8%); 2 workers cannot be as fast"
