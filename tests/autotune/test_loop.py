"""The online loop's rules on the Lightning-free class, fed synthetic step periods: each phase and what moves it."""

from __future__ import annotations

import itertools

import pytest

from lightning_dataperf.autotune.online import Phase, Setting, SettingSpace
from lightning_dataperf.autotune.online.loop import ENDED, OnlineLoop, planned_batches, refusal

START = Setting(1, 2, False, 2)
TWO = Setting(2, 2, False, 2)
SPACE = SettingSpace(max_workers=2, cpus=2, tune_threads=False, tune_pinning=False)


def _loop(**options):
    """A loop from :data:`START`; trials end at 1% error, with no minimum length; no cost cap unless planned."""
    return OnlineLoop(START, SPACE, **{"precision": 0.01, "min_seconds": 0.0, **options})


def _drive(loop, period_of, steps, mark=lambda step: 0):
    """Feeds ``loop`` as the glue would (a switch restarts the segment, its first period a burst of one); the
    setting in use at the end and the phases it went through (each once, in order)."""
    now, current, phases = 0.0, START, [loop.phase]
    wobble = itertools.cycle([0.99, 1.01])  # a steady rate with a small, known error
    for step in range(steps):
        setting = loop.step(now, mark(step))
        if setting is not None:
            loop.switched(0.0)
            current = setting
            loop.restart(1)
        if loop.phase is not phases[-1]:
            phases.append(loop.phase)
        now += period_of(current) * next(wobble)
    return current, phases


def test_a_neighbour_ten_percent_faster_is_confirmed_then_kept_and_watched():
    loop = _loop(planned=lambda: 1e6)
    in_use, phases = _drive(loop, lambda setting: 0.09 if setting.num_workers == 2 else 0.1, 400)
    # 10% is under the 25% that is kept at once: the start is measured again before 2 workers are kept
    assert phases[:4] == [Phase.START, Phase.TRYING, Phase.CONFIRMING, Phase.TRYING], phases
    assert phases[-1] is Phase.WATCHING, "decided with budget left: the kept rate is watched"
    assert loop.result.done and loop.result.kept.setting.num_workers == 2 and in_use.num_workers == 2
    assert [trial.setting for trial in loop.result.trials[:3]] == [START, TWO, START]


def test_a_neighbour_far_faster_is_kept_without_a_second_look():
    loop = _loop(planned=lambda: 1e6)
    _, phases = _drive(loop, lambda setting: 0.05 if setting.num_workers == 2 else 0.1, 400)
    assert Phase.CONFIRMING not in phases and loop.result.kept.setting.num_workers == 2
    assert [trial.setting for trial in loop.result.trials[:3]] == [START, TWO, Setting(2, 4, False, 2)]


def test_a_neighbour_far_slower_is_cut_once_it_cannot_tie():
    loop = _loop(precision=1e-9)  # never measured to its precision: only the cut ends it early
    _drive(loop, lambda setting: 0.5 if setting == TWO else 0.1, 260)
    start, two = loop.result.trials[:2]
    assert start.seconds >= 10.0, "the start: no setting to be cut against, it runs to its cap (max_seconds)"
    assert two.setting == TWO and two.batches < 20, "a fifth of the start's rate: cut at the first look"


def test_at_the_cost_cap_the_loop_goes_back_to_the_setting_it_stood_on_and_is_done():
    # 1000 planned steps at 10 steps/s, 1%: a 1-s budget; a neighbour at half the speed costs 0.1 s a step
    loop = _loop(precision=0.05, max_cost=0.01, planned=lambda: 1000)
    in_use, phases = _drive(loop, lambda setting: 0.1 if setting == START else 0.2, 200)
    assert phases == [Phase.START, Phase.TRYING, Phase.DONE], "over the cap: no drift watch either"
    assert in_use == START and loop.result.kept.setting == START
    assert loop.result.stop_reason == "the trials had cost 1.0% of the run"
    assert loop.step(1e9, 0) is None and loop.phase is Phase.DONE, "done: the loop reads nothing more"


