"""StepClock on an injected clock; on a GPU (marked cuda, run on the H200: benchmarks/README.md), the ground-truth
accuracy of the CUDA path."""

import lightning.pytorch as pl
import pytest
import torch
from helpers import trainer_kwargs

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.testing import GpuSleepModel, calibrate_cuda_sleep, sleeping_loader
from lightning_dataperf.timing.clock import StepClock


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def run_step(clock, fake, wait, transfer, compute, step):
    clock.fetch_started()
    fake.now += wait
    clock.fetch_finished()
    fake.now += transfer
    clock.step_started()
    fake.now += compute
    clock.step_finished(step, samples=4)


def test_host_clock_splits_wait_transfer_compute():
    fake = FakeClock()
    clock = StepClock(torch.device("cpu"), clock=fake)
    clock.break_continuity(new_epoch=True)
    run_step(clock, fake, 0.5, 0.1, 0.2, 0)
    fake.now += 0.05  # hook/logging gap between steps counts in step time
    run_step(clock, fake, 0.3, 0.1, 0.2, 1)
    first, second = clock.completed()
    assert first.first_of_epoch and first.step_time is None
    assert (first.data_wait, first.transfer, first.compute) == pytest.approx((0.5, 0.1, 0.2))
    assert not second.first_of_epoch
    assert second.step_time == pytest.approx(0.05 + 0.3 + 0.1 + 0.2)
    assert second.input_stall == pytest.approx(0.3) and second.stall_base == pytest.approx(0.65)
    assert second.device_idle is None and second.samples == 4
    assert clock.completed() == []


def test_break_continuity_drops_step_time_across_a_gap():
    fake = FakeClock()
    clock = StepClock(torch.device("cpu"), clock=fake)
    run_step(clock, fake, 0.1, 0.0, 0.1, 0)
    fake.now += 10.0  # e.g. a validation run
    clock.break_continuity()
    run_step(clock, fake, 0.1, 0.0, 0.1, 1)
    _, after_gap = clock.completed()
    assert after_gap.step_time is None and not after_gap.first_of_epoch


def test_step_without_fetch_has_zero_wait_and_unmatched_end_is_ignored():
    fake = FakeClock()
    clock = StepClock(torch.device("cpu"), clock=fake)
    clock.step_finished(0)  # no step started: ignored
    clock.step_started()
    fake.now += 0.2
    clock.step_finished(1)
    (timing,) = clock.completed()
    assert timing.data_wait == 0.0 and timing.compute == pytest.approx(0.2)


def test_reset_forgets_pending_steps():
    fake = FakeClock()
    clock = StepClock(torch.device("cpu"), clock=fake)
    clock.fetch_started()
    clock.step_started()
    clock.reset()
    clock.step_finished(0)
    assert clock.pending == 0 and clock.flush() == []


def test_cpu_clock_never_uses_cuda_events():
    assert not StepClock(torch.device("cpu")).uses_cuda_events
    assert not StepClock(None).uses_cuda_events


# ---------------------------------------------------------------------------------------------- on a GPU
# Ground-truth accuracy of the CUDA path (marked cuda: skipped without a GPU).


@pytest.fixture(scope="module")
def cycles_per_ms():
    return calibrate_cuda_sleep()


def fit_on_gpu(tmp_path, loader_ms, gpu_ms, cycles_per_ms, steps=60):
    perf = DataPerfCallback(print_summary=False)
    trainer = pl.Trainer(
        max_epochs=1, callbacks=[perf], log_every_n_steps=10, **trainer_kwargs(tmp_path, accelerator="cuda")
    )
    trainer.fit(GpuSleepModel(gpu_ms, cycles_per_ms), sleeping_loader(steps, loader_ms))
    return perf.summaries[-1]


@pytest.mark.cuda
def test_host_runs_ahead_device_idle_near_zero(tmp_path, cycles_per_ms, monkeypatch):
    calls = {"synchronize": 0, "event_synchronize": 0}
    real_sync, real_event_sync = torch.cuda.synchronize, torch.cuda.Event.synchronize

    def counting_sync(*args, **kwargs):
        calls["synchronize"] += 1
        return real_sync(*args, **kwargs)

    def counting_event_sync(self):
        calls["event_synchronize"] += 1
        return real_event_sync(self)

    monkeypatch.setattr(torch.cuda, "synchronize", counting_sync)
    monkeypatch.setattr(torch.cuda.Event, "synchronize", counting_event_sync)
    summary = fit_on_gpu(tmp_path, loader_ms=8.0, gpu_ms=15.0, cycles_per_ms=cycles_per_ms)
    assert summary.on_device
    assert summary.timings["DataLoading"].p50 == pytest.approx(8e-3, rel=0.10)
    assert summary.timings["DeviceSpan"].p50 == pytest.approx(15e-3, rel=0.10)
    assert summary.timings["DeviceIdle"].p50 < 0.5e-3
    assert summary.input_stall_fraction < 0.05
    assert calls["synchronize"] <= 2  # never once per step (60 steps)
    assert calls["event_synchronize"] <= 1  # one wait at the epoch end


@pytest.mark.cuda
def test_slow_loader_device_idle_is_loader_minus_gpu_time(tmp_path, cycles_per_ms):
    summary = fit_on_gpu(tmp_path, loader_ms=20.0, gpu_ms=5.0, cycles_per_ms=cycles_per_ms)
    assert summary.timings["DataLoading"].p50 == pytest.approx(20e-3, rel=0.10)
    assert summary.timings["DeviceSpan"].p50 == pytest.approx(5e-3, rel=0.10)
    # The GPU idles for the loader's 20 ms minus its 5 ms of work, plus Lightning's own per-step host
    # time (hooks, optimizer bookkeeping), which is real idle time too: idle = step - GPU work.
    idle, step = summary.timings["DeviceIdle"].p50, summary.timings["Step"].p50
    assert idle >= 15e-3 * 0.97
    assert idle == pytest.approx(step - 5e-3, rel=0.10)
    assert summary.input_stall_fraction == pytest.approx(idle / step, rel=0.10)
