"""The host-gap arithmetic on profiler events (CPU), and the real profiler on a GPU (the tests marked cuda)."""

import time
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from helpers import sleepy_loader, trainer_kwargs

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.testing import calibrate_cuda_sleep
from lightning_dataperf.timing.host_gap import HostGapProbe, _stats, split_device_span

MS = 1_000_000


def event(name, device, correlation, start_ms, duration_ms=0.0, thread=1):
    return SimpleNamespace(
        device_resource_id=lambda: thread,
        name=lambda: name,
        device_type=lambda: f"DeviceType.{device}",
        correlation_id=lambda: correlation,
        start_ns=lambda: int(start_ms * MS),
        duration_ns=lambda: int(duration_ms * MS),
    )


def test_union_of_overlapping_intervals():
    assert split_device_span([]) == (0, 0)
    assert split_device_span([(0, 2), (1, 3), (6, 8)]) == (8, 5)  # [0, 3] and [6, 8]: busy 5 of 8


def test_kernels_are_assigned_to_the_step_that_launched_them():
    events = [
        # step 0 (host window 0-10 ms): two 2 ms kernels with a 4 ms wait for the host between them
        event("cudaLaunchKernel", "CPU", 1, 0.5),
        event("spin_kernel", "CUDA", 1, 1.0, 2.0),
        event("cudaLaunchKernel", "CPU", 2, 6.5),
        event("spin_kernel", "CUDA", 2, 7.0, 2.0),
        # step 1 (host window 20-30 ms): back-to-back work, no gap
        event("cudaLaunchKernel", "CPU", 3, 20.5),
        event("gemm", "CUDA", 3, 21.0, 3.0),
        event("cudaMemcpyAsync", "CPU", 4, 20.6),
        event("Memcpy HtoD", "CUDA", 4, 24.0, 1.0),
        event("aten::mm", "CPU", 99, 20.4),  # a CPU op: neither launch nor device work
    ]
    stats = _stats(events, [(0, 10 * MS), (20 * MS, 30 * MS)], first_step=7)
    assert stats.steps == 2 and stats.first_step == 7
    assert stats.span_s == pytest.approx((0.008 + 0.004) / 2)
    assert stats.gpu_busy_s == pytest.approx((0.004 + 0.004) / 2)
    assert stats.host_gap_s == pytest.approx(0.002)
    assert stats.gap_share == pytest.approx(0.002 / 0.006)


def test_work_on_other_threads_streams_is_not_the_steps_but_its_backward_thread_is():
    """A decode thread on its own stream (99) is left out; autograd's thread (33) launching on the step's stream (7)
    is the step's backward pass and counts. Resource ids: a launch's is its thread, a kernel's its stream."""
    events = [
        event("cudaLaunchKernel", "CPU", 1, 0.5, thread=11),
        event("forward_kernel", "CUDA", 1, 1.0, 2.0, thread=7),
        event("cudaLaunchKernel", "CPU", 2, 1.0, thread=-22),  # the decode thread (a signed int32 resource id)
        event("decode_kernel", "CUDA", 2, 3.0, 5.0, thread=99),
        event("cudaLaunchKernel", "CPU", 3, 6.5, thread=33),  # autograd's device thread
        event("backward_kernel", "CUDA", 3, 8.0, 1.0, thread=7),
    ]
    windows = [(0, 10 * MS)]
    ours = _stats(events, windows, first_step=0, threads=frozenset({11}))
    assert ours.gpu_busy_s == pytest.approx(0.003) and ours.span_s == pytest.approx(0.008)
    # under DDP autograd's thread also queues the all-reduce on NCCL's stream (8): the step's work too
    nccl = [
        *events,
        event("cudaLaunchKernel", "CPU", 4, 7.0, thread=33),
        event("allreduce", "CUDA", 4, 9.0, 0.5, thread=8),
    ]
    assert _stats(nccl, windows, first_step=0, threads=frozenset({11})).gpu_busy_s == pytest.approx(0.0035)
    assert not ours.other_threads_kept
    decode = _stats(events, windows, 0, threads=frozenset({-22 & 0xFFFFFFFF}))  # seen from the decode thread
    assert decode.gpu_busy_s == pytest.approx(0.005)
    unknown = _stats(events, windows, first_step=0, threads=frozenset({44}))  # ids not recognised: say so
    assert unknown.gpu_busy_s == pytest.approx(0.008) and unknown.other_threads_kept
    assert "thread ids not recognised" in unknown.format()


