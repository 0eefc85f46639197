"""The training process's stalls (a full garbage collection, a periodic log): found in a look, each look's rate
read between its own, and what they took said in the summary."""

from __future__ import annotations

import itertools
import math

from lightning_dataperf.autotune.online import OnlineLoop, Segment, Setting, SettingSpace
from lightning_dataperf.autotune.online.segment import STALLS_RECUR, Stalls

ZERO = Setting(0, None, False, 2)
TWO = Setting(2, 2, False, 1)
CPU = SettingSpace(max_workers=4, cpus=2, tune_threads=True, tune_pinning=False)


def _look(setting, periods):
    look = Segment(setting, None)
    for period in periods:
        look.add(period)
    return look


def test_a_round_far_beyond_the_looks_median_is_a_stall_counted_by_its_excess():
    steady = [0.005] * 100
    assert _look(ZERO, steady).stalls() == []
    (stall,) = _look(ZERO, [*steady[:50], 0.145, *steady[50:]]).stalls()
    assert math.isclose(stall, 0.14)
    # with workers the rounds are read (a round's batches arrive together): one long period in a round of two
    (stall,) = _look(TWO, [0.0, 0.01] * 50 + [0.0, 0.15] + [0.0, 0.01] * 50).stalls()
    assert math.isclose(stall, 0.14)


def test_a_look_with_a_stall_and_one_without_read_alike_between_their_stalls():
    with_stall = _look(ZERO, [0.005] * 100 + [0.145] + [0.005] * 100)
    without = _look(ZERO, [0.005] * 200)
    assert without._steady_rate()[0] > 1.12 * with_stall._steady_rate()[0], "over every round: 14% apart"
    assert math.isclose(with_stall.rate()[0], without.rate()[0])
    measured = with_stall.measured()
    assert math.isclose(measured.steps_per_sec, 200) and math.isclose(measured.seconds, measured.batches / 200)
    assert measured.error < 0.01, "the error between its stalls, not one stall's"


def test_what_the_stalls_took_is_said_once_they_recur():
    stalls = Stalls()
    one_second_one_stall = [0.005] * 172 + [0.145]
    for _ in range(STALLS_RECUR - 1):
        stalls.add(_look(ZERO, one_second_one_stall))
    assert stalls.words() == "", "fewer stalls than a pattern: a one-off is not said"
    stalls.add(_look(ZERO, one_second_one_stall))
    assert f"({STALLS_RECUR} in 3 s of looks" in stalls.words() and "14% of the time" in stalls.words()


def _drive(loop, seconds):
    """Feeds ``loop`` a pipeline whose every setting runs 200 steps/s between stalls of 0.14 s every 1.2 s (a full
    collection)."""
    now, next_stall = 0.0, 1.2
    wobble = itertools.cycle([0.98, 1.02])
    while now < seconds:
        if loop.step(now) is not None:
            loop.switched(0.0)
            loop.restart(1)
        now += 0.005 * next(wobble)
        if now >= next_stall:
            now, next_stall = now + 0.14, next_stall + 1.2


def test_every_look_reads_the_rate_between_stalls_and_the_summary_says_what_they_took():
    loop = OnlineLoop(ZERO, CPU)
    _drive(loop, 60.0)
    # a look that held a stall, and one that held none, read alike: never 200 beside 175 (the stall-free look
    # 14% ahead of an equal setting's)
    assert all(abs(trial.steps_per_sec / 200 - 1) < 0.03 for trial in loop.result.trials), [
        trial.words() for trial in loop.result.trials
    ]
    assert loop.result.done and any("between the training process's stalls" in note for note in loop.result.notes)
    assert "between the training process's stalls" in loop.result.summary()


def test_a_look_as_fast_as_the_setting_in_use_between_stalls_costs_nothing_for_its_stall():
    incumbent = _look(ZERO, [0.005] * 200).measured()
    look = Segment(TWO, incumbent)
    for period in [0.0, 0.01] * 50 + [0.0, 0.15] + [0.0, 0.01] * 50:
        look.add(period)
    assert look.cost() > 0.13, "checked per step with its stalls in"
    assert look.measured().cost_s < 0.01
