"""How a loader's rate moves over a long run, and what autotune's trial rule reads from its first seconds.

Each configuration runs ``--seconds`` through the training path (the consumer autotune's trials use), its batch
arrivals and the moments the workers finished each batch recorded. Printed per configuration: the rate in
successive windows after the first batch, the long run's rate (the second half, well past start-up), and the
rate autotune's rule (``trial_rate``: the burst skipped, only batches made inside the window) reads from the
same run cut at ``--cuts`` seconds after its burst, as a trial capped there would. A cut that reads well
above the long run is a trial rule that overrates the configuration on short trials.

    python benchmarks/rate_over_time.py --workload jpeg --path side_stream --configs 15p 32p --seconds 20  # H200
    python benchmarks/rate_over_time.py --workload io --configs 8u 32u --seconds 10
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import print_table, write_json
from trial_noise import label, parse_config, workload

from lightning_dataperf import probe_hardware
from lightning_dataperf.autotune.runner import TrialRunner
from lightning_dataperf.autotune.trial import Limits, trial_rate
from lightning_dataperf.loader.probe import TimedBatch


def record(runner: TrialRunner, config: tuple[int, int, bool], seconds: float, sharing: str | None) -> dict:
    """Arrivals (s after the loader was asked for its first batch) and the workers' batch-made moments."""
    workers, prefetch, pin = config
    consume = runner.path.consumer()
    started = time.perf_counter()
    iterator = iter(runner._loader(workers, prefetch if workers else None, pin, sharing))
    arrivals: list[float] = []
    made: list[float] = []
    try:
        for item in iterator:
            batch = item
            if type(item) is TimedBatch:
                made.append(item.timing.produced_at - started)
                batch = item.batch
            consume(batch)
            arrivals.append(time.perf_counter() - started)
            if arrivals[-1] - arrivals[0] > seconds:
                break
        consume.finish()
    finally:
        del iterator  # shuts the workers down
    return {"arrivals": arrivals, "made": made}


def cut_rate(arrivals: list[float], made: list[float], workers: int, prefetch: int, cut: float) -> float | None:
    """The rate autotune's rule reads from this run had the trial stopped ``cut`` s after its burst."""
    in_flight = workers * (prefetch if workers else 0)
    skip = max(0, in_flight - 1)
    if len(arrivals) <= skip:
        return None
    end = next((i for i, moment in enumerate(arrivals) if moment - arrivals[skip] > cut), len(arrivals))
    # a trial runs at least one round and the batches in flight after the burst (autotune_drain)
    end = max(end, skip + 1 + max(1, workers) + in_flight)
    rate, _, rough = trial_rate(arrivals[: end + 1], made, workers, skip, in_flight)
    return rate if rate and not rough else None  # no steady round: no rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["cpu", "io", "jpeg", "tiny"], default="tiny")
    parser.add_argument("--path", choices=["stock", "side_stream"], default="stock", help="jpeg's transfer path")
    parser.add_argument("--configs", nargs="+", default=["1u", "2u"], help="<workers>[x<prefetch>]<p|u>")
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument("--sharing", default=None)
    parser.add_argument("--seconds", type=float, default=20.0, help="each run's length after its first batch")
    parser.add_argument("--runs", type=int, default=2, help="runs of each configuration, interleaved")
    parser.add_argument("--window", type=float, default=1.0, help="seconds per printed window")
    parser.add_argument("--cuts", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--name", default="rate_over_time")
    args = parser.parse_args()
    dataset, batch_size, path = workload(args.workload, args.path)
    configs = [parse_config(text, args.prefetch) for text in args.configs]
    limits = Limits(1e9, 10**9, 0.03, 0.5, None, 0, trial_seconds=args.seconds)
    runner = TrialRunner(dataset, batch_size, {}, probe_hardware(), path, limits)
    runner.learn_batch_size()
    runs: dict[str, list[dict]] = {label(config): [] for config in configs}
    for index in range(args.runs):
        for config in configs if index % 2 == 0 else list(reversed(configs)):
            run = record(runner, config, args.seconds, args.sharing)
            runs[label(config)].append(run)
            arrivals, made = run["arrivals"], run["made"]
            workers, prefetch, _ = config
            windows = []
            edge = arrivals[0]
            while edge + args.window <= arrivals[-1]:  # whole windows
                count = sum(1 for moment in arrivals if edge <= moment < edge + args.window)
                windows.append(count / args.window)
                edge += args.window
            half = arrivals[len(arrivals) // 2 :]
            run["windows"] = windows
            run["long"] = (len(half) - 1) / (half[-1] - half[0])
            run["cuts"] = {cut: cut_rate(arrivals, made, workers, prefetch, cut) for cut in args.cuts}
            run["startup"] = arrivals[0]
            cuts = ", ".join(f"{cut:g}s {value:.1f}" if value else f"{cut:g}s -" for cut, value in run["cuts"].items())
            print(f"  {label(config)} run {index + 1}: start-up {arrivals[0]:.2f} s, windows "
                  f"{' '.join(f'{value:.0f}' for value in windows)}; second half {run['long']:.1f}/s; cuts {cuts}",
                  flush=True)  # fmt: skip
    rows = []
    for name, items in runs.items():
        long = statistics.fmean(run["long"] for run in items)
        cells = []
        for cut in args.cuts:
            values = [run["cuts"][cut] for run in items if run["cuts"][cut]]
            mean = statistics.fmean(values) if values else None
            cells.append(f"{mean:.1f} ({100 * mean / long:.0f}%)" if mean else "-")
        startup = statistics.fmean(run["startup"] for run in items)
        rows.append([name, len(items), f"{startup:.2f}", f"{long:.1f}", *cells])
    headers = ["config", "runs", "start-up s", "long-run batches/s (second half)"]
    table = print_table([*headers, *(f"rule at {cut:g} s" for cut in args.cuts)], rows)
    write_json(args.name, {"args": vars(args), "table": table, "runs": runs})


if __name__ == "__main__":
    main()
