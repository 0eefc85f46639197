"""Reference pipelines with a known binding stage: the verdict on each, and its advice applied and measured.

On the CPU the rows are pipelines whose steps compute for real (``_cpu_pipelines.py``: the README
quickstart, a dict of small tensors, a numpy FFT transform into an MLP, tiny batches, a Python-heavy
collate, large batches, I/O latency): the verdict in each of three epochs at the pipeline's start setting,
then its advised change (workers, intra-op threads) applied and measured against the start in interleaved
pairs, predicted beside measured ("ok": no change below 0.97x, and an estimate of at least 1.1x delivers
at least half of itself; where more workers "cannot help", one worker more gains under 10%). On CUDA the
rows bind by construction (the step is GPU work, ``torch.cuda._sleep``); ``pageable`` and ``jpeg`` need
CUDA; the JPEG rows are PIL decode + RandomResizedCrop + flip in workers into a torchvision ResNet-18 in
bf16 (channels-last, batch 128), then the verdict's GPU-decode advice applied (``GpuDecodeLoader``, 4
workers). ``straggler`` runs two gloo ranks on the CPU (``torch.distributed.run``, DDP), rank 1's loader
40 ms per batch slower, then without the slowdown. Prints a table and writes JSON (``$OUT`` or
``benchmarks/results``).

    PYTHONPATH=$PWD python benchmarks/verdicts.py                 # every row this machine can run
    PYTHONPATH=$PWD python benchmarks/verdicts.py --rows quickstart fft --pairs 3 --name verdicts_cpu
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from _common import ROOT, print_table, quiet_trainer, write_json
from _common import CostlySamples as Samples
from _common import HostStepModel as CpuModel
from _common import fit_with_dataperf as run
from _cpu_pipelines import PIPELINES, computing
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader

from lightning_dataperf import DataPerfCallback, SideStreamStrategy, probe_hardware, recommend_loader_settings
from lightning_dataperf.diagnosis.findings import Diagnosis
from lightning_dataperf.testing import GpuSleepModel, calibrate_cuda_sleep, loopback_ranks
from lightning_dataperf.timing.summary import EpochSummary

#: Rows whose step is GPU work made to bind at one stage (on the CPU the computing pipelines stand for them).
CUDA_ROWS = {"zero_workers", "io_latency", "cpu_heavy", "tiny_batches", "pageable", "compute", "jpeg"}
#: Where more workers were said to give nothing, a gain below this counts as "as said".
NO_GAIN = 1.10


class BigModel(GpuSleepModel):
    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        torch.cuda._sleep(self.cycles)
        return self.layer(batch[:, :16]).pow(2).mean()


class HostWork(Callback):
    def on_train_batch_end(self, *args: object, **kwargs: object) -> None:
        time.sleep(0.005)


class Rig:
    """The machine the rows run on: a GPU step (calibrated ``torch.cuda._sleep``) or a host-sleep step."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.cycles = calibrate_cuda_sleep() if cuda else 0.0
        self.accelerator = "cuda" if cuda else "cpu"
        self.policy_workers = recommend_loader_settings(probe_hardware(), accelerator=self.accelerator).num_workers

    def model(self, step_ms: float) -> pl.LightningModule:
        return GpuSleepModel(step_ms, self.cycles) if self.cuda else CpuModel(step_ms)

    def run(self, model: pl.LightningModule, loader: object, **options: object) -> dict:
        return run(model, loader, accelerator=self.accelerator, **options)


def prediction(diagnosis: Diagnosis) -> float | None:
    """The gain the verdict's first advice estimates ("an estimate from this epoch: up to 1.77x"; before issue 37
    "predicted from this epoch: 1.77x faster"); 1.0 for "more workers cannot help"."""
    advice = diagnosis.findings[0].advice if diagnosis.findings else []
    for line in advice:
        if match := re.search(r"(?:an estimate from this epoch: up to|predicted from this epoch:) ([0-9.]+)x", line):
            return float(match.group(1))
    return 1.0 if any("cannot help" in line for line in advice) else None


