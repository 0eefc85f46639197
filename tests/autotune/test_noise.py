"""The one vocabulary of rate comparisons: what the offline search and the online loop call faster, ahead, as
fast and slower for sure."""

from __future__ import annotations

import math

import pytest

from lightning_dataperf.autotune.noise import (
    TURNS_DECIDE,
    ahead,
    as_fast,
    as_fast_in_turns,
    faster,
    faster_in_looks,
    faster_in_turns,
    gap,
    lead_in_turns,
    no_lead_in_turns,
    slower_for_sure,
)
from lightning_dataperf.autotune.online import Measured, NeighbourSearch, Setting, SettingSpace
from lightning_dataperf.autotune.trial import Trial, decided, margin


def test_the_gap_is_the_noise_floor_or_twice_the_combined_error():
    assert gap(0.001, 0.001, 0.03) == 0.03
    assert gap(0.03, 0.04, 0.03) == pytest.approx(0.1)
    assert faster(10.5, 10.0, 0.03) and not faster(10.3, 10.0, 0.03)
    assert ahead(10.4, 10.0, 0.03) and not ahead(10.3, 10.0, 0.03)
    assert as_fast(9.8, 10.0, 0.03) and not as_fast(9.6, 10.0, 0.03)


def test_slower_for_sure_needs_the_tie_band_and_three_errors_and_known_errors():
    assert slower_for_sure(10.0, 0.1, 40.0, 0.05)
    assert slower_for_sure(8.5, 0.0, 10.0, 0.0) and not slower_for_sure(9.5, 0.0, 10.0, 0.0), "the 10% tie band"
    assert not slower_for_sure(8.5, 0.02, 10.0, 0.01), "15% slower, within 10% and three combined errors (6.7%)"
    assert not slower_for_sure(1.0, math.inf, 10.0, 0.01) and not slower_for_sure(1.0, 0.01, 10.0, math.inf)
    assert not slower_for_sure(1.0, 0.01, 0.0, 0.01), "no rate to be slower than"


def test_the_offline_search_and_the_loop_decide_the_same_pair_alike():
    # the same two rates and errors, as offline trials and as the loop's measurements
    fast = Trial(4, 2, False, 40.0, batches=50, precision=0.02)
    slow_rates = [(20.0, 0.05), (34.0, 0.01), (38.0, 0.02), (10.0, math.inf)]
    noise = 0.03
    for rate, error in slow_rates:
        offline = decided(rate, error, fast, noise)
        online = slower_for_sure(rate, error, 40.0, fast.relative_error(noise / 2))
        assert offline == online, (rate, error)
    trial = Trial(8, 2, False, 44.0, batches=50, precision=0.02)
    assert margin(trial, fast, noise) == gap(0.02, 0.02, noise)


def test_the_loop_search_calls_faster_what_gap_calls_faster():
    start, two = Setting(1, 2, False, 2), Setting(2, 2, False, 2)
    space = SettingSpace(max_workers=2, cpus=2, tune_threads=False, tune_pinning=False)
    search = NeighbourSearch(start, space)
    search.measured(Measured(start, 10.0, 0.02, 50, 5.0))
    # gap(0.02, 0.02, 0.03) is 5.7%: 10.5 steps/s is ahead by the noise floor, within the errors: a close call
    search.measured(Measured(two, 10.5, 0.02, 50, 50 / 10.5))
    assert search.ask == (start, None)


def test_a_small_lead_steady_over_looks_in_turn_is_faster_and_a_drift_or_a_noisy_look_is_not():
    # tiny, 2 cores: 1 thread against 2 in three looks each (1 s, ±0.3-0.5% each)
    one = [(1364.6, 0.003), (1362.8, 0.003), (1368.4, 0.003)]
    two = [(1326.2, 0.005), (1329.3, 0.005), (1336.0, 0.005)]
    assert faster_in_looks(one, two) and not faster_in_looks(two, one)
    assert not faster_in_looks(one[:2], two[:2]), "two looks each: the spread is a guess"
    # the same means, the looks spread by a drift of the step rate: 2.7% is within it
    drifting = [(1300.0, 0.003), (1365.0, 0.003), (1430.0, 0.003)]
    assert not faster_in_looks(drifting, two)
    # steady, but each look only to 3%: their own errors say 2.7% is not decided
    assert not faster_in_looks([(rate, 0.03) for rate, _ in one], [(rate, 0.03) for rate, _ in two])
    # under the 1% floor however steady
    assert not faster_in_looks([(rate * 1.008, 0.001) for rate, _ in two], [(rate, 0.001) for rate, _ in two])


def test_looks_in_turn_set_each_neighbour_look_against_the_incumbents_beside_it():
    # a step slowing 5% a look: the neighbour 3% ahead at every moment, its looks at times 1, 3, 5 ...
    turns = [(slot % 2 == 1, (103.0 if slot % 2 else 100.0) * (1 - 0.05 * slot)) for slot in range(13)]
    lead, _, looks = lead_in_turns(turns)
    assert looks == 6 and lead == pytest.approx(0.03, abs=0.004), "a linear drift cancels"
    assert faster_in_turns(turns) and not no_lead_in_turns(turns, 0.03)
    # the looks' own means: the drift is their spread, and the same lead is not called
    assert not faster_in_looks([(r, 0.003) for n, r in turns if n], [(r, 0.003) for n, r in turns if not n])
    assert not faster_in_turns(turns[: 2 * TURNS_DECIDE - 2]), "too few looks to call a lead"
    level = [(neighbour, rate * (1.004 if slot % 4 == 1 else 0.996)) for slot, (neighbour, rate) in enumerate(turns)]
    level = [(neighbour, rate / 1.03 if neighbour else rate) for neighbour, rate in level]
    assert not faster_in_turns(level) and no_lead_in_turns(level, 0.03)
    assert as_fast_in_turns(level, 0.03), "level: behind by less than the floor beyond doubt"
    assert not as_fast_in_turns(level[: 2 * TURNS_DECIDE - 2], 0.03), "too few looks to call a tie"
    behind = [(neighbour, rate * 0.95 if neighbour else rate) for neighbour, rate in level]
    assert not as_fast_in_turns(behind, 0.03), "5% behind is no tie"
