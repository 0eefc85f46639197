"""TrialRunner: a trial's rate and start-up, its workers reused and their CPU read, repeats and the budget it
reserves, the path and the dataset slice its batches take."""

from __future__ import annotations

import dataclasses
import threading

import torch
from autotune_fakes import FakeRunner, SlowSamples
from helpers import fake_hardware

from lightning_dataperf.autotune.trial import Trial
from lightning_dataperf.testing import SleepingLoaderDataset


class BusySamples(SleepingLoaderDataset):
    """CPU-bound samples: 1 ms of busy loop each."""

    def __getitem__(self, index):
        import time

        until = time.thread_time() + 0.001
        while time.thread_time() < until:
            pass
        return super().__getitem__(index)


def test_outliers_against_their_neighbours_are_repeated():
    rates = {1: 50.0, 2: 100.0, 4: 30.0, 8: 400.0, 16: 420.0}
    runner = FakeRunner(lambda workers, prefetch, pin: rates[workers])
    for workers in rates:
        runner.measure(workers, 2, False)
    from lightning_dataperf.autotune.runner import repeat_outliers

    repeat_outliers(runner)
    assert runner.remeasured == [(4, 2, False)]


def test_a_trial_is_never_faster_than_its_workers_can_make_batches():
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    # each batch of 4 waits >= 4 x 2 ms in its worker: 3 workers make at most 375 batches/s, however deep the
    # queue they filled during start-up (a loaded machine only makes them slower)
    limits = Limits(60.0, 200, 0.03, 0.5, None, 0, trial_seconds=2.0)
    runner = TrialRunner(SlowSamples(20000), 4, {}, fake_hardware(usable_cpus=2), TransferPath(), limits)
    runner.learn_batch_size()
    try:
        trial = runner.run(3, 16, False)
    finally:
        runner.close()
    assert 0 < trial.batches_per_sec <= 3 / 0.008 * 1.05, trial


class ThreadsSeen(torch.utils.data.Dataset):
    def __init__(self):
        self.seen = []

    def __len__(self):
        return 64

    def __getitem__(self, index):
        self.seen.append(torch.get_num_threads())
        return torch.zeros(2)


def test_the_batch_loaded_in_this_process_uses_no_more_threads_than_the_ranks_cpus():
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    # a thread count from the whole machine (an affinity set after start-up, a CPU quota): the one batch autotune
    # loads in this process runs on the rank's CPUs, and the process's own count is left as it was
    before = torch.get_num_threads()
    dataset = ThreadsSeen()
    torch.set_num_threads(3)
    try:
        limits = Limits(10.0, 100, 0.03, 0.5, None, 0)
        TrialRunner(dataset, 4, {}, fake_hardware(usable_cpus=1), TransferPath(), limits).learn_batch_size()
        assert dataset.seen == [1] * 4
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


class SlowStart(SleepingLoaderDataset):
    def __getitem__(self, index):
        threading.Event().wait(0.005)
        return super().__getitem__(index)


def _slow_worker_start(worker_id):
    threading.Event().wait(1.0)


def test_worker_start_up_is_reported_apart_and_not_ranked_on():
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    limits = Limits(20.0, 400, 0.03, 0.5, None, 1, trial_seconds=10.0)
    runner = TrialRunner(
        SlowStart(4000), 4, {"worker_init_fn": _slow_worker_start}, fake_hardware(), TransferPath(), limits
    )
    runner.learn_batch_size()
    trial = runner.measure(2, 2, False)
    assert trial.startup_s >= 0.95 and trial.seconds >= trial.startup_s
    # Steady: 2 workers x 4 samples x 5 ms = 100 batches/s. With the >= 1 s start-up counted it would read
    # batches / seconds; without it about batches / (seconds - start-up): at least half of it is left out,
    # however long the trial ran (a loaded machine measures longer)
    with_start_up = trial.batches / trial.seconds
    assert trial.batches_per_sec > 30.0
    assert trial.batches_per_sec > with_start_up / (1 - 0.5 * trial.startup_s / trial.seconds)


