"""Is a trial's reported error the error it has? Autotune's standard error against the spread between trials.

Autotune calls two configurations different only beyond ``margin()``: the noise, or twice the two trials'
combined standard error, each trial's error estimated from its own rounds of batches. This runs ``--trials``
fresh trials of each configuration by autotune's own rule (``TrialRunner.run``: start-up excluded, stopped
once the rate is known within the precision, or at the caps of a ``--budget``-second search), the
configurations interleaved, and prints per configuration the mean of the trials' reported relative standard
errors against the relative standard deviation of their rates (what the reported error claims to be). A
ratio well above 1 means the trials differ by more than they say: "beyond noise" is then too easily met.

    python benchmarks/trial_noise.py --workload tiny --workers 1 2 3 --trials 12
    python benchmarks/trial_noise.py --workload io --workers 52 77 --sharing file_system --trials 8
"""

from __future__ import annotations

import argparse
import math
import statistics

from _common import print_table, write_json
from autotune import DecodedImages, SleepySamples, TinySamples

from lightning_dataperf import probe_hardware
from lightning_dataperf.autotune_consumer import TransferPath
from lightning_dataperf.autotune_records import Limits
from lightning_dataperf.autotune_trials import TrialRunner

#: ``(dataset factory, batch size, path)`` of ``benchmarks/autotune.py``'s CPU workloads.
WORKLOADS = {
    "tiny": (TinySamples, 64, TransferPath(host_step_seconds=0.002)),
    "cpu": (DecodedImages, 32, TransferPath()),
    "io": (SleepySamples, 16, TransferPath()),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="tiny")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument("--sharing", default=None, help="the workers' sharing strategy (default: the process's)")
    parser.add_argument("--trials", type=int, default=8, help="trials of each configuration")
    parser.add_argument("--budget", type=float, default=30.0, help="the search budget whose trial caps are used")
    parser.add_argument("--name", default="trial_noise")
    args = parser.parse_args()
    dataset_factory, batch_size, path = WORKLOADS[args.workload]
    hardware = probe_hardware()
    limits = Limits(1e9, 400, 0.03, 0.5, None, 0, trial_seconds=max(1.0, args.budget / 15))
    rates: dict[int, list[float]] = {workers: [] for workers in args.workers}
    errors: dict[int, list[float]] = {workers: [] for workers in args.workers}
    for index in range(args.trials):
        for workers in args.workers if index % 2 == 0 else list(reversed(args.workers)):
            runner = TrialRunner(dataset_factory(), batch_size, {}, hardware, path, limits)
            runner.learn_batch_size()
            try:
                trial = runner.run(workers, args.prefetch, False, sharing=args.sharing)
            finally:
                runner.close()
            rates[workers].append(trial.batches_per_sec)
            errors[workers].append(trial.precision if trial.precision is not None else float("nan"))
            print(f"  {workers} workers, trial {index + 1}: {trial.batches_per_sec:.1f} batches/s, reported error "
                  f"{100 * errors[workers][-1]:.1f}%, {trial.batches} batches", flush=True)  # fmt: skip
    rows, summary = [], {}
    for workers in args.workers:
        mean = statistics.fmean(rates[workers])
        spread = statistics.stdev(rates[workers]) / mean if len(rates[workers]) > 1 else float("nan")
        reported = statistics.fmean(error for error in errors[workers] if not math.isnan(error))
        summary[workers] = {"mean": mean, "spread": spread, "reported": reported, "rates": rates[workers]}
        rows.append([workers, len(rates[workers]), f"{mean:.1f}", f"{100 * reported:.1f}%", f"{100 * spread:.1f}%",
                     f"{spread / reported:.1f}x"])  # fmt: skip
    table = print_table(
        ["workers", "trials", "mean batches/s", "reported error (mean)", "spread between trials", "spread / reported"],
        rows,
    )
    write_json(args.name, {"args": vars(args), "table": table, "summary": summary})


if __name__ == "__main__":
    main()
