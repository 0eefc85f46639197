"""The online loop on a simulated collate-like pipeline (2 cores): its kept settings over many seeded runs.

Each setting runs at its measured rate between stalls of the training process (a full garbage collection, 140 ms,
at a rate per setting as timed on the 2-core VM), and the machine slows by ``--slowdown`` for 3 s in every 5-25 s.
A run is planned 60 s at the best setting's rate; the loop is fed each step's start as the glue would.

    PYTHONPATH=$PWD python benchmarks/loop_sim.py --runs 200 --slowdown 1.0 1.08 1.15

Prints one row per slowdown (the kept settings, the runs at 95% of the best or more) and writes JSON.
"""

from __future__ import annotations

import argparse
import collections
import random
from typing import Any

from _common import print_table, write_json

from lightning_dataperf.autotune.online import OnlineLoop, Setting, SettingSpace

#: Steps/s between stalls at 0-4 workers + 1 thread (collate, 2-core VM), and stalls a second in each.
FREE = {0: 215.0, 1: 236.0, 2: 266.0, 3: 285.0, 4: 275.0}
STALLS_PER_S = {0: 0.75, 1: 0.7, 2: 0.6, 3: 0.45, 4: 0.35}
STALL_S = 0.14
START = Setting(0, None, False, 2)
SPACE = SettingSpace(max_workers=4, cpus=2, tune_threads=True, tune_pinning=False)


def free_rate(setting: Setting) -> float:
    """Steps/s between stalls: 2 intra-op threads beside workers cost 38%, 1 thread at 0 workers 3%."""
    rate = FREE[setting.num_workers]
    if setting.num_workers and setting.threads == 2:
        rate *= 0.62
    if not setting.num_workers and setting.threads == 1:
        rate *= 0.97
    return rate


def rate(workers: int, threads: int) -> float:
    """Steps/s a fit sees, stalls included."""
    return free_rate(Setting(workers, 2, False, threads)) / (1 + STALL_S * STALLS_PER_S[workers])


def run(seed: int, slowdown: float, seconds: float = 60.0) -> tuple[int, int]:
    """One seeded run of the loop; the kept (workers, threads)."""
    rng = random.Random(seed)
    planned = seconds * max(rate(workers, 1) for workers in FREE)
    loop = OnlineLoop(START, SPACE, planned=lambda: planned)
    now, current = 0.0, START
    stall_at, slow_at = rng.expovariate(STALLS_PER_S[0]), rng.uniform(5, 25)
    for _ in range(int(planned)):
        setting = loop.step(now)
        if setting is not None:
            loop.switched(0.03)
            current, now = setting, now + 0.03
            loop.restart(1)
        slow = slowdown if slow_at <= now < slow_at + 3 else 1.0
        if now >= slow_at + 3:
            slow_at = now + rng.uniform(5, 25)
        now += max(1e-4, rng.gauss(1, 0.2) * slow / free_rate(current))
        if now >= stall_at:
            now += STALL_S
            stall_at = now + rng.expovariate(STALLS_PER_S[current.num_workers])
    kept = (loop.result.kept or loop.result.start).setting
    return kept.num_workers, kept.threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--slowdown", type=float, nargs="+", default=[1.0, 1.08, 1.15])
    parser.add_argument("--name", default="loop_sim")
    args = parser.parse_args()
    best = max(rate(workers, 1) for workers in FREE)
    rows: list[dict[str, Any]] = []
    table: list[list[str]] = []
    for slowdown in args.slowdown:
        kept = collections.Counter(run(seed, slowdown) for seed in range(args.runs))
        good = sum(count for (workers, threads), count in kept.items() if rate(workers, threads) >= 0.95 * best)
        picks = ", ".join(f"{w}w{t}t x{count}" for (w, t), count in kept.most_common())
        table.append([f"{slowdown:g}", picks, f"{good} of {args.runs}"])
        rows.append({"slowdown": slowdown, "kept": {f"{w}w{t}t": c for (w, t), c in kept.items()}, "good": good})
    print_table(["slowdown", "kept (of runs)", "at 95% of the best or more"], table)
    write_json(args.name, {"runs": args.runs, "rows": rows})


if __name__ == "__main__":
    main()
