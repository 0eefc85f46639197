"""Reference pipelines with a known binding stage: the verdict on each, and its advice applied and measured.

Each row is a real Trainer run with DataPerfCallback on a pipeline built to bind at one stage. The
row records the expected kind, the verdict's kind, and, where the verdict advises a change, the
throughput after applying that change next to the gain it predicted. On CUDA the JPEG rows use
PIL decode + RandomResizedCrop + flip in workers into a torchvision ResNet-18 in bf16 (channels-last,
batch 128); their GPU busy time (host-gap probe) is compared with the same step on data already on
the device. Prints a table and writes JSON (``$OUT`` or ``benchmarks/results``).

    PYTHONPATH=$PWD python benchmarks/verdicts.py                 # every row this machine can run
    PYTHONPATH=$PWD python benchmarks/verdicts.py --rows zero_workers io_latency
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time

import lightning.pytorch as pl
import torch
from _common import machine, print_table, write_json
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, Dataset

from lightning_dataperf import DataPerfCallback, SideStreamStrategy
from lightning_dataperf.testing import GpuSleepModel, calibrate_cuda_sleep

CUDA = torch.cuda.is_available()


class Samples(Dataset):
    """16 features per sample; each sample costs ``sample_ms`` of sleep (I/O) or busy CPU work."""

    def __init__(self, length: int, sample_ms: float = 0.0, busy: bool = False, stall_at: int | None = None) -> None:
        self.length, self.sample_ms, self.busy, self.stall_at = length, sample_ms, busy, stall_at

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.stall_at:
            time.sleep(3.0)
        if self.busy:
            deadline = time.perf_counter() + self.sample_ms / 1e3
            while time.perf_counter() < deadline:
                pass
        elif self.sample_ms:
            time.sleep(self.sample_ms / 1e3)
        return torch.full((16,), float(index % 97))


class BigModel(GpuSleepModel):
    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        torch.cuda._sleep(self.cycles)
        return self.layer(batch[:, :16]).pow(2).mean()


class CpuModel(pl.LightningModule):
    def __init__(self, step_ms: float) -> None:
        super().__init__()
        self.step_ms, self.layer = step_ms, torch.nn.Linear(16, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        time.sleep(self.step_ms / 1e3)
        return self.layer(batch[:, :16]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class HostWork(Callback):
    def on_train_batch_end(self, *args: object, **kwargs: object) -> None:
        time.sleep(0.005)


def run(
    model: pl.LightningModule,
    loader: object,
    *,
    batches: int,
    epochs: int = 1,
    accelerator: str = "auto",
    strategy: object = "auto",
    callbacks: tuple = (),
    precision: str | None = None,
) -> dict:
    perf = DataPerfCallback(print_summary=False, telemetry_interval=0.25)
    trainer = pl.Trainer(
        max_epochs=epochs,
        limit_train_batches=batches,
        accelerator=accelerator,
        devices=1,
        strategy=strategy,
        callbacks=[perf, *callbacks],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tempfile.mkdtemp(),
        precision=precision,
    )
    trainer.fit(model, loader)
    summary, diagnosis = perf.last_summary, perf.last_diagnosis
    return {"summary": summary, "diagnosis": diagnosis, "samples_per_sec": summary.samples_per_sec or 0.0}


def predicted_speedup(diagnosis: object) -> float | None:
    """The gain the verdict's first advice predicts ("predicted from this epoch: 1.77x faster")."""
    for advice in diagnosis.findings[0].advice:
        if match := re.search(r"predicted from this epoch: ([0-9.]+)x faster", advice):
            return float(match.group(1))
    return None


def advised_workers(diagnosis: object) -> int | None:
    for advice in diagnosis.findings[0].advice:
        if match := re.search(r"(?:set num_workers=|num_workers from \d+ to )(\d+)", advice):
            return int(match.group(1))
    return None


