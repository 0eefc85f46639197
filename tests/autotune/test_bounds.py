"""What the machine allows one search: the memory guard, the /dev/shm bound, the CPU-share bound."""

from __future__ import annotations

import threading

import torch
from helpers import fake_hardware

from lightning_dataperf import autotune_loader
from lightning_dataperf.autotune.bounds import Resources
from lightning_dataperf.autotune.trial import Trial
from lightning_dataperf.testing import SleepingLoaderDataset


def test_memory_guard_refuses_oversized_configurations(tmp_path):
    class BigSamples(SleepingLoaderDataset):
        def __getitem__(self, index):
            return torch.zeros(256, 1024)  # 1 MB per sample, 16 MB per batch

    cramped = fake_hardware(usable_cpus=8, shm_free_mb=40.0, ram_available_mb=40.0, accelerator="cpu")
    result = autotune_loader(BigSamples(256), 16, hardware=cramped, time_budget=3.0, cache_path=tmp_path / "c.json")
    refused = [trial for trial in result.trials if trial.refused]
    assert all("over 50% of free" in trial.refused for trial in refused)
    assert result.stop_reason in {"/dev/shm", "memory guard"} and "/dev/shm" in result.bounds
    assert result.settings.num_workers * (result.settings.prefetch_factor or 0) * 16 <= 20


def test_real_io_loader_goes_past_twice_the_cpus_and_stops_at_the_shm_bound(tmp_path):
    # Latency, almost no CPU: 10 ms per sample, 1 KB samples, so 11 workers (80 ms per batch each: ~140
    # batches/s) need ~0.2 of one core even when the machine is loaded. With 64 KB samples and 5 ms the
    # workers' and the main thread's share-memory hand-over took the core a loaded VM leaves (measured
    # with the test pinned to one core: 4 and 11 workers both ~58 batches/s), so stopping at 4 was right.
    class Latency(SleepingLoaderDataset):
        def __getitem__(self, index):
            threading.Event().wait(0.010)
            return torch.zeros(256)  # 1 KB per sample, 8 KB per batch of 8

    # /dev/shm for 24 batches at 50%: (24 - 2) // prefetch 2 = 11 workers
    small = fake_hardware(
        logical_cpus=2, physical_cpus=2, usable_cpus=2, shm_free_mb=0.375, ram_available_mb=32_000, accelerator="cpu"
    )
    result = autotune_loader(
        Latency(4000), 8, hardware=small, time_budget=20.0, cache_path=tmp_path / "c.json", progress=False
    )
    assert result.settings.num_workers > 4, result.format()
    assert result.stop_reason in {"/dev/shm", "gain"}, result.format()
    assert result.bounds["/dev/shm"] == 11 and result.stop_detail
    assert str(result.settings.num_workers) in result.summary_line()


def test_cpu_share_bound_reads_the_busy_share_at_the_most_workers():
    # Measured on 2 cores (the I/O-latency loader): one worker busy 10% of its time, 41 workers 3% each
    # (queues full, waiting on the main thread). The busiest share bounded the climb at 42 workers where the
    # grid's best had 64; the share at the most workers is what more workers would each use.
    resources = Resources(fake_hardware(usable_cpus=2, logical_cpus=2, physical_cpus=2), 0.5)
    latency = [
        Trial(1, 2, False, 11.4, batches=40, worker_busy=0.10),
        Trial(41, 2, False, 280.6, batches=400, worker_busy=0.03),
    ]
    assert resources.worker_bounds(2, False, latency)["CPU share"] == 133  # 2 x 2 CPUs / 3%
    # a refused trial measured nothing (counted, its 50% at 64 workers would give 8); under 2% counts as 2%
    idle = [
        Trial(1, 2, False, 9.0, batches=9, worker_busy=0.01),
        Trial(8, 2, False, 70.0, batches=90, worker_busy=0.01),
    ]
    idle.append(Trial(64, 2, False, refused="needs too much memory", worker_busy=0.5))
    assert resources.worker_bounds(2, False, idle)["CPU share"] == 200


def test_cpu_share_bound_still_binds_cpu_bound_workers():
    # CPU-bound workers on 2 CPUs: each one's share falls as they outnumber the CPUs (together 1.9, 2.0, 2.0
    # CPUs), so the share at the most workers would allow twice as many again at every step; once their CPU
    # stopped growing the busiest share is read: twice the CPUs
    resources = Resources(fake_hardware(usable_cpus=2, logical_cpus=2, physical_cpus=2), 0.5)
    saturated = [
        Trial(workers, 2, False, 20.0, batches=40, worker_busy=busy)
        for workers, busy in ((2, 0.95), (4, 0.5), (8, 0.25))
    ]
    assert resources.worker_bounds(2, False, saturated)["CPU share"] == 4  # 2 x 2 / 95%, not 2 x 2 / 25% = 16
    # measured on 2 cores (the CPU-heavy loader, session 11): 1 worker 100% busy, 3 workers 63%, 4 workers 47%
    heavy = [
        Trial(1, 2, False, 10.6, batches=40, worker_busy=1.0),
        Trial(3, 2, False, 20.6, batches=40, worker_busy=0.63),
    ]
    heavy.append(Trial(4, 2, False, 20.7, batches=40, worker_busy=0.47))
    assert resources.worker_bounds(2, False, heavy)["CPU share"] == 4
    # still growing (1 -> 3 workers: 1.0 -> 1.9 CPUs): the share at the most workers
    assert resources.worker_bounds(2, False, heavy[:2])["CPU share"] == 6  # 2 x 2 / 63%
