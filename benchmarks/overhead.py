"""Cost of DataPerfCallback: the same run with and without it, interleaved, median step time.

    python benchmarks/overhead.py --device cpu --repeats 7
    python benchmarks/overhead.py --device cuda --repeats 7

Each run trains ``--steps`` steps; the step time is the wall time of the steps after ``--warmup``
divided by their number (one device synchronisation at the end, outside the measured callbacks).
Runs alternate (without, with, without, with, ...) so drift hits both alike. Writes ``overhead_<device>.json``.
"""

from __future__ import annotations

import argparse
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
        return (self.end - self.start) / self.steps


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
    _common.fit_quietly(
        Mlp(width, depth),
        _Repeat(batches, steps),
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
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    width, depth, batch = WORKLOADS[args.device]
    times: dict[str, list[float]] = {"without": [], "with": []}
    for repeat in range(args.repeats + 1):  # the first pair is a warm-up and is discarded
        for variant in ("without", "with"):
            step = one_run(args.device, variant == "with", args.steps, args.warmup)
            if repeat:
                times[variant].append(step)
    without, with_ = statistics.median(times["without"]), statistics.median(times["with"])
    ratio = with_ / without
    spread = {name: (min(values) * 1e3, max(values) * 1e3) for name, values in times.items()}
    _common.print_table(
        ["device", "median step without (ms)", "median step with (ms)", "ratio", "range without", "range with"],
        [
            [
                args.device,
                without * 1e3,
                with_ * 1e3,
                ratio,
                "{:.3f}-{:.3f}".format(*spread["without"]),
                "{:.3f}-{:.3f}".format(*spread["with"]),
            ]
        ],
    )
    _common.write_json(
        f"overhead_{args.device}",
        {
            "args": vars(args),
            "times_s": times,
            "ratio": ratio,
            "workload": {"width": width, "depth": depth, "batch": batch},
        },
    )


if __name__ == "__main__":
    main()
