"""Side-stream copies on a GPU: the next batch's copy overlaps this step's compute.

    python examples/gpu_side_stream.py --batch-mb 256 --steps 60

Trains the same step (``--gpu-ms`` of GPU work) twice on ready, pinned uint8 batches: with Lightning's stock transfer
(``non_blocking`` on the compute stream: a step costs about compute + copy) and with
``strategy="side_stream"`` (about max(compute, copy)); the uint8 -> float cast and normalisation run on
the GPU after the copy (``device_transform``), so 4x fewer bytes cross PCIe. Prints DataPerf's step and
transfer times for both, and the side stream's own copy time, GB/s and hidden share. Without a GPU it
says so and runs the stock path on the CPU.

Measured on one H200 (``--batch-mb 256 --steps 60``): see benchmarks/README.md ("Examples on the H200").
"""

from __future__ import annotations

import argparse

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_dataperf import DataPerfCallback, SideStreamStrategy
from lightning_dataperf.testing import calibrate_cuda_sleep


class ReadyBatches(Dataset):
    """Whole uint8 'image' batches, made once and handed out again (the loader costs nothing)."""

    def __init__(self, steps: int, batch_mb: float) -> None:
        side = int((batch_mb * 2**20 / 3 / 64) ** 0.5)
        self.batch = torch.randint(0, 256, (64, 3, side, side), dtype=torch.uint8)
        if torch.cuda.is_available():
            self.batch = self.batch.pin_memory()  # pinned once: the loader hands it over at no cost
        self.steps = steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.batch


def normalise_on_device(batch: torch.Tensor) -> torch.Tensor:
    return (batch.float() / 255.0 - 0.45) / 0.225


class GpuWork(pl.LightningModule):
    """A step that keeps the GPU busy for a known time (``torch.cuda._sleep``) and reads the batch."""

    def __init__(self, cycles: int) -> None:
        super().__init__()
        self.cycles = cycles
        self.scale = nn.Parameter(torch.ones(()))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if batch.dtype == torch.uint8:  # stock path: normalise here, after the copy
            batch = normalise_on_device(batch)
        if self.cycles:
            torch.cuda._sleep(self.cycles)
        return (self.scale * batch[:, :, :8, :8]).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-4)


def train(strategy: str, args: argparse.Namespace, accelerator: str) -> DataPerfCallback:
    perf = DataPerfCallback(print_summary=False)
    chosen = SideStreamStrategy(device_transform=normalise_on_device) if strategy == "side_stream" else "auto"
    loader = DataLoader(ReadyBatches(args.steps, args.batch_mb), batch_size=None)
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=1,
        strategy=chosen,
        max_epochs=1,
        callbacks=[perf],
        logger=TensorBoardLogger(args.logdir, name=f"gpu_{strategy}"),
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        log_every_n_steps=5,
    )
    cycles = int(args.gpu_ms * calibrate_cuda_sleep()) if accelerator == "gpu" else 0
    trainer.fit(GpuWork(cycles), loader)
    return perf


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-mb", type=float, default=256.0, help="uint8 batch size in MB")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--gpu-ms", type=float, default=5.0, help="GPU work per step (about the copy time)")
    parser.add_argument("--logdir", default="dataperf_logs")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("No CUDA GPU here: the side-stream strategy falls back to the stock copy; running that on the CPU.")
        args.steps, args.batch_mb = min(args.steps, 8), min(args.batch_mb, 1.0)
        perf = train("stock", args, "cpu")
        return {"stock_step_ms": 1e3 * perf.last_summary.timings["Step"].mean}
    results = {}
    for strategy in ("stock", "side_stream"):
        summary = train(strategy, args, "gpu").last_summary
        # The host runs ahead of the GPU, so the GPU's timeline is the one that counts: from the end of one
        # step's work to the end of the next = idle + copy waited for + the step's device span (CUDA events).
        means = {name: 1e3 * summary.timings[name].mean for name in ("DeviceIdle", "Transfer", "DeviceSpan")}
        results[f"{strategy}_gpu_step_ms"] = sum(means.values())
        results.update({f"{strategy}_{name}_ms": value for name, value in means.items()})
        print(
            f"{strategy:12s} GPU step {results[f'{strategy}_gpu_step_ms']:.2f} ms = idle {means['DeviceIdle']:.2f} "
            f"+ copy not hidden {means['Transfer']:.2f} + step on the GPU {means['DeviceSpan']:.2f} (means)"
        )
        copies = summary.copies  # the side stream's own copy timings (one copy in timing_every)
        if copies is not None:
            results["side_stream_copy_ms"] = 1e3 * copies.copy_s
            results["side_stream_copy_GBps"] = copies.gbps or 0.0
            results["side_stream_copy_hidden"] = copies.hidden_fraction
            print(
                f"{'':12s} side-stream copy {results['side_stream_copy_ms']:.2f} ms at "
                f"{results['side_stream_copy_GBps']:.1f} GB/s, {100 * results['side_stream_copy_hidden']:.0f}% "
                "hidden behind compute"
            )
    return results


if __name__ == "__main__":
    main()
