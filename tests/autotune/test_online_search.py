"""The closed loop's search (no Lightning): which setting it tries next, and which one it keeps."""

from __future__ import annotations

import math

import pytest

from lightning_dataperf.autotune.noise import TURNS_DECIDE, faster_in_looks
from lightning_dataperf.autotune.online import Measured, NeighbourSearch, Phase, Setting, SettingSpace
from lightning_dataperf.autotune.online.search import CLOSE_CALL_ROUNDS, TURNS_ROUNDS


def _measured(setting, rate, error=0.01):
    return Measured(setting, rate, error, batches=50, seconds=50 / rate)


def test_the_search_keeps_a_neighbour_only_when_the_incumbent_measured_again_is_still_slower():
    start = Setting(0, None, False, 2)
    space = SettingSpace(max_workers=4, cpus=2, tune_threads=True, tune_pinning=False)
    rates = {Setting(1, 2, False, 2): 9.0, Setting(2, 2, False, 2): 11.0, Setting(2, 2, False, 1): 18.0}
    search = NeighbourSearch(start, space)
    asked = [search.ask]
    while search.measured(_measured(asked[-1][0], rates.get(asked[-1][0], 10.0))) is not Phase.DONE:
        asked.append(search.ask)
    kept = search.kept
    assert kept.setting == Setting(2, 2, False, 1), "2 workers and one intra-op thread: the fastest"
    settings = [setting for setting, _ in asked]
    # the larger move first; a 10% win is kept once the start, measured again, still reads slower
    assert settings[:3] == [start, Setting(2, 2, False, 2), start]
    # each worker count also with the cores it leaves as intra-op threads: 4 workers with 2, then with 1
    assert settings[3:5] == [Setting(4, 2, False, 2), Setting(4, 2, False, 1)]
    assert settings.count(Setting(2, 2, False, 1)) == 1, "64% faster: kept without a second look at 2 threads"


def test_a_drifting_incumbent_does_not_make_a_neighbour_a_winner():
    start = Setting(1, 2, False, 2)
    space = SettingSpace(max_workers=2, cpus=2, tune_threads=False, tune_pinning=False)
    search = NeighbourSearch(start, space)
    assert search.measured(_measured(start, 10.0)) is Phase.TRYING
    setting, _ = search.ask
    assert search.measured(_measured(setting, 11.0)) is Phase.CONFIRMING  # 10% faster than the first look
    again, _ = search.ask
    assert again == start, "measured again before the neighbour is kept"
    search.measured(_measured(start, 12.0))  # the step itself got faster: the start reads as fast
    while search.phase is not Phase.DONE:  # every other neighbour is slower
        other, _ = search.ask
        search.measured(_measured(other, 5.0))
    assert search.kept.setting == start
    with pytest.raises(RuntimeError, match="asks for no more"):
        search.measured(_measured(start, 5.0))


def _run(search, rate_of, error=0.01):
    """Drives a search to its end; every measurement of a setting reads ``rate_of(setting, look)``."""
    looks: dict[Setting, int] = {}
    asked = [search.ask]
    while True:
        setting, _ = asked[-1]
        looks[setting] = looks.get(setting, 0) + 1
        if search.measured(_measured(setting, rate_of(setting, looks[setting]), error)) is Phase.DONE:
            return search.kept, [setting for setting, _ in asked]
        asked.append(search.ask)


def test_a_neighbour_ahead_by_less_than_its_error_is_measured_again_until_it_is_decided():
    start = Setting(3, 2, False, 1)
    four = Setting(4, 2, False, 1)
    space = SettingSpace(max_workers=4, cpus=2, tune_threads=False, tune_pinning=False)
    # 8% ahead, each look 3% in error: one look at each cannot call it (twice the combined error is 8.5%)
    search = NeighbourSearch(start, space)
    kept, asked = _run(search, lambda s, look: 54.0 if s == four else 50.0, error=0.03)
    assert kept.setting == four
    assert asked[:4] == [start, four, start, four], "the incumbent and the close neighbour measured again"