def gpu_decode_ceiling(diagnosis: Diagnosis) -> float | None:
    """The ceiling the verdict names with its GPU-decode advice ("... ceiling 1.44x if input cost nothing")."""
    for finding in diagnosis.findings:
        for line in finding.advice:
            if "decode and augment on the GPU" in line and (match := re.search(r"ceiling ([0-9.]+)x", line)):
                return float(match.group(1))
    return None


def advised_workers(diagnosis: Diagnosis) -> int | None:
    for advice in diagnosis.findings[0].advice if diagnosis.findings else []:
        if match := re.search(r"(?:set num_workers=|num_workers from \d+ to )(\d+)", advice):
            return int(match.group(1))
    return None


FROM_ADVICE = object()  # row()'s default prediction: what the verdict's first advice predicts


def row(
    name: str, expected: str, before: dict, after: dict | None = None, note: str = "", predicted: object = FROM_ADVICE
) -> dict:
    """One table row; ``predicted``: a gain, None (nothing predicted), or what the first advice predicts."""
    diagnosis = before["diagnosis"]
    if predicted is FROM_ADVICE:
        predicted = prediction(diagnosis) if after is not None else None
    measured = after["samples_per_sec"] / before["samples_per_sec"] if after and before["samples_per_sec"] else None
    ok = None
    if predicted is not None and measured is not None:
        ok = measured < NO_GAIN if predicted == 1.0 else (measured - 1) >= 0.5 * (predicted - 1)
    result = {
        "row": name,
        "expected": expected,
        "verdict": diagnosis.bottleneck,
        "all_kinds": [finding.kind for finding in diagnosis.findings],
        "right": diagnosis.bottleneck.startswith(expected),
        "before_sps": before["samples_per_sec"],
        "after_sps": None if after is None else after["samples_per_sec"],
        "predicted": predicted,
        "measured": measured,
        "ok": ok,
        "note": note,
        "verdict_text": diagnosis.format(),
        "summary_text": before["summary"].format(),
    }
    if after is not None:
        result["after_verdict_text"] = after["diagnosis"].format()
    print(
        f"\n=== {name}: expected {expected}, verdict {diagnosis.bottleneck}\n{result['summary_text']}\n"
        f"{result['verdict_text']}",
        flush=True,
    )
    return result


def guarded(name: str, make: object) -> list[dict]:
    """One row's runs; a failure is recorded as the row's result instead of ending the benchmark."""
    begin, load = time.perf_counter(), os.getloadavg()[0]  # other processes on the machine skew the figures
    try:
        made = make()
        results = made if isinstance(made, list) else [made]
    except Exception as error:
        print(f"\n=== {name}: FAILED {type(error).__name__}: {error}", flush=True)
        results = [dict(row=name, expected="", verdict=f"error: {error}", right=False, before_sps=0.0)]
    for result in results:
        result.update(wall_s=time.perf_counter() - begin, load_before=load, load_after=os.getloadavg()[0])
    print(f"--- {name}: {time.perf_counter() - begin:.1f} s, load average {load:.1f} -> {os.getloadavg()[0]:.1f}")
    return results


def zero_workers(rig: Rig) -> list[dict]:  # 8 x 2 ms per batch in the training process, 6 ms step
    before = rig.run(rig.model(6.0), DataLoader(Samples(8 * 200, 2.0), batch_size=8), batches=120)
    workers = advised_workers(before["diagnosis"]) or rig.policy_workers
    loader = DataLoader(Samples(8 * 200, 2.0), batch_size=8, num_workers=workers, persistent_workers=True)
    after = rig.run(rig.model(6.0), loader, batches=120)
    return [row("zero_workers", "input_bound_workers", before, after, f"applied num_workers={workers}")]


def io_latency(rig: Rig) -> list[dict]:  # 20 ms of latency per sample, 2 workers, 10 ms step
    def latency_loader(workers: int) -> DataLoader:
        return DataLoader(Samples(8 * 400, 20.0), batch_size=8, num_workers=workers, persistent_workers=True)

    before = rig.run(rig.model(10.0), latency_loader(2), batches=60)
    workers = advised_workers(before["diagnosis"]) or 4
    after = rig.run(rig.model(10.0), latency_loader(workers), batches=60)
    return [row("io_latency", "input_bound_workers", before, after, f"applied num_workers={workers}")]