def row(name: str, expected: str, before: dict, after: dict | None = None, note: str = "") -> dict:
    diagnosis = before["diagnosis"]
    kinds = [finding.kind for finding in diagnosis.findings]
    predicted = predicted_speedup(diagnosis) if diagnosis.findings else None
    if predicted is None and after is not None and diagnosis.findings:
        predicted = diagnosis.findings[0].ceiling_speedup  # no explicit prediction: the ceiling it names
    measured = after["samples_per_sec"] / before["samples_per_sec"] if after and before["samples_per_sec"] else None
    result = {
        "row": name,
        "expected": expected,
        "verdict": diagnosis.bottleneck,
        "all_kinds": kinds,
        "right": diagnosis.bottleneck.startswith(expected),
        "before_sps": before["samples_per_sec"],
        "after_sps": None if after is None else after["samples_per_sec"],
        "predicted": predicted,
        "measured": measured,
        "note": note,
        "verdict_text": diagnosis.format(),
        "summary_text": before["summary"].format(),
    }
    if predicted and measured:
        result["half_of_predicted_gain"] = (measured - 1) >= 0.5 * (predicted - 1)
    print(
        f"\n=== {name}: expected {expected}, verdict {diagnosis.bottleneck}\n{result['summary_text']}\n"
        f"{result['verdict_text']}",
        flush=True,
    )
    return result


def guarded(name: str, make: object) -> list[dict]:
    """One row's runs; a failure is recorded as the row's result instead of ending the benchmark."""
    try:
        made = make()
        return made if isinstance(made, list) else [made]
    except Exception as error:
        print(f"\n=== {name}: FAILED {type(error).__name__}: {error}", flush=True)
        return [
            {
                "row": name,
                "expected": "",
                "verdict": f"error: {error}",
                "right": False,
                "before_sps": 0.0,
                "after_sps": None,
                "predicted": None,
                "measured": None,
            }
        ]


