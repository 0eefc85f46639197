"""What DataPerfCallback itself costs per step, measured inside the run rather than by difference.

    python benchmarks/self_time.py --device cpu --repeats 5

``overhead.py`` compares whole runs with and without the callback; on a busy 2-core machine the
run-to-run spread (±25%) hides a cost of 1%. Here every hook the callback runs (its Callback hooks and
the two fetch hooks) is wrapped in a ``perf_counter_ns`` stopwatch, and the CPU time of the telemetry
and hang-watchdog threads is read from the OS, in the same run as the step time they are compared
with. What this leaves out: indirect costs (cache effects, the GIL held by the telemetry thread while
the main thread waits).

The workload's loader is a plain iterable, which the in-loader timing cannot look into; its cost is
measured apart ("in-loader timing"): the same ready batches through a ``DataLoader(num_workers=0)``,
one instrumented and one not, in alternating blocks of ``--loader-block`` batches (each timed block
drains its probe once, as a log point does), so that the timed dataset, collate and unwrapping all run
in the main process: the median per-batch difference. It runs in a tight loop (warm caches), so it is
a lower bound for the cost inside a training step; with workers, only the unwrapping stays here.
"""

from __future__ import annotations

import argparse
import statistics
import time

import _common
import psutil
import torch
from overhead import WORKLOADS, WallClock, fit_workload
from torch.utils.data import DataLoader

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.loader.probe import instrument


def stopwatch(function, totals: dict[str, int], name: str):
    def timed(*args, **kwargs):
        started = time.perf_counter_ns()
        try:
            return function(*args, **kwargs)
        finally:
            totals[name] = totals.get(name, 0) + time.perf_counter_ns() - started

    return timed


def instrumented(totals: dict[str, int]) -> DataPerfCallback:
    perf = DataPerfCallback(print_summary=False, write_json=False)
    for name in vars(DataPerfCallback):
        if name.startswith("on_") and callable(getattr(perf, name)):
            setattr(perf, name, stopwatch(getattr(perf, name), totals, name))
    perf._hooks.before = stopwatch(perf._hooks.before, totals, "fetch_before")
    perf._hooks.after = stopwatch(perf._hooks.after, totals, "fetch_after")
    return perf


def sampler_cpu_seconds(perf: DataPerfCallback) -> float:
    """CPU seconds of the callback's own threads so far: the telemetry sampler's and the hang watchdog's."""
    tickers = [owner._ticker for owner in (perf.sampler, perf._watchdog) if owner is not None]
    ids = {ticker._thread.native_id for ticker in tickers if ticker._thread is not None}
    return sum(info.user_time + info.system_time for info in psutil.Process().threads() if info.id in ids)


class SamplerClock(WallClock):
    """Also reads the telemetry thread's CPU time at the start and end of the measured steps."""

    def __init__(self, warmup: int, perf: DataPerfCallback) -> None:
        super().__init__(warmup)
        self.perf, self.cpu_start, self.cpu_end = perf, 0.0, 0.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if batch_idx + 1 == self.warmup:
            self.cpu_start = sampler_cpu_seconds(self.perf)

    def on_train_epoch_end(self, trainer, pl_module):
        self.cpu_end = sampler_cpu_seconds(self.perf)
        super().on_train_epoch_end(trainer, pl_module)


def one_run(device: str, steps: int, warmup: int) -> dict[str, float]:
    totals: dict[str, int] = {}
    perf = instrumented(totals)
    clock = SamplerClock(warmup, perf)
    fit_workload(device, steps, [perf, clock])
    per_step_us = sum(totals.values()) / 1e3 / steps
    sampler_share = (clock.cpu_end - clock.cpu_start) / (clock.end - clock.start)
    return {
        "step_ms": clock.step_time * 1e3,
        "callback_us_per_step": per_step_us,
        "sampler_cpu_share": sampler_share,
        "implied_ratio": 1 + per_step_us / 1e3 / (clock.step_time * 1e3) + sampler_share,
    }


class _ReadyBatches:
    """A map-style dataset whose items are whole batches (``DataLoader(batch_size=None)``)."""

    def __init__(self, batches: list) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int):
        return self.batches[index]


def in_loader_us_per_batch(device: str, blocks: int, block: int) -> float:
    """Median per-batch main-process cost of the in-loader timing (see the module docstring)."""
    width, _, batch = WORKLOADS[device]
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(batch, width, generator=generator), torch.randn(batch, generator=generator))] * block
    plain = DataLoader(_ReadyBatches(batches), batch_size=None)
    timed = DataLoader(_ReadyBatches(batches), batch_size=None)
    probe = instrument(timed)
    assert probe.blind is None, probe.blind

    def block_time(loader: DataLoader) -> float:
        started = time.perf_counter_ns()
        for _ in loader:
            pass
        if loader is timed:
            probe.completed()
        return (time.perf_counter_ns() - started) / block

    differences = []
    for _ in range(blocks):
        before, with_probe, after = block_time(plain), block_time(timed), block_time(plain)
        differences.append(with_probe - (before + after) / 2)
    return statistics.median(differences) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--loader-blocks", type=int, default=300, help="in-loader timing: blocks of each kind")
    parser.add_argument("--loader-block", type=int, default=50, help="in-loader timing: batches per block")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    runs = [one_run(args.device, args.steps, args.warmup) for _ in range(args.repeats)]
    medians = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    medians["in_loader_us_per_batch"] = in_loader_us_per_batch(args.device, args.loader_blocks, args.loader_block)
    table = _common.print_table(
        [
            "device",
            "step (ms)",
            "callback hooks (us/step)",
            "own threads (CPU share)",
            "implied ratio",
            "in-loader timing (us/batch, warm)",
        ],
        [
            [
                args.device,
                medians["step_ms"],
                medians["callback_us_per_step"],
                medians["sampler_cpu_share"],
                medians["implied_ratio"],
                medians["in_loader_us_per_batch"],
            ]
        ],
    )
    _common.write_json(
        f"self_time_{args.device}", {"args": vars(args), "runs": runs, "medians": medians, "table": table}
    )


if __name__ == "__main__":
    main()
