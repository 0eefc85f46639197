"""The worker climb (Search): past twice the CPUs, the bracket halved, the bounds and spent CPUs it stops at, deeper
queues, repeats of a slow step, the stop told against the answer."""

from __future__ import annotations

import dataclasses

from autotune_fakes import AveragingRunner, FakeRunner, search_with

from lightning_dataperf.autotune.trial import Trial


def test_io_latency_climb_goes_past_twice_the_cpus_and_says_why_it_stopped():
    # 20 ms of latency per batch per worker, no CPU: the rate grows with workers until 1,000 batches/s.
    runner = FakeRunner(lambda workers, prefetch, pin: min(50.0 * workers, 1000.0))
    search = search_with(runner)
    best = search.climb_workers(runner.measure(1, 2, False))
    assert best.num_workers >= 20 > 2 * 2  # twice the 2 CPUs was the old ceiling
    assert search.compare.stop_reason == "gain" and "more gave nothing" in search.compare.stop_detail


def test_no_deeper_queue_is_tried_where_the_main_thread_waited_too_little_to_show_a_gain():
    runner = FakeRunner(lambda w, p, pin: 100.0 * p)
    search = search_with(runner)
    # the workers could make 180 batches/s and 100 arrived, but the main thread waited only 9% of the time:
    # a deeper queue gives back at most +10%, inside this trial's 14% gap
    best = Trial(18, 2, False, 100.0, batches=100, precision=0.067, wait_share=0.09, work_s=0.1, worker_busy=0.9)
    assert search.tune_prefetch(best) is best and not runner.measured
    assert search.tune_prefetch(dataclasses.replace(best, wait_share=0.5)).prefetch_factor > 2 and runner.measured


def test_a_step_that_ties_brackets_the_peak_and_the_climb_halves_the_bracket():
    # mostly idle workers (the climb doubles them): the rate peaks at 48 workers, and 32 and 64 read the same
    def rate(workers, prefetch, pin):
        return 10.0 * workers if workers <= 48 else 480.0 - 10.0 * (workers - 48)

    runner = FakeRunner(rate)
    search = search_with(runner)
    best = search.climb_workers(runner.measure(1, 2, False))
    assert best.num_workers == 48 and search.compare.stop_reason == "gain"
    assert max(workers for workers, _, _ in runner.measured) == 64  # nothing past the bracket's top
    assert [workers for workers, _, _ in runner.measured][-2:] == [48, 56]  # the middle, then the upper half's
    # the peak at 56: the bracket is halved twice (48, then 56), and once more above it (60)
    runner = FakeRunner(lambda workers, prefetch, pin: 10.0 * workers if workers <= 56 else 560 - 30.0 * (workers - 56))
    best = search_with(runner).climb_workers(runner.measure(1, 2, False))
    assert best.num_workers == 56 and [workers for workers, _, _ in runner.measured][-3:] == [64, 48, 56]
    assert (60, 2, False) not in runner.measured  # 56 -> 64 lost, but is less than a step (68): not halved
    # no middle past a bound the step's own trial set (here: 40 workers), nor one cut short
    capped = FakeRunner(rate)
    capped.worker_bounds = lambda prefetch, pin: {"memory": 40} if (64, 2, False) in capped.trials else {}
    best = search_with(capped).climb_workers(capped.measure(1, 2, False))
    assert best.num_workers == 32 and (48, 2, False) not in capped.measured

    # a middle faster by the noise but not beyond the two trials' error is measured again, and kept still so
    def unsure_rate(w, p, pin):
        return 333.0 if w == 48 else min(10.0 * w, 320.0)

    # (the hand-over sending by file name reads half: not a tie, so not measured again)
    unsure = FakeRunner(unsure_rate, sharing_rate=lambda *config: 0.5 * unsure_rate(*config))
    best = search_with(unsure).climb_workers(unsure.measure(1, 2, False))
    assert best.num_workers == 48 and best.measurements == 2 and unsure.remeasured == [(48, 2, False)]
    # a step that lost, one step above the best (15 -> 18, capped by a bound): the middle is tried all the same,
    # but not the next (16 -> 18 is less than a step)
    rates = {15: 36.0, 16: 40.0, 18: 28.0}
    lost = FakeRunner(lambda w, p, pin: rates.get(w, 10.0), bounds={"memory": 18}, busy=0.9)
    best = search_with(lost).climb_workers(lost.measure(15, 2, False))
    assert best.num_workers == 16 and [w for w, _, _ in lost.measured] == [15, 18, 16]  # not 17: within one step
    # the budget ran out with the first middle: the next is not measured, and the stop says the budget, not the gain
    spent = FakeRunner(rate)
    measure_spent = spent.measure

    def measure_until_48(workers, prefetch, pin, against=None):
        trial = measure_spent(workers, prefetch, pin)
        spent.remaining = 0.0 if workers == 48 else spent.remaining
        return trial

    spent.measure = measure_until_48
    search = search_with(spent)
    assert search.climb_workers(spent.measure(1, 2, False)).num_workers == 48 and (56, 2, False) not in spent.trials
    assert (
        search.compare.stop_reason == "time budget"
        and "before 56 workers, between 48 (best) and 64" in search.compare.stop_detail
    )
    rough = FakeRunner(rate)
    measure = rough.measure
    rough.measure = lambda w, p, pin, against=None: dataclasses.replace(measure(w, p, pin), rough=w == 48)
    assert search_with(rough).climb_workers(rough.measure(1, 2, False)).num_workers == 32
    flat = FakeRunner(lambda workers, prefetch, pin: min(10.0 * workers, 320.0))  # flat past 32: 48 ties too
    best = search_with(flat).climb_workers(flat.measure(1, 2, False))
    assert best.num_workers == 32 and [workers for workers, _, _ in flat.measured][-2:] == [64, 48]


