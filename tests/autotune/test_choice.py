"""The answer from the trials (choose): the policy's pick as the floor, ties to fewer workers, close calls measured
again, rough trials never taken, the other pinning only when faster beyond noise."""

from __future__ import annotations

import dataclasses

import pytest
from autotune_fakes import AveragingRunner, FakeRunner, search_with
from helpers import fake_hardware

from lightning_dataperf.autotune.trial import Trial
from lightning_dataperf.autotune.tune import AutotuneResult


def test_the_policys_pinning_is_kept_on_a_tie_and_changed_only_when_the_other_is_faster():
    from lightning_dataperf.autotune.choice import choose

    # the H200 pick check: 15 workers pinned (the policy) 38.2 batches/s, unpinned 37.6: a tie, which does not
    # take the policy's pinning away (unpinned re-measured 14% slower there)
    rates = {True: 38.2, False: 37.6}
    runner = FakeRunner(lambda workers, prefetch, pin: rates[pin])
    search = search_with(runner)
    policy = runner.measure(15, 2, True)
    runner.measure(15, 2, False)
    assert choose(search.compare, policy, 0.02).config == (15, 2, True)
    # faster beyond noise (session 9's call: +21% unpinned): the other pinning wins
    rates[False] = 46.2
    runner = FakeRunner(lambda workers, prefetch, pin: rates[pin])
    search = search_with(runner)
    policy = runner.measure(15, 2, True)
    runner.measure(15, 2, False)
    assert choose(search.compare, policy, 0.02).config == (15, 2, False)
    # a tie with fewer workers still goes to the cheaper setting, pinning and all
    runner = FakeRunner(lambda workers, prefetch, pin: 38.0)
    search = search_with(runner)
    policy = runner.measure(15, 2, True)
    runner.measure(12, 2, False)
    assert choose(search.compare, policy, 0.02).config == (12, 2, False)


def test_a_close_call_that_is_only_the_other_pinning_keeps_the_policys_unmeasured_where_workers_pin():
    from lightning_dataperf.autotune.choice import choose

    def chosen(workers, rates, looks=2):
        # the H200 cpu row (session 18): 5 workers pinned (the policy's pinning) read 53.9 over two looks, unpinned
        # 56.1 once (+4%, within the two trials' 5% errors)
        runner = FakeRunner(lambda w, prefetch, pin: rates[w, pin])
        search = search_with(runner)
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
    search = search_with(runner)
    best = runner.measure(52, 2, False)
    burst = Trial(52, 4, False, 1949.6, batches=8, rough=True)
    runner.trials[burst.config] = burst
    assert not search.compare.faster(burst, best) and not search.compare.as_fast(burst, best)
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
    search = search_with(runner)
    floor = Trial(52, 2, False, 1949.6, batches=8, rough=True)
    runner.trials[floor.config] = floor
    runner.measure(26, 2, False)
    assert choose(search.compare, floor, 0.02).config == (26, 2, False)
    # only the rough floor: it is the answer, and says it is rough
    lone = dataclasses.replace(result, trials=(burst,), settings=dataclasses.replace(result.settings, num_workers=52,
                               prefetch_factor=4, pin_memory=False))  # fmt: skip
    assert "(rough: cut before one steady round)" in lone.summary_line()


def test_the_policys_pick_is_the_floor_and_ties_go_to_fewer_workers():
    from lightning_dataperf.autotune.choice import choose

    # within noise (3%) of each other: the policy's 2 workers stay, although 6 measured 2% faster
    runner = FakeRunner(lambda workers, prefetch, pin: {2: 100.0, 6: 102.0}[workers])
    search = search_with(runner)
    policy = runner.measure(2, 2, False)
    runner.measure(6, 2, False)
    assert choose(search.compare, policy, 0.02).num_workers == 2
    # a configuration faster beyond noise replaces it
    runner = FakeRunner(lambda workers, prefetch, pin: {2: 100.0, 6: 130.0}[workers])
    search = search_with(runner)
    policy = runner.measure(2, 2, False)
    runner.measure(6, 2, False)
    assert choose(search.compare, policy, 0.02).num_workers == 6
    # a cheaper one as fast replaces it too (ties go to fewer workers)
    runner = FakeRunner(lambda workers, prefetch, pin: {1: 100.0, 2: 101.0}[workers])
    search = search_with(runner)
    policy = runner.measure(2, 2, False)
    runner.measure(1, 2, False)
    assert choose(search.compare, policy, 0.02).num_workers == 1


def test_a_close_call_is_measured_again_longer_and_interleaved():
    from lightning_dataperf.autotune.choice import REFINE_ROUNDS, choose

    runner = FakeRunner(lambda workers, prefetch, pin: {4: 100.0, 8: 97.5}[workers])
    search = search_with(runner)
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
        return runner, search_with(runner), runner.trials[(1, 2, False)]

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
        return runner, search_with(runner), runner.trials[(15, 2, True)]

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