def test_a_close_call_goes_through_its_named_phases():
    start, four = Setting(3, 2, False, 1), Setting(4, 2, False, 1)
    search = NeighbourSearch(start, SettingSpace(max_workers=4, cpus=2, tune_threads=False, tune_pinning=False))
    phases = [search.phase]
    for setting, rate in [(start, 50.0), (four, 54.0), (start, 50.0), (four, 54.0), (start, 50.0)]:
        assert search.ask[0] == setting
        phases.append(search.measured(_measured(setting, rate, error=0.03)))
    close_call = [Phase.CLOSE_CALL_INCUMBENT, Phase.CLOSE_CALL_NEIGHBOUR]
    # pooled, 8% ahead is beyond the errors; under 25%, the start is measured once more before 4 is kept
    assert phases == [Phase.START, Phase.TRYING, *close_call, Phase.CONFIRMING, Phase.TRYING]
    assert search.best.setting == four and search.ask == (Setting(2, 2, False, 1), search.best)


def test_a_lead_below_the_noise_floor_is_measured_again_but_never_kept():
    start = Setting(3, 2, False, 1)
    four = Setting(4, 2, False, 1)
    space = SettingSpace(max_workers=4, cpus=2, tune_threads=False, tune_pinning=False)
    rates = {four: 51.0, start: 50.0}  # 2 workers 10% behind: no tie to settle for fewer workers
    kept, asked = _run(NeighbourSearch(start, space), lambda s, look: rates.get(s, 45.0), error=0.03)
    assert kept.setting == start, "2% is under the 3% floor however often it is measured"
    assert asked.count(four) == 1 + CLOSE_CALL_ROUNDS and asked.count(start) == 1 + CLOSE_CALL_ROUNDS


def test_a_close_calls_looks_are_asked_precise_enough_to_decide_the_lead_read():
    start, four = Setting(3, 2, False, 1), Setting(4, 2, False, 1)
    search = NeighbourSearch(start, SettingSpace(max_workers=4, cpus=2, tune_threads=False, tune_pinning=False))
    search.measured(_measured(start, 50.0, error=0.03))
    assert search.precision is None, "a first look runs to the loop's own precision"
    # 6% ahead at 3% a look: one more look at 3% each would not decide it
    assert search.measured(_measured(four, 53.0, error=0.03)) is Phase.CLOSE_CALL_INCUMBENT
    asked = search.precision
    assert 0 < asked < 0.03
    # a look at the asked error has (3% / asked)^2 the batches of one at 3%
    batches = round(50 * (0.03 / asked) ** 2)
    search.measured(Measured(start, 50.0, asked, batches, batches / 50.0))
    assert search.phase is Phase.CLOSE_CALL_NEIGHBOUR and search.precision is not None
    batches = round(50 * (0.03 / search.precision) ** 2)
    # pooled to the errors asked, the same 6% lead is now beyond noise: the start is confirmed slower once more
    assert search.measured(Measured(four, 53.0, search.precision, batches, batches / 53.0)) is Phase.CONFIRMING
    assert search.precision is None


def test_an_incumbent_that_closes_the_gap_on_its_second_look_leaves_a_close_call_not_a_loss():
    start, four = Setting(3, 2, False, 1), Setting(4, 2, False, 1)
    search = NeighbourSearch(start, SettingSpace(max_workers=4, cpus=2, tune_threads=False, tune_pinning=False))
    search.measured(_measured(start, 50.0, error=0.03))
    assert search.measured(_measured(four, 56.0, error=0.03)) is Phase.CONFIRMING, "12%: beyond 8.5%"
    # the start's second look reads 55: pooled 52.5, the lead 6.7%, under twice the combined error
    assert search.measured(_measured(start, 55.0, error=0.03)) is Phase.CLOSE_CALL_NEIGHBOUR
    assert search.ask[0] == four and search.lead is not None and search.lead.setting == four


