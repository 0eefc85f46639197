"""The closed loop (``TunedDataModule(autotune="online")``) against a grid measured in the same run, on CPU
pipelines whose steps compute for real; and the callback's verdict at the start setting, its advised change
measured by the same grid (predicted beside measured).

    PYTHONPATH=$PWD python benchmarks/online.py --name online_2core
    PYTHONPATH=$PWD python benchmarks/online.py --pipelines quickstart fft --reps 3 --online-seconds 90

Per pipeline: every grid point (workers x intra-op threads) is a short fit of its own, measured ``--reps``
times in shuffled, interleaved order (steady steps/s: the first batches after the workers start are left
out); then one fit with the callback at the pipeline's start setting (the verdict and its advice); then
one online fit of ``--online-seconds``. Prints a table and writes ``results/<name>.json``.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from _common import print_table, write_json
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from _synthetic import SmallClassifier, SyntheticImages

from lightning_dataperf import DataPerfCallback, TunedDataModule


class FftSamples(Dataset):
    """A numpy FFT transform per sample (about 3 ms on one core), into a 1024-float vector."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        signal = np.random.default_rng(index).standard_normal((192, 192))
        for _ in range(3):
            signal = np.abs(np.fft.ifft2(np.fft.fft2(signal) * 0.5))
        return torch.from_numpy(signal[:32, :32].astype(np.float32).ravel()), index % 10


class SmallDicts(Dataset):
    """A dict of small tensors per sample, cheap to make: the hand-over dominates a worker's cost."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        return {
            "x": torch.rand(64, generator=generator),
            "mask": torch.ones(64, dtype=torch.bool),
            "y": torch.tensor(index % 10),
        }


class Records(Dataset):
    """Samples of many small tensors and a Python-heavy collate (a tokenised-text stand-in that computes)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        return [torch.rand(16, generator=generator) for _ in range(32)]