def test_a_close_call_the_budget_left_no_time_to_measure_again_goes_to_fewer():
    from lightning_dataperf.autotune.choice import choose

    runner = FakeRunner(lambda workers, prefetch, pin: {4: 97.5, 8: 100.0}[workers])
    search = search_with(runner)
    policy = runner.measure(4, 2, False)
    runner.measure(8, 2, False)
    runner.remaining = 0.0
    assert choose(search.compare, policy, 0.02).num_workers == 4 and runner.remeasured == []


def test_a_close_call_takes_at_most_the_seconds_it_is_given():
    from lightning_dataperf.autotune.choice import choose

    runner = FakeRunner(lambda workers, prefetch, pin: {4: 97.5, 8: 100.0}[workers])
    search = search_with(runner)
    policy = runner.measure(4, 2, False)
    runner.measure(8, 2, False)
    # 100 s of budget left, none of it given to the close call: nothing re-measured, the tie goes to fewer
    assert choose(search.compare, policy, 0.02, seconds=0.0).num_workers == 4 and runner.remeasured == []
    assert runner.remaining == 100.0  # the rest is given back
    assert choose(search.compare, policy, 0.02, seconds=50.0).num_workers == 8 and runner.remeasured


def test_a_close_call_the_budget_cannot_fit_at_twice_the_cap_measures_both_sides_shorter_or_neither():
    from lightning_dataperf.autotune.choice import _pair_scale, choose

    runner = FakeRunner(lambda workers, prefetch, pin: {15: 97.5, 18: 100.0}[workers])
    search = search_with(runner)
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
    search = search_with(runner)
    policy = runner.measure(4, 2, False)
    runner.measure(8, 2, False)

    def spent(trial, cap_scale=1.0, against=None):  # the first repeat finds the budget gone: nothing measured
        runner.remaining = 0.0
        return trial

    runner.remeasure = spent
    # single measurements within noise: the tie goes to the policy's (cheaper) 4, not to the faster mean
    assert choose(search.compare, policy, 0.02).num_workers == 4


def test_a_tie_never_spans_more_than_the_tie_band_however_noisy_the_trials():
    from lightning_dataperf.autotune.choice import choose
    from lightning_dataperf.autotune.search import TIE_BAND

    runner = FakeRunner(lambda workers, prefetch, pin: {1: 11.0, 14: 88.0, 17: 131.0}[workers])
    search = search_with(runner)
    policy = runner.measure(1, 2, False)
    for workers in (14, 17):
        runner.measure(workers, 2, False)
    for config, trial in list(runner.trials.items()):  # each rate known only within 30% (a loaded VM)
        runner.trials[config] = dataclasses.replace(trial, precision=0.3)
    near = Trial(16, 2, False, 131.0 * (1 - TIE_BAND / 2), batches=20, precision=0.3)
    assert search.compare.as_fast(near, runner.trials[(17, 2, False)])  # within the band and the noise: a tie
    assert not search.compare.as_fast(runner.trials[(14, 2, False)], runner.trials[(17, 2, False)])
    assert choose(search.compare, policy, 0.02).num_workers == 17


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
    search = search_with(runner)
    policy, eighteen = _looked(runner, 15, 0.03), _looked(runner, 18, 0.06, looks=2)
    assert eighteen.batches_per_sec == pytest.approx(40.2) and not search.compare.faster(eighteen, policy)
    assert choose(search.compare, policy, 0.02).num_workers == 18
    assert runner.remeasured[-1] == (15, 2, False)
    # the floor's second look (44.0) brings its mean to 40.0: within 2% of 18's, the policy's 15 stays
    runner = AveragingRunner({15: [36.0, 44.0], 18: [39.3, 41.1]})
    search = search_with(runner)
    policy, _ = _looked(runner, 15, 0.03), _looked(runner, 18, 0.06, looks=2)
    assert choose(search.compare, policy, 0.02).num_workers == 15 and runner.remeasured[-1] == (15, 2, False)
    # a repeat that measured nothing (cut before one steady round: the trial itself comes back): the floor stays
    runner = AveragingRunner({15: [36.0, 35.0], 18: [39.3, 41.1]})
    search = search_with(runner)
    policy, _ = _looked(runner, 15, 0.03), _looked(runner, 18, 0.06, looks=2)
    averaged = runner.remeasure
    runner.remeasure = lambda trial, cap_scale=1.0, against=None: trial if trial.num_workers == 15 else averaged(trial)
    assert choose(search.compare, policy, 0.02).num_workers == 15
    # a cheaper pick as fast as the floor is taken as it is: the floor is not measured again for it
    runner = AveragingRunner({15: [36.0, 35.0], 8: [39.3, 41.1]})
    search = search_with(runner)
    policy, _ = _looked(runner, 15, 0.03), _looked(runner, 8, 0.06, looks=2)
    assert choose(search.compare, policy, 0.02).num_workers == 8 and runner.remeasured == [(8, 2, False)]
    # no time left for the look: the floor stays, nothing measured
    runner = AveragingRunner({15: [36.0, 35.0], 18: [39.3, 41.1]})
    search = search_with(runner)
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
        search = search_with(runner)
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
