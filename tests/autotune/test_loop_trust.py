"""A loop a newcomer trusts (issue 49), on the Lightning-free loop fed synthetic periods: trusted trials, leads left
unconfirmed said, short runs said up front, first moves from the start's facts, the cap on max_steps runs."""

from __future__ import annotations

import itertools
import types

import torch
from torch.utils.data import DataLoader, SequentialSampler

from lightning_dataperf.autotune.online import OnlineLoop, Phase, Setting, SettingSpace, planned_batches
from lightning_dataperf.autotune.online.records import MIN_TRUSTED_BATCHES, Measured, OnlineResult, share_steps

ZERO = Setting(0, None, False, 2)
CPU = SettingSpace(max_workers=4, cpus=2, tune_threads=True, tune_pinning=False)


def _drive(loop, start, period_of, steps, switch_s=0.0, load_of=None):
    """Feeds ``loop`` as the glue would; the setting in use at the end and every setting switched to, in order."""
    now, current, switched = 0.0, start, []
    wobble = itertools.cycle([0.98, 1.02])
    for _ in range(steps):
        if load_of is not None and current.num_workers == 0:
            loop.fetched(load_of(current))
        setting = loop.step(now)
        if setting is not None:
            loop.switched(switch_s)
            current = setting
            switched.append(setting)
            loop.restart(1)
        now += period_of(current) * next(wobble)
    return current, switched


def test_a_lead_the_cap_leaves_unconfirmed_is_reported_with_what_would_settle_it():
    # 11% faster, under the 25% kept at once: the start must be measured again, but the switch spent the cap
    loop = OnlineLoop(ZERO, CPU, min_seconds=0.0, planned=lambda: 1000.0)
    two = Setting(2, 2, False, 1)
    in_use, _ = _drive(loop, ZERO, lambda s: 0.09 if s == two else 0.1, 300, switch_s=6.0, load_of=lambda s: 0.03)
    result = loop.result
    assert result.done and result.kept.setting == ZERO and in_use == ZERO, "an unconfirmed lead is not kept"
    assert result.unconfirmed is not None and result.unconfirmed.setting == two
    assert result.unconfirmed.batches >= MIN_TRUSTED_BATCHES, "a faster trial runs on to a trusted length"
    summary = result.summary()
    assert "2 workers + 1 thread read +1" in summary, summary
    assert "not confirmed: the 5% cap (4.99 s) was spent" in summary, summary
    assert "OnlineTuning(max_cost=...)" in summary and "a longer run" in summary


def test_a_lead_from_too_few_batches_decides_nothing():
    start = Measured(ZERO, 10.0, 0.01, 200, 20.0)
    few = Measured(Setting(2, 2, False, 1), 20.0, 0.3, MIN_TRUSTED_BATCHES - 1, 0.4)
    from lightning_dataperf.autotune.online.search import NeighbourSearch

    search = NeighbourSearch(ZERO, CPU)
    search.first = [few.setting]
    search.measured(start)
    assert search.ask[0] == few.setting
    # twice the rate, read from 8 batches: a close call measured again, never a win on its own
    assert search.measured(few) is Phase.CLOSE_CALL_INCUMBENT and search.lead == few


def test_every_trial_carries_its_batches_seconds_and_error_in_the_summary():
    loop = OnlineLoop(ZERO, CPU, min_seconds=0.0, planned=lambda: 1e6)
    _drive(loop, ZERO, lambda s: 0.05 if s.num_workers == 2 and s.threads == 1 else 0.1, 800, load_of=lambda s: 0.04)
    result = loop.result
    assert result.done and len(result.trials) >= 3
    summary = result.summary()
    for trial in result.trials:
        assert trial.words() in summary
        assert f"({trial.batches} batches, {trial.seconds:.2f} s)" in trial.words() and "±" in trial.words()
    assert f"{result.gain:.2f}x ± " in summary and "not measured to 10%" not in summary


def test_a_gain_whose_error_exceeds_ten_percent_is_printed_as_a_lead_not_a_gain():
    start = Measured(ZERO, 10.0, 0.08, 40, 4.0)
    kept = Measured(Setting(2, 2, False, 1), 16.0, 0.09, 40, 2.5)
    result = OnlineResult(start=start, kept=kept, trials=[start, kept], done=True, stop_reason="...")
    assert "1.60x ± 12% the start's 10.0 steps/s (not measured to 10%: a lead, not a gain)" in result.summary()


