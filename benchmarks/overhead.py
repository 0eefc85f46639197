"""Cost of DataPerfCallback: the same run with and without it, interleaved, median step time.

    python benchmarks/overhead.py --device cpu --repeats 7               # blocks (CPU default)
    python benchmarks/overhead.py --device cuda --repeats 7              # runs (CUDA default)

``--interleave blocks`` (default on the CPU): each run trains ``--steps`` steps and, after
``--warmup``, adds the callback to the Trainer for one block of ``--block`` steps and removes it for
the next (a fresh ``trainer.callbacks`` list without it, and its fetch hooks taken off the loops), so
"with" and "without" steps alternate within one process. On a shared 2-core machine whole runs of the
same configuration differ by +-20% and the speed drifts within a run over tenths of a second, far
more than the 1% being measured; short blocks (default 4 steps, ~16 ms) put each "with" block next to
two "without" blocks that ran at the same speed. A step's time is the host time between two step
ends; the first step of each block (which holds the swap) is left out; each "with" block's median
step is divided by the mean of its two neighbours' medians; a run's ratio is the median of those, and
the result the median over runs. The median is a user's
steady-state step: the one step in ``log_every_n_steps`` that writes the logs is outside it (its cost
is in ``self_time.py``), and so is the telemetry thread, which runs through both kinds of block (its
CPU share is in ``self_time.py`` too).

``--interleave runs`` (default on CUDA, where the host runs ahead of the GPU and per-step host times
mean little): whole runs alternate (without, with, without, ...); a run's step time is the wall time
of its steps after the warm-up divided by their number, with one device synchronisation at each end,
outside the measured callbacks; the ratio is the median of the per-pair ratios.

``--floor`` (blocks) also measures an empty ``Callback`` the same way, in runs alternating with
DataPerf's: the cost of Lightning's per-step dispatch to one more callback, which any callback pays.

The table gives, next to each median ratio, the range over repeats and a 95% bootstrap confidence
interval of the median (``--repeats`` of at least 10 make it narrower than the VM's noise).
``--name`` changes the JSON's name.

Writes ``overhead_<device>.json``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import _common
import lightning.pytorch as pl
import torch
from torch import nn

from lightning_dataperf import DataPerfCallback


class WallClock(pl.Callback):
    def __init__(self, warmup: int) -> None:
        self.warmup, self.start, self.end, self.steps = warmup, 0.0, 0.0, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx + 1 == self.warmup:
            _synchronize(pl_module.device)
            self.start = time.perf_counter()
        elif batch_idx + 1 > self.warmup:
            self.steps += 1

    def on_train_epoch_end(self, trainer, pl_module):
        _synchronize(pl_module.device)
        self.end = time.perf_counter()

    @property
    def step_time(self) -> float:
        """Mean step time over the measured steps (wall time between two device synchronisations)."""
        return (self.end - self.start) / self.steps


class BlockToggle(pl.Callback):
    """Takes ``perf`` out of the Trainer for every other block of ``block`` steps after the warm-up.

    Place it last: it reads the clock after every other callback's ``on_train_batch_end``.
    """

    def __init__(self, perf: DataPerfCallback, block: int, warmup: int) -> None:
        self.perf, self.block, self.warmup = perf, block, warmup
        self.enabled = True  # on during the warm-up, so that it sets up like in any run
        self.step_ends: list[float] = []
        self.enabled_in_step: list[bool] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.step_ends.append(time.perf_counter())
        self.enabled_in_step.append(self.enabled)
        done = batch_idx + 1 - self.warmup
        if done >= 0 and done % self.block == 0:
            self._switch(trainer, not self.enabled)

    def on_train_end(self, trainer, pl_module):
        self._switch(trainer, True)  # so that Lightning tears it down (telemetry thread, hooks)

    def _switch(self, trainer: pl.Trainer, enabled: bool) -> None:
        if enabled == self.enabled:
            return
        others = [callback for callback in trainer.callbacks if callback is not self.perf]
        # A new list, not an edit: the loop that is calling this hook keeps iterating the old one.
        trainer.callbacks = [*others[:-1], self.perf, others[-1]] if enabled else others
        if enabled:
            self.perf._hooks.install(trainer)
        else:
            self.perf._hooks.uninstall()
        self.enabled = enabled

    def block_medians(self) -> list[tuple[bool, float]]:
        """(callback on?, median step time) of each block after the warm-up, its first step left out."""
        blocks: list[tuple[bool, float]] = []
        current: list[float] = []
        for index in range(self.warmup + 1, len(self.step_ends)):
            enabled = self.enabled_in_step[index]
            if enabled != self.enabled_in_step[index - 1]:  # first step of a block: holds the swap
                current = []
                continue
            current.append(self.step_ends[index] - self.step_ends[index - 1])
            last = index + 1 == len(self.step_ends) or self.enabled_in_step[index + 1] != enabled
            if last:
                blocks.append((enabled, statistics.median(current)))
        return blocks

    def neighbour_ratios(self) -> list[float]:
        """Each "with" block over the mean of the "without" blocks on either side (cancels drift)."""
        blocks = self.block_medians()
        return [
            blocks[i][1] / ((blocks[i - 1][1] + blocks[i + 1][1]) / 2)
            for i in range(1, len(blocks) - 1)
            if blocks[i][0] and not blocks[i - 1][0] and not blocks[i + 1][0]
        ]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Mlp(pl.LightningModule):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        layers = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(width, 1))

    def training_step(self, batch, batch_idx):
        features, target = batch
        return nn.functional.mse_loss(self.net(features).squeeze(-1), target)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-4)


#: (width, depth, batch) of the MLP workload per device.
WORKLOADS = {"cuda": (2048, 4, 2048), "cpu": (256, 3, 128)}


#: ``--loader``: ``iterable`` hands the batches over as a plain iterable (the in-loader timing cannot see into it);
#: ``dataloader`` through a ``DataLoader`` (``num_workers=0``, ``batch_size=None``), so DataPerf's in-loader timing
#: (timed dataset and collate, the unwrap before ``training_step``) runs in the training process on every batch.
LOADER = {"kind": "iterable"}


def fit_workload(device: str, steps: int, callbacks: list[pl.Callback]) -> None:
    """Train the MLP for ``steps`` steps on ready batches: the loader costs nothing, so any callback cost shows."""
    width, depth, batch = WORKLOADS[device]
    generator = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(batch, width, generator=generator), torch.randn(batch, generator=generator)) for _ in range(8)
    ]
    if device == "cuda":
        batches = [(features.pin_memory(), target.pin_memory()) for features, target in batches]
    torch.manual_seed(0)
    loader = _Repeat(batches, steps)
    if LOADER["kind"] == "dataloader":
        loader = torch.utils.data.DataLoader(_Cycle(batches, steps), batch_size=None, num_workers=0)
    _common.fit_quietly(
        Mlp(width, depth),
        loader,
        accelerator=device,
        max_epochs=None,
        max_steps=steps,
        callbacks=callbacks,
        log_every_n_steps=50,
        limit_val_batches=0,
    )


def one_run(device: str, with_callback: bool, steps: int, warmup: int) -> float:
    clock = WallClock(warmup)
    callbacks: list[pl.Callback] = [clock]
    if with_callback:
        callbacks.append(DataPerfCallback(print_summary=False, write_json=False))
    fit_workload(device, steps, callbacks)
    return clock.step_time


class _NoFetchHooks:
    def install(self, trainer: pl.Trainer) -> None:
        pass

    def uninstall(self) -> None:
        pass


class EmptyCallback(pl.Callback):
    """Overrides nothing: what Lightning's per-step dispatch to one more callback costs (``--floor``)."""

    _hooks = _NoFetchHooks()  # BlockToggle takes a callback's fetch hooks on and off


