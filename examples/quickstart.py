"""Quickstart: a short CPU training run that shows where the time goes.

Run it, then open TensorBoard::

    python examples/quickstart.py --sample-ms 2 --workers 0
    tensorboard --logdir dataperf_logs

Each sample costs ``--sample-ms`` of CPU work in the loader (like decoding an image), so with
``--workers 0`` the run is input-bound and the report says so; try ``--workers 2`` to see it change.
"""

from __future__ import annotations

import argparse

import lightning.pytorch as pl
from _synthetic import SmallClassifier, SyntheticImages
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader

from lightning_dataperf import DataPerfCallback


def main(argv: list[str] | None = None) -> DataPerfCallback:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample-ms", type=float, default=1.0, help="CPU work per sample in the loader")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--logdir", default="dataperf_logs")
    args = parser.parse_args(argv)

    pl.seed_everything(0, verbose=False)
    train = DataLoader(
        SyntheticImages(args.samples, work_ms=args.sample_ms),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
    )
    perf = DataPerfCallback()
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=1,
        callbacks=[perf],
        logger=TensorBoardLogger(args.logdir, name="quickstart"),
        log_every_n_steps=5,
        enable_progress_bar=False,
        enable_checkpointing=False,
    )
    trainer.fit(SmallClassifier(), train)
    print(f"\nTensorBoard logs: {trainer.logger.log_dir}\n  tensorboard --logdir {args.logdir}")
    return perf


if __name__ == "__main__":
    main()
