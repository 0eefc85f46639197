"""Side-stream copies vs stock Lightning on a GPU: step time as a ratio to the ideal.

The loader hands over ready batches (no loader cost). For each batch size the GPU step is a
``torch.cuda._sleep`` of 0.5x, 1x and 2x the measured pinned copy time. Variants: stock Lightning with
pageable batches, stock with pinned batches, and ``SideStreamStrategy`` (pinned). The ideal is
max(step time with the data already on the GPU, copy time). A second table repeats the source
article's pin_memory experiment (224x224 images, batch 8/16/32/128) with spread over repeats.

    python benchmarks/transfer.py --repeats 3
"""

from __future__ import annotations

import argparse
import statistics

import _common
import lightning.pytorch as pl
import torch
from overhead import WallClock

from lightning_dataperf import SideStreamStrategy
from lightning_dataperf.testing import calibrate_cuda_sleep

MB = 1 << 20


class ReadyBatches:
    """Yields the same prepared batch ``steps`` times (a loader that costs nothing)."""

    def __init__(self, batch: torch.Tensor, steps: int) -> None:
        self.batch, self.steps = batch, steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        for _ in range(self.steps):
            yield self.batch


class SleepStep(pl.LightningModule):
    def __init__(self, cycles: int) -> None:
        super().__init__()
        self.cycles = cycles
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        torch.cuda._sleep(self.cycles)
        return (batch.view(-1)[:1] * self.weight).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


class SideAllocStrategy(SideStreamStrategy):
    """The side stream with device memory from the side stream's pool and ``record_stream`` (older path)."""

    @property
    def copier(self):
        copier = super().copier
        copier.allocate_on_compute = False
        return copier


def pinned_bandwidth(nbytes: int) -> float:
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        device.copy_(host, non_blocking=True)
    end.record()
    end.synchronize()
    return nbytes * 10 / (start.elapsed_time(end) / 1e3)


def step_time(batch: torch.Tensor, cycles: int, strategy, steps: int, devices: int = 1) -> float:
    """Mean step time after 5 warm-up steps of ``SleepStep`` on ``steps`` copies of ``batch``."""
    clock = WallClock(warmup=5)
    _common.fit_quietly(
        SleepStep(cycles),
        ReadyBatches(batch, steps),
        accelerator="cuda",
        devices=devices,
        strategy=strategy,
        callbacks=[clock],
        logger=False,
    )
    return clock.step_time


