"""The closed loop on a GPU pipeline: JPEG decode + RandomResizedCrop + flip (PIL) in the workers into a
torchvision ResNet-18 (bf16, channels-last, batch 128), against a grid of worker counts measured in the same run.

    PYTHONPATH=$PWD python benchmarks/online_jpeg.py --name online_jpeg_h200           # CUDA + torchvision
    PYTHONPATH=$PWD python benchmarks/online_jpeg.py --smoke --name online_jpeg_smoke  # CPU, a small CNN

Under DDP (started by torchrun): the ranks share the one GPU over gloo (or run on the CPU with
``--smoke``), the grid is of worker counts per rank, every fit runs a fixed number of steps on every rank (a stop
by time on rank zero alone would leave the others in a collective), rank zero's clock is the job's, and the
decisions between fits are rank zero's, broadcast::

    PYTHONPATH=$PWD torchrun --standalone --nproc_per_node=2 benchmarks/online_jpeg.py --grid 2 3 4 5 6 7 \
        --root /tmp/online_jpeg_ddp --name online_jpeg_ddp_h200

Every grid point (worker count, pinned) is a fit of its own, measured ``--reps`` times in shuffled order
(steady steps/s, the workers' start-up left out); the ceiling is the same model on one batch already
decoded; then one online fit from ``--start`` workers; the setting the loop keeps is measured against the
grid's best again in ``--pairs`` interleaved pairs. Prints a table and writes ``results/<name>.json``.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import statistics
import tempfile
import time
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from _common import print_table, quiet_trainer, write_json
from _cpu_pipelines import StepClock
from gpu_decode import PilDataset, make_set
from torch import nn
from torch.utils.data import DataLoader

from lightning_dataperf import OnlineTuning, TunedDataModule, probe_hardware, recommend_loader_settings

ROOT_DIR = tempfile.mkdtemp(prefix="dataperf_online_jpeg_")
BATCH = 128
RANK = int(os.environ.get("RANK", "0"))
#: DDP ranks, on the one GPU (torchrun's WORLD_SIZE)
RANKS = int(os.environ.get("WORLD_SIZE", "1"))


class Classifier(pl.LightningModule):
    """ResNet-18 (or, ``--smoke``, a small CNN) on uint8 NHWC images, normalised on the device."""

    def __init__(self, smoke: bool) -> None:
        super().__init__()
        if smoke:
            # no lazy layer: DDP wraps the model before its first forward
            self.model = nn.Sequential(
                nn.Conv2d(3, 8, 7, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 1000)
            )
        else:
            import torchvision

            self.model = torchvision.models.resnet18(num_classes=1000).to(memory_format=torch.channels_last)
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        images = images.permute(0, 3, 1, 2).float().sub_(self.mean).div_(self.std)
        images = images.contiguous(memory_format=torch.channels_last)
        return nn.functional.cross_entropy(self.model(images), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


class Jpegs(TunedDataModule):
    def __init__(self, samples: list[tuple[str, int]], workers: int, prefetch: int = 4, **kwargs: Any) -> None:
        super().__init__(seed=0, verbose=False, **kwargs)
        self.samples, self.workers, self.prefetch = samples, workers, prefetch

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            PilDataset(self.samples), batch_size=BATCH, shuffle=True, drop_last=True, num_workers=self.workers,
            pin_memory=torch.cuda.is_available(), persistent_workers=self.workers > 0,
            prefetch_factor=self.prefetch if self.workers else None,
        )  # fmt: skip


def _distributed(cuda: bool) -> dict[str, Any]:
    """The Trainer's options for ``RANKS`` ranks: on one GPU over gloo (NCCL takes one rank per GPU)."""
    if RANKS == 1:
        return {}
    from lightning.pytorch.strategies import DDPStrategy

    if cuda:
        devices = [torch.device("cuda", 0)] * RANKS
        return {"strategy": DDPStrategy(parallel_devices=devices, process_group_backend="gloo")}
    return {"strategy": "ddp", "devices": RANKS}


