"""The telemetry thread: lifecycle, sources, fake NVML, and Usage/... scalars in TensorBoard; real NVML on a GPU."""

from __future__ import annotations

import os
import threading
import time
import warnings
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from helpers import SleepyModel, scalar_tags, sleepy_loader, trainer_kwargs

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.telemetry.sources import CpuSource, DiskSource, GpuSource, MemorySource, ProcessSource
from lightning_dataperf.telemetry.stats import SystemStats
from lightning_dataperf.telemetry.system_sampler import SystemSampler
from lightning_dataperf.testing import GpuSleepModel, calibrate_cuda_sleep, sleeping_loader

MB = 2**20


def sampler_threads():
    return [thread for thread in threading.enumerate() if thread.name == "lightning_dataperf-sampler"]


class FakeNvml:
    """Enough of pynvml for GpuSource: PCIe byte counters that grow by a known amount per read."""

    NVML_FI_DEV_PCIE_COUNT_RX_BYTES, NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 100, 101
    NVML_PCIE_UTIL_RX_BYTES, NVML_PCIE_UTIL_TX_BYTES = 1, 0
    NVML_CLOCK_SM = 1

    def __init__(self, rx_per_read=300 * MB, tx_per_read=10 * MB, fields_supported=True, reasons=0x0):
        self.rx = self.tx = 0
        self.rx_per_read, self.tx_per_read = rx_per_read, tx_per_read
        self.fields_supported, self.reasons = fields_supported, reasons
        self.shutdowns = 0

    def nvmlInit(self):  # noqa: N802 (pynvml's names)
        pass

    def nvmlShutdown(self):  # noqa: N802 (pynvml's names)
        self.shutdowns += 1

    def nvmlDeviceGetHandleByUUID(self, uuid):  # noqa: N802 (pynvml's names)
        raise RuntimeError("no such uuid")

    def nvmlDeviceGetHandleByIndex(self, index):  # noqa: N802 (pynvml's names)
        return f"gpu{index}"

    def nvmlDeviceGetUtilizationRates(self, handle):  # noqa: N802 (pynvml's names)
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle):  # noqa: N802 (pynvml's names)
        return SimpleNamespace(used=2048 * MB, total=80000 * MB)

    def nvmlDeviceGetClockInfo(self, handle, clock):  # noqa: N802 (pynvml's names)
        return 1980

    def nvmlDeviceGetPowerUsage(self, handle):  # noqa: N802 (pynvml's names)
        return 350_000

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):  # noqa: N802 (pynvml's names)
        return self.reasons

    def nvmlDeviceGetFieldValues(self, handle, fields):  # noqa: N802 (pynvml's names)
        self.rx += self.rx_per_read
        self.tx += self.tx_per_read
        status = 0 if self.fields_supported else 3
        return [
            SimpleNamespace(fieldId=fields[0], nvmlReturn=status, value=SimpleNamespace(ullVal=self.rx)),
            SimpleNamespace(fieldId=fields[1], nvmlReturn=status, value=SimpleNamespace(ullVal=self.tx)),
        ]

    def nvmlDeviceGetPcieThroughput(self, handle, counter):  # noqa: N802 (pynvml's names)
        return 5_000 if counter == self.NVML_PCIE_UTIL_RX_BYTES else 1_000  # KB/s


def test_gpu_source_reads_pcie_counters_as_deltas():
    nvml = FakeNvml(reasons=0x20)
    source = GpuSource(0, nvml=nvml)
    first = source.read(elapsed=1.0)
    assert "gpu_pcie_rx_mbps" not in first, "a rate needs two readings"
    second = source.read(elapsed=2.0)
    assert second["gpu_pcie_rx_mbps"] == pytest.approx(150.0)
    assert second["gpu_pcie_tx_mbps"] == pytest.approx(5.0)
    assert second["gpu_util_percent"] == 87
    assert second["gpu_memory_used_mb"] == pytest.approx(2048)
    assert second["gpu_power_w"] == pytest.approx(350)
    assert second["gpu_slowdown"] == 1.0, "0x20 is a thermal slowdown"
    assert second["gpu_power_capped"] == 0.0
    source.close()
    assert nvml.shutdowns == 1


def test_gpu_source_falls_back_to_nvml_throughput_sample():
    source = GpuSource(0, nvml=FakeNvml(fields_supported=False, reasons=0x4))
    values = source.read(elapsed=1.0)
    assert values["gpu_power_capped"] == 1.0, "0x4 is the software power cap, not a slowdown"
    assert values["gpu_pcie_rx_mbps"] == pytest.approx(5_000 * 1e3 / MB)
    assert values["gpu_slowdown"] == 0.0