def one_block_run(device: str, steps: int, warmup: int, block: int, empty: bool = False) -> dict[str, float]:
    perf = EmptyCallback() if empty else DataPerfCallback(print_summary=False, write_json=False)
    toggle = BlockToggle(perf, block, warmup)
    fit_workload(device, steps, [perf, toggle])
    blocks = toggle.block_medians()
    return {
        "with": statistics.median(time for enabled, time in blocks if enabled),
        "without": statistics.median(time for enabled, time in blocks if not enabled),
        "ratio": statistics.median(toggle.neighbour_ratios()),
    }


def compare_runs(args: argparse.Namespace) -> dict:
    times: dict[str, list[float]] = {"without": [], "with": []}
    for repeat in range(args.repeats + 1):  # the first pair is a warm-up and is discarded
        for variant in ("without", "with"):
            step = one_run(args.device, variant == "with", args.steps, args.warmup)
            if repeat:
                times[variant].append(step)
    ratios = [after / before for before, after in zip(times["without"], times["with"], strict=True)]
    return {"without": times["without"], "with": times["with"], "ratios": ratios}


def compare_blocks(args: argparse.Namespace) -> dict:
    runs, floor = [], []
    for _ in range(args.repeats):
        runs.append(one_block_run(args.device, args.steps, args.warmup, args.block))
        if args.floor:
            floor.append(one_block_run(args.device, args.steps, args.warmup, args.block, empty=True)["ratio"])
    return {
        "without": [run["without"] for run in runs],
        "with": [run["with"] for run in runs],
        "ratios": [run["ratio"] for run in runs],
        "floor_ratios": floor,
    }


