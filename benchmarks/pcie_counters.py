"""Which NVML PCIe figure tracks a known host-to-device copy? Byte counters vs the throughput sample.

    python benchmarks/pcie_counters.py

Copies a pinned 256 MB buffer to the GPU for ``--seconds``, knowing exactly how many bytes moved, and
compares (a) the delta of NVML_FI_DEV_PCIE_COUNT_RX/TX_BYTES read before and well after the copies
(counters are refreshed lazily), (b) ``nvmlDeviceGetPcieThroughput`` sampled during the copies (KB/s).
"""

from __future__ import annotations

import argparse
import statistics
import time

import pynvml
import torch
from _common import print_table, write_json

MB = 2**20


def counters(handle) -> tuple[float, float]:
    fields = [pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES]
    rx, tx = pynvml.nvmlDeviceGetFieldValues(handle, fields)
    return float(rx.value.ullVal), float(tx.value.ullVal)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    host = torch.empty(256 * MB, dtype=torch.uint8).pin_memory()
    device = torch.empty_like(host, device="cuda")
    device.copy_(host)
    torch.cuda.synchronize()
    time.sleep(2.0)
    before = counters(handle)
    samples, copies = [], 0
    started = time.perf_counter()
    while time.perf_counter() - started < args.seconds:
        device.copy_(host, non_blocking=True)
        copies += 1
        if copies % 4 == 0:
            torch.cuda.synchronize()
            samples.append(pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES))
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    time.sleep(2.0)
    after = counters(handle)
    moved = copies * host.numel()
    rows = [
        ["known copy rate", f"{moved / MB / elapsed:.0f}", "1.00"],
        [
            "counter RX delta / copy time",
            f"{(after[0] - before[0]) / MB / elapsed:.0f}",
            f"{(after[0] - before[0]) / moved:.3f}",
        ],
        [
            "counter TX delta / copy time",
            f"{(after[1] - before[1]) / MB / elapsed:.0f}",
            f"{(after[1] - before[1]) / moved:.3f}",
        ],
        [
            "throughput sample RX (median)",
            f"{statistics.median(samples) * 1e3 / MB:.0f}",
            f"{statistics.median(samples) * 1e3 / MB / (moved / MB / elapsed):.3f}",
        ],
    ]
    table = print_table(["figure", "MB/s", "ratio to known"], rows)
    write_json(
        "pcie_counters",
        {
            "table": table,
            "moved_bytes": moved,
            "seconds": elapsed,
            "before": before,
            "after": after,
            "throughput_samples_kBps": samples,
        },
    )
    pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()