def test_a_busy_step_bounds_the_rate_on_the_host():
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    limits = Limits(10.0, 60, 0.03, 0.5, None, 0, trial_seconds=2.0)
    path = TransferPath(step_seconds=0.02)  # 20 ms of main-thread work per batch: at most 50 batches/s
    runner = TrialRunner(SleepingLoaderDataset(4000), 4, {}, fake_hardware(), path, limits)
    runner.learn_batch_size()
    assert 0 < runner.measure(0, None, False).batches_per_sec <= 50.0 * 1.02


def test_trials_take_the_strategys_path_side_stream_pinned_only():
    from types import SimpleNamespace

    from lightning_dataperf.autotune.options import SearchTuning
    from lightning_dataperf.datamodule.tuning import transfer_path_of
    from lightning_dataperf.transfer.strategies import SideStreamTransferMixin

    class FakeSideStream(SideStreamTransferMixin):
        root_device = torch.device("cuda", 0)
        side_stream_active = True

    def transform(batch):
        return batch

    strategy = FakeSideStream.__new__(FakeSideStream)
    strategy.pin, strategy.min_bytes, strategy.device_transform = True, 1024, transform
    path = transfer_path_of(SimpleNamespace(strategy=strategy), SearchTuning(step_seconds=0.011))
    assert path.side_stream and path.pin_choices() == (True,) and path.min_bytes == 1024
    assert path.device_transform is transform and path.step_seconds == 0.011
    stock = SimpleNamespace(root_device=torch.device("cuda", 0))
    assert transfer_path_of(SimpleNamespace(strategy=stock), SearchTuning()).pin_choices() == (True, False)
    host = SimpleNamespace(root_device=torch.device("cpu"))
    assert transfer_path_of(SimpleNamespace(strategy=host), SearchTuning()).describe() == "host"


def test_a_repeat_of_the_last_trial_reuses_its_workers(tmp_path):
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    limits = Limits(30.0, 200, 0.03, 0.5, None, 1, trial_seconds=3.0)
    runner = TrialRunner(
        SlowStart(4000), 4, {"worker_init_fn": _slow_worker_start}, fake_hardware(), TransferPath(), limits
    )
    runner.learn_batch_size()
    first = runner.measure(2, 2, False)
    again = runner.run(2, 2, False)  # the same configuration next: its workers are still alive
    assert again.startup_s == -1.0 and again.batches_per_sec > 30.0  # no start-up paid, steady rate measured
    merged = runner.remeasure(first)
    assert merged.measurements == 2 and merged.startup_s == first.startup_s >= 0.95
    runner.close()
    fresh = runner.run(2, 2, False)
    runner.close()
    assert fresh.startup_s >= 0.95 and again.work_s is not None and again.wait_share is not None


def test_a_repeat_that_measured_nothing_is_said_so_not_shown_as_a_new_trial(monkeypatch):
    import io

    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.progress import LogProgress
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    # the H200 side-stream row: 22 workers' repeat was cut by the budget, and the log showed trial 4 twice
    stream = io.StringIO()
    limits = Limits(100.0, 60, 0.03, 0.5, None, 0)
    runner = TrialRunner(SlowSamples(100), 4, {}, fake_hardware(), TransferPath(), limits, listener=LogProgress(stream))
    first = Trial(22, 2, True, 48.3, batches=137, precision=0.05)
    runner.trials[first.config] = first
    cut = Trial(22, 2, True, 60.0, batches=3, rough=True)  # the burst's rate: not averaged in
    monkeypatch.setattr(runner, "run", lambda *config, **options: cut)
    assert runner.remeasure(first) is first
    assert stream.getvalue() == (
        "DataPerf autotune: trial 1/~8 workers=22 prefetch=2 pin=yes: measured nothing more (the time budget ran "
        "out before one steady round); kept at 48.3 batches/s\n"
    )