def test_two_looks_pool_weighted_by_their_batches():
    setting = Setting(2, 2, False, 1)
    short, long = Measured(setting, 40.0, 0.03, 50, 1.25), Measured(setting, 44.0, 0.01, 450, 450 / 44.0)
    pooled = short.pooled(long)
    assert pooled.batches == 500 and pooled.steps_per_sec == pytest.approx(500 / (1.25 + 450 / 44.0))
    assert pooled.error == pytest.approx((1.5**2 + 4.5**2) ** 0.5 / 500), "the long look counts nine times over"
    assert short.pooled(short).error == pytest.approx(0.03 / 2**0.5)


def test_a_close_call_that_stays_undecided_keeps_the_incumbent():
    start = Setting(3, 2, False, 1)
    four = Setting(4, 2, False, 1)
    space = SettingSpace(max_workers=4, cpus=2, tune_threads=False, tune_pinning=False)
    rates = {four: 54.0, start: 50.0}
    kept, asked = _run(NeighbourSearch(start, space), lambda s, look: rates.get(s, 45.0), error=0.2)
    assert kept.setting == start
    assert asked.count(four) == 3, "the first look and two more"


def test_a_climb_doubles_the_workers_then_goes_halfway_and_keeps_big_wins_at_once():
    start = Setting(4, 2, False, 1)
    space = SettingSpace(max_workers=32, cpus=16, tune_threads=False, tune_pinning=False)

    def rate(setting, look):  # the H200's JPEG loader: faster up to 24 workers, slower beyond
        workers = setting.num_workers
        return float(workers if workers <= 24 else 48 - workers)

    kept, asked = _run(NeighbourSearch(start, space), rate)
    assert kept.setting.num_workers == 24
    workers = [setting.num_workers for setting in asked]
    # 8 and 16 are kept at once (2x); 32 reads no faster than 16, 24 (halfway) 50% faster
    assert workers[:5] == [4, 8, 16, 32, 24], workers
    assert len(asked) <= 12, f"{len(asked)} trials"


def test_a_neighbour_read_behind_by_a_noisy_look_is_measured_again_where_it_stands():
    # collate, 2 cores: 2 workers (30% faster) read 102 ± 17% beside the start's 107 ± 10% and were dropped
    start, two = Setting(0, None, False, 2), Setting(2, 2, False, 1)
    space = SettingSpace(max_workers=4, cpus=2, tune_threads=True, tune_pinning=False)
    search = NeighbourSearch(start, space)
    search.first = [two]
    search.measured(Measured(start, 106.8, 0.10, 200, 1.87))
    assert search.ask[0] == two
    assert search.measured(Measured(two, 102.1, 0.17, 198, 1.94)) is Phase.CLOSE_CALL_NEIGHBOUR
    assert search.ask[0] == two, "the setting in use again: no switch"
    # the new look replaces the noisy one (pooled, 102 would drag 140 to a tie): 31% faster, kept at once
    search.measured(Measured(two, 140.0, 0.03, 400, 2.86))
    assert search.best.setting == two and search.best.steps_per_sec == 140.0
    # read behind by a precise look, or far behind: dropped as before
    for rate, error in ((102.1, 0.03), (50.0, 0.17)):
        search = NeighbourSearch(start, space)
        search.first = [two]
        search.measured(Measured(start, 106.8, 0.03, 200, 1.87))
        assert search.measured(Measured(two, rate, error, 198, 1.94)) is Phase.TRYING
        assert search.ask[0] != two


def test_pooled_looks_keep_each_look_in_turn():
    setting = Setting(0, None, False, 1)
    first, second = Measured(setting, 40.0, 0.01, 50, 1.25), Measured(setting, 44.0, 0.02, 50, 50 / 44.0)
    assert first.every_look == ((40.0, 0.01),)
    assert first.pooled(second).pooled(first).every_look == ((40.0, 0.01), (44.0, 0.02), (40.0, 0.01))