def cpu_heavy(rig: Rig) -> list[dict]:
    """Busy CPU work per sample at the policy's worker count (the CPU budget), then one worker more."""

    def busy_loader(workers: int) -> DataLoader:
        return DataLoader(
            Samples(32 * 400, 3.0, busy=True), batch_size=32, num_workers=workers, persistent_workers=True
        )

    batches = 60 if rig.cuda else 25  # two epochs: the second has no worker start-up
    counts = [("cpu_heavy_full_budget", rig.policy_workers)]
    if not rig.cuda:  # on 2 cores the policy keeps one core for the training process: also every core busy
        counts.append(("cpu_heavy_every_core", os.cpu_count() or 2))
    results = []
    for name, workers in counts:
        before = rig.run(rig.model(2.0), busy_loader(workers), batches=batches, epochs=2)
        after = rig.run(rig.model(2.0), busy_loader(workers + 1), batches=batches, epochs=2)
        results.append(row(name, "input_bound_cpu", before, after, f"{workers} -> {workers + 1} workers"))
    return results


def tiny_batches(rig: Rig) -> list[dict]:
    loader = DataLoader(Samples(2000), batch_size=1)
    before = rig.run(rig.model(0.2), loader, batches=300, callbacks=(HostWork(),))
    return [row("tiny_batches_host_work", "host_bound", before)]


def pageable(rig: Rig) -> list[dict]:  # 64 MB float batches from pageable memory, stock copy
    batch = torch.randn(16, 1 << 20)  # 64 MB, made once: the loader costs nothing, the copy binds

    def big(pin: bool) -> DataLoader:
        return DataLoader([batch] * 80, batch_size=None, pin_memory=pin)

    before = rig.run(BigModel(8.0, rig.cycles), big(False), batches=60)
    after = rig.run(BigModel(8.0, rig.cycles), big(True), batches=60, strategy=SideStreamStrategy())
    note = "applied pin_memory + side_stream; predicted: the transfer ceiling"
    return [
        row("pageable_transfer", "transfer_bound", before, after, note, before["diagnosis"].findings[0].ceiling_speedup)
    ]


def compute(rig: Rig) -> list[dict]:
    before = rig.run(rig.model(20.0), DataLoader(Samples(8 * 100), batch_size=8, num_workers=2), batches=60)
    return [row("compute_bound", "compute_bound", before)]


def stall(rig: Rig) -> list[dict]:
    loader = DataLoader(Samples(8 * 300, stall_at=8 * 150), batch_size=8, num_workers=0)
    return [row("one_long_stall", "stall", rig.run(rig.model(5.0), loader, batches=300))]


def short_epoch(rig: Rig) -> list[dict]:
    loader = DataLoader(Samples(8 * 12), batch_size=8, num_workers=4)  # 12 steps, workers restarted
    before = rig.run(rig.model(5.0), loader, batches=12)
    advised = "persistent_workers" in before["diagnosis"].format()
    note = "persistent_workers advised" if advised else "no persistent_workers advice"
    return [row("short_single_epoch", "epoch_start", before, note=note)]


STRAGGLER_MS, STRAGGLER_BATCHES = 40.0, 60


def straggler_rank(out_dir: str, slow_ms: float) -> None:
    """One rank of the straggler row (under torch.distributed.run): rank 1's loader ``slow_ms`` slower per batch."""
    rank = int(os.environ["RANK"])
    sample_ms = 0.25 + (slow_ms / 8 if rank == 1 else 0.0)  # 8 samples a batch: 2 ms, or 2 + slow_ms
    loader = DataLoader(Samples(2 * 8 * STRAGGLER_BATCHES, sample_ms), batch_size=8)
    perf = DataPerfCallback(print_summary=False, telemetry_interval=0.25)
    trainer = quiet_trainer(
        max_epochs=1, accelerator="cpu", devices=2, strategy="ddp", callbacks=[perf],
        num_sanity_val_steps=0, default_root_dir=out_dir, use_distributed_sampler=True,
    )  # fmt: skip
    trainer.fit(CpuModel(5.0), loader)
    record = {"summary": perf.last_summary.to_dict(), "diagnosis": perf.last_diagnosis.to_dict()}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(record, default=str))


