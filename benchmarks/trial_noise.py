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
    python benchmarks/trial_noise.py --workload jpeg --configs 15p 18p 24u 32u --trials 8   # H200, ResNet-18

A configuration is ``--workers`` at ``--prefetch`` unpinned, or ``--configs`` written ``<workers>[x<prefetch>]<p|u>``
(``p`` pinned, ``u`` not). The table also ranks the configurations by their mean rate: where they sit within
each other's spread (a plateau), one trial each cannot order them.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics

import torch
from _common import print_table, write_json
from autotune import workloads

from lightning_dataperf import probe_hardware
from lightning_dataperf.autotune.consumer import TransferPath
from lightning_dataperf.autotune.runner import TrialRunner
from lightning_dataperf.autotune.trial import Limits

Config = tuple[int, int, bool]


def parse_config(text: str, prefetch: int) -> Config:
    """``"24x4u"`` -> ``(24, 4, False)``; ``"15p"`` -> ``(15, prefetch, True)``."""
    match = re.fullmatch(r"(\d+)(?:x(\d+))?([pu])", text)
    if match is None:
        raise SystemExit(f"--configs {text!r}: write <workers>[x<prefetch>]<p|u>, e.g. 15p or 24x4u")
    return int(match[1]), int(match[2] or prefetch), match[3] == "p"


def label(config: Config) -> str:
    workers, prefetch, pin = config
    return f"{workers}x{prefetch}{'p' if pin else 'u'}"


def workload(name: str, path: str = "stock") -> tuple[object, int, TransferPath]:
    """``(dataset, batch size, path)`` of ``benchmarks/autotune.py``'s workload ``name`` (jpeg: over ``path``,
    the stock copy or the side stream). The dataset is made once (the same JPEG blobs for every trial; the
    others hold no state)."""
    device = torch.device("cuda", 0) if name == "jpeg" and torch.cuda.is_available() else None  # the rest: host
    plans = workloads([name], device, [path])
    if not plans:
        raise SystemExit("--workload jpeg needs CUDA and torchvision (the H200 row of benchmarks/autotune.py)")
    _, _, factory, batch_size, make_path = plans[0]
    return factory(), batch_size, make_path()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["cpu", "io", "jpeg", "tiny"], default="tiny")
    parser.add_argument("--path", choices=["stock", "side_stream"], default="stock", help="jpeg's transfer path")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument("--configs", nargs="+", default=None, help="instead of --workers: e.g. 15p 18p 24x4u")
    parser.add_argument("--sharing", default=None, help="the workers' sharing strategy (default: the process's)")
    parser.add_argument("--trials", type=int, default=8, help="trials of each configuration")
    parser.add_argument("--budget", type=float, default=30.0, help="the search budget whose trial caps are used")
    parser.add_argument("--name", default="trial_noise")
    args = parser.parse_args()
    dataset, batch_size, path = workload(args.workload, args.path)
    configs = [parse_config(text, args.prefetch) for text in args.configs or []]
    configs = configs or [(workers, args.prefetch, False) for workers in args.workers]
    hardware = probe_hardware()
    limits = Limits(1e9, 400, 0.03, 0.5, None, 0, trial_seconds=max(1.0, args.budget / 15))
    rates: dict[Config, list[float]] = {config: [] for config in configs}
    errors: dict[Config, list[float]] = {config: [] for config in configs}
    for index in range(args.trials):
        for config in configs if index % 2 == 0 else list(reversed(configs)):
            runner = TrialRunner(dataset, batch_size, {}, hardware, path, limits)
            runner.learn_batch_size()
            try:
                trial = runner.run(*config, sharing=args.sharing)
            finally:
                runner.close()
            rates[config].append(trial.batches_per_sec)
            errors[config].append(trial.precision if trial.precision is not None else float("nan"))
            print(f"  {label(config)}, trial {index + 1}: {trial.batches_per_sec:.1f} batches/s, reported error "
                  f"{100 * errors[config][-1]:.1f}%, {trial.batches} batches", flush=True)  # fmt: skip
    rows, summary = [], {}
    top = max(statistics.fmean(values) for values in rates.values())
    for config in sorted(configs, key=lambda item: statistics.fmean(rates[item]), reverse=True):
        mean = statistics.fmean(rates[config])
        spread = statistics.stdev(rates[config]) / mean if len(rates[config]) > 1 else float("nan")
        reported = statistics.fmean(error for error in errors[config] if not math.isnan(error))
        of_top = mean / top
        mean_error = spread / math.sqrt(len(rates[config]))  # the mean's own standard error, from the spread
        summary[label(config)] = {
            "mean": mean, "spread": spread, "reported": reported, "rates": rates[config], "of_top": of_top,
        }  # fmt: skip
        rows.append([label(config), len(rates[config]), f"{mean:.1f}", f"{100 * of_top:.1f}% ± {200 * mean_error:.1f}",
                     f"{100 * reported:.1f}%", f"{100 * spread:.1f}%", f"{spread / reported:.1f}x"])  # fmt: skip
    table = print_table(
        ["config", "trials", "mean batches/s", "of the fastest mean ± 2 SE (its own)", "reported error (mean)",
         "spread between trials", "spread / reported"],
        rows,
    )  # fmt: skip
    write_json(args.name, {"args": vars(args), "table": table, "summary": summary})


if __name__ == "__main__":
    main()
