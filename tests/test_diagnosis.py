"""Each verdict, provoked: rules on constructed evidence, and four real pipelines on the CPU."""

from __future__ import annotations

import dataclasses
import time

import lightning.pytorch as pl
import pytest
import torch
from helpers import SleepyModel, sleepy_loader, trainer_kwargs
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.copy_stats import CopyStats
from lightning_dataperf.diagnosis import diagnose
from lightning_dataperf.evidence import Evidence
from lightning_dataperf.loaders import LoaderFacts
from lightning_dataperf.stats import EpochSummary, TimingSummary
from lightning_dataperf.system_stats import SystemStats
from lightning_dataperf.testing import SleepingLoaderDataset


def timing(mean: float) -> TimingSummary:
    return TimingSummary(mean, mean, mean, mean, mean, 100)


def summary(on_device=False, stall=0.0, wait_share=None, epoch_start=0.001, world=1, waits=(), **means):
    return EpochSummary(
        stage="train",
        epoch=0,
        steps=100,
        timings={name: timing(value) for name, value in means.items()},
        input_stall_fraction=stall,
        data_wait_share=stall if wait_share is None else wait_share,
        samples_per_sec=1000.0,
        epoch_start=epoch_start,
        world_size=world,
        rank_data_wait=list(waits),
        slowest_rank=None if not waits else max(range(len(waits)), key=lambda rank: waits[rank]),
        straggler_ratio=None if not waits else max(waits) / max(min(waits), 1e-3),
        on_device=on_device,
    )


INPUT_BOUND = summary(stall=0.6, DataLoading=0.030, Transfer=0.0, Compute=0.018, Step=0.050)


def verdict(evidence: Evidence) -> str:
    return diagnose(evidence).bottleneck


@pytest.mark.parametrize(
    ("system", "workers", "expected"),
    [
        ({"cpu_iowait_percent_mean": 35.0}, 4, "input_bound_storage"),
        ({"disk_util_percent": 97.0, "cpu_iowait_percent_mean": 2.0}, 4, "input_bound_storage"),
        ({"worker_cpu_percent_mean": 98.0, "cpu_busy_percent_mean": 99.0}, 4, "input_bound_cpu"),
        ({"worker_cpu_percent_mean": 3.0, "cpu_busy_percent_mean": 10.0}, 2, "input_bound_workers"),
        # saturated cores: 40 runnable tasks on 16 CPUs -> a fair share is 40% of a core; workers use 35%
        (
            {"worker_cpu_percent_mean": 35.0, "cpu_busy_percent_mean": 99.0, "runnable_tasks": 40},
            4,
            "input_bound_cpu",
        ),
        # saturated cores but the workers sleep (I/O): still too few workers, not CPU
        (
            {"worker_cpu_percent_mean": 2.0, "cpu_busy_percent_mean": 99.0, "runnable_tasks": 40},
            4,
            "input_bound_workers",
        ),
        ({}, 0, "input_bound_workers"),
    ],
)
def test_input_bound_causes(system, workers, expected):
    system = SystemStats.from_mapping(system)
    evidence = Evidence(INPUT_BOUND, LoaderFacts(num_workers=workers, prefetch_factor=2), system, usable_cpus=16)
    diagnosis = diagnose(evidence)
    assert diagnosis.bottleneck == expected
    finding = diagnosis.findings[0]
    assert finding.ceiling_speedup == pytest.approx(1 / (1 - 0.6))
    assert finding.advice and finding.evidence["data_wait_ms"] == pytest.approx(30.0)


def test_cpu_bound_workers_with_idle_cores_are_told_to_add_workers():
    system = SystemStats(worker_cpu_percent_mean=99.0, cpu_busy_percent_mean=40.0)
    finding = diagnose(Evidence(INPUT_BOUND, LoaderFacts(num_workers=2), system, usable_cpus=10)).findings[0]
    assert "raise num_workers from 2 to 8" in " ".join(finding.advice)