def two_ranks(slow_ms: float) -> dict:
    out_dir = tempfile.mkdtemp(prefix="verdicts_ddp_")
    command, env = loopback_ranks(__file__, "--rank-out", out_dir, "--slow-ms", str(slow_ms), pythonpath=str(ROOT))
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode:
        raise RuntimeError(f"two gloo ranks failed: {done.stdout[-1500:]}{done.stderr[-1500:]}")
    record = json.loads(Path(out_dir, "rank0.json").read_text())
    summary, diagnosis = EpochSummary.from_dict(record["summary"]), Diagnosis.from_dict(record["diagnosis"])
    return {"summary": summary, "diagnosis": diagnosis, "samples_per_sec": summary.samples_per_sec or 0.0}


def straggler(rig: Rig) -> list[dict]:
    before, after = two_ranks(STRAGGLER_MS), two_ranks(0.0)
    found = [finding for finding in before["diagnosis"].findings if finding.kind == "straggler"]
    predicted = found[0].ceiling_speedup if found else None
    note = f"2 gloo ranks, rank 1's loader +{STRAGGLER_MS:.0f} ms per batch; applied: slowdown removed"
    return [row("straggler", "straggler", before, after, note, predicted)]


def jpeg(rig: Rig) -> list[dict]:
    """JPEG decode + augment (PIL in workers) into ResNet-18 bf16; the same step on data already on the GPU;
    the verdict's GPU-decode advice applied (``GpuDecodeLoader``)."""
    import torchvision
    from gpu_decode import PilDataset, make_set

    from lightning_dataperf.decode import GpuDecodeLoader
    from lightning_dataperf.decode.encoded import EncodedImageDataset, collate_encoded

    samples, _ = make_set(tempfile.mkdtemp(), "uniform", 4000)

    class ResNet(pl.LightningModule):
        def __init__(self, decoded_on_gpu: bool = False) -> None:
            super().__init__()
            self.decoded_on_gpu = decoded_on_gpu  # GpuDecodeLoader hands over normalised NCHW channels-last
            self.model = torchvision.models.resnet18(num_classes=1000).to(memory_format=torch.channels_last)
            self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255)
            self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255)

        def training_step(self, batch, batch_idx):
            images, labels = batch
            if not self.decoded_on_gpu:
                images = images.permute(0, 3, 1, 2).float().sub_(self.mean).div_(self.std)
                images = images.contiguous(memory_format=torch.channels_last)
            return torch.nn.functional.cross_entropy(self.model(images), labels)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    def pil(workers: int) -> DataLoader:
        return DataLoader(
            PilDataset(samples * 4),  # 16,000 images: 125 steps an epoch
            batch_size=128, shuffle=True, num_workers=workers, pin_memory=True, persistent_workers=True,
            prefetch_factor=4,
        )  # fmt: skip

    def on_gpu(workers: int = 4) -> GpuDecodeLoader:  # docs/gpu_decode.md's recipe
        loader = DataLoader(
            EncodedImageDataset(samples * 4, seed=0), batch_size=128, shuffle=True, num_workers=workers,
            drop_last=True, collate_fn=collate_encoded, persistent_workers=True, prefetch_factor=4,
        )  # fmt: skip
        return GpuDecodeLoader(loader, size=224, dtype=torch.bfloat16)

    one = next(iter(DataLoader(PilDataset(samples), batch_size=128)))
    ready = DataLoader([one] * 200, batch_size=None, pin_memory=True)  # the same batch: no decode at all
    ceiling = run(ResNet(), ready, batches=80, precision="bf16-mixed")
    # two epochs of 100 steps, judged on the second: persistent workers, no start-up, past the prefetched burst
    workers = rig.policy_workers
    policy = run(ResNet(), pil(workers), batches=100, epochs=2, precision="bf16-mixed")
    more = run(ResNet(), pil(workers + 1), batches=100, epochs=2, precision="bf16-mixed")
    gc.collect()  # the PIL runs' persistent workers go before the GPU-decode run starts its own
    gpu_loader = on_gpu()
    decoded = run(ResNet(decoded_on_gpu=True), gpu_loader, batches=100, epochs=2, precision="bf16-mixed")
    rows = [row("jpeg_resnet18_ceiling", "compute_bound", ceiling, note="data already on the device")]
    jpeg = row(f"jpeg_resnet18_{workers}_workers", "input_bound_cpu", policy, more, f"{workers + 1} workers tried")
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
    ceiling_named = gpu_decode_ceiling(policy["diagnosis"])
    note = "applied GpuDecodeLoader, 4 workers; predicted: the ceiling the GPU-decode advice names"
    if ceiling_named is None:
        note = "the verdict names no GPU decoding; GpuDecodeLoader measured anyway (4 workers)"
    gpu = row("jpeg_resnet18_gpu_decode", "input_bound_cpu", policy, decoded, note, ceiling_named)
    gpu["decode_stats"] = gpu_loader.stats().to_metrics()
    gpu["ceiling_share"] = decoded["samples_per_sec"] / max(1e-9, ceiling["samples_per_sec"])
    return [*rows, jpeg, gpu]


