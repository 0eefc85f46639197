"""Ground-truth accuracy of the CUDA path. Skips without a GPU; run on the H200 (see benchmarks/README.md)."""

import lightning.pytorch as pl
import pytest
import torch
from helpers import trainer_kwargs

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.testing import GpuSleepModel, calibrate_cuda_sleep, sleeping_loader

pytestmark = pytest.mark.cuda


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