def test_missing_or_failing_source_is_dropped_with_one_warning():
    class Broken:
        name = "flaky"
        reads = 0

        def read(self, elapsed):
            Broken.reads += 1
            if Broken.reads > 1:
                raise PermissionError("/proc is restricted")
            return {"flaky_reading": 1.0}

        def close(self):
            pass

    def no_nvml():
        raise RuntimeError("NVML Shared Library Not Found")

    sampler = SystemSampler(interval=60, sources=[no_nvml, Broken, MemorySource])
    with pytest.warns(UserWarning, match="NVML Shared Library Not Found"):
        sampler.start()
    try:
        assert sampler.epoch_means().ram_available_mb is not None
        with pytest.warns(UserWarning, match="restricted"):
            sampler.reset_epoch()
            means = sampler.epoch_means()
        assert means.ram_available_mb is not None and "Usage/flaky_reading" not in means.to_metrics()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sampler.reset_epoch()
            sampler.epoch_means()
        assert set(sampler.unavailable) == {"no_nvml", "flaky"}
    finally:
        sampler.stop()
    assert not sampler_threads()


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux /proc needed")
def test_host_sources_read_plausible_values(tmp_path):
    for source in (CpuSource(), ProcessSource(), MemorySource(), DiskSource(tmp_path)):
        source.read(0.5)
        time.sleep(0.05)
        values = source.read(0.05)
        assert values, source.name
        for key, value in values.items():
            assert key in SystemStats.fields() and value >= 0, (key, value)  # every reading has a tag
    cpu = CpuSource()
    time.sleep(0.05)
    busy = cpu.read(0.05)
    assert 0 <= busy["cpu_busy_percent_mean"] <= busy["cpu_busy_percent_max"] <= 100


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="Linux /proc/<pid>/io needed")
def test_process_source_reports_what_this_process_read(tmp_path):
    source = ProcessSource(workers=lambda: [])
    source.read(0.5)  # the first read only sets the counters
    values = source.read(0.5)
    assert "own_read_mbps" in values and values["own_read_mbps"] >= 0.0
    # the figure is this process's own rchar delta (every read(), any filesystem) per second
    reads = iter([4 * 2**20, 6 * 2**20])

    class Counters:
        def __init__(self):
            self.read_chars = next(reads)

    source = ProcessSource(workers=lambda: [])
    source.main.io_counters = Counters  # an instance attribute: psutil.Process allows it
    source.read(1.0)
    assert source.read(0.5)["own_read_mbps"] == pytest.approx(4.0)  # 2 MiB in 0.5 s


def test_bad_interval_is_refused():
    with pytest.raises(ValueError, match="interval"):
        SystemSampler(interval=0)
    with pytest.raises(ValueError, match="telemetry_interval"):
        DataPerfCallback(telemetry_interval=-1)
    with pytest.raises(ValueError, match="hang_timeout"):
        DataPerfCallback(hang_timeout=0)


def test_sampler_thread_joined_after_fit_and_after_exception(tmp_path):
    perf = DataPerfCallback(print_summary=False, telemetry_interval=0.05)
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], logger=False, **trainer_kwargs(tmp_path))
    trainer.fit(SleepyModel(), sleepy_loader(16, 4, 0.01))
    assert perf.sampler is None and not sampler_threads()

    class Boom(SleepyModel):
        def training_step(self, batch, batch_idx):
            if batch_idx == 2:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    perf = DataPerfCallback(print_summary=False, telemetry_interval=0.05)
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], logger=False, **trainer_kwargs(tmp_path))
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Boom(), sleepy_loader(16, 4, 0.01))
    assert perf.sampler is None and not sampler_threads()


def test_system_scalars_land_in_tensorboard_and_evidence(tmp_path):
    perf = DataPerfCallback(print_summary=False, telemetry_interval=0.05)
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], log_every_n_steps=2, **trainer_kwargs(tmp_path))
    trainer.fit(SleepyModel(), sleepy_loader(48, 4, 0.04, num_workers=1, persistent_workers=True))
    tags = scalar_tags(trainer.logger.log_dir).Tags()["scalars"]
    for expected in ("Usage/cpu_busy_percent_mean", "Usage/main_rss_mb", "Usage/ram_available_mb"):
        assert expected in tags, sorted(tag for tag in tags if tag.startswith("System"))
    assert "Usage/loader_workers_alive" in tags
    numbers = perf.last_diagnosis.findings[0].evidence
    assert "worker_cpu_percent_mean" in numbers, numbers


# ---------------------------------------------------------------------------------------------- on a GPU
# Real NVML on a GPU (marked cuda): PCIe bytes move during a copy, and GPU scalars reach TensorBoard.


@pytest.mark.cuda
def test_pcie_counters_are_read_as_non_negative_rates():
    """NVML's PCIe byte counters are read and turned into rates. Whether they track the copy is a property
    of the machine: on the lent H200 they moved by ~1% of the bytes copied (benchmarks/pcie_counters.py)."""
    source = GpuSource(torch.cuda.current_device())
    host = torch.empty(512 * 2**20, dtype=torch.uint8).pin_memory()
    time.sleep(1.5)  # NVML refreshes its PCIe byte counters lazily
    source.read(1.0)
    started = time.perf_counter()
    while time.perf_counter() - started < 2.0:
        host.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
    time.sleep(1.5)
    values = source.read(time.perf_counter() - started)
    source.close()
    assert values["gpu_pcie_rx_mbps"] >= 0 and values["gpu_pcie_tx_mbps"] >= 0, values
    assert 0 <= values["gpu_util_percent"] <= 100


@pytest.mark.cuda
def test_gpu_telemetry_lands_in_tensorboard(tmp_path):
    cycles = calibrate_cuda_sleep()
    perf = DataPerfCallback(print_summary=False, telemetry_interval=0.1)
    options = trainer_kwargs(tmp_path, accelerator="cuda", devices=1)
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], log_every_n_steps=5, **options)
    trainer.fit(GpuSleepModel(gpu_ms=10, cycles_per_ms=cycles), sleeping_loader(60, 2.0))
    tags = scalar_tags(trainer.logger.log_dir).Tags()["scalars"]
    for expected in ("Usage/gpu_util_percent", "Usage/gpu_pcie_rx_mbps", "Usage/gpu_power_w"):
        assert expected in tags
    assert perf.sampler is None
