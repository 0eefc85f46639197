"""Where one autotune search's time goes: ``cProfile`` around ``autotune_loader`` on a benchmark workload.

Prints where the search's time goes besides the trials' own batches, in wall seconds on the main thread
(the one batch loaded in this process, stopping trial workers, reclaiming their segments, the memory
guard's reads, full garbage collections with the objects they freed; the rows are inclusive: ``close``
includes ``_stop``, which includes ``reclaim_segments``; a stop at a trial's end, when its dataset ran out,
and a collection Python starts during a trial fall inside that trial's seconds), then the functions with
the most cumulative time (``--top``; 0 leaves ``cProfile`` out; on Python 3.12 it also counts the
loader's threads, so its cumulative times can exceed the wall time) as tables, and writes JSON.

    python benchmarks/profile_autotune.py --budget 30 --top 25                 # the I/O-latency loader
    python benchmarks/profile_autotune.py --workload cpu --cpus 4 --cuda        # CPU-heavy, stock copy to CUDA

Workloads as in ``benchmarks/autotune.py`` (``io``, ``cpu``, ``tiny`` with its 2 ms host step); ``--cuda``
copies each batch to the GPU the stock way (``pin_memory`` searched both ways), as that script's rows do.
``--cpus N`` pins the process to N cores and sets PyTorch's threads to N, as a process started there has;
``--machine-threads`` keeps the machine's thread count instead (a CPU quota, an affinity set later).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _common import print_table, write_json
from autotune import DecodedImages, SleepySamples, TinySamples

from lightning_dataperf import autotune_loader
from lightning_dataperf.autotune import bounds as autotune_bounds
from lightning_dataperf.autotune import runner as autotune_trials
from lightning_dataperf.autotune.consumer import TransferPath

WORKLOADS = {"io": (SleepySamples, 16, 0.0), "cpu": (DecodedImages, 32, 0.0), "tiny": (TinySamples, 64, 0.002)}


#: Wall time outside the trials' own seconds, by what spends it (patched in place, main thread).
PHASES = {
    "learn_batch_size (one batch in this process)": (autotune_trials.TrialRunner, "learn_batch_size"),
    "close (stop kept workers)": (autotune_trials.TrialRunner, "close"),
    "_stop (shutdown + reclaim)": (autotune_trials, "_stop"),
    "reclaim_segments": (autotune_trials, "reclaim_segments"),
    "memory_mb (the guard's reads)": (autotune_bounds.Resources, "memory_mb"),
}


def _timed(function: Callable[..., Any], total: list[Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            total[0] += time.perf_counter() - started
            total[1] += 1

    return timed


def _collection_timer(collections: list[tuple[float, int]]) -> Callable[[str, dict[str, int]], None]:
    """A :data:`gc.callbacks` entry recording each full (generation 2) collection's wall time and objects freed."""
    began = [0.0]

    def on_collection(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        elif info["generation"] == 2:
            collections.append((time.perf_counter() - began[0], info["collected"]))

    return on_collection


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=30.0, help="autotune time budget (s)")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="io")
    parser.add_argument("--cpus", type=int, default=None, help="pin this process (and workers) to N cores")
    parser.add_argument("--cuda", action="store_true", help="copy each batch to the GPU (the stock way)")
    parser.add_argument(
        "--machine-threads",
        action="store_true",
        help="with --cpus, keep PyTorch's thread count from the whole machine (as under a CPU quota)",
    )
    parser.add_argument("--top", type=int, default=25, help="functions listed, by cumulative time (0: no cProfile)")
    parser.add_argument("--name", default="profile_autotune")
    args = parser.parse_args()
    if args.cpus:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cpus])
        if not args.machine_threads:
            torch.set_num_threads(args.cpus)  # as a process started on N cores has (PyTorch counts them at start-up)
    factory, batch_size, host_step = WORKLOADS[args.workload]
    device = torch.device("cuda", 0) if args.cuda else None
    if device is not None:
        torch.zeros(1, device=device)  # the CUDA context exists before the search, as in training
    path = TransferPath(device=device, host_step_seconds=host_step)
    min_workers = 0 if host_step else 1  # as benchmarks/autotune.py: 0 where the workload models its step
    cache = Path(tempfile.mkdtemp()) / "autotune.json"  # a fresh cache: the search runs
    phases = {name: [0.0, 0] for name in PHASES}
    for name, (owner, attribute) in PHASES.items():
        setattr(owner, attribute, _timed(getattr(owner, attribute), phases[name]))
    collections: list[tuple[float, int]] = []  # each full collection: (seconds, objects it freed)
    gc.callbacks.append(_collection_timer(collections))
    profile = cProfile.Profile()
    started = time.perf_counter()
    if args.top:
        profile.enable()
    result = autotune_loader(
        factory(), batch_size, time_budget=args.budget, cache_path=cache, path=path, min_workers=min_workers
    )
    profile.disable()
    wall = time.perf_counter() - started
    print(result.format())
    print(f"PyTorch threads in this process: {torch.get_num_threads()}; CPUs: {len(os.sched_getaffinity(0))}")
    phase_rows = [[name, calls, f"{spent:.2f}"] for name, (spent, calls) in phases.items()]
    spent = sum(seconds for seconds, _ in collections)
    phase_rows.append(
        [f"full garbage collections (freed {sum(n for _, n in collections)} objects)", len(collections), f"{spent:.2f}"]
    )
    phase_table = print_table(["phase (wall, main thread; inclusive)", "calls", "s"], phase_rows)
    in_trials = result.trial_seconds
    print(f"search {result.search_seconds:.1f} s, in trials {in_trials:.1f} s, outside {wall - in_trials:.1f} s")
    stats = pstats.Stats(profile).stats if args.top else {}  # type: ignore[attr-defined]
    entries = sorted(stats.items(), key=lambda item: item[1][3], reverse=True)[: args.top]
    rows = []
    for (filename, line, function), (calls, _, own, cumulative, _) in entries:
        where = f"{Path(filename).name}:{line}({function})" if line else function
        rows.append([where, calls, f"{own:.2f}", f"{cumulative:.2f}", f"{100 * cumulative / wall:.0f}%"])
    table = print_table(["function", "calls", "own s", "cumulative s", "of the search"], rows)
    payload = {
        "args": vars(args),
        "wall_s": wall,
        "search_s": result.search_seconds,
        "in_trials_s": in_trials,
        "phases": phase_table,
        "settings": result.settings.as_kwargs(),
        "table": table,
    }
    write_json(args.name, payload)


if __name__ == "__main__":
    main()
