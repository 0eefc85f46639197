"""Does pinning win or lose with workers? Read from grids already measured, no new run.

For each workload of each given ``benchmarks/autotune.py`` result, every grid point with workers and
``pin_memory=True`` is paired with the same point unpinned (same workers, prefetch and sharing), and the
ratio unpinned / pinned is summarised: median, mean, spread, and the share of pairs unpinned read faster.
Autotune keeps the policy's pinning where a close call is only the other pinning at the same workers
(``autotune_choice._other_pinning``); a median near 1 with pairs either side says the grid cannot tell the
two apart, one well off 1 that the policy's pinning is wrong for that path.

Usage::

    python benchmarks/pin_pairs.py results/autotune_h200_jpeg_stock_s20.json ... --name pin_pairs_s20
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
from pathlib import Path

from _common import print_table, write_json


def pairs(grid: dict[str, float]) -> list[float]:
    """Unpinned / pinned rate for every grid point with workers that was measured both ways."""
    points = {ast.literal_eval(key): rate for key, rate in grid.items()}
    ratios = []
    for key, pinned in points.items():
        workers, prefetch, pin, *sharing = key
        unpinned = points.get((workers, prefetch, False, *sharing))
        if workers and pin is True and unpinned is not None and pinned > 0:
            ratios.append(unpinned / pinned)
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="benchmarks/autotune.py JSON files")
    parser.add_argument("--name", default="pin_pairs")
    args = parser.parse_args()
    rows, summary = [], {}
    for path in args.results:
        for workload, data in json.loads(path.read_text())["workloads"].items():
            ratios = pairs(data["grid"])
            if len(ratios) < 2:
                continue
            row = {
                "pairs": len(ratios),
                "median": statistics.median(ratios),
                "mean": statistics.mean(ratios),
                "sd": statistics.stdev(ratios),
                "unpinned_faster": sum(ratio > 1 for ratio in ratios) / len(ratios),
            }
            summary[f"{path.stem}:{workload}"] = row
            figures = (row[key] for key in ("median", "mean", "sd", "unpinned_faster"))
            rows.append([path.stem, workload, row["pairs"], *figures])
    headers = ["result", "workload", "pairs", "unpinned/pinned median", "mean", "sd", "share unpinned faster"]
    table = print_table(headers, rows)
    write_json(args.name, {"args": {"results": [str(p) for p in args.results]}, "table": table, "summary": summary})


if __name__ == "__main__":
    main()