def test_on_cuda_a_host_wait_hidden_by_the_gpu_is_not_a_bottleneck():
    # The host runs ahead: its step (4 ms) is shorter than the GPU's (15 ms); the GPU's timeline decides.
    hidden = summary(on_device=True, wait_share=0.35, DataLoading=0.008, Compute=0.015, DeviceIdle=0.0, Step=0.004)
    assert verdict(Evidence(hidden)) == "compute_bound"
    starved = summary(on_device=True, stall=0.75, wait_share=0.8, DataLoading=0.020, Compute=0.005, DeviceIdle=0.015)
    assert verdict(Evidence(starved, LoaderFacts(num_workers=2))) == "input_bound_workers"


def test_transfer_bound_pageable_and_pcie_saturated():
    copying = summary(on_device=True, DataLoading=0.0, Transfer=0.004, Compute=0.006, DeviceIdle=0.0, Step=0.002)
    pageable = diagnose(Evidence(copying, LoaderFacts(pin_memory=False)))
    assert pageable.bottleneck == "transfer_bound" and "not overlapped" in pageable.findings[0].headline
    assert pageable.findings[0].share == pytest.approx(0.4), "a share of the GPU's step, not of the host's"
    assert any("side_stream" in advice for advice in pageable.findings[0].advice)
    assert any("pin_memory=False" in advice for advice in pageable.findings[0].advice)
    saturated = Evidence(
        copying, LoaderFacts(pin_memory=True), SystemStats(gpu_pcie_rx_mbps=55_000.0), pcie_capacity_mbps=63_000.0
    )
    assert "PCIe saturated" in diagnose(saturated).findings[0].headline


def test_side_stream_copy_left_exposed_is_transfer_bound_not_host_bound():
    # Look-ahead copies: the compute stream waits for the copy inside next(), so the wait shows up as GPU
    # idle, and the compute-stream gap (Time/Transfer) is ~0. The verdict must read the side stream's own
    # figures: 4 ms of the 10 ms device step were spent waiting for a 5 ms copy that was only partly hidden.
    exposed = CopyStats(copies=25, copy_s=0.005, exposed_s=0.004, transform_s=0.0, hidden_fraction=0.2, gbps=12.0)
    waiting = summary(
        on_device=True,
        stall=0.4,
        wait_share=0.01,
        DataLoading=0.0001,
        Transfer=0.0,
        Compute=0.006,
        DeviceIdle=0.004,
        Step=0.010,
    )
    evidence = Evidence(
        dataclasses.replace(waiting, copies=exposed), LoaderFacts(pin_memory=True), side_stream_transfer=True
    )
    diagnosis = diagnose(evidence)
    assert diagnosis.bottleneck == "transfer_bound", diagnosis.format()
    finding = diagnosis.findings[0]
    assert finding.share == pytest.approx(0.4)
    assert finding.evidence["side_stream_copy_ms"] == pytest.approx(5.0)
    assert finding.evidence["hidden_fraction"] == pytest.approx(0.2)
    assert not any("strategy='side_stream'" in advice for advice in finding.advice), "it is already on"
    assert "host_bound" not in {finding.kind for finding in diagnosis.findings}, "the idle is the copy, not launches"
    hidden = dataclasses.replace(exposed, exposed_s=0.0001, hidden_fraction=0.98)
    assert (
        verdict(
            Evidence(
                dataclasses.replace(
                    waiting,
                    copies=hidden,
                    input_stall_fraction=0.01,
                    timings={**waiting.timings, "DeviceIdle": timing(0.0001)},
                ),
                side_stream_transfer=True,
            )
        )
        == "compute_bound"
    )


def test_host_bound_on_gpu_and_compute_bound_with_throttling():
    launches = summary(on_device=True, stall=0.8, wait_share=0.0, DataLoading=0.0001, Compute=0.002, DeviceIdle=0.008)
    assert verdict(Evidence(launches, LoaderFacts(num_workers=4))) == "host_bound", "idle GPU, host not waiting"
    busy = summary(on_device=True, DataLoading=0.0, Compute=0.0098, DeviceIdle=0.0002, Step=0.010)
    diagnosis = diagnose(Evidence(busy, system=SystemStats(gpu_slowdown=1.0, gpu_util_percent=99.0)))
    assert diagnosis.bottleneck == "compute_bound"
    assert any("slowed by heat" in advice for advice in diagnosis.findings[0].advice)


