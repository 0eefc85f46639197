import pytest
import torch

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