ROWS = {
    "zero_workers": zero_workers,
    "io_latency": io_latency,
    "cpu_heavy": cpu_heavy,
    "tiny_batches": tiny_batches,
    "pageable": pageable,
    "compute": compute,
    "stall": stall,
    "short_epoch": short_epoch,
    "jpeg": jpeg,
    "straggler": straggler,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="*", default=None, choices=[*ROWS, *PIPELINES])
    parser.add_argument("--pairs", type=int, default=3, help="interleaved start/advised pairs per computing row")
    parser.add_argument("--seconds", type=float, default=3.0, help="steady seconds per computing measurement")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda if present")
    parser.add_argument("--name", default="verdicts", help="the JSON file's name (without .json)")
    parser.add_argument("--rank-out", help=argparse.SUPPRESS)  # one straggler rank (torch.distributed.run)
    parser.add_argument("--slow-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_out:
        straggler_rank(args.rank_out, args.slow_ms)
        return
    rig = Rig(torch.cuda.is_available() if args.device == "auto" else args.device == "cuda")
    results: list[dict] = []
    rows = args.rows or ([*ROWS] if rig.cuda else [*PIPELINES, "stall", "short_epoch", "straggler"])
    for name in rows:
        if name in CUDA_ROWS and not rig.cuda:
            print(f"--- {name}: skipped (needs CUDA; on the CPU the computing pipelines stand for it)", flush=True)
            continue
        if name in PIPELINES:
            results += guarded(name, lambda name=name: computing(name, args.pairs, args.seconds))
            continue
        results += guarded(name, lambda name=name: ROWS[name](rig))
        write_json(args.name, {"device": rig.accelerator, "policy_workers": rig.policy_workers, "rows": results})
    table = print_table(
        ["row", "expected", "verdict", "right", "steady", "before/s", "after/s", "predicted", "measured", "ok", "note"],
        [
            [
                r["row"],
                r["expected"],
                r["verdict"],
                "" if r.get("right") is None else r["right"],
                "" if r.get("steady_same") is None else r["steady_same"],
                f"{r['before_sps']:.0f}" if r.get("before_sps") else "",
                "" if r.get("after_sps") is None else f"{r['after_sps']:.0f}",
                "" if r.get("predicted") is None else f"{r['predicted']:.2f}x",
                "" if r.get("measured") is None else f"{r['measured']:.2f}x",
                "" if r.get("ok") is None else r["ok"],
                r.get("note", ""),
            ]
            for r in results
        ],
    )
    payload = {"device": rig.accelerator, "policy_workers": rig.policy_workers, "rows": results, "table": table}
    write_json(args.name, payload)


if __name__ == "__main__":
    main()
