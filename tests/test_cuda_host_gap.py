"""Host gap on a real GPU: a step that makes the GPU wait for the host is split into busy time and gap."""

import time

import lightning.pytorch as pl
import pytest
import torch
from helpers import sleepy_loader, trainer_kwargs

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.testing import calibrate_cuda_sleep
from lightning_dataperf.timing.host_gap import HostGapProbe

pytestmark = pytest.mark.cuda


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


def test_probe_splits_the_device_span_into_busy_and_gap(tmp_path):
    perf = fit_probed(tmp_path, LateLaunch(calibrate_cuda_sleep()))
    gap = perf.last_summary.host_gap
    assert gap is not None and gap.steps == 6
    assert gap.gpu_busy_s == pytest.approx(0.004, rel=0.3), gap  # the two sleeps (plus the small layer's kernels)
    assert gap.host_gap_s == pytest.approx(0.004, rel=0.4), gap  # the host's 6 ms less the first kernel's 2 ms
    assert perf.last_diagnosis.findings, perf.last_diagnosis.format()
    assert "host_bound" in [finding.kind for finding in perf.last_diagnosis.findings], perf.last_diagnosis.format()


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


def test_the_backward_pass_autograd_launches_from_its_own_thread_is_the_steps_gpu_work(tmp_path):
    perf = fit_probed(tmp_path, BackwardWork(calibrate_cuda_sleep()))
    gap = perf.last_summary.host_gap
    assert gap is not None and not gap.other_threads_kept, gap
    assert gap.gpu_busy_s == pytest.approx(0.005, rel=0.25), gap  # forward 2 ms + backward 3 ms, not 2 ms
