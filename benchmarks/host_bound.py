"""Where a host-bound step's time goes: stock, pinned and side-stream copies, step by step.

    PYTHONPATH=$PWD python benchmarks/host_bound.py --repeats 5 --steps 400

``transfer.py`` reports a mean step time per run. When the GPU step is shorter than Lightning's own
host work per step (32 MB batches with a 0.3-0.6 ms GPU step on an H200), the run is host-bound and
those means scatter by +-20% between runs. This script traces every step of the same runs instead:
host time between step ends (mean, median, 90th percentile), host time spent fetching the batch
(``next()`` on the loader, which is where the side-stream path issues and hands over copies) and in
``Strategy.batch_to_device``, and, from CUDA events read after the run, the GPU time from one step's
start to its end and the GPU's idle time between steps. Variants: data already on the GPU, stock
Lightning with pinned batches, the side stream (``lookahead`` 1 and 2, every copy or one in 8 timed,
side-stream memory with ``record_stream``), and the resident and side-stream runs with Python's garbage
collector switched off during the fit.
Writes ``host_bound.json``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import _common
import lightning.pytorch as pl
import torch
from transfer import MB, ReadyBatches, SideAllocStrategy, SleepStep, pinned_bandwidth

from lightning_dataperf import SideStreamStrategy
from lightning_dataperf.testing import calibrate_cuda_sleep


class StepTrace(pl.Callback):
    """Host step ends and CUDA events around each step, read back after the run."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.step_ends: list[float] = []
        self.gpu_marks: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        self.gpu_marks.append((start, torch.cuda.Event(enable_timing=True)))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.gpu_marks[-1][1].record()
        self.step_ends.append(time.perf_counter())

    def figures(self) -> dict[str, float]:
        torch.cuda.synchronize()
        marks = self.gpu_marks[self.warmup :]
        intervals = [b - a for a, b in itertools.pairwise(self.step_ends[self.warmup :])]
        busy = [start.elapsed_time(end) for start, end in marks]
        idle = [marks[i][1].elapsed_time(marks[i + 1][0]) for i in range(len(marks) - 1)]
        ordered = sorted(intervals)
        return {
            "mean_ms": 1e3 * statistics.fmean(intervals),
            "median_ms": 1e3 * statistics.median(intervals),
            "p90_ms": 1e3 * ordered[int(0.9 * len(ordered))],
            "gpu_step_ms": statistics.median(busy),
            "gpu_idle_ms": statistics.median(idle),
        }


class HostTimer:
    """Accumulates host time spent in wrapped calls after the warm-up."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def wrap(self, function: Callable) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds.append(time.perf_counter() - started)

        return timed

    def median_us(self, skip: int) -> float:
        return 1e6 * statistics.median(self.seconds[skip:]) if len(self.seconds) > skip else float("nan")


class TimedIterable:
    """The loader, with the host time of each ``next()`` on its iterator recorded."""

    def __init__(self, loader: Any, timer: HostTimer) -> None:
        self.loader, self.timer = loader, timer

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator:
        iterator = iter(self.loader)
        next_batch = self.timer.wrap(iterator.__next__)
        while True:
            try:
                yield next_batch()
            except StopIteration:
                return


def traced_run(batch: torch.Tensor, cycles: int, strategy: Any, steps: int, gc_off: bool, warmup: int = 20) -> dict:
    trace, fetch, to_device = StepTrace(warmup), HostTimer(), HostTimer()
    trainer = _common.quiet_trainer(accelerator="cuda", strategy=strategy, max_epochs=1, callbacks=[trace])
    trainer.strategy.batch_to_device = to_device.wrap(trainer.strategy.batch_to_device)
    # Fetch timing wraps the strategy's processed loader, so it includes the side stream's issue + hand-over.
    process = trainer.strategy.process_dataloader
    trainer.strategy.process_dataloader = lambda loader: TimedIterable(process(loader), fetch)
    if gc_off:
        gc.collect()
        gc.disable()
    try:
        trainer.fit(SleepStep(cycles), ReadyBatches(batch, steps))
    finally:
        gc.enable()
    return {**trace.figures(), "fetch_us": fetch.median_us(warmup), "batch_to_device_us": to_device.median_us(warmup)}


VARIANTS: dict[str, tuple[str, Callable[[], Any], bool]] = {
    "resident": ("resident", lambda: "auto", False),
    "resident, gc off": ("resident", lambda: "auto", True),
    "stock pinned": ("pinned", lambda: "auto", False),
    "side stream": ("pinned", lambda: SideStreamStrategy(lookahead=1), False),
    "side stream, gc off": ("pinned", lambda: SideStreamStrategy(lookahead=1), True),
    "side stream, lookahead 2": ("pinned", lambda: SideStreamStrategy(lookahead=2), False),
    "side stream, 1 in 8 timed": ("pinned", lambda: SideStreamStrategy(lookahead=1, timing_every=8), False),
    "side stream, side-pool memory": ("pinned", lambda: SideAllocStrategy(lookahead=1), False),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--size", type=float, default=32, help="batch MB")
    parser.add_argument("--factors", type=float, nargs="+", default=[0.5, 1.0], help="compute / copy time")
    args = parser.parse_args()
    cycles_per_ms = calibrate_cuda_sleep()
    bandwidth = pinned_bandwidth(256 * MB)
    nbytes = int(args.size * MB)
    copy_ms = nbytes / bandwidth * 1e3
    pageable = torch.randn(nbytes // 4)
    batches = {"pinned": pageable.pin_memory(), "resident": pageable.cuda()}
    rows, cases = [], []
    for factor in args.factors:
        cycles = int(max(0.2, factor * copy_ms) * cycles_per_ms)
        runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
        for _ in range(args.repeats):
            for name, (batch, strategy, gc_off) in VARIANTS.items():
                runs[name].append(traced_run(batches[batch], cycles, strategy(), args.steps, gc_off))
        cases.append({"compute_factor": factor, "copy_ms": copy_ms, "runs": runs})
        for name, results in runs.items():
            figures = {key: statistics.median(result[key] for result in results) for key in results[0]}
            rows.append([f"{factor:g}x", name, *(round(value, 3) for value in figures.values())])
    headers = ["compute", "variant", "mean ms", "median ms", "p90 ms", "GPU step ms", "GPU idle ms"]
    table = _common.print_table([*headers, "fetch us", "batch_to_device us"], rows)
    print(f"batch {args.size:g} MB, copy {copy_ms:.2f} ms; each figure: median over {args.repeats} runs")
    _common.write_json("host_bound", {"args": vars(args), "cases": cases, "table": table})


if __name__ == "__main__":
    main()