def test_a_run_too_short_for_one_trusted_trial_says_so_up_front_and_never_switches():
    # 30 steps at 10 steps/s: a 5% cap of 0.15 s holds no trusted trial of a slower neighbour (0.2 s)
    loop = OnlineLoop(ZERO, CPU, min_seconds=0.0, planned=lambda: 30.0)
    in_use, switched = _drive(loop, ZERO, lambda s: 0.1, 30, load_of=lambda s: 0.04)
    assert switched == [] and in_use == ZERO and loop.phase is Phase.DONE
    result = loop.result
    assert result.notes and "the run is too short to decide" in result.notes[0], result.notes
    assert "steps, or OnlineTuning(max_cost=" in result.notes[0] and result.notes[0] in result.summary()
    assert len(result.trials) == 1, "only the start was measured"
    # a noisy start (its precision never reached) still says so once its rate is roughly known, not at its cap
    loop = OnlineLoop(ZERO, CPU, min_seconds=0.0, planned=lambda: 30.0)
    noisy = itertools.cycle([0.05, 0.15])
    in_use, switched = _drive(loop, ZERO, lambda s: next(noisy), 30)
    assert switched == [] and loop.result.notes and loop.result.start.batches <= MIN_TRUSTED_BATCHES + 1
    # ten times as long: the loop tries its neighbours
    loop = OnlineLoop(ZERO, CPU, min_seconds=0.0, planned=lambda: 300.0)
    _, switched = _drive(loop, ZERO, lambda s: 0.1, 100, load_of=lambda s: 0.04)
    assert switched and not loop.result.notes


def test_the_first_moves_come_from_the_starts_load_and_compute():
    # the tokeniser pipeline: 29 ms of loading beside 59 of compute, 0 workers and 2 threads on 2 cores
    loop = OnlineLoop(ZERO, CPU, min_seconds=0.0, planned=lambda: 1e6)
    _, switched = _drive(loop, ZERO, lambda s: 0.088, 200, load_of=lambda s: 0.029)
    # every setting ties here: the start, read once, is looked at again between them
    moves = list(dict.fromkeys(setting for setting in switched if setting != ZERO))
    assert moves[:2] == [Setting(2, 2, False, 1), Setting(1, 2, False, 1)], switched[:4]
    # without load figures (a feeder that reports none), the fixed order: 2 workers beside the start's threads
    loop = OnlineLoop(ZERO, CPU, min_seconds=0.0, planned=lambda: 1e6)
    _, switched = _drive(loop, ZERO, lambda s: 0.088, 200)
    assert switched[0] == Setting(2, 2, False, 2)
    # loading cheaper than a hand-over: no worker count can pay, the threads at 0 workers are tried first
    loop = OnlineLoop(ZERO, CPU, min_seconds=0.0, planned=lambda: 1e6)
    _, switched = _drive(loop, ZERO, lambda s: 0.088, 200, load_of=lambda s: 0.001)
    assert switched[0] == Setting(0, None, False, 1), switched[:2]


def test_a_run_bounded_by_max_steps_is_held_to_the_cost_cap():
    # Lightning's max_epochs=-1 with max_steps=3000: planned, so the cap applies (it did not: 29-31% spent)
    planned = planned_batches(-1, 3000, 120.0)
    assert planned == 3000.0
    loop = OnlineLoop(ZERO, CPU, min_seconds=0.0, planned=lambda: planned)
    _drive(loop, ZERO, lambda s: 0.1 if s == ZERO else 0.4, 3000, switch_s=0.5)
    result = loop.result
    assert result.done and result.kept.setting == ZERO
    assert result.cost_s <= 0.05 * 3000 * 0.1 + max(trial.cost_s for trial in result.trials), result.summary()


def test_min_workers_keeps_the_users_worker_init_running():
    one = Setting(1, 2, False, 1)
    space = SettingSpace(max_workers=4, cpus=2, tune_threads=True, tune_pinning=False, min_workers=1)
    assert all(setting.num_workers >= 1 for setting in space.neighbours(one, first=[ZERO]))
    assert any(setting.num_workers == 0 for setting in SettingSpace(4, 2, True, False).neighbours(one))
    # 0 workers the fastest by far: never tried
    loop = OnlineLoop(one, space, min_seconds=0.0, planned=lambda: 1e6)
    _, switched = _drive(loop, one, lambda s: 0.01 if s.num_workers == 0 else 0.1, 600)
    assert switched and all(setting.num_workers >= 1 for setting in switched)


def test_attach_online_keeps_a_worker_where_the_users_worker_init_fn_must_run():
    from lightning_dataperf.datamodule.online_start import attach_online
    from lightning_dataperf.loader.seeding import EpochSeededWorkerInit, SharedEpoch

    def tuner_for(user_init):
        sampler = SequentialSampler(range(8))
        sampler.position = lambda: (0, 0)
        init = EpochSeededWorkerInit(0, 0, SharedEpoch(), user_init, batch_seeded=True)
        loader = DataLoader(torch.arange(8), batch_size=2, sampler=sampler, num_workers=1, worker_init_fn=init)
        strategy = types.SimpleNamespace(root_device=torch.device("cpu"))
        trainer = types.SimpleNamespace(world_size=1, fast_dev_run=False, overfit_batches=0.0, strategy=strategy)
        notes: list[str] = []
        return attach_online(loader, trainer, 2, notes, (0, 0)), notes

    tuner, notes = tuner_for(print)
    assert tuner.loop.space.min_workers == 1 and "never fewer than 1 worker" in notes[-1]
    tuner, notes = tuner_for(None)
    assert tuner.loop.space.min_workers == 0 and "never fewer" not in notes[-1]