def test_probe_without_cuda_profiling_turns_itself_off_with_one_warning(monkeypatch):
    probe = HostGapProbe(start_step=0, steps=1)

    def broken(*args, **kwargs):
        raise RuntimeError("CUPTI not available")

    monkeypatch.setattr("torch.profiler.profile", broken)
    with pytest.warns(UserWarning, match="host-gap probe is off"):
        probe.step_started(0)
    assert probe.disabled and not probe.active and probe.step_finished(0) is False
    probe.step_started(1)  # no second warning, no profiler
    assert probe.result() is None
    with pytest.raises(ValueError, match="steps >= 1"):
        HostGapProbe(steps=0)


# ---------------------------------------------------------------------------------------------- on a GPU
# Host gap on a real GPU (marked cuda): a step that makes the GPU wait for the host is split into busy time
# and gap.


class LateLaunch(pl.LightningModule):
    """2 ms of GPU work, 6 ms of host time before the next launch, 2 ms more: busy 4 ms, gap ~4 ms."""

    def __init__(self, cycles_per_ms: float) -> None:
        super().__init__()
        self.cycles = int(2.0 * cycles_per_ms)
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        torch.cuda._sleep(self.cycles)
        time.sleep(0.006)
        torch.cuda._sleep(self.cycles)
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def fit_probed(tmp_path, model) -> DataPerfCallback:
    """One CUDA epoch of 20 steps of ``model`` with the host-gap probe on steps 5-10."""
    perf = DataPerfCallback(print_summary=False, host_gap_probe=HostGapProbe(start_step=5, steps=6))
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], **trainer_kwargs(tmp_path, accelerator="cuda"))
    trainer.fit(model, sleepy_loader(8 * 20, 8, 0.0))
    return perf


@pytest.mark.cuda
def test_probe_splits_the_device_span_into_busy_and_gap(tmp_path):
    perf = fit_probed(tmp_path, LateLaunch(calibrate_cuda_sleep()))
    gap = perf.last_summary.host_gap
    assert gap is not None and gap.steps == 6
    assert gap.gpu_busy_s == pytest.approx(0.004, rel=0.3), gap  # the two sleeps (plus the small layer's kernels)
    assert gap.host_gap_s == pytest.approx(0.004, rel=0.4), gap  # the host's 6 ms less the first kernel's 2 ms
    assert perf.last_diagnosis.findings, perf.last_diagnosis.format()
    assert "host_bound" in [finding.kind for finding in perf.last_diagnosis.findings], perf.last_diagnosis.format()


@pytest.mark.cuda
def test_kernels_of_another_thread_on_its_own_stream_are_not_the_steps_gpu_work(tmp_path):
    """A GPU-decode-like thread keeps its own stream busy through the profiled steps: GPU busy stays the step's."""
    import threading

    cycles_per_ms = calibrate_cuda_sleep()
    stop = threading.Event()

    def background() -> None:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            while not stop.is_set():
                torch.cuda._sleep(int(1.0 * cycles_per_ms))
                stream.synchronize()

    worker = threading.Thread(target=background, daemon=True)
    worker.start()
    try:
        perf = fit_probed(tmp_path, LateLaunch(cycles_per_ms))
    finally:
        stop.set()
        worker.join()
    gap = perf.last_summary.host_gap
    assert gap is not None and not gap.other_threads_kept, gap
    assert gap.gpu_busy_s == pytest.approx(0.004, rel=0.3), gap  # not the background thread's ~1 ms kernels


class _SleepInBackward(torch.autograd.Function):
    """Identity forward; the backward pass (run by autograd's own device thread) spins the GPU ``cycles``."""

    @staticmethod
    def forward(ctx, x, cycles):
        ctx.cycles = cycles
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        torch.cuda._sleep(ctx.cycles)
        return grad, None


class BackwardWork(pl.LightningModule):
    """2 ms of GPU work in the forward pass, 3 ms in the backward pass: GPU busy about 5 ms."""

    def __init__(self, cycles_per_ms: float) -> None:
        super().__init__()
        self.forward_cycles, self.backward_cycles = int(2.0 * cycles_per_ms), int(3.0 * cycles_per_ms)
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        torch.cuda._sleep(self.forward_cycles)
        return _SleepInBackward.apply(self.layer(batch), self.backward_cycles).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


@pytest.mark.cuda
def test_the_backward_pass_autograd_launches_from_its_own_thread_is_the_steps_gpu_work(tmp_path):
    perf = fit_probed(tmp_path, BackwardWork(calibrate_cuda_sleep()))
    gap = perf.last_summary.host_gap
    assert gap is not None and not gap.other_threads_kept, gap
    assert gap.gpu_busy_s == pytest.approx(0.005, rel=0.25), gap  # forward 2 ms + backward 3 ms, not 2 ms
