"""The run's recurring stalls (a full garbage collection, a periodic log): found in a look, pooled over the run,
and each look's rate read between its own stalls and counted at the run's share of them."""

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


def test_the_runs_share_of_stalls_is_pooled_over_its_looks_once_they_recur():
    stalls = Stalls()
    one_second_one_stall = [0.005] * 172 + [0.145]
    for _ in range(STALLS_RECUR - 1):
        stalls.add(_look(ZERO, one_second_one_stall))
    assert stalls.share() is None, "fewer stalls than a pattern: a one-off changes no rate"
    stalls.add(_look(ZERO, [0.005] * 200))
    stalls.add(_look(ZERO, one_second_one_stall))
    assert math.isclose(stalls.share(), STALLS_RECUR * 0.14 / (STALLS_RECUR * 1.005 + 1.0))


def test_a_look_with_a_stall_and_one_without_read_alike_at_the_runs_share():
    with_stall = _look(ZERO, [0.005] * 100 + [0.145] + [0.005] * 100)
    without = _look(ZERO, [0.005] * 200)
    (raw, _, _), (clean, _, _) = with_stall.rate(), without.rate()
    assert clean > 1.12 * raw, "read alone, a stall-free look is 14% faster"
    share = 0.1
    assert math.isclose(with_stall.rate(share)[0], without.rate(share)[0])
    assert math.isclose(without.measured(share=share).steps_per_sec, 200 * (1 - share))
    assert with_stall.measured(share=share).error < 0.01, "the error between its stalls, not one stall's"


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


def test_once_stalls_recur_every_look_reads_the_rate_with_its_share_of_them():
    loop = OnlineLoop(ZERO, CPU)
    _drive(loop, 60.0)
    share = loop.stalls.share()
    assert share is not None and 0.09 < share < 0.13, share
    later = loop.result.trials[STALLS_RECUR + 1 :]
    assert later, "the search went on past its first looks"
    # 200 steps/s less its stalls' share of the time: a look that held one, or none, reads the same
    true = 200 * (1 - 0.14 / 1.34)
    assert all(abs(trial.steps_per_sec / true - 1) < 0.04 for trial in later), [t.words() for t in later]