def test_the_gpu_share_and_persistent_workers_are_searched_only_where_asked():
    split = Setting(4, 2, True, 1, gpu_share=0.5)
    plain = SettingSpace(max_workers=8, cpus=8, tune_threads=False, tune_pinning=False)
    assert all(s.gpu_share == 0.5 and not s.persistent_workers for s in plain.neighbours(split))
    space = SettingSpace(8, 8, False, False, tune_share=True, tune_persistent=True)
    around = list(space.neighbours(split))
    assert [s.gpu_share for s in around if s.gpu_share != 0.5] == [0.0, 1.0, 0.25, 0.75]
    assert Setting(4, 2, True, 1, gpu_share=0.5, persistent_workers=True) in around
    assert not any(s.persistent_workers for s in space.neighbours(Setting(0, None, False, 1)))
    assert share_steps(1.0) == [0.0, 0.5] and share_steps(0.0) == [1.0, 0.5]
    assert Setting(4, 2, True, 1).describe() == "num_workers=4, prefetch_factor=2, pin_memory=True, threads=1"
    assert "gpu_share=0.25, " not in split.describe() and "persistent_workers=True, gpu_share=0.5" in (
        Setting(4, 2, True, 1, gpu_share=0.5, persistent_workers=True).describe()
    )
    # both ends measured: the summary says what each read
    cpu, gpu = Measured(Setting(4, 2, True, 1, 0.0), 30.0, 0.01, 90, 3.0), Measured(split, 40.0, 0.01, 90, 2.2)
    gpu_end = Measured(Setting(4, 2, True, 1, 1.0), 20.0, 0.01, 90, 4.5)
    result = OnlineResult(start=cpu, kept=gpu, trials=[cpu, gpu, gpu_end], done=True, stop_reason="...")
    assert "decode on the CPU only 30.0 steps/s, on the GPU only 20.0" in result.summary()


def test_a_move_of_the_share_toward_the_cpu_carries_workers_for_its_part_of_the_decode():
    # the GPU end's 4 workers only read files; decoding every image on the CPU takes the policy's 15
    space = SettingSpace(32, 16, False, True, tune_share=True, decode_workers=15)
    gpu_end = Setting(4, 2, True, 16, gpu_share=1.0)
    moves = {s.gpu_share: s for s in space.neighbours(gpu_end) if s.gpu_share != 1.0}
    assert moves[0.0].num_workers == 15 and moves[0.0].prefetch_factor == 2
    assert moves[0.5].num_workers == 4 + 6, "half the images: half the decode workers more"
    # toward the GPU, or from as many workers already: the count stays (worker moves follow)
    cpu_end = Setting(15, 2, True, 16, gpu_share=0.0)
    assert {s.num_workers for s in space.neighbours(cpu_end) if s.gpu_share != 0.0} == {15}
    assert [s.num_workers for s in SettingSpace(32, 16, False, True, tune_share=True).neighbours(gpu_end)][:2] == [4, 4]


def test_a_close_calls_look_runs_past_max_batches_to_the_error_it_was_asked():
    from lightning_dataperf.autotune.online import Segment

    loop = OnlineLoop(ZERO, CPU, max_batches=20, min_seconds=0.0)
    plain, close = Segment(ZERO, None), Segment(ZERO, None, precision=0.01)
    for segment in (plain, close):
        for period in itertools.islice(itertools.cycle([0.09, 0.11]), 30):
            segment.add(period)
    assert loop._full(plain) and not loop._full(close), "only its error, or max_seconds, ends a close call's look"


def test_a_close_calls_look_is_asked_no_finer_than_two_thirds_of_the_loops_own_precision():
    from lightning_dataperf.autotune.online import Segment

    def decided(precision):
        loop = OnlineLoop(ZERO, CPU, precision=precision, min_seconds=0.0)
        look = Segment(ZERO, None, precision=0.001)  # a lead the looks could never decide at the loop's precision
        for period in itertools.islice(itertools.cycle([0.05, 0.15]), 40):
            look.add(period)
        return loop._decided(look)

    assert decided(10.0), "a coarse precision of your own keeps a close call's looks coarse"
    assert not decided(0.03), "at the default 3%, the look runs on towards 2%"


def test_after_a_drift_the_summary_gives_no_gain_from_rates_of_different_moments():
    # dicts, 2 cores: kept 0 workers + 1 thread, last read 887.7 steps/s after two drifts; the start read 921.4 first
    start = Measured(ZERO, 921.4, 0.01, 922, 1.0)
    kept = Measured(Setting(0, None, False, 1), 887.7, 0.005, 888, 1.0)
    result = OnlineResult(start=start, kept=kept, trials=[start, kept], done=True, stop_reason="...", looks=2)
    summary = result.summary()
    assert result.gain is None and "0.96x" not in summary
    assert "no gain given: the step rate drifted after the start's 921.4 steps/s were measured" in summary
    assert "looked again 2 times after the step rate drifted" in summary
    assert OnlineResult(start=start, kept=kept, trials=[start, kept], done=True).gain == kept.steps_per_sec / 921.4
