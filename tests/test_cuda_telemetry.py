"""Real NVML on a GPU: PCIe bytes move during a copy, and GPU scalars reach TensorBoard."""

from __future__ import annotations

import time

import lightning.pytorch as pl
import pytest
import torch
from helpers import scalar_tags, trainer_kwargs

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.telemetry.sources import GpuSource
from lightning_dataperf.testing import GpuSleepModel, calibrate_cuda_sleep, sleeping_loader

pytestmark = pytest.mark.cuda


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
