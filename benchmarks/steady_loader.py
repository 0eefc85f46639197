"""Long-run loader rates: what an epoch sees, against which a trial's short measurement is read.

For each ``(num_workers, prefetch_factor)`` a plain DataLoader over the I/O-latency dataset of
``benchmarks/autotune.py`` (5 ms sleep per sample, batches of 16) is consumed for ``--warmup`` batches,
then timed over ``--steady`` batches; configurations interleaved, ``--repeats`` times. Prints a table
(steady batches/s per repeat, their mean) and writes JSON. A configuration ending ``/fs`` hands its
batches over with ``torch.multiprocessing``'s ``file_system`` sharing strategy (set in each worker by its
``worker_init_fn``) instead of the default ``file_descriptor`` one, which opens a connection to the worker,
with an authentication challenge, for every shared tensor the main thread receives.

    python benchmarks/steady_loader.py --configs 39x2 64x8 48x8 64x2 39x8 --repeats 2
    python benchmarks/steady_loader.py --configs 42x2 42x2/fs 64x8 64x8/fs --repeats 3
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch.multiprocessing
from _common import print_table, write_json
from autotune import SleepySamples
from torch.utils.data import DataLoader


def steady_rate(workers: int, prefetch: int, warmup: int, steady: int, sharing: str = "file_descriptor") -> float:
    init = functools.partial(_share_by, sharing)  # in each worker: whatever the start method, only this loader
    loader = DataLoader(SleepySamples(), 16, num_workers=workers, prefetch_factor=prefetch, worker_init_fn=init)
    iterator = iter(loader)
    try:
        for _ in range(warmup):
            next(iterator)
        started = time.perf_counter()
        for _ in range(steady):
            next(iterator)
        return steady / (time.perf_counter() - started)
    finally:
        iterator._shutdown_workers()  # type: ignore[attr-defined]


def _share_by(strategy: str, worker_id: int) -> None:
    """A worker's batches are sent with ``strategy`` (the sender's choice; the main process reads either)."""
    torch.multiprocessing.set_sharing_strategy(strategy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=["39x2", "64x8"], help="WORKERSxPREFETCH")
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--steady", type=int, default=2500)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--name", default="steady_loader")
    args = parser.parse_args()
    configs = [_parse(text) for text in args.configs]
    rates: dict[str, list[float]] = {text: [] for text in args.configs}
    for _ in range(args.repeats):
        for text, (workers, prefetch, sharing) in zip(args.configs, configs, strict=True):
            rates[text].append(steady_rate(workers, prefetch, args.warmup, args.steady, sharing))
            print(f"  {text}: {rates[text][-1]:.0f} batches/s", flush=True)
    rows = [[text, *[f"{rate:.0f}" for rate in got], f"{statistics.fmean(got):.0f}"] for text, got in rates.items()]
    headers = ["workers x prefetch", *[f"repeat {index + 1}" for index in range(args.repeats)], "mean batches/s"]
    table = print_table(headers, rows)
    write_json(args.name, {"args": vars(args), "rates": rates, "table": table})


def _parse(text: str) -> tuple[int, int, str]:
    shape, slash, strategy = text.partition("/")
    if slash and strategy != "fs":
        raise SystemExit(f"--configs {text!r}: the only suffix is /fs (the file_system sharing strategy)")
    workers, prefetch = (int(part) for part in shape.split("x"))
    return workers, prefetch, "file_system" if strategy else "file_descriptor"


if __name__ == "__main__":
    main()