def measure(
    nbytes: int, cycles: int, steps: int, repeats: int, side_alloc: bool = False, timing_every: int | None = None
) -> dict[str, list[float]]:
    pageable = torch.randn(nbytes // 4)
    pinned = pageable.pin_memory()
    resident = pageable.cuda()
    runs: dict[str, list[float]] = {"resident": [], "stock_pageable": [], "stock_pinned": [], "side_stream": []}
    if side_alloc:
        runs["side_stream_side_alloc"] = []
    sampled = f"side_stream_timing_every_{timing_every}"
    if timing_every:
        runs[sampled] = []
    for _ in range(repeats):
        runs["resident"].append(step_time(resident, cycles, "auto", steps))
        runs["stock_pageable"].append(step_time(pageable, cycles, "auto", steps))
        runs["stock_pinned"].append(step_time(pinned, cycles, "auto", steps))
        runs["side_stream"].append(step_time(pinned, cycles, SideStreamStrategy(lookahead=1), steps))
        if side_alloc:
            runs["side_stream_side_alloc"].append(step_time(pinned, cycles, SideAllocStrategy(lookahead=1), steps))
        if timing_every:
            strategy = SideStreamStrategy(lookahead=1, timing_every=timing_every)
            runs[sampled].append(step_time(pinned, cycles, strategy, steps))
    return runs


def spread(values: list[float]) -> str:
    return f"{1e3 * statistics.median(values):.2f} [{1e3 * min(values):.2f}-{1e3 * max(values):.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--sizes", type=float, nargs="+", default=[32, 128, 256], help="batch sizes in MB")
    parser.add_argument("--factors", type=float, nargs="+", default=[0.5, 1.0, 2.0], help="compute / copy time")
    parser.add_argument("--tiny", type=float, nargs="*", default=[0.0625], help="tiny batch MB, compute 1x")
    parser.add_argument("--skip-article", action="store_true", help="leave out the article's pin_memory table")
    parser.add_argument(
        "--compare-allocation", action="store_true", help="also run the side stream with side-stream allocation"
    )
    parser.add_argument(
        "--also-timing-every", type=int, help="also run the side stream timing one copy in N (default: every copy)"
    )
    args = parser.parse_args()
    cycles_per_ms = calibrate_cuda_sleep()
    bandwidth = pinned_bandwidth(256 * MB)
    print(f"pinned H2D bandwidth: {bandwidth / 1e9:.1f} GB/s; _sleep cycles/ms: {cycles_per_ms:.0f}")
    rows, results = [], []
    cases = [(size, factor) for size in args.sizes for factor in args.factors] + [(size, 1.0) for size in args.tiny]
    for size_mb, factor in cases:
        nbytes = int(size_mb * MB)
        copy_ms = nbytes / bandwidth * 1e3
        compute_ms = max(0.2, factor * copy_ms)
        cycles = int(compute_ms * cycles_per_ms)
        runs = measure(nbytes, cycles, args.steps, args.repeats, args.compare_allocation, args.also_timing_every)
        ideal = max(statistics.median(runs["resident"]), copy_ms / 1e3)
        ratios = {name: statistics.median(values) / ideal for name, values in runs.items() if name != "resident"}
        results.append(
            {
                "batch_MB": size_mb,
                "compute_factor": factor,
                "copy_ms": copy_ms,
                "ideal_ms": ideal * 1e3,
                "runs_s": runs,
                "ratio_to_ideal": ratios,
            }
        )
        rows.append(
            [
                f"{size_mb:g}",
                f"{factor:g}x",
                f"{copy_ms:.2f}",
                f"{ideal * 1e3:.2f}",
                spread(runs["stock_pageable"]),
                spread(runs["stock_pinned"]),
                spread(runs["side_stream"]),
                f"{ratios['stock_pageable']:.2f}",
                f"{ratios['stock_pinned']:.2f}",
                f"{ratios['side_stream']:.2f}",
            ]
        )
    _common.print_table(
        [
            "batch MB",
            "compute",
            "copy ms",
            "ideal ms",
            "stock pageable ms",
            "stock pinned ms",
            "side stream ms",
            "pageable/ideal",
            "pinned/ideal",
            "side/ideal",
        ],
        rows,
    )

    if args.also_timing_every:
        sampled = f"side_stream_timing_every_{args.also_timing_every}"
        _common.print_table(
            ["batch MB", "compute", "side ms", f"side, 1 in {args.also_timing_every} timed ms", "ratios to ideal"],
            [
                [
                    f"{r['batch_MB']:g}",
                    f"{r['compute_factor']:g}x",
                    spread(r["runs_s"]["side_stream"]),
                    spread(r["runs_s"][sampled]),
                    f"{r['ratio_to_ideal']['side_stream']:.2f} / {r['ratio_to_ideal'][sampled]:.2f}",
                ]
                for r in results
            ],
        )
    if args.compare_allocation:
        _common.print_table(
            ["batch MB", "compute", "side (compute-pool memory) / ideal", "side (side-pool + record_stream) / ideal"],
            [
                [
                    f"{r['batch_MB']:g}",
                    f"{r['compute_factor']:g}x",
                    r["ratio_to_ideal"]["side_stream"],
                    r["ratio_to_ideal"]["side_stream_side_alloc"],
                ]
                for r in results
            ],
        )
    article_rows, article = [], []
    image_bytes = 3 * 224 * 224 * 4
    for batch in () if args.skip_article else (8, 16, 32, 128):
        nbytes = batch * image_bytes
        compute_ms = 2.0
        runs = measure(nbytes, int(compute_ms * cycles_per_ms), args.steps, max(args.repeats, 5))
        article.append({"batch": batch, "batch_MB": nbytes / MB, "runs_s": runs})
        article_rows.append(
            [
                batch,
                f"{nbytes / MB:.1f}",
                spread(runs["resident"]),
                spread(runs["stock_pageable"]),
                spread(runs["stock_pinned"]),
                spread(runs["side_stream"]),
            ]
        )
    if article_rows:
        _common.print_table(
            ["batch", "MB", "data on GPU ms", "pin off ms", "pin on ms", "pin on + side stream ms"], article_rows
        )
    _common.write_json(
        "transfer", {"pinned_bandwidth_Bps": bandwidth, "cases": results, "article": article, "args": vars(args)}
    )


if __name__ == "__main__":
    main()