def collate_records(samples: list[list[torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [torch.stack(parts).mean(0) + torch.stack(parts).std(0) for parts in samples]
    return torch.stack(rows), torch.tensor([len(rows) % 10] * len(rows))


class Mlp(pl.LightningModule):
    """An MLP that does real arithmetic on the CPU (``width`` sets its cost)."""

    def __init__(self, inputs: int, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(inputs, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.head = nn.Linear(width, 10)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if isinstance(batch, dict):
            inputs, labels = batch["x"] * batch["mask"], batch["y"]
        else:
            inputs, labels = batch
        inputs = inputs.flatten(1)
        return nn.functional.cross_entropy(self.head(self.net(inputs)), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


#: the verdict's summaries file and any Lightning output go here, not into the working directory
ROOT_DIR = tempfile.mkdtemp(prefix="dataperf_online_")

PIPELINES: dict[str, dict[str, Any]] = {
    # the README quickstart: 1 ms of busy work per sample in the loader, the examples' small MLP
    "quickstart": {
        "data": lambda n: SyntheticImages(n, work_ms=1.0),
        "model": SmallClassifier,
        "batch": 32,
        "start": 0,
    },
    "fft": {"data": FftSamples, "model": lambda: Mlp(1024, 512), "batch": 32, "start": 1},
    "dicts": {"data": SmallDicts, "model": lambda: Mlp(64, 256), "batch": 8, "start": 0},
    "io": {"data": lambda n: SyntheticImages(n, sleep_ms=4.0), "model": SmallClassifier, "batch": 16, "start": 2},
    # tiny batches and a step whose Python (many small layers) dominates its arithmetic
    "tiny": {"data": lambda n: SyntheticImages(n, shape=(64,)), "model": lambda: Mlp(64, 64), "batch": 2, "start": 0},
    "collate": {"data": Records, "model": lambda: Mlp(16, 256), "batch": 64, "start": 0, "collate": collate_records},
    # large float batches (8 MB) made cheaply: the hand-over from a worker is the cost
    "large": {
        "data": lambda n: SyntheticImages(n, shape=(3, 64, 64)),
        "model": lambda: Mlp(3 * 64 * 64, 64),
        "batch": 512,
        "start": 0,
    },
}


class Pipeline(TunedDataModule):
    def __init__(self, name: str, workers: int | None, **kwargs: Any) -> None:
        super().__init__(seed=0, verbose=False, **kwargs)
        self.spec, self.workers = PIPELINES[name], workers

    def train_dataloader(self) -> DataLoader:
        options = {} if self.workers is None else {"num_workers": self.workers}
        if "collate" in self.spec:
            options["collate_fn"] = self.spec["collate"]
        return DataLoader(self.spec["data"](200_000), batch_size=self.spec["batch"], shuffle=True, **options)


class StepClock(Callback):
    """Times steps from the batch after start-up; stops the fit after ``seconds`` of them."""

    def __init__(self, seconds: float, skip: int) -> None:
        self.seconds, self.skip, self.times = seconds, skip, []

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self.times.append(time.perf_counter())
        steady = self.times[self.skip :]
        if len(steady) > 2 and steady[-1] - steady[0] >= self.seconds:
            trainer.should_stop = True

    def rate(self) -> float:
        steady = self.times[self.skip :]
        return (len(steady) - 1) / (steady[-1] - steady[0])


def trainer(callbacks: list[Callback], **options: Any) -> pl.Trainer:
    return pl.Trainer(
        default_root_dir=ROOT_DIR,
        accelerator="cpu",
        devices=1,
        max_epochs=options.pop("max_epochs", 1),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        **options,
    )


def measure(name: str, workers: int, threads: int, seconds: float) -> float:
    torch.set_num_threads(threads)
    clock = StepClock(seconds, skip=2 * workers + 3)
    trainer([clock]).fit(PIPELINES[name]["model"](), datamodule=Pipeline(name, workers))
    return clock.rate()


class Verdicts(Callback):
    """Each epoch's verdict (after DataPerfCallback wrote it): the bottleneck, the advised workers, the estimate."""

    def __init__(self, perf: DataPerfCallback) -> None:
        self.perf, self.epochs = perf, []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        diagnosis = self.perf.last_diagnosis
        if diagnosis is None or not diagnosis.findings:
            self.epochs.append({"bottleneck": "unknown", "workers": None, "estimate": None, "text": ""})
            return
        advice = " ".join(advice for finding in diagnosis.findings for advice in finding.advice)
        workers = re.search(r"num_workers(?:=| from \d+ to )(\d+)", advice)
        threads = re.search(r"torch.set_num_threads\((\d+)\)", advice)
        estimate = re.search(r"up to ([0-9.]+)x", advice)
        self.epochs.append(
            {
                "bottleneck": diagnosis.bottleneck,
                "workers": int(workers.group(1)) if workers else None,
                "threads": int(threads.group(1)) if threads else None,
                "estimate": float(estimate.group(1)) if estimate else None,
                "text": diagnosis.format(),
            }
        )


def verdicts_at_start(name: str, threads: int, batches: int, epochs: int = 3) -> list[dict[str, Any]]:
    """The callback's verdict in each of ``epochs`` epochs of ``batches`` steps at the pipeline's start setting."""
    torch.set_num_threads(threads)
    perf = DataPerfCallback(telemetry_interval=0.25)
    verdicts = Verdicts(perf)
    trainer([perf, verdicts], log_every_n_steps=5, max_epochs=epochs, limit_train_batches=batches).fit(
        PIPELINES[name]["model"](), datamodule=Pipeline(name, PIPELINES[name]["start"])
    )
    return verdicts.epochs


def online_run(name: str, threads: int, seconds: float) -> dict[str, Any]:
    torch.set_num_threads(threads)
    module = Pipeline(name, None if name == "fft" else PIPELINES[name]["start"], autotune="online")
    clock = StepClock(seconds, skip=0)
    started = time.perf_counter()
    trainer([clock]).fit(PIPELINES[name]["model"](), datamodule=module)
    result = module.online_result
    if result is None or result.start is None:
        raise SystemExit(f"{name}: the online run ended before its first trial; give it more --online-seconds")
    # still searching when the run ended: the setting in use is the start's or a trial's, report the start's
    kept = result.kept or result.start
    return {
        "kept": [kept.setting.num_workers, kept.setting.threads, kept.setting.prefetch_factor],
        "start": [result.start.setting.num_workers, result.start.setting.threads],
        "done": result.done,
        "trials": len(result.trials),
        "cost_s": result.cost_s,
        "search_s": sum(trial.seconds + trial.switch_s for trial in result.trials),
        "run_s": time.perf_counter() - started,
        "summary": result.summary(),
    }


def run_pipeline(name: str, args: argparse.Namespace) -> dict[str, Any]:
    cpus = len(os.sched_getaffinity(0))
    # the online loop may go up to 2 x cpus workers: the grid covers what it can keep
    grid = [(w, t) for w in range(0, 2 * cpus + 1) for t in sorted({1, cpus})]
    rates: dict[tuple[int, int], list[float]] = {point: [] for point in grid}
    for _ in range(args.reps):
        for workers, threads in random.sample(grid, len(grid)):
            rates[(workers, threads)].append(measure(name, workers, threads, args.seconds))
    median = {point: statistics.median(values) for point, values in rates.items()}
    best = max(median, key=median.get)
    start = (PIPELINES[name]["start"], cpus)
    epochs = verdicts_at_start(name, cpus, max(20, int(median[start] * args.seconds * 2)))
    steady = [(epoch["bottleneck"], epoch["workers"]) for epoch in epochs[1:]]
    last = epochs[-1]
    text, advised, estimate = last["text"], last["workers"], last["estimate"]
    advised_point = (advised, last["threads"] or cpus)
    online = online_run(name, cpus, args.online_seconds)
    kept = (online["kept"][0], online["kept"][1])
    row = {
        "pipeline": name,
        "grid": {f"{w}w{t}t": values for (w, t), values in rates.items()},
        "best": list(best),
        "best_rate": median[best],
        "start": list(start),
        "start_rate": median[start],
        "verdict": text,
        "verdicts": epochs,
        "steady_epochs_same": steady.count(steady[-1]) if steady else 0,
        "steady_epochs": len(steady),
        "advised_workers": advised,
        "estimate": estimate,
        "advised_threads": advised_point[1],
        "advised_measured": None
        if advised is None or advised_point not in median
        else median[advised_point] / median[start],
        "online": online,
        "online_of_best": median.get(kept, float("nan")) / median[best],
        "online_cost_of_5min": online["cost_s"] / 300.0,
    }
    torch.set_num_threads(cpus)
    return row


def setting(point: list[int]) -> str:
    return f"{point[0]}w {point[1]}t"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipelines", nargs="+", default=list(PIPELINES), choices=list(PIPELINES))
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0, help="steady seconds per grid measurement")
    parser.add_argument("--online-seconds", type=float, default=60.0)
    parser.add_argument("--name", default="online")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    random.seed(0)
    rows = [run_pipeline(name, args) for name in args.pipelines]
    headers = [
        "pipeline",
        "start",
        "grid best",
        "verdict",
        "same in steady epochs",
        "advised",
        "estimate",
        "advised measured",
        "online kept",
        "of grid best",
        "start of best",
        "cost s",
        "cost of 5 min",
    ]
    print_table(
        headers,
        [
            [
                row["pipeline"],
                setting(row["start"]),
                setting(row["best"]),
                row["verdicts"][-1]["bottleneck"],
                f"{row['steady_epochs_same']}/{row['steady_epochs']}",
                "-" if row["advised_workers"] is None else f"{row['advised_workers']}w {row['advised_threads']}t",
                "-" if row["estimate"] is None else f"{row['estimate']:.2f}x",
                "-" if row["advised_measured"] is None else f"{row['advised_measured']:.2f}x",
                setting(row["online"]["kept"][:2]),
                f"{100 * row['online_of_best']:.1f}%",
                f"{100 * row['start_rate'] / row['best_rate']:.1f}%",
                f"{row['online']['cost_s']:.1f}",
                f"{100 * row['online_cost_of_5min']:.1f}%",
            ]
            for row in rows
        ],
    )
    write_json(args.name, {"args": vars(args), "rows": rows})
    shutil.rmtree(ROOT_DIR, ignore_errors=True)


if __name__ == "__main__":
    main()