def fit(model: pl.LightningModule, data: Any, callbacks: list[Any], epochs: int, max_steps: int = -1) -> None:
    cuda = torch.cuda.is_available()
    trainer = quiet_trainer(
        # a root of its own: the loop would start the next fit from the setting this one saved
        default_root_dir=tempfile.mkdtemp(dir=ROOT_DIR),
        accelerator="cuda" if cuda else "cpu",
        precision="bf16-mixed" if cuda else "32-true",
        max_epochs=epochs,
        max_steps=max_steps,
        callbacks=callbacks,
        **_distributed(cuda),
    )
    if isinstance(data, DataLoader):
        trainer.fit(model, train_dataloaders=data)
    else:
        trainer.fit(model, datamodule=data)


def measure(samples: list[tuple[str, int]], workers: int, seconds: float, smoke: bool, prefetch: int = 4) -> float:
    skip = 2 * workers + 3
    if RANKS > 1:  # ``seconds`` as steps (at 15 steps/s), after the batches queued while the workers started
        skip = workers * prefetch + 3
        # no stop by time: max_steps ends the fit on every rank at once
        clock = StepClock(math.inf, skip=skip)
        steps = max(8, round(15 * seconds))
        fit(Classifier(smoke), Jpegs(samples, workers, prefetch), [clock], epochs=20, max_steps=skip + steps)
        return clock.rate()
    clock = StepClock(seconds, skip=skip)
    fit(Classifier(smoke), Jpegs(samples, workers, prefetch), [clock], epochs=20)
    return clock.rate()


def from_rank_zero(value: Any) -> Any:
    """Rank zero's ``value`` on every rank (each rank's clock reads its own rates; the next fits must agree)."""
    if RANKS == 1:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def every_rank(value: Any) -> list[Any]:
    if RANKS == 1:
        return [value]
    import torch.distributed as dist

    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def ceiling(samples: list[tuple[str, int]], seconds: float, smoke: bool) -> float:
    """The same step on one batch already decoded (and pinned): no decode at all."""
    one = next(iter(DataLoader(PilDataset(samples), batch_size=BATCH)))
    ready = DataLoader([one] * 400, batch_size=None, pin_memory=torch.cuda.is_available())
    if RANKS > 1:
        clock = StepClock(math.inf, skip=5)
        fit(Classifier(smoke), ready, [clock], epochs=20, max_steps=5 + max(8, round(20 * seconds)))
        return clock.rate()
    clock = StepClock(seconds, skip=5)
    fit(Classifier(smoke), ready, [clock], epochs=20)
    return clock.rate()


