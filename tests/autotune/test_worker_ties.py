"""The online search settles a tie of worker counts for fewer workers, once, and never a real lead."""

from __future__ import annotations

from lightning_dataperf.autotune.online import Measured, NeighbourSearch, Phase, Setting, SettingSpace
from lightning_dataperf.autotune.online.search import CLOSE_CALL_ROUNDS

SPACE = SettingSpace(max_workers=4, cpus=2, tune_threads=False, tune_pinning=False)
THREE, FOUR = Setting(3, 2, False, 1), Setting(4, 2, False, 1)


def _run(search: NeighbourSearch, rates: dict[Setting, float], other: float = 40.0) -> tuple[Measured, list[Setting]]:
    """Drives a search to its end, every look at 2% error; settings not in ``rates`` read ``other``."""
    asked = [search.ask[0]]
    while True:
        rate = rates.get(asked[-1], other)
        if search.measured(Measured(asked[-1], rate, 0.02, 50, 50 / rate)) is Phase.DONE:
            break
        asked.append(search.ask[0])
    assert search.kept is not None
    return search.kept, asked


def test_fewer_workers_as_fast_are_kept_after_their_close_call_and_said():
    search = NeighbourSearch(FOUR, SPACE)
    kept, asked = _run(search, {FOUR: 50.0, THREE: 49.6})
    assert kept.setting == THREE, "0.8% behind, 2% a look: a tie, settled for fewer workers"
    assert asked.count(THREE) == 1 + CLOSE_CALL_ROUNDS, "kept only after its close call"
    assert len(search.ties) == 1 and search.ties[0].startswith("3 workers kept over 4 on a tie (-0.8%")


def test_fewer_workers_behind_by_more_than_the_tie_are_measured_again_but_not_kept():
    search = NeighbourSearch(FOUR, SPACE)
    kept, asked = _run(search, {FOUR: 50.0, THREE: 49.0})
    assert kept.setting == FOUR, "2% behind in every look: beyond the tie"
    assert asked.count(THREE) == 1 + CLOSE_CALL_ROUNDS and search.ties == []


def test_more_workers_as_fast_do_not_displace_fewer():
    search = NeighbourSearch(THREE, SPACE)
    kept, _ = _run(search, {THREE: 49.6, FOUR: 50.0})
    assert kept.setting == THREE and search.ties == []


def test_worker_ties_do_not_chain_down():
    eight, six, four = (Setting(count, 2, False, 1) for count in (8, 6, 4))
    search = NeighbourSearch(eight, SettingSpace(max_workers=8, cpus=8, tune_threads=False, tune_pinning=False))
    # each 1% behind the last: one tie is kept, the next would be 2% behind the fastest read
    kept, asked = _run(search, {eight: 50.0, six: 49.5, four: 49.0})
    assert kept.setting == six and four in asked
    assert len(search.ties) == 1


def test_no_tie_is_settled_for_zero_workers():
    zero, one = Setting(0, None, False, 1), Setting(1, 2, False, 1)
    search = NeighbourSearch(one, SettingSpace(max_workers=2, cpus=2, tune_threads=False, tune_pinning=False))
    kept, _ = _run(search, {one: 50.0, zero: 50.0})
    assert kept.setting == one, "loading in the training process is no cheaper than one worker"


def test_fewer_workers_whose_lead_is_gone_when_the_incumbent_is_measured_again_are_kept_on_the_tie():
    search = NeighbourSearch(FOUR, SPACE)
    looks = [(FOUR, 50.0), (THREE, 50.5), (FOUR, 50.0), (THREE, 50.5), (FOUR, 50.0), (THREE, 56.0)]
    for setting, rate in looks:
        assert search.ask[0] == setting
        phase = search.measured(Measured(setting, rate, 0.02, 50, 50 / rate))
    assert phase is Phase.CONFIRMING, "three looks pooled, 3 workers read ahead beyond their error"
    search.measured(Measured(FOUR, 54.0, 0.02, 50, 50 / 54.0))  # the incumbent again: the lead is gone
    assert search.best.setting == THREE and len(search.ties) == 1
