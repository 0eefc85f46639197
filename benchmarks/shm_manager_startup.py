"""Time to the first batch of a ``file_system`` loader, with and without the shared-memory manager started first.

Each row runs in a fresh process (the manager is per process): a DataLoader over the I/O-latency dataset of
``benchmarks/autotune.py`` whose ``--workers`` workers send by ``file_system``, either set bare in each worker
(``bare``: each forked worker starts its own ``torch_shm_manager``) or through
:class:`lightning_dataperf.ShareBy` (``ShareBy``: the training process starts one first, the workers share
it). Prints the time to the first batch and the ``torch_shm_manager`` processes running then; writes JSON.

    python benchmarks/shm_manager_startup.py --workers 56 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from _common import print_table, write_json

_CHILD = r"""
import json, subprocess, sys, time
sys.path.insert(0, {here!r})
import torch.multiprocessing
from autotune import SleepySamples
from torch.utils.data import DataLoader
from lightning_dataperf import ShareBy

def bare(worker_id):
    torch.multiprocessing.set_sharing_strategy("file_system")

started = time.perf_counter()
init = ShareBy("file_system") if {mode!r} == "ShareBy" else bare
iterator = iter(DataLoader(SleepySamples(), 16, num_workers={workers}, worker_init_fn=init))
next(iterator)
first = time.perf_counter() - started
managers = subprocess.run(["pgrep", "-c", "torch_shm_manag"], capture_output=True, text=True).stdout.strip()
iterator._shutdown_workers()
print(json.dumps({{"first_batch_s": first, "managers": int(managers or 0)}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=56)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--name", default="shm_manager_startup")
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parent)
    results: dict[str, list[dict[str, float]]] = {"bare": [], "ShareBy": []}
    for _ in range(args.repeats):
        for mode, runs in results.items():
            code = _CHILD.format(here=here, mode=mode, workers=args.workers)
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"  {mode}: {runs[-1]}", flush=True)
    rows = [
        [mode, *[f"{run['first_batch_s']:.2f} s, {run['managers']} managers" for run in runs]]
        for mode, runs in results.items()
    ]
    table = print_table(["workers send by", *[f"repeat {index + 1}" for index in range(args.repeats)]], rows)
    write_json(args.name, {"args": vars(args), "results": results, "table": table})


if __name__ == "__main__":
    main()
