"""NVML telemetry moving as expected: a transfer-heavy phase, then a compute-heavy phase, on one GPU.

    python benchmarks/telemetry_phases.py --seconds 4

The sampler thread (``SystemSampler``, 0.2 s interval) reads NVML while the main thread first copies a
pinned 256 MB buffer to the GPU in a loop, then runs large matmuls with no copies. Expected: PCIe RX
near the pinned bandwidth and low SM activity in the first phase; PCIe RX near zero and GPU
utilisation near 100% in the second.
"""

from __future__ import annotations

import argparse
import time

import torch
from _common import print_table, write_json

from lightning_dataperf.telemetry.sources import GpuSource
from lightning_dataperf.telemetry.system_sampler import SystemSampler


def phase(sampler: SystemSampler, seconds: float, work) -> dict[str, float]:
    sampler.window_means()  # drop what came before
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        work()
    torch.cuda.synchronize()
    time.sleep(2 * sampler.interval)  # let the thread take its last readings of this phase
    return sampler.window_means()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    device = torch.device("cuda", 0)
    host = torch.empty(256 * 2**20, dtype=torch.uint8).pin_memory()
    target = torch.empty_like(host, device=device)
    a = torch.randn(8192, 8192, device=device)

    def copy() -> None:
        target.copy_(host, non_blocking=True)
        torch.cuda.synchronize()

    def compute() -> None:
        for _ in range(8):
            torch.mm(a, a)
        torch.cuda.synchronize()

    sampler = SystemSampler(interval=0.2, sources=[lambda: GpuSource(0)])
    sampler.start()
    try:
        copy_means = phase(sampler, args.seconds, copy)
        compute_means = phase(sampler, args.seconds, compute)
    finally:
        sampler.stop()
    keys = [
        "gpu_util_percent",
        "gpu_pcie_rx_mbps",
        "gpu_pcie_tx_mbps",
        "gpu_sm_clock_mhz",
        "gpu_power_w",
        "gpu_memory_used_mb",
    ]
    nan = float("nan")
    rows = [
        [key, f"{getattr(copy_means, key) or nan:.0f}", f"{getattr(compute_means, key) or nan:.0f}"] for key in keys
    ]
    table = print_table(["metric", "transfer phase", "compute phase"], rows)
    write_json("telemetry_phases", {"transfer": copy_means.known(), "compute": compute_means.known(), "table": table})


if __name__ == "__main__":
    main()