def test_climb_stops_at_the_smallest_bound_and_names_it():
    runner = FakeRunner(lambda workers, prefetch, pin: 50.0 * workers, bounds={"file descriptors": 24, "dataset": 99})
    search = search_with(runner)
    best = search.climb_workers(runner.measure(1, 2, False))
    assert best.num_workers == 24 and max(config[0] for config in runner.measured) == 24
    assert search.compare.stop_reason == "file descriptors" and "24 workers" in search.compare.stop_detail


def test_a_slow_trial_at_the_end_of_the_climb_is_measured_again_before_it_stops_the_search():
    seen = set()

    def rate(workers, prefetch, pin):
        if workers == 8 and workers not in seen:  # start-up artefact: measured once at 2.5 batches/s
            seen.add(workers)
            return 2.5
        return 50.0 * min(workers, 16)

    runner = FakeRunner(rate)
    best = search_with(runner).climb_workers(runner.measure(4, 2, False))
    assert (8, 2, False) in runner.remeasured and best.num_workers == 16

    # a loss of 12% is taken as measured (more workers contend): not repeated, the middle is measured instead
    def contended(workers, prefetch, pin):
        return 50.0 * workers if workers <= 16 else 800 - 6.25 * (workers - 16)

    runner = FakeRunner(contended, sharing_rate=lambda *config: 0.5 * contended(*config))  # no hand-over tie
    best = search_with(runner).climb_workers(runner.measure(4, 2, False))
    assert best.num_workers == 16 and not runner.remeasured and runner.measured[-2:] == [(32, 2, False), (24, 2, False)]


def test_a_bound_read_from_the_best_trial_itself_is_said_as_such():
    # 2-core VM, I/O-latency loader: 77 workers measured fastest, and their CPU time together had not grown
    # over 52's, so the CPU-share bound read from them fell to 67, below the best measured
    runner = FakeRunner(lambda workers, prefetch, pin: 10.0 * workers, bounds={"CPU share": 67, "memory": 1081})
    search = search_with(runner)
    best = search.climb_workers(runner.measure(52, 2, False))
    assert best.num_workers == 67 and search.compare.stop_reason == "CPU share"
    assert search.compare.stop_detail.endswith("(CPU share 67, memory 1081)")  # the climb reached the bound itself
    search = search_with(runner)
    runner.measure(77, 2, False)
    best = search.climb_workers(runner.trials[(77, 2, False)])
    assert best.num_workers == 77 and search.compare.stop_detail.endswith("; 77 were measured before it")


def test_a_start_the_training_path_limits_does_not_climb():
    runner = FakeRunner(lambda workers, prefetch, pin: 100.0)
    runner.trials[(8, 2, False)] = Trial(8, 2, False, 100.0, batches=40, work_s=0.02, main_s=0.01, wait_share=0.01)
    search = search_with(runner, min_workers=1)
    best = search.climb_workers(runner.trials[(8, 2, False)])
    assert search.compare.stop_reason == "path" and "training path is the limit" in search.compare.stop_detail
    assert all(config[0] <= 8 for config in runner.measured)  # never more workers
    assert best.num_workers == 3  # 100 batches/s x 20 ms x 1.15 = 2.3 -> 3 workers, as fast


