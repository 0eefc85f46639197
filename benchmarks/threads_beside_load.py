"""CPU training's intra-op threads beside one busy process: each computing pipeline at every thread count, on a
quiet machine and beside a process that spins on one core, in interleaved repeats.

    PYTHONPATH=$PWD python benchmarks/threads_beside_load.py --pipelines tiny quickstart --name threads_2core

What ``TunedDataModule(intra_op_threads="auto")`` rests on: torch's default (one thread per core) assumes
nothing else runs. Prints steps/s per setting and the busy/quiet ratio; writes ``results/<name>.json``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import warnings

from _common import print_table, write_json
from _cpu_pipelines import OTHERS, PIPELINES, measure, usable_cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipelines", nargs="+", default=["tiny", "quickstart"], choices=list(PIPELINES))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--name", default="threads_beside_load")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    random.seed(0)
    cpus = usable_cpus()
    points = [(name, threads, busy) for name in args.pipelines for threads in range(1, cpus + 1) for busy in (0, 1)]
    rates: dict[tuple[str, int, int], list[float]] = {point: [] for point in points}
    others: dict[tuple[str, int, int], list[float]] = {point: [] for point in points}
    for _ in range(args.reps):
        for name, threads, busy in random.sample(points, len(points)):
            spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
            try:
                workers = PIPELINES[name]["start"]
                rates[(name, threads, busy)].append(measure(name, workers, threads, args.seconds))
                others[(name, threads, busy)].append(OTHERS[-1])
            finally:
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
    median = {point: statistics.median(values) for point, values in rates.items()}
    rows = [
        [
            name,
            PIPELINES[name]["start"],
            threads,
            f"{median[(name, threads, 0)]:.1f}",
            f"{median[(name, threads, 1)]:.1f}",
            f"{median[(name, threads, 1)] / median[(name, threads, 0)]:.2f}x",
            f"{max(others[(name, threads, 0)]):.2f} / {statistics.median(others[(name, threads, 1)]):.2f}",
        ]
        for name in args.pipelines
        for threads in range(1, cpus + 1)
    ]
    table = print_table(
        ["pipeline", "workers", "threads", "quiet steps/s", "beside one busy process", "busy / quiet", "others' cores"],
        rows,
    )

    def keyed(values: dict[tuple[str, int, int], list[float]]) -> dict[str, list[float]]:
        return {f"{name} {threads}t busy={busy}": value for (name, threads, busy), value in values.items()}

    write_json(args.name, {"args": vars(args), "rates": keyed(rates), "others": keyed(others), "table": table})


if __name__ == "__main__":
    main()
