"""Quickstart: a short CPU training run that shows where the time goes.

Run it, then draw the report or open TensorBoard:

    python examples/quickstart.py
    lightning-dataperf report dataperf_logs/quickstart
    tensorboard --logdir dataperf_logs

Options (all optional):
  --sample-ms MS     CPU work per sample in the loader, like decoding an image (default 1.0)
  --workers N        DataLoader num_workers (default 0: loading in the training process)
  --epochs N         training epochs (default 2; 8 with --online)
  --samples N        samples in the synthetic data set (default 1024)
  --batch-size N     batch size (default 32)
  --logdir DIR       where the TensorBoard logs go (default dataperf_logs)
  --online           let the loader be tuned on the training steps themselves
                     (TunedDataModule.from_loaders(loader, autotune=OnlineTuning()): workers and threads tried,
                     the fastest kept, the same samples in the same order); it runs 8 epochs (about 10 s
                     at the start's speed): 2 epochs are too short for a trusted trial within the loop's 5%
                     cost cap, and the loop would say so and keep the start

With the default --workers 0 each batch is loaded in the training process, so the run is input-bound
and the verdict says so; try --workers 2 to see it change.
"""

from __future__ import annotations

import argparse

import lightning.pytorch as pl
from _synthetic import SmallClassifier, SyntheticImages
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader

from lightning_dataperf import DataPerfCallback, OnlineTuning, TunedDataModule


def main(argv: list[str] | None = None) -> DataPerfCallback:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample-ms", type=float, default=1.0, help="CPU work per sample in the loader")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    parser.add_argument("--epochs", type=int, default=None, help="training epochs (default 2; 8 with --online)")
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--logdir", default="dataperf_logs")
    parser.add_argument("--online", action="store_true", help="tune the loader on the training steps")
    args = parser.parse_args(argv)
    # the loop needs a run long enough that one trusted trial fits its 5% cost cap; the plain run stays short
    epochs = args.epochs if args.epochs is not None else (8 if args.online else 2)

    pl.seed_everything(0, verbose=False)
    train = DataLoader(
        SyntheticImages(args.samples, work_ms=args.sample_ms),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
    )
    # telemetry four times a second (default: once), so that a run of a few seconds has Usage/ points
    perf = DataPerfCallback(telemetry_interval=0.25)
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        callbacks=[perf],
        logger=TensorBoardLogger(args.logdir, name="quickstart"),
        log_every_n_steps=5,
        enable_progress_bar=False,
        enable_checkpointing=False,
    )
    if args.online:
        trainer.fit(SmallClassifier(), datamodule=TunedDataModule.from_loaders(train, autotune=OnlineTuning()))
    else:
        trainer.fit(SmallClassifier(), train)
    print(f"\nTensorBoard logs: {trainer.logger.log_dir}\n  tensorboard --logdir {args.logdir}")
    return perf


if __name__ == "__main__":
    main()