def rows_cuda(cycles: float, selected: set[str]) -> list[dict]:
    results: list[dict] = guarded("jpeg", jpeg_rows) if "jpeg" in selected else []

    def zero_workers() -> list[dict]:  # 8 x 2 ms per batch in the training process, 6 ms of GPU work
        local: list[dict] = []
        before = run(GpuSleepModel(6.0, cycles), DataLoader(Samples(8 * 200, 2.0), batch_size=8), batches=120)
        workers = advised_workers(before["diagnosis"]) or 4
        loader = DataLoader(Samples(8 * 200, 2.0), batch_size=8, num_workers=workers, persistent_workers=True)
        after = run(GpuSleepModel(6.0, cycles), loader, batches=120)
        local.append(row("zero_workers", "input_bound_workers", before, after, f"applied num_workers={workers}"))
        return local

    if "zero_workers" in selected:
        results += guarded("zero_workers", zero_workers)

    def io_latency() -> list[dict]:  # 20 ms of latency per sample, 2 workers, 10 ms of GPU work
        local: list[dict] = []

        def latency_loader(workers: int) -> DataLoader:
            return DataLoader(Samples(8 * 400, 20.0), batch_size=8, num_workers=workers, persistent_workers=True)

        before = run(GpuSleepModel(10.0, cycles), latency_loader(2), batches=60)
        workers = advised_workers(before["diagnosis"]) or 4
        after = run(GpuSleepModel(10.0, cycles), latency_loader(workers), batches=60)
        local.append(row("io_latency", "input_bound_workers", before, after, f"applied num_workers={workers}"))
        return local

    if "io_latency" in selected:
        results += guarded("io_latency", io_latency)

    def cpu_heavy() -> list[dict]:  # busy CPU work at the full CPU budget: more workers measured to give nothing
        local: list[dict] = []

        def busy_loader(workers: int) -> DataLoader:
            return DataLoader(
                Samples(32 * 400, 3.0, busy=True), batch_size=32, num_workers=workers, persistent_workers=True
            )

        before = run(GpuSleepModel(2.0, cycles), busy_loader(15), batches=60, epochs=2)  # epoch 1: no start-up
        after = run(GpuSleepModel(2.0, cycles), busy_loader(16), batches=60, epochs=2)
        local.append(
            row("cpu_heavy_full_budget", "input_bound_cpu", before, after, "16 workers tried: expected no gain")
        )
        return local

    if "cpu_heavy" in selected:
        results += guarded("cpu_heavy", cpu_heavy)

    def tiny_batches() -> list[dict]:
        local: list[dict] = []
        before = run(
            GpuSleepModel(0.2, cycles), DataLoader(Samples(2000), batch_size=1), batches=300, callbacks=(HostWork(),)
        )
        local.append(row("tiny_batches_host_work", "host_bound", before))
        return local

    if "tiny_batches" in selected:
        results += guarded("tiny_batches", tiny_batches)

    def pageable() -> list[dict]:  # 64 MB float batches from pageable memory, stock copy
        local: list[dict] = []

        batch = torch.randn(16, 1 << 20)  # 64 MB, made once: the loader costs nothing, the copy binds

        def big(pin: bool) -> DataLoader:
            return DataLoader([batch] * 80, batch_size=None, pin_memory=pin)

        before = run(BigModel(8.0, cycles), big(False), batches=60)
        after = run(BigModel(8.0, cycles), big(True), batches=60, strategy=SideStreamStrategy())
        local.append(row("pageable_transfer", "transfer_bound", before, after, "applied pin_memory + side_stream"))
        return local

    if "pageable" in selected:
        results += guarded("pageable", pageable)

    def compute() -> list[dict]:
        local: list[dict] = []
        before = run(GpuSleepModel(20.0, cycles), DataLoader(Samples(8 * 100), batch_size=8, num_workers=2), batches=60)
        local.append(row("compute_bound", "compute_bound", before))
        return local

    if "compute" in selected:
        results += guarded("compute", compute)

    def stall() -> list[dict]:
        local: list[dict] = []
        loader = DataLoader(Samples(8 * 300, stall_at=8 * 150), batch_size=8, num_workers=0)
        before = run(GpuSleepModel(5.0, cycles), loader, batches=300)
        local.append(row("one_long_stall", "stall", before))
        return local

    if "stall" in selected:
        results += guarded("stall", stall)

    def short_epoch() -> list[dict]:
        local: list[dict] = []
        loader = DataLoader(Samples(8 * 12), batch_size=8, num_workers=4)  # 12 steps, workers restarted
        before = run(GpuSleepModel(5.0, cycles), loader, batches=12)
        text = before["diagnosis"].format()
        local.append(
            row(
                "short_single_epoch",
                "epoch_start",
                before,
                note="persistent_workers advised" if "persistent_workers" in text else "no persistent_workers advice",
            )
        )
        return local

    if "short_epoch" in selected:
        results += guarded("short_epoch", short_epoch)

    return results


