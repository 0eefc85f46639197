"""The intra-op threads changed mid-fit, as the online loop changes them: the step rate before and after.

    PYTHONPATH=$PWD python benchmarks/threads_at_runtime.py
    OMP_WAIT_POLICY=PASSIVE PYTHONPATH=$PWD python benchmarks/threads_at_runtime.py --name threads_at_runtime_passive
    PYTHONPATH=$PWD python benchmarks/threads_at_runtime.py --mkl-dynamic --name threads_at_runtime_mkl_dynamic

Per case, one fit of a ``_cpu_pipelines.py`` pipeline at ``--workers`` loader workers that starts with ``from``
intra-op threads and calls ``torch.set_num_threads(to)`` in the training process at step ``--at`` (the same count
included); its steps/s over the ``--at - 20`` steps before the call and those after it, 20 steps left out on each
side. Then a fit at each count set before it starts, read in windows of 100 steps (no change at runtime).
``--mkl-dynamic``: every ``torch.set_num_threads`` call is followed by MKL's dynamic threading switched back on
(torch switches it off in each call; MKL starts with it on). Writes ``<name>.json``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import time
from typing import Any

import _common
import _cpu_pipelines as pipelines
import torch
from lightning.pytorch.callbacks import Callback


def set_num_threads(count: int, mkl_dynamic: bool) -> None:
    torch.set_num_threads(count)
    if mkl_dynamic:
        library = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        library.MKL_Set_Dynamic(ctypes.c_int(1))


class SwitchThreads(Callback):
    """Sets the intra-op threads to ``to`` at step ``at``; stops the fit at twice that."""

    def __init__(self, at: int, to: int | None, mkl_dynamic: bool) -> None:
        self.at, self.to, self.times, self.mkl_dynamic = at, to, [], mkl_dynamic

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        self.times.append(time.perf_counter())
        if len(self.times) == self.at and self.to is not None:
            set_num_threads(self.to, self.mkl_dynamic)
        if len(self.times) >= 2 * self.at:
            trainer.should_stop = True

    def rates(self) -> tuple[float, float]:
        times, at = self.times, self.at
        return (at - 21) / (times[at - 1] - times[20]), (at - 21) / (times[-1] - times[at + 20])


def fit(name: str, workers: int, start: int, to: int | None, at: int, mkl_dynamic: bool) -> SwitchThreads:
    set_num_threads(start, mkl_dynamic)
    clock = SwitchThreads(at, to, mkl_dynamic)
    # intra_op_threads=None: TunedDataModule's "auto" would set 1 thread beside 2 workers at the fit's start
    module = pipelines.Pipeline(name, workers, intra_op_threads=None)
    pipelines.trainer([clock]).fit(pipelines.PIPELINES[name]["model"](), datamodule=module)
    return clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipeline", default="tokeniser")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--at", type=int, default=400, help="the step at which the threads are set")
    parser.add_argument("--mkl-dynamic", action="store_true", help="MKL's dynamic threading back on after each call")
    parser.add_argument("--name", default="threads_at_runtime")
    args = parser.parse_args()
    cpus = pipelines.usable_cpus()
    rows, cases = [], []
    for start, to in [(1, cpus), (cpus, cpus), (1, 1), (cpus, 1)]:
        before, after = fit(args.pipeline, args.workers, start, to, args.at, args.mkl_dynamic).rates()
        cases.append({"from": start, "to": to, "before": before, "after": after})
        rows.append([f"{start} -> {to} at step {args.at}", f"{before:.1f}", f"{after:.1f}", f"{after / before:.2f}x"])
    for threads in sorted({1, cpus}):
        times = fit(args.pipeline, args.workers, threads, None, args.at, args.mkl_dynamic).times
        windows = [100 / (times[i + 100] - times[i]) for i in range(0, len(times) - 100, 100)]
        cases.append({"from": threads, "to": None, "windows": windows})
        spread = f"{min(windows):.1f}-{max(windows):.1f}"
        rows.append([f"{threads} set before the fit", spread, "(100-step windows)", ""])
    _common.print_table(["intra-op threads", "steps/s before", "after", "after / before"], rows)
    _common.write_json(args.name, {"args": vars(args), "cases": cases})


if __name__ == "__main__":
    main()
