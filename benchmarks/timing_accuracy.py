"""Timing accuracy on a GPU against ground truth, and how wrong the naive host timer is.

Loader: a known host sleep per batch (num_workers=0). Step: ``torch.cuda._sleep`` of a known GPU
time. Two regimes from the brief: loader 8 ms / GPU 15 ms (host runs ahead) and loader 20 ms / GPU
5 ms (GPU starves 15 ms per step). Prints a table and writes ``timing_accuracy.json``.

    python benchmarks/timing_accuracy.py --steps 200
"""

from __future__ import annotations

import argparse
import statistics

import _common
import lightning.pytorch as pl
import torch
from naive_timer import NaiveHostTimer

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.testing import GpuSleepModel, calibrate_cuda_sleep, sleeping_loader

REGIMES = [(8.0, 15.0), (20.0, 5.0)]


def run(loader_ms: float, gpu_ms: float, cycles: float, steps: int, callback: pl.Callback) -> None:
    _common.fit_quietly(
        GpuSleepModel(gpu_ms, cycles),
        sleeping_loader(steps, loader_ms),
        accelerator="cuda",
        callbacks=[callback],
        log_every_n_steps=10,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("timing_accuracy.py needs a CUDA GPU")
    cycles = calibrate_cuda_sleep()
    rows, results = [], []
    for loader_ms, gpu_ms in REGIMES:
        perf = DataPerfCallback(print_summary=False)
        run(loader_ms, gpu_ms, cycles, args.steps, perf)
        naive = NaiveHostTimer()
        run(loader_ms, gpu_ms, cycles, args.steps, naive)
        summary = perf.summaries[-1]
        truth_idle = max(0.0, loader_ms - gpu_ms)
        measured = {
            "data_wait_ms": 1e3 * summary.timings["DataLoading"].p50,
            "compute_ms": 1e3 * summary.timings["DeviceSpan"].p50,  # CUDA: the step's device span
            "device_idle_ms": 1e3 * summary.timings["DeviceIdle"].p50,
            "input_stall_fraction": summary.input_stall_fraction,
        }
        naive_ms = {
            "data_wait_ms": 1e3 * statistics.median(naive.data_times[1:]),
            "compute_ms": 1e3 * statistics.median(naive.compute_times[1:]),
        }
        naive_stall = naive_ms["data_wait_ms"] / (naive_ms["data_wait_ms"] + naive_ms["compute_ms"])
        truth_stall = truth_idle / max(loader_ms, gpu_ms)
        results.append(
            {
                "loader_ms": loader_ms,
                "gpu_ms": gpu_ms,
                "truth_device_idle_ms": truth_idle,
                "truth_stall_fraction": truth_stall,
                "dataperf": measured,
                "naive": naive_ms,
                "naive_stall_fraction": naive_stall,
            }
        )
        rows.append([f"{loader_ms:g}/{gpu_ms:g}", "truth", loader_ms, gpu_ms, truth_idle, truth_stall])
        rows.append(
            [
                "",
                "DataPerfCallback",
                measured["data_wait_ms"],
                measured["compute_ms"],
                measured["device_idle_ms"],
                measured["input_stall_fraction"],
            ]
        )
        rows.append(["", "naive host timer", naive_ms["data_wait_ms"], naive_ms["compute_ms"], "n/a", naive_stall])
    _common.print_table(
        ["loader/GPU ms", "method", "data wait ms", "compute ms", "GPU idle ms", "stall fraction"], rows
    )
    _common.write_json("timing_accuracy", {"steps": args.steps, "cycles_per_ms": cycles, "regimes": results})


if __name__ == "__main__":
    main()