def test_without_a_planned_length_there_is_no_cost_cap():
    loop = _loop(precision=0.05, max_cost=0.0)
    _, phases = _drive(loop, lambda setting: 0.1 if setting == START else 0.2, 400)
    assert phases[-1] is Phase.WATCHING and "cost" not in loop.result.stop_reason


def test_two_drifted_windows_in_a_row_start_the_search_again_from_the_kept_setting():
    loop = _loop(max_batches=20, planned=lambda: 1e6)
    kept_period = [0.1]
    _drive(loop, lambda setting: kept_period[0] if setting == START else 0.2, 300)
    assert loop.phase is Phase.WATCHING and loop.result.kept.setting == START
    loop.restart(0)  # each drive's clock starts again at 0 (its first step only reads the clock)
    _drive(loop, lambda setting: kept_period[0], 20 - len(loop.watch.periods) + 1)  # the window in progress ends
    kept_period[0] = 0.05  # the pipeline changed: the kept setting now runs at twice its rate
    loop.restart(0)
    _drive(loop, lambda setting: kept_period[0], 21)
    assert loop.phase is Phase.WATCHING and loop.result.looks == 0, "one window off may be a passing load"
    loop.restart(0)
    _drive(loop, lambda setting: kept_period[0], 21)
    assert loop.phase is Phase.START and loop.result.looks == 1 and not loop.result.done
    assert loop.trial.setting == START and loop.trial.against is None, "the kept setting measured again: no switch"
    # the fit ends during that first look: the setting kept before stays, with the reason said
    assert loop.conclude() and loop.result.done and loop.result.kept.setting == START
    assert loop.result.stop_reason == ENDED and "; ;" not in loop.result.summary()


def test_a_steady_kept_rate_is_watched_without_a_new_search():
    loop = _loop(max_batches=20, planned=lambda: 1e6)
    _drive(loop, lambda setting: 0.1 if setting == START else 0.2, 1000)
    assert loop.phase is Phase.WATCHING and loop.result.looks == 0


def test_a_period_across_a_change_of_mark_is_not_counted():
    loop = _loop()
    for now, mark in [(0.0, "a"), (1.0, "a"), (2.0, "b"), (3.5, "b"), (4.0, ("epoch", 1))]:
        assert loop.step(now, mark) is None
    assert loop.trial.periods == [1.0, 1.5], "2.0 follows validation (mark b); 4.0 an epoch's end"


def test_a_new_iterators_burst_is_charged_to_the_switch_not_the_rate():
    loop = _loop()
    loop.restart(2)
    for now in [0.0, 0.01, 0.02, 0.12, 0.22]:
        loop.step(now)
    trial = loop.trial
    assert trial.periods == pytest.approx([0.1, 0.1]) and trial.skipped == 2
    assert trial.switch_s == pytest.approx(0.02)


def test_the_planned_run_is_the_nearer_of_its_epochs_and_max_steps_and_none_where_both_are_unbounded():
    assert planned_batches(3, None, 100) == 300.0 and planned_batches(3, -1, 100) == 300.0
    assert planned_batches(None, None, 100) is None and planned_batches(-1, -1, 100) is None
    assert planned_batches(3, None, float("inf")) is None and planned_batches(3, None, None) is None
    # Lightning sets max_epochs=-1 where only max_steps bounds the run: the steps bound it (issue 47)
    assert planned_batches(-1, 3000, 100) == 3000.0 and planned_batches(-1, 3000, None) == 3000.0
    assert planned_batches(3, 10, 100) == 10.0 and planned_batches(3, 1000, 100) == 300.0


def test_the_loop_refuses_ddp_fast_dev_run_and_overfit_batches():
    assert refusal(2, False, 0.0) == "", "under DDP rank zero decides for every rank"
    assert "fast_dev_run" in refusal(1, True, 0.0)
    assert "overfit_batches" in refusal(1, False, 0.1)
    assert refusal(1, False, 0.0) == ""