def jpegs(root: str, count: int) -> list[tuple[str, int]]:
    """The uniform set, written by rank zero alone (the others wait for it: two writers of one file corrupt it)."""
    done = os.path.join(root, "written")
    if RANK == 0:
        samples, _ = make_set(root, "uniform", count)
        open(done, "w").close()
        return samples
    while not os.path.exists(done):
        time.sleep(0.2)
    return [(os.path.join(root, f"{i:06d}.jpg"), i % 1000) for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--grid", type=int, nargs="+", default=[4, 8, 12, 14, 16, 20, 24, 32])
    parser.add_argument("--start", type=int, default=4, help="the online fit's starting worker count")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=2, help="interleaved pairs of the loop's pick against the best")
    parser.add_argument("--seconds", type=float, default=4.0, help="steady seconds per grid measurement")
    parser.add_argument("--online-seconds", type=float, default=150.0)
    parser.add_argument("--online-steps", type=int, default=1800, help="under DDP: the online fit's steps")
    parser.add_argument("--root", default=None, help="the JPEGs' folder (under DDP: the same for every rank)")
    parser.add_argument("--smoke", action="store_true", help="CPU, a small CNN, no torchvision")
    parser.add_argument("--name", default="online_jpeg")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    random.seed(0)
    samples = jpegs(args.root or tempfile.mkdtemp(dir=ROOT_DIR), args.images)
    samples = samples * max(1, 16_000 // len(samples))  # 125 steps an epoch
    accelerator = "cuda" if torch.cuda.is_available() else "cpu"
    policy = recommend_loader_settings(probe_hardware(), accelerator=accelerator).num_workers
    grid = sorted({*args.grid, policy, args.start})
    rates: dict[int, list[float]] = {workers: [] for workers in grid}
    for _ in range(args.reps):
        for workers in random.sample(grid, len(grid)):
            rates[workers].append(measure(samples, workers, args.seconds, args.smoke))
            if RANK == 0:
                print(f"grid {workers} workers: {rates[workers][-1]:.2f} steps/s", flush=True)
    rates = from_rank_zero(rates)
    median = {workers: statistics.median(values) for workers, values in rates.items()}
    best = max(median, key=median.get)
    top = from_rank_zero(ceiling(samples, args.seconds, args.smoke))

    module = Jpegs(samples, args.start, autotune=OnlineTuning())
    started = time.perf_counter()
    if RANKS > 1:
        fit(Classifier(args.smoke), module, [StepClock(math.inf, skip=0)], epochs=400, max_steps=args.online_steps)
    else:
        fit(Classifier(args.smoke), module, [StepClock(args.online_seconds, skip=0)], epochs=400)
    result = module.online_result
    assert result is not None and result.start is not None, "the online fit ended before its first trial"
    kept = result.kept or result.start
    kept_by_rank = every_rank(kept.setting)
    # one decision for every rank: the pairs below would hang on ranks that disagree
    assert all(setting == kept_by_rank[0] for setting in kept_by_rank), kept_by_rank
    workers, prefetch = kept.setting.num_workers, kept.setting.prefetch_factor or 4
    pick, top_of_grid = (workers, prefetch), (best, 4)
    pairs: list[float] = []
    if pick != top_of_grid:  # the grid's best is the top of noisy medians: measured again beside it, interleaved
        for pair in range(args.pairs):
            order = [pick, top_of_grid] if pair % 2 == 0 else [top_of_grid, pick]
            got = {key: measure(samples, key[0], args.seconds, args.smoke, key[1]) for key in order}
            pairs.append(from_rank_zero(got[pick] / got[top_of_grid]))
    of_best = statistics.median(pairs) if pairs else median[workers] / median[best]
    row = {
        "grid": {str(workers): values for workers, values in rates.items()},
        "best": best,
        "best_rate": median[best],
        "ceiling_rate": top,
        "policy": policy,
        "policy_of_best": median[policy] / median[best],
        "start": args.start,
        "start_of_best": median[args.start] / median[best],
        "ranks": RANKS,
        "kept_by_rank": [str(setting) for setting in kept_by_rank],
        "kept": [workers, kept.setting.prefetch_factor, kept.setting.pin_memory],
        "kept_rate_in_run": kept.steps_per_sec,
        "online_of_best": of_best,
        "pairs_against_best": pairs,
        "done": result.done,
        "trials": [
            [
                t.setting.num_workers,
                t.setting.prefetch_factor,
                t.setting.pin_memory,
                t.steps_per_sec,
                t.error,
                t.switch_s,
                t.cost_s,
            ]
            for t in result.trials
        ],
        "cost_s": result.cost_s,
        "cap_s": result.cap_s,
        "stop_reason": result.stop_reason,
        "cost_of_5min": result.cost_s / 300.0,
        "run_s": time.perf_counter() - started,
        "summary": result.summary(),
    }
    if RANK != 0:
        return
    print_table(
        ["start", "policy", "of best", "grid best", "steps/s", "ceiling", "online kept", "of best", "cost", "cap"],
        [
            [
                f"{args.start}w ({100 * row['start_of_best']:.0f}%)",
                f"{policy}w",
                f"{100 * row['policy_of_best']:.1f}%",
                f"{best}w",
                f"{median[best]:.1f}",
                f"{top:.1f}",
                f"{workers}w pf{kept.setting.prefetch_factor} pin={kept.setting.pin_memory}",
                f"{100 * of_best:.1f}%",
                f"{result.cost_s:.1f} s",
                "-" if result.cap_s is None else f"{result.cap_s:.1f} s",
            ]
        ],
    )
    print(result.summary())
    write_json(args.name, {"args": vars(args), "device": accelerator, "rows": [row]})
    shutil.rmtree(ROOT_DIR, ignore_errors=True)


if __name__ == "__main__":
    main()