def test_a_rough_first_measurement_is_replaced_by_a_steady_repeat(monkeypatch):
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    limits = Limits(100.0, 60, 0.03, 0.5, None, 0)
    runner = TrialRunner(SlowSamples(100), 4, {}, fake_hardware(), TransferPath(), limits)
    rough = Trial(18, 2, True, 80.0, batches=3, rough=True)  # a climb trial cut by the budget: the burst's rate
    runner.trials[rough.config] = rough
    steady = Trial(18, 2, True, 37.7, batches=60, precision=0.02, tree_cpu_s=0.3)
    monkeypatch.setattr(runner, "run", lambda *config, **options: steady)
    again = runner.remeasure(rough)
    assert again.batches_per_sec == 37.7 and not again.rough and runner.trials[rough.config] is again


def _busy_trial(samples, batch_budget):
    """One 2-worker trial on CPU-bound samples (1 ms each, batches of 4), read to precision or the batch cap."""
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    limits = Limits(60.0, batch_budget, 0.03, 0.5, None, 0, precision=1e-6, trial_seconds=30.0)
    runner = TrialRunner(BusySamples(samples), 4, {}, fake_hardware(), TransferPath(), limits)
    runner.learn_batch_size()
    try:
        return runner.measure(2, 2, False)
    finally:
        runner.close()


def test_an_iterator_that_ran_out_reports_no_worker_cpu():
    # 160 samples, 40 batches: the trial reads to the end, and the loader shuts its workers down at
    # StopIteration, before their CPU time could be read (it read 1.4 ms per batch against 4.6 in-loader)
    trial = _busy_trial(160, 400)
    assert trial.refused is None and trial.batches >= 2
    assert trial.tree_cpu_s is None and trial.worker_busy is None


def test_a_repeat_the_budget_cut_before_a_steady_round_is_not_averaged_in(monkeypatch):
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    limits = Limits(100.0, 60, 0.03, 0.5, None, 0)
    runner = TrialRunner(SlowSamples(100), 4, {}, fake_hardware(), TransferPath(), limits)
    measured = Trial(18, 2, True, 37.7, batches=80, measurements=2, precision=0.02)
    runner.trials[measured.config] = measured
    # the budget ran out during the queued burst: 36 batches at once, a rate of the queue, not the workers
    rough = Trial(18, 2, True, 13.4, batches=3, rough=True)
    monkeypatch.setattr(runner, "run", lambda *config, **options: rough)
    again = runner.remeasure(measured)
    assert again.batches_per_sec == 37.7 and again.measurements == 2
    steady = dataclasses.replace(rough, batches_per_sec=35.0, batches=60, rough=False)
    monkeypatch.setattr(runner, "run", lambda *config, **options: steady)
    assert runner.remeasure(measured).measurements == 3  # a steady one is


def test_reserved_keeps_budget_back_and_gives_it_back():
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import Limits

    limits = Limits(100.0, 60, 0.03, 0.5, None, 0)
    runner = TrialRunner(SlowSamples(100), 4, {}, fake_hardware(), TransferPath(), limits)
    before = runner.remaining
    with runner.reserved(30.0):
        assert before - 31.0 < runner.remaining < before - 29.0
        with runner.reserved(10.0):
            assert runner.remaining < before - 39.0
            runner.release(10.0)  # given back early
            assert before - 31.0 < runner.remaining < before - 29.0
        assert runner.remaining > before - 31.0
    assert runner.remaining > before - 1.0


def test_a_real_trial_against_a_far_faster_one_stops_before_its_precision(tmp_path):
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import MIN_STEADY_BATCHES, Limits

    # a precision no trial reaches and a cap far away: alone, the trial runs to its 60-batch cap
    limits = Limits(120.0, 60, 0.03, 0.5, None, 0, precision=1e-6, trial_seconds=60.0)
    runner = TrialRunner(SlowSamples(4000), 4, {}, fake_hardware(usable_cpus=2), TransferPath(), limits)
    runner.learn_batch_size()
    alone = runner.run(0, None, False)
    assert alone.batches >= 60
    sprint = Trial(0, None, False, alone.batches_per_sec * 20, batches=20, precision=0.01)
    raced = runner.run(0, None, False, against=sprint)
    assert MIN_STEADY_BATCHES <= raced.batches < alone.batches / 2
    crawl = dataclasses.replace(sprint, batches_per_sec=alone.batches_per_sec / 20)
    assert runner.run(0, None, False, against=crawl).batches >= 60, "far faster than the reference: not cut short"
    runner.close()


