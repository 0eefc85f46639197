"""One trial's figures: the steady rate, the rate the workers made, when a trial is decided, which trials are
confirmed."""

from __future__ import annotations

import dataclasses

import pytest

from lightning_dataperf.autotune.trial import Trial, confirmation_candidates, steady_rate


def test_confirmation_remeasures_the_fastest_and_the_cheapest_near_them():
    rates = {(4, 2, False): 100.0, (8, 2, False): 98.0, (2, 2, False): 97.0, (1, 2, False): 40.0}
    rates[(0, None, False)] = 75.0  # loading in the main process, measured once and unluckily low
    trials = [Trial(*config, batches_per_sec=rate, batches=10) for config, rate in rates.items()]
    chosen = [trial.config for trial in confirmation_candidates(trials, count=3, band=0.7)]
    assert chosen == [(4, 2, False), (8, 2, False), (2, 2, False), (0, None, False)]
    fastest_only = [trial.config for trial in confirmation_candidates(trials, count=3, band=0.9)]
    assert fastest_only == [(4, 2, False), (8, 2, False), (2, 2, False)], "(2, 2) is already the cheapest near"
    assert confirmation_candidates([], count=3) == []


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


def test_a_trial_stops_once_it_is_decided_against_the_best_so_far():
    from lightning_dataperf.autotune.trial import decided

    slow = Trial(4, 2, False, 40.0, batches=20, precision=0.05)
    assert decided(10.0, 0.1, slow, 0.03), "a quarter of the best so far: lost"
    assert not decided(150.0, 0.1, slow, 0.03), "far faster: it becomes the reference, measured to its precision"
    assert not decided(44.0, 0.02, slow, 0.03), "within the tie band: measured to its precision"
    assert not decided(80.0, 0.5, slow, 0.03), "too noisy to tell yet"
    assert not decided(10.0, 0.1, dataclasses.replace(slow, precision=None), 0.03), "the reference's error unknown"
    assert not decided(10.0, 0.1, None, 0.03)
