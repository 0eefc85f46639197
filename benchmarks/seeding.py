"""Cost of per-batch seeding at ``num_workers=0``: the same loader seeded and plain, interleaved.

    PYTHONPATH=$PWD python benchmarks/seeding.py --blocks 20 --fits 3

Two parts. *Per batch*: a loader of tiny samples (batch 2) iterated in alternating blocks of ``--batches``
batches, plain and through ``seed_batches_in_main_process``; the cost is the difference of the blocks' median
time per batch (µs), for samples that draw from no generator and for samples that draw from ``random``, NumPy
and torch each (all three seeded for every batch). *In a fit*: the ``tiny`` CPU pipeline of
``_cpu_pipelines.py`` (a ~0.7-ms step), fitted with ``TunedDataModule`` (seeded) and with the same loader in a
plain ``LightningDataModule``, alternating; the ratio of their steady steps/s (``--unseeded``: also
``TunedDataModule`` with its per-batch seeding left out, what the rest of it costs; ``--callback``: also the
plain loader with ``DataPerfCallback``, the callback's own cost on the same step). Writes ``<name>.json``
(default ``seeding.json``).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any
from unittest import mock

import _common
import _cpu_pipelines as pipelines
import lightning.pytorch as pl
import numpy
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

import lightning_dataperf.datamodule.datamodule as datamodule_module
from lightning_dataperf import DataPerfCallback
from lightning_dataperf.loader.seeding import seed_batches_in_main_process


class Drawing(Dataset):
    """Tiny samples that draw one number from each of ``random``, NumPy and torch."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[float, float, torch.Tensor]:
        return random.random(), float(numpy.random.random()), torch.rand(())


def per_batch(blocks: int, batches: int, draws: bool) -> dict[str, Any]:
    """Median µs per batch of each kind over alternating blocks, and the seeding's cost (their difference)."""
    data = Drawing(batches * 2) if draws else TensorDataset(torch.rand(batches * 2, 8), torch.arange(batches * 2))
    plain, seeded = DataLoader(data, batch_size=2), DataLoader(data, batch_size=2)
    seed_batches_in_main_process(seeded, seed=0, rank=0, position=lambda: (0, 0))
    times: dict[str, list[float]] = {"plain": [], "seeded": []}
    for block in range(2 * blocks):
        kind, loader = ("plain", plain) if block % 2 == 0 else ("seeded", seeded)
        started = time.perf_counter()
        count = sum(1 for _ in loader)
        times[kind].append((time.perf_counter() - started) / count * 1e6)
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    # each seeded block against the plain blocks beside it: the machine's drift cancels
    costs = [
        seeded_us - (times["plain"][index] + times["plain"][min(index + 1, blocks - 1)]) / 2
        for index, seeded_us in enumerate(times["seeded"])
    ]
    return {**medians, "cost_us": statistics.median(costs), "cost_range_us": [min(costs), max(costs)]}


class PlainPipeline(pl.LightningDataModule):
    """The tuned pipeline's loader, untouched."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.spec = pipelines.PIPELINES[name]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.spec["data"](200_000), batch_size=self.spec["batch"], shuffle=True)


def plain_rate(name: str, seconds: float, callback: bool = False) -> float:
    """:func:`_cpu_pipelines.measure` at 0 workers and 1 thread, with the loader in a plain data module (and,
    with ``callback``, ``DataPerfCallback`` in the fit)."""
    torch.set_num_threads(1)
    clock = pipelines.StepClock(seconds, skip=3)
    callbacks: list[pl.Callback] = [clock, DataPerfCallback()] if callback else [clock]
    pipelines.trainer(callbacks).fit(pipelines.PIPELINES[name]["model"](), datamodule=PlainPipeline(name))
    return clock.rate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=20, help="blocks of each kind (per batch)")
    parser.add_argument("--batches", type=int, default=2000, help="batches a block")
    parser.add_argument("--fits", type=int, default=3, help="fits of each kind (0: none)")
    parser.add_argument("--pipeline", default="tiny")
    parser.add_argument("--seconds", type=float, default=4.0, help="steady seconds a fit")
    parser.add_argument("--unseeded", action="store_true", help="also fit TunedDataModule with seeding left out")
    parser.add_argument("--callback", action="store_true", help="also fit the plain loader with DataPerfCallback")
    parser.add_argument("--name", default="seeding")
    args = parser.parse_args()
    costs = {kind: per_batch(args.blocks, args.batches, kind == "draws") for kind in ("no draws", "draws")}
    rows = [
        [f"per batch, µs ({kind})", f"{cost['plain']:.1f}", f"{cost['seeded']:.1f}", f"+{cost['cost_us']:.1f}"]
        for kind, cost in costs.items()
    ]
    ratios: list[float] = []
    unseeded_ratios: list[float] = []
    callback_ratios: list[float] = []
    for _ in range(args.fits):
        plain = plain_rate(args.pipeline, args.seconds)
        seeded = pipelines.measure(args.pipeline, 0, 1, args.seconds)
        ratios.append(seeded / plain)
        rows.append([f"{args.pipeline} fit, steps/s", f"{plain:.0f}", f"{seeded:.0f}", f"{seeded / plain:.2f}x"])
        if args.unseeded:
            # TunedDataModule with its per-batch seeding left out, the rest of what it does at 0 workers kept
            with mock.patch.object(datamodule_module, "seed_batches_in_main_process", lambda *args, **kwargs: None):
                rest = pipelines.measure(args.pipeline, 0, 1, args.seconds)
            unseeded_ratios.append(rest / plain)
            label = f"{args.pipeline} fit, seeding left out, steps/s"
            rows.append([label, f"{plain:.0f}", f"{rest:.0f}", f"{rest / plain:.2f}x"])
        if args.callback:
            timed = plain_rate(args.pipeline, args.seconds, callback=True)
            callback_ratios.append(timed / plain)
            label = f"{args.pipeline} fit, plain with DataPerfCallback, steps/s"
            rows.append([label, f"{plain:.0f}", f"{timed:.0f}", f"{timed / plain:.2f}x"])
    _common.print_table(["", "plain", "seeded", "seeded / plain"], rows)
    payload = {
        "args": vars(args), "per_batch": costs, "fit_ratios": ratios, "unseeded_fit_ratios": unseeded_ratios,
        "callback_fit_ratios": callback_ratios,
    }  # fmt: skip
    _common.write_json(args.name, payload)


if __name__ == "__main__":
    main()