def median_ci(values: list[float], level: float = 0.95, resamples: int = 4000) -> tuple[float, float]:
    """Bootstrap confidence interval of the median of ``values`` (seeded: the same values give the same interval)."""
    if len(values) < 2:
        return values[0], values[0]
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    tail = int(resamples * (1 - level) / 2)
    return medians[tail], medians[-tail - 1]


class _Cycle(torch.utils.data.Dataset):
    """``steps`` ready batches as a map-style dataset (one batch per index), for ``--loader dataloader``."""

    def __init__(self, batches: list, steps: int) -> None:
        self.batches, self.steps = batches, steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, index: int):
        return self.batches[index % len(self.batches)]


class _Repeat:
    """Cycles a loader so that one epoch holds ``steps`` batches."""

    def __init__(self, loader: list, steps: int) -> None:
        self.loader, self.steps = loader, steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        produced = 0
        while True:
            for batch in self.loader:
                if produced == self.steps:
                    return
                produced += 1
                yield batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--interleave", choices=("blocks", "runs"), default=None)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=None, help="steps per run (blocks: 1500, runs: 300)")
    parser.add_argument("--block", type=int, default=4, help="steps per block (--interleave blocks)")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--name", default=None, help="JSON name (default overhead_<device>)")
    parser.add_argument(
        "--loader",
        choices=("iterable", "dataloader"),
        default="iterable",
        help="dataloader: batches through a DataLoader, so the in-loader timing runs too (use with --interleave runs)",
    )
    parser.add_argument(
        "--floor", action="store_true", help="blocks: also measure an empty Callback, alternating runs with DataPerf's"
    )
    args = parser.parse_args()
    args.interleave = args.interleave or ("runs" if args.device == "cuda" else "blocks")
    LOADER["kind"] = args.loader
    if args.loader == "dataloader" and args.interleave == "blocks":
        parser.error("--loader dataloader needs --interleave runs (blocks take the callback off, not the loader probe)")
    if args.floor and args.interleave == "runs":
        parser.error("--floor needs --interleave blocks")
    args.steps = args.steps or (1500 if args.interleave == "blocks" else 300)
    if args.device == "cpu":
        torch.set_num_threads(1)
    width, depth, batch = WORKLOADS[args.device]
    result = compare_blocks(args) if args.interleave == "blocks" else compare_runs(args)
    without, with_ = statistics.median(result["without"]), statistics.median(result["with"])
    ratios = result["ratios"]
    ci = median_ci(ratios)
    rows = [
        [
            args.device,
            args.interleave,
            without * 1e3,
            with_ * 1e3,
            statistics.median(ratios),
            f"{min(ratios):.3f}-{max(ratios):.3f}",
            f"{ci[0]:.4f}-{ci[1]:.4f}",
        ]
    ]
    floor = result.get("floor_ratios")
    floor_ci = median_ci(floor) if floor else None
    if floor:
        spread = f"{min(floor):.3f}-{max(floor):.3f}"
        interval = f"{floor_ci[0]:.4f}-{floor_ci[1]:.4f}"
        rows.append(["empty Callback", args.interleave, "", "", statistics.median(floor), spread, interval])
    _common.print_table(
        ["device", "interleave", "step without (ms)", "step with (ms)", "ratio", "ratios of repeats", "95% CI"],
        rows,
    )
    _common.write_json(
        args.name or f"overhead_{args.device}",
        {
            "args": vars(args),
            "times_s": {"without": result["without"], "with": result["with"]},
            "ratios": ratios,
            "ratio": statistics.median(ratios),
            "ratio_ci95": ci,
            "floor_ratios": floor or None,
            "floor_ratio": statistics.median(floor) if floor else None,
            "floor_ratio_ci95": floor_ci,
            "workload": {"width": width, "depth": depth, "batch": batch},
        },
    )


if __name__ == "__main__":
    main()