def test_straggler_epoch_start_and_memory_pressure():
    ranks = summary(world=2, waits=(0.001, 0.012), DataLoading=0.006, Compute=0.02, Step=0.026)
    straggler = diagnose(Evidence(ranks)).findings
    assert any(finding.kind == "straggler" and "rank 1" in finding.headline for finding in straggler)
    short = summary(epoch_start=3.0, DataLoading=0.0, Compute=0.010, Step=0.010)
    assert verdict(Evidence(short, LoaderFacts(persistent_workers=False))) == "epoch_start"
    pressure = SystemStats(swap_used_mb=4096.0, shm_free_mb=10.0, pinned_host_mb=9000.0, ram_available_mb=500.0)
    busy = summary(DataLoading=0.0, Compute=0.010, Step=0.010)
    memory = {finding.kind: finding for finding in diagnose(Evidence(busy, system=pressure)).findings}
    expected = {"swap_used_mb", "shm_free_mb", "pinned_host_mb", "ram_available_mb"}
    assert set(memory["memory_pressure"].evidence) == expected
    assert "memory_pressure" not in {finding.kind for finding in diagnose(Evidence(busy)).findings}


class BusyCollate:
    """Collate with real CPU work (a busy loop standing in for decode/augment)."""

    def __init__(self, work_ms: float) -> None:
        self.work_ms = work_ms

    def __call__(self, samples):
        deadline = time.perf_counter() + self.work_ms / 1e3
        while time.perf_counter() < deadline:
            pass
        return torch.utils.data.default_collate(samples)


class PerStepHostWork(Callback):
    """Per-step bookkeeping outside the step (a slow metrics writer, say)."""

    def on_train_batch_end(self, *args, **kwargs):
        time.sleep(0.01)


def fit_and_diagnose(tmp_path, loader, model, *extra_callbacks):
    perf = DataPerfCallback(print_summary=False, telemetry_interval=0.05)
    callbacks = [perf, *extra_callbacks]
    trainer = pl.Trainer(max_epochs=1, callbacks=callbacks, logger=False, **trainer_kwargs(tmp_path))
    trainer.fit(model, loader)
    return perf.last_diagnosis


def test_pipeline_cpu_heavy_collate_is_input_bound_by_cpu(tmp_path):
    loader = DataLoader(SleepingLoaderDataset(96), batch_size=8, num_workers=1, collate_fn=BusyCollate(40))
    diagnosis = fit_and_diagnose(tmp_path, loader, SleepyModel(features=16))
    assert diagnosis.bottleneck == "input_bound_cpu", diagnosis.format()


def test_pipeline_sleeping_loader_with_one_worker_needs_more_workers(tmp_path):
    diagnosis = fit_and_diagnose(tmp_path, sleepy_loader(96, 8, 0.04, num_workers=1), SleepyModel())
    assert diagnosis.bottleneck == "input_bound_workers", diagnosis.format()
    assert any("raise num_workers from 1" in advice for advice in diagnosis.findings[0].advice)


def test_pipeline_fast_data_heavy_compute_is_compute_bound(tmp_path):
    diagnosis = fit_and_diagnose(tmp_path, sleepy_loader(96, 8, 0.0), SleepyModel(step_s=0.03))
    assert diagnosis.bottleneck == "compute_bound", diagnosis.format()


def test_pipeline_tiny_batches_with_per_step_overhead_are_host_bound(tmp_path):
    diagnosis = fit_and_diagnose(tmp_path, sleepy_loader(48, 1, 0.0), SleepyModel(), PerStepHostWork())
    assert diagnosis.bottleneck == "host_bound", diagnosis.format()
