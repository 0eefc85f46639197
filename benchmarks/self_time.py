"""What DataPerfCallback itself costs per step, measured inside the run rather than by difference.

    python benchmarks/self_time.py --device cpu --repeats 5

``overhead.py`` compares whole runs with and without the callback; on a busy 2-core machine the
run-to-run spread (±25%) hides a cost of 1%. Here every hook the callback runs (its Callback hooks and
the two fetch hooks) is wrapped in a ``perf_counter_ns`` stopwatch, and the telemetry thread's CPU time
is read from the OS, in the same run as the step time they are compared with. What this leaves out:
indirect costs (cache effects, the GIL held by the telemetry thread while the main thread waits).
"""

from __future__ import annotations

import argparse
import statistics
import time

import _common
import psutil
import torch
from overhead import WallClock, fit_workload

from lightning_dataperf import DataPerfCallback


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
    thread = perf.sampler._thread if perf.sampler is not None else None
    if thread is None:
        return 0.0
    for info in psutil.Process().threads():
        if info.id == thread.native_id:
            return info.user_time + info.system_time
    return 0.0


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    runs = [one_run(args.device, args.steps, args.warmup) for _ in range(args.repeats)]
    medians = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    table = _common.print_table(
        ["device", "step (ms)", "callback hooks (us/step)", "telemetry thread (CPU share)", "implied ratio"],
        [
            [
                args.device,
                medians["step_ms"],
                medians["callback_us_per_step"],
                medians["sampler_cpu_share"],
                medians["implied_ratio"],
            ]
        ],
    )
    _common.write_json(
        f"self_time_{args.device}", {"args": vars(args), "runs": runs, "medians": medians, "table": table}
    )


if __name__ == "__main__":
    main()