def _scripted(search, reads, other=None):
    """Drives a search with each setting's looks read in turn from ``reads[setting]`` (its last one repeated; a
    setting not in ``reads`` reads ``other``)."""
    looks: dict[Setting, int] = {}
    asked = []
    while search.phase is not Phase.DONE:
        setting, _ = search.ask
        asked.append(setting)
        values = reads.get(setting, [other])
        rate = values[min(looks.get(setting, 0), len(values) - 1)]
        looks[setting] = looks.get(setting, 0) + 1
        search.measured(Measured(setting, rate, 0.003, batches=1300, seconds=1300 / rate))
    return search.kept, asked


def test_a_lead_under_the_noise_floor_steady_over_three_looks_each_is_kept():
    # tiny, 2 cores: 1 thread read 2.4-2.9% ahead of 2 in each of three looks (±0.3%); the 3% floor kept 2 threads
    # (here between worker counts: a change of threads alone is judged in turns, below)
    start, more = Setting(1, 2, False, 1), Setting(2, 2, False, 1)
    space = SettingSpace(max_workers=2, cpus=2, tune_threads=False, tune_pinning=False)
    reads = {start: [1326.2, 1329.3, 1336.0, 1330.0], more: [1364.6, 1362.8, 1368.4]}
    kept, asked = _scripted(NeighbourSearch(start, space), reads, other=500.0)
    assert kept.setting == more
    assert asked[:7] == [start, more, start, more, start, more, start], "two close-call rounds, then the start again"
    # the same reads, one look of 2 workers drifting: its spread covers the lead, the start stays
    drifting = {start: reads[start], more: [1364.6, 1300.0, 1368.4]}
    assert _scripted(NeighbourSearch(start, space), drifting, other=500.0)[0].setting == start


def _drift(slot):
    """The step's own drift at a look's place in time: up to 15%, a few percent from one look to the next."""
    return 1 + 0.15 * math.sin((slot + 10) / 3)


def test_a_change_of_threads_alone_is_judged_in_turns_against_the_drift():
    """The dicts pipeline, 2 cores: 1 thread led 2 by 4% while the step moved 10-15% between looks; three looks of
    each, compared by their means, kept either in 6 of 10 runs. Looks in turn cancel a drift that is slow beside one
    look: the neighbour's looks (times 0, 2, 4, ...) against the incumbent's (1, 3, 5, ...)."""
    two, one = Setting(0, None, False, 2), Setting(0, None, False, 1)
    space = SettingSpace(max_workers=0, cpus=2, tune_threads=True, tune_pinning=False)
    reads = {
        two: [1000 * _drift(-1)] + [1000 * _drift(2 * k + 1) for k in range(TURNS_ROUNDS + 1)],
        one: [1040 * _drift(2 * k) for k in range(TURNS_ROUNDS + 1)],
    }
    kept, asked = _scripted(NeighbourSearch(two, space), reads)
    assert kept.setting == one
    assert asked[1:10] == [one, two] * 4 + [one], "in turns, from the neighbour's first look (1% behind)"
    # the same looks compared by their means: the drift is their spread, and no lead is called
    looks = asked.count(one)
    assert not faster_in_looks([(r, 0.003) for r in reads[one][:looks]], [(r, 0.003) for r in reads[two][1:looks]])