class RoughAbove(FakeRunner):
    """A dataset that runs out before one steady round of more than 8 workers."""

    def measure(self, workers, prefetch, pin, against=None):
        trial = super().measure(workers, prefetch, pin, against)
        if workers > 8 and not trial.rough:
            trial = self.trials[trial.config] = dataclasses.replace(trial, batches=6, rough=True)
        return trial

    def remeasure(self, trial, cap_scale=1.0, against=None):
        if trial.rough:  # as TrialRunner: a repeat cut before one steady round measures nothing (the trial itself)
            self.remeasured.append(trial.config)
            return trial
        return super().remeasure(trial, cap_scale, against)


def test_a_rough_step_up_ends_the_climb_without_a_figure():
    runner = RoughAbove(lambda workers, prefetch, pin: 50.0 * workers)
    search = search_with(runner)
    best = search.climb_workers(runner.measure(1, 2, False))
    assert best.num_workers <= 8 and not best.rough
    assert (
        search.compare.stop_reason == "cut short"
        and "cut before one steady round (not ranked)" in search.compare.stop_detail
    )
    assert "%" not in search.compare.stop_detail  # no gain or loss quoted from a burst


def test_a_repeat_still_ahead_within_noise_has_the_best_measured_again_too():
    # the 2-core io row (session 15): 64 workers read 697 batches/s once the default way (the grid: 551-579);
    # sent by file name they read 729, then 705 measured twice: +1% against the one high look, not kept
    def confirmed(best_looks, repeat):
        default = iter(best_looks)
        runner = FakeRunner(lambda workers, prefetch, pin: next(default), sharing_rate=lambda *config: repeat)
        search = search_with(runner)
        best = runner.measure(64, 2, False)
        runner.trials[best.config] = best = dataclasses.replace(best, precision=0.05)
        trial = Trial(64, 2, False, 729.2, batches=20, precision=0.05, sharing="file_system")
        runner.earlier.append(trial)
        return runner, search.compare.confirmed(trial, best)

    runner, (again, faster) = confirmed([697.2, 570.0], 705.1)
    assert faster and again.batches_per_sec == 705.1
    assert runner.remeasured == [(64, 2, False), (64, 2, False)]  # the new trial, then the best
    runner, (again, faster) = confirmed([697.2, 690.0], 705.1)  # the best holds: within noise, not faster
    assert not faster and len(runner.remeasured) == 2
    runner, (again, faster) = confirmed([697.2], 680.0)  # the repeat fell behind: the best is not measured again
    assert not faster and runner.remeasured == [(64, 2, False)]


def test_the_climb_goes_on_from_the_best_as_measured_again_not_its_first_look():
    # 16 workers read 100, then 110 when 32's repeat (104, 101) stayed ahead within noise: 16 is 105 over two
    # looks. The middle, 24, read 103.5: within noise of 105, not a step up; the stop quotes 32 against 105
    looks = {16: [100.0, 110.0, 95.0], 32: [104.0, 101.0], 24: [103.5, 101.5], 28: [90.0]}
    runner = AveragingRunner({**looks, **{workers: [50.0] for workers in range(1, 16)}})
    search = search_with(runner)
    best = search.climb_workers(runner.measure(16, 2, False))
    assert best.num_workers == 16 and (best.batches_per_sec, best.measurements) == (105.0, 2)
    assert runner.remeasured == [(32, 2, False), (16, 2, False)]  # 16 once, its two looks kept
    assert search.compare.stop_detail == "more gave nothing (32 workers: -2%)"


def test_the_climb_stops_where_the_cost_model_says_the_cpus_are_spent():
    from lightning_dataperf.autotune.search import Search
    from lightning_dataperf.autotune.trial import Limits

    # 3 workers on 2 CPUs, each batch 80 ms of a worker's CPU, the main thread busy 13%: (2 - 0.13) / 0.08
    # = 23.4 batches/s is all the CPUs can make, and 24 were measured
    timing = dict(worker_busy=0.6, work_s=0.12, cpu_s=0.08, main_s=0.006, wait_share=0.87)
    start = Trial(3, 2, False, 24.0, batches=40, **timing)
    runner = FakeRunner(lambda workers, prefetch, pin: 24.0)
    runner.trials[start.config] = start
    search = Search(runner, {}, (False,), Limits(30.0, 200, 0.03, 0.5, None, 1), cpus=2)
    assert search.climb_workers(start) is start and search.compare.stop_reason == "CPUs"
    assert "23.4 batches/s" in search.compare.stop_detail and runner.measured == []
    # half the CPU per batch: the CPUs could make twice as much, so it climbs
    runner = FakeRunner(lambda workers, prefetch, pin: 24.0)
    search = Search(runner, {}, (False,), Limits(30.0, 200, 0.03, 0.5, None, 1), cpus=2)
    search.climb_workers(dataclasses.replace(start, cpu_s=0.04))
    assert runner.measured and runner.measured[0][0] > 3