def jpeg_rows() -> list[dict]:
    """JPEG decode + augment (PIL in workers) into ResNet-18 bf16, and the same step on data already on the GPU."""
    import torchvision
    from gpu_decode import PilDataset, make_set

    samples, _ = make_set(tempfile.mkdtemp(), "uniform", 4000)

    class ResNet(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = torchvision.models.resnet18(num_classes=1000).to(memory_format=torch.channels_last)
            self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255)
            self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255)

        def training_step(self, batch, batch_idx):
            images, labels = batch
            images = images.permute(0, 3, 1, 2).float().sub_(self.mean).div_(self.std)
            images = images.contiguous(memory_format=torch.channels_last)
            return torch.nn.functional.cross_entropy(self.model(images), labels)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    def pil(workers: int) -> DataLoader:
        return DataLoader(
            PilDataset(samples * 4),  # 16,000 images: 125 steps an epoch
            batch_size=128,
            shuffle=True,
            num_workers=workers,
            pin_memory=True,
            persistent_workers=True,
            prefetch_factor=4,
        )

    one = next(iter(DataLoader(PilDataset(samples), batch_size=128)))
    ready = DataLoader([one] * 200, batch_size=None, pin_memory=True)  # the same batch: no decode at all
    ceiling = run(ResNet(), ready, batches=80, precision="bf16-mixed")
    # two epochs of 100 steps, judged on the second: persistent workers, no start-up, past the prefetched burst
    policy = run(ResNet(), pil(15), batches=100, epochs=2, precision="bf16-mixed")
    more = run(ResNet(), pil(16), batches=100, epochs=2, precision="bf16-mixed")
    rows = [row("jpeg_resnet18_ceiling", "compute_bound", ceiling, note="data already on the device")]
    jpeg = row("jpeg_resnet18_15_workers", "input_bound_cpu", policy, more, "16 workers tried")
    summary, reference = policy["summary"], ceiling["summary"]
    if summary.host_gap is not None:
        busy = summary.host_gap.gpu_busy_s
        reference_span = reference.timings["DeviceSpan"].mean  # the same step on data already on the GPU
        reference_busy = reference.host_gap.gpu_busy_s if reference.host_gap else reference_span
        jpeg["gpu_busy_ms"], jpeg["ceiling_gpu_busy_ms"] = 1e3 * busy, 1e3 * reference_busy
        jpeg["ceiling_device_span_ms"] = 1e3 * reference_span
        jpeg["gpu_busy_within_10pct"] = abs(busy - reference_busy) <= 0.1 * reference_busy
        jpeg["host_gap_ms"] = 1e3 * summary.host_gap.host_gap_s
    jpeg["device_span_ms"] = 1e3 * summary.timings["DeviceSpan"].mean  # GPU busy + host gap
    if summary.loader is not None:
        wait = summary.timings["DataLoading"].mean
        jpeg["loader_wait_ms"], jpeg["data_wait_ms"] = 1e3 * summary.loader.wait_s, 1e3 * wait
        jpeg["loader_adds_up_within_10pct"] = abs(summary.loader.wait_s - wait) <= 0.1 * max(wait, 1e-6)
        jpeg["workers_busy"] = summary.loader.busy_fraction
    jpeg["ceiling_sps"] = ceiling["samples_per_sec"]
    rows.append(jpeg)
    return rows


def rows_cpu(selected: set[str]) -> list[dict]:
    results = []
    if "cpu_only" in selected:  # CPU training, large batches loaded in the training process
        before = run(CpuModel(5.0), DataLoader(Samples(64 * 60, 0.3), batch_size=64), batches=40, accelerator="cpu")
        text = before["diagnosis"].format()
        cuda_words = [word for word in ("pin_memory", "side_stream", "GPU", "CUDA") if word in text]
        results.append(
            row(
                "cpu_only_large_batches",
                "input_bound_workers",
                before,
                note=f"CUDA words in the verdict: {cuda_words or 'none'}",
            )
        )
    return results


ALL = [
    "zero_workers",
    "io_latency",
    "cpu_heavy",
    "tiny_batches",
    "pageable",
    "compute",
    "stall",
    "short_epoch",
    "jpeg",
    "cpu_only",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="*", default=ALL, choices=ALL)
    args = parser.parse_args()
    selected = set(args.rows)
    results = rows_cpu(selected)
    if CUDA:
        results = rows_cuda(calibrate_cuda_sleep(), selected) + results
    table = print_table(
        ["row", "expected", "verdict", "right", "before/s", "after/s", "predicted", "measured"],
        [
            [
                r["row"],
                r["expected"],
                r["verdict"],
                r["right"],
                f"{r['before_sps']:.0f}",
                "" if r["after_sps"] is None else f"{r['after_sps']:.0f}",
                "" if r["predicted"] is None else f"{r['predicted']:.2f}x",
                "" if r["measured"] is None else f"{r['measured']:.2f}x",
            ]
            for r in results
        ],
    )
    write_json("verdicts", {"machine": machine(), "rows": results, "table": table})


if __name__ == "__main__":
    main()