def test_a_tie_of_thread_counts_ends_its_turns_early_and_goes_to_fewer_threads():
    """The dicts pipeline, 2 cores: 1 and 2 threads tie when quiet, 2 threads dip for looks at a time; a tie
    settled for the start kept either in 6 of 10 runs. Fewer threads win a tie, said in the search's ties."""
    two, one = Setting(0, None, False, 2), Setting(0, None, False, 1)
    space = SettingSpace(max_workers=0, cpus=2, tune_threads=True, tune_pinning=False)
    tied = {
        two: [1000 * _drift(-1)] + [1000 * _drift(2 * k + 1) for k in range(TURNS_ROUNDS + 1)],
        one: [1000 * _drift(2 * k) * (1.01 if k % 2 else 0.99) for k in range(TURNS_ROUNDS + 1)],
    }
    search = NeighbourSearch(two, space)
    kept, asked = _scripted(search, tied)
    assert kept.setting == one
    assert TURNS_DECIDE <= asked.count(one) < TURNS_ROUNDS, "settled once no lead above the floor is left"
    assert len(search.ties) == 1 and search.ties[0].startswith("1 thread kept over 2 threads on a tie (")
    # from 1 thread the same tie keeps 1 thread: no note
    search = NeighbourSearch(one, space)
    kept, _ = _scripted(search, {one: tied[two], two: tied[one]})
    assert kept.setting == one and not search.ties
    # 1 thread steadily 5% behind is no tie: the start stays
    behind = {two: tied[two], one: [0.95 * rate for rate in tied[one]]}
    search = NeighbourSearch(two, space)
    assert _scripted(search, behind)[0].setting == two and not search.ties
    # a first look slower beyond noise is dropped at once, as before
    slow = {two: [1000.0], one: [850.0]}
    assert _scripted(NeighbourSearch(two, space), slow)[1] == [two, one]


def test_a_tie_behind_a_start_read_once_measures_the_start_again():
    """The collate pipeline, 2 cores: the start read 156 steps/s in its one look (131 in the grid), 2 workers tied at
    154 and were dropped, and the run kept the start at 75% of the grid's best."""
    start, two = Setting(0, None, False, 2), Setting(2, 2, False, 2)
    space = SettingSpace(max_workers=2, cpus=2, tune_threads=False, tune_pinning=False)
    reads = {start: [155.8, 131.0, 131.0], two: [154.2, 150.0, 150.0]}
    kept, asked = _scripted(NeighbourSearch(start, space), reads, other=60.0)
    assert asked[:4] == [start, two, start, two], "the start looked at again before the tie is dropped"
    assert kept.setting == two
    # a start read twice is not looked at a third time for a tie
    steady = {start: [150.0, 150.0, 150.0], two: [148.0, 148.0, 148.0]}
    kept, asked = _scripted(NeighbourSearch(start, space), steady, other=60.0)
    assert kept.setting == start and asked.count(start) == 2


def test_a_noisy_look_of_the_incumbent_is_taken_again_once_instead_of_pooled():
    """The collate pipeline, 2 cores: the start's confirming look read 188 ± 19% beside its first 222 ± 0.2%;
    pooled by batches they left 2 workers' 9.5% lead within the pair's error, and the run kept the start."""
    start, two = Setting(1, 2, False, 1), Setting(2, 2, False, 1)
    space = SettingSpace(max_workers=2, cpus=2, tune_threads=False, tune_pinning=False)

    def look(setting, rate, error):
        return Measured(setting, rate, error, batches=220, seconds=220 / rate)

    search = NeighbourSearch(start, space)
    search.measured(look(start, 222.0, 0.002))
    assert search.measured(look(two, 243.0, 0.036)) is Phase.CONFIRMING
    assert search.measured(look(start, 188.0, 0.19)) is Phase.CONFIRMING, "the noisy look is taken again"
    assert search.ask == (start, None)
    search.measured(look(start, 225.0, 0.002))
    assert search.best.setting == two and len(search.best.every_look) == 1
    # the same noisy look, pooled as before the rule: the lead is left within the pair's error
    pooled = look(start, 222.0, 0.002).pooled(look(start, 188.0, 0.19))
    assert not search._faster(look(two, 243.0, 0.036), pooled)
    # only once a neighbour: a second noisy look is pooled
    search = NeighbourSearch(start, space)
    search.measured(look(start, 222.0, 0.002))
    search.measured(look(two, 243.0, 0.036))
    search.measured(look(start, 188.0, 0.19))
    assert search.measured(look(start, 190.0, 0.19)) is not Phase.CONFIRMING
    assert len(search.best.every_look) == 2