def test_a_trial_reads_the_cpu_of_the_workers_and_this_process_per_batch():
    trial = _busy_trial(4000, 60)
    assert trial.tree_cpu_s is not None and trial.cpu_s is not None
    # the workers' whole CPU time (their dataset's busy loop, collate, hand-over) and this process's:
    # at least what the in-loader clock saw inside the dataset, and not the start-up's (bounded loosely:
    # CPU time, not wall, but a loaded VM's steal can inflate it)
    assert 3 * trial.cpu_s > trial.tree_cpu_s >= 0.8 * trial.cpu_s > 0, (trial.tree_cpu_s, trial.cpu_s)


def test_reading_the_workers_memory_is_not_counted_in_the_trials_rate(monkeypatch):
    import time

    from lightning_dataperf.autotune import runner as autotune_trials
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.drain import drain
    from lightning_dataperf.autotune.measures import WorkerCpu
    from lightning_dataperf.autotune.trial import Limits

    read_at = []
    unique_mb = WorkerCpu.unique_mb

    def recorded(self):  # reading /proc/<pid>/smaps of every worker took 0.05-0.4 s on a 2-core VM
        read_at.append(time.perf_counter())
        return unique_mb(self)

    monkeypatch.setattr(WorkerCpu, "unique_mb", recorded)
    limits = Limits(60.0, 24, 0.03, 0.5, None, 0, precision=1e-6, trial_seconds=30.0)
    runner = autotune_trials.TrialRunner(SlowSamples(4000), 4, {}, fake_hardware(), TransferPath(), limits)
    runner.learn_batch_size()
    iterator = iter(runner._loader(2, 2, False))
    try:
        drained = drain(runner, iterator, time.perf_counter(), 2, 3, 4, 1.0, None)  # 2 workers x prefetch 2
    finally:
        autotune_trials.shutdown_loader_iterator(iterator)
    assert read_at and drained.worker_mb is not None
    assert drained.arrivals[-1] <= read_at[0], "the last batch's time must be taken before the memory is read"


def test_each_trial_reads_its_own_slice_of_one_permutation_of_the_dataset():
    from lightning_dataperf.autotune.order import TrialOrder, coprime_stride

    for length in (1, 2, 3, 10, 12, 97, 1000):
        order = list(TrialOrder(length, 5, coprime_stride(length)))
        assert sorted(order) == list(range(length)), length
    stride = coprime_stride(1000)
    first, second = list(TrialOrder(1000, 0, stride))[:40], list(TrialOrder(1000, 40, stride))[:40]
    assert not set(first) & set(second) and max(first) - min(first) > 500  # disjoint, spread over the dataset


def test_a_trial_with_fewer_than_two_batches_says_whether_the_budget_or_the_dataset_ran_out():
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.runner import TrialRunner
    from lightning_dataperf.autotune.trial import BUDGET_REFUSAL, DATASET_REFUSAL, Limits

    limits = Limits(120.0, 60, 0.03, 0.5, None, 0, trial_seconds=60.0)
    runner = TrialRunner(SlowSamples(3), 4, {}, fake_hardware(usable_cpus=2), TransferPath(), limits)
    runner.learn_batch_size()
    assert runner.run(0, None, False).refused == DATASET_REFUSAL  # 3 samples: one batch, then the end
    runner.deadline = 0.0  # a deadline long past: the budget ran out before a second batch
    assert runner.run(0, None, False).refused == BUDGET_REFUSAL
    runner.close()
