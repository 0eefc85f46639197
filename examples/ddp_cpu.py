"""DDP on the CPU (2 processes, gloo) with TunedDataModule and DataPerfCallback.

    python examples/ddp_cpu.py

Each rank gets a disjoint shard in a new order every epoch; its CPU budget is the usable CPUs divided
by the 2 local ranks; the callback reduces timings across ranks and names the slowest one. Rank 1's
loader is made slower on purpose (``--slow-rank-ms``), so the verdict reports a straggler.
"""

from __future__ import annotations

import argparse
import os
import time

import lightning.pytorch as pl
import torch
from _synthetic import SmallClassifier, SyntheticImages
from torch.utils.data import DataLoader

from lightning_dataperf import DataPerfCallback, TunedDataModule


class SlowOnRankOne:
    """A collate that sleeps on rank 1 only: a straggling node."""

    def __init__(self, sleep_ms: float, rank: int) -> None:
        self.sleep_ms, self.rank = sleep_ms, rank

    def __call__(self, samples):
        if self.rank == 1:
            time.sleep(self.sleep_ms / 1e3)
        return torch.utils.data.default_collate(samples)


class ShardedImages(TunedDataModule):
    def __init__(self, samples: int, slow_rank_ms: float) -> None:
        super().__init__(seed=0)
        self.samples, self.slow_rank_ms = samples, slow_rank_ms

    def train_dataloader(self) -> DataLoader:
        collate = SlowOnRankOne(self.slow_rank_ms, self.trainer.global_rank)
        return DataLoader(SyntheticImages(self.samples), batch_size=16, shuffle=True, num_workers=0, collate_fn=collate)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--slow-rank-ms", type=float, default=30.0)
    parser.add_argument("--logdir", default="dataperf_logs")
    args = parser.parse_args(argv)
    perf = DataPerfCallback(telemetry_interval=0.5)
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        callbacks=[perf],
        default_root_dir=os.path.join(args.logdir, "ddp_cpu"),
        log_every_n_steps=4,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(SmallClassifier(), datamodule=ShardedImages(args.samples, args.slow_rank_ms))


if __name__ == "__main__":
    main()