def test_the_climb_stops_where_the_whole_path_spends_the_cpus_though_the_workers_only_wait():
    from lightning_dataperf.autotune.search import Search
    from lightning_dataperf.autotune.trial import Limits

    # a latency loader: each worker waits 80 ms per batch and computes 1 ms of it (in-loader), so the
    # in-loader model sees no CPU limit; but the OS says the path spent 8.3 ms of CPU per batch at 48
    # workers (the hand-over of their batches, the main thread) and 8.4 at 16: 2 CPUs / 8.3 ms = 241
    # batches/s at most, with 240 measured
    timing = dict(worker_busy=0.1, work_s=0.08, cpu_s=0.001, main_s=0.002, wait_share=0.5)
    start = Trial(48, 2, False, 240.0, batches=400, tree_cpu_s=0.0083, **timing)
    below = Trial(16, 2, False, 180.0, batches=200, tree_cpu_s=0.0084, **timing)

    def climb(*trials):
        runner = FakeRunner(lambda workers, prefetch, pin: 240.0)
        runner.trials.update({trial.config: trial for trial in trials})
        search = Search(runner, {}, (False,), Limits(30.0, 200, 0.03, 0.5, None, 1), cpus=2)
        return search, runner, search.climb_workers(trials[0])

    search, runner, best = climb(start, below)
    # (the hand-over's trial after the stop reads the same: raced, so 48 is measured again; no climb trial)
    assert best.config == start.config and search.compare.stop_reason == "CPUs", search.compare.stop_detail
    assert "241.0 batches/s" in search.compare.stop_detail and runner.measured == []
    # fewer workers made cheaper batches (16: 7.0 ms, as on the 2-core VM): more workers will not be cheaper
    # than 48's own 8.3 ms, so the CPUs are spent all the same
    search, runner, best = climb(start, dataclasses.replace(below, tree_cpu_s=0.0070))
    assert best.config == start.config and search.compare.stop_reason == "CPUs" and runner.measured == []
    # more workers measured cheaper (96: 7.0 ms, as on the H200: 18 workers 10% below 15), the CPUs might
    # make 286 batches/s; one point alone, or another prefetch depth, proves nothing: it climbs
    for trials in (
        (start, below, Trial(96, 2, False, 230.0, batches=200, tree_cpu_s=0.0070, **timing)),
        (start,),
        (start, Trial(16, 4, False, 180.0, batches=200, tree_cpu_s=0.0084, **timing)),
    ):
        search, runner, _ = climb(*trials)
        assert runner.measured and runner.measured[0][0] > 48, search.compare.stop_detail
    # without the OS figure (psutil missing): the in-loader model sees no CPU limit and climbs
    search, runner, _ = climb(dataclasses.replace(start, tree_cpu_s=None), below)
    assert runner.measured and runner.measured[0][0] > 48


def test_a_bound_less_than_one_step_away_ends_the_climb_without_a_trial():
    # 20 workers gaining; the smallest bound allows 22: +10%, less than the 20% a trial can resolve
    runner = FakeRunner(lambda workers, prefetch, pin: 10.0 * workers, bounds={"CPU share": 22})
    search = search_with(runner)
    start = Trial(20, 2, False, 200.0, batches=200)
    runner.trials[start.config] = start
    assert search.climb_workers(start) is start and runner.measured == []
    assert search.compare.stop_reason == "CPU share" and "less than one step above 20" in search.compare.stop_detail


def test_the_stop_is_told_against_the_answer_when_the_choice_took_fewer_workers():
    # a newcomer's run: the climb stopped at 4 workers (80.2), 12 read 100.2 ("+25%", within its noise), and the
    # choice took the middle, 8 (108.7): the stop said "more gave nothing (12 workers: +25%)" next to "8 workers"
    runner = FakeRunner(lambda workers, prefetch, pin: {4: 80.2, 8: 108.7, 12: 100.2}[workers])
    search = search_with(runner)
    four, twelve, eight = (runner.measure(workers, 2, False) for workers in (4, 12, 8))
    search.compare.stop("gain", "more gave nothing (12 workers: +25%); 2 workers cannot be as fast")
    search.gained_nothing = twelve, "more gave nothing (12 workers: +25%)"
    search.stop_against(four)  # the answer is the best at the stop: its words stand
    assert search.compare.stop_detail.startswith("more gave nothing (12 workers: +25%)")
    search.stop_against(eight)
    assert search.compare.stop_detail == "more gave nothing (12 workers: -8%); 2 workers cannot be as fast"
    search.stop_against(twelve)  # not fewer workers than the step: unchanged
    assert search.compare.stop_detail == "more gave nothing (12 workers: -8%); 2 workers cannot be as fast"
