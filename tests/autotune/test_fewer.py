"""The way down: fewer workers where they are as fast, zero workers where the main thread limits, none where they
cannot be as fast."""

from __future__ import annotations

import math

import pytest
from autotune_fakes import AveragingRunner, FakeRunner, search_with

from lightning_dataperf.autotune.trial import Trial


def test_cpu_bound_loader_climbs_down_when_fewer_workers_are_as_fast():
    # 2 CPUs: 8 workers share them (each busy 25% of its time, 10 ms of CPU per batch), 2 make as much
    runner = FakeRunner(lambda workers, prefetch, pin: min(100.0 * workers, 200.0), busy=0.25)
    search = search_with(runner, min_workers=0)
    best = search.climb_workers(runner.measure(8, 2, False))
    assert best.num_workers == 2 and search.compare.stop_reason == "fewer"


def test_after_a_gaining_climb_zero_workers_are_tried_when_the_main_thread_limits():
    # tiny batches + 2 ms of host work per step on 2 cores: 1 -> 2 workers gains, 3 loses, and loading in
    # the main thread (no hand-over, no workers competing for the 2 cores) is fastest
    rates = {0: 300.0, 1: 125.0, 2: 185.0, 3: 125.0}
    runner = FakeRunner(lambda workers, prefetch, pin: rates[workers], busy=0.3)
    runner.timing = {workers: (0.001, 0.003) for workers in (1, 2, 3)}  # 1 / (3 ms + 1 ms) = 250 batches/s
    search = search_with(runner, min_workers=0)
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
    search = search_with(runner, min_workers=0)
    start = runner.measure(1, 2, False)
    search.probe_fewer(search.climb_workers(start), start)
    assert all(config[0] > 0 for config in runner.measured)


def test_no_fewer_workers_are_tried_after_a_first_step_up_that_gained():
    # the H200 side-stream shape: 15 -> 18 workers gains 8% (beyond the 3% noise), 22 gains nothing; the rate
    # was still rising at 15, so 7 workers (what a loader-capacity model might suggest) would only lose
    rates = {15: 36.0, 18: 39.0, 22: 39.2}
    runner = FakeRunner(lambda workers, prefetch, pin: rates.get(workers, 2.4 * workers), busy=0.45)
    runner.timing = {workers: (0.2, 0.025) for workers in rates}  # the main thread takes 40 batches/s at most
    search = search_with(runner, min_workers=1)
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
    search = search_with(runner, min_workers=1)
    start = runner.measure(15, 2, False)
    best = search.probe_fewer(search.climb_workers(start), start)
    # (18: halfway, and a step above 15 itself, tried where 22 tied)
    assert best.num_workers == 15 and runner.measured == [(15, 2, False), (22, 2, False), (18, 2, False)]
    assert "7 workers cannot be as fast" in search.compare.stop_detail
    # mostly idle workers (a latency loader) could be over-provisioned: fewer are measured
    runner = FakeRunner(lambda workers, prefetch, pin: 36.0, busy=0.05)
    search = search_with(runner, min_workers=1)
    search.climb_workers(runner.measure(15, 2, False))
    assert (7, 2, False) in runner.measured and search.compare.stop_reason == "fewer"


def test_the_way_down_compares_with_the_start_as_measured_again_not_its_first_look():
    # 16 workers read 100, then 110 when 32's repeat (104, 101) stayed ahead within noise: 16 is 105 over two
    # looks, the middle (24) gains nothing, and the way down starts. 8 workers read 98.5: as fast as 16's first
    # look (100), but 6% below 16 as measured twice: 8 is not taken
    looks = {16: [100.0, 110.0], 32: [104.0, 101.0], 24: [103.5, 101.5], 8: [98.5], 4: [50.0]}
    runner = AveragingRunner(looks)
    search = search_with(runner)
    best = search.climb_workers(runner.measure(16, 2, False))
    assert best.num_workers == 16 and (best.batches_per_sec, best.measurements) == (105.0, 2)
    assert (8, 2, False) in runner.trials  # the way down was measured, and lost
    assert search.compare.stop_reason == "gain"
