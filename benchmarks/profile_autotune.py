"""Where one autotune search's time goes: ``cProfile`` around ``autotune_loader`` on the I/O-latency dataset.

Prints the functions with the most cumulative time (the search, the trials, the main thread's ``next()``
and what it spends receiving batches from the workers) as a table, and writes JSON.

    python benchmarks/profile_autotune.py --budget 30 --top 25
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

from _common import print_table, write_json
from autotune import SleepySamples

from lightning_dataperf import autotune_loader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=30.0, help="autotune time budget (s)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--top", type=int, default=25, help="functions listed, by cumulative time")
    parser.add_argument("--name", default="profile_autotune")
    args = parser.parse_args()
    cache = Path(tempfile.mkdtemp()) / "autotune.json"  # a fresh cache: the search runs
    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.enable()
    result = autotune_loader(SleepySamples(), args.batch_size, time_budget=args.budget, cache_path=cache)
    profile.disable()
    wall = time.perf_counter() - started
    print(result.format())
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    entries = sorted(stats.items(), key=lambda item: item[1][3], reverse=True)[: args.top]
    rows = []
    for (filename, line, function), (calls, _, own, cumulative, _) in entries:
        where = f"{Path(filename).name}:{line}({function})" if line else function
        rows.append([where, calls, f"{own:.2f}", f"{cumulative:.2f}", f"{100 * cumulative / wall:.0f}%"])
    table = print_table(["function", "calls", "own s", "cumulative s", "of the search"], rows)
    payload = {"args": vars(args), "wall_s": wall, "settings": result.settings.as_kwargs(), "table": table}
    write_json(args.name, payload)


if __name__ == "__main__":
    main()
