"""Is the GPU-decode path ordered against the training stream? Every decoded image against a CPU decode (issue 38).

Two public reports concern this path: ``torchvision.io.decode_jpeg(device="cuda")`` allocates its outputs on the
caller's stream and decodes on a private one that never waits for it (pytorch/vision#9606), and nvJPEG's hardware
engine writes when the call is made, not in stream order (meta-pytorch/torchcodec#1634). A block the caching
allocator hands out again while kernels queued on the same stream still read it is then overwritten.

Per configuration (``backend:augment[:unordered]:batches``), a ``GpuDecodeLoader`` over 4 workers feeds a
training stream kept busy (``--busy`` bf16 matmuls of 8192 x 8192 per batch on freshly allocated inputs, freed
while queued, so the caching allocator hands their blocks out again at once), and every image of every batch
is compared, on that stream, with the reference for its dataset index: the file decoded on the CPU (PIL) once,
then the same crop / resize / flip / normalise arithmetic run once on an idle GPU (synchronised). The crop of a
sample depends on ``(seed, epoch, index)`` alone, so each epoch (``--epoch-batches`` batches) has one reference
per index; labels carry the dataset index. An image fails if its mean absolute difference exceeds
``--tolerance`` levels of 255 or more than ``--far-share`` of its values differ by more than ``--far-levels``
levels. No synchronize per step: the failure counts stay on the GPU and are read at the end of each epoch.

``unordered`` (controls, to show the harness sees the hazard): torchvision's decode on the decode stream itself
(as a user calls it), or nvImageCodec with the host barrier off and one graph buffer (the code before issue 38).

    PYTHONPATH=$PWD python benchmarks/gpu_decode_stress.py --configs torchvision:graph:10000
    PYTHONPATH=$PWD python benchmarks/gpu_decode_stress.py --dry-run   # CPU (PIL), 2 x 3 batches

``--gpu-share 0.5`` (issue 46): split decode, the workers decode the other half of each batch on the CPU; every
image is still compared with the same reference.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader, RandomSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_json
from gpu_decode import make_set

from lightning_dataperf.decode import GpuDecodeLoader
from lightning_dataperf.decode._gather import augment_batch
from lightning_dataperf.decode._prepare import pil_decode
from lightning_dataperf.decode.decoder import IMAGENET_MEAN, IMAGENET_STD
from lightning_dataperf.decode.encoded import EncodedImageDataset, collate_encoded

BATCH, SIZE = 128, 224


class References:
    """Every file decoded on the CPU once; per epoch, each index's expected output (its crop, flip, normalise)."""

    def __init__(self, dataset: EncodedImageDataset, device: torch.device, dtype: torch.dtype) -> None:
        self.dataset, self.device, self.dtype = dataset, device, dtype

        def decode(index: int) -> torch.Tensor:
            with open(dataset.samples[index][0], "rb") as file:
                return pil_decode(file.read())

        with concurrent.futures.ThreadPoolExecutor(min(16, os.cpu_count() or 1)) as pool:
            images = list(pool.map(decode, range(len(dataset))))
        self.sizes = [(image.shape[0], image.shape[1]) for image in images]
        bases, position = [], 0
        for image in images:
            bases.append(position)
            position += image.numel()
        self.bases = bases
        self.flat = torch.cat([image.reshape(-1) for image in images] + [torch.zeros(3, dtype=torch.uint8)])
        self.flat = self.flat.to(device)
        self.scale = torch.tensor([1 / (255 * s) for s in IMAGENET_STD], device=device)
        self.shift = (-torch.tensor(IMAGENET_MEAN) / torch.tensor(IMAGENET_STD)).to(device)
        self.levels = (255 * torch.tensor(IMAGENET_STD)).to(device).view(1, 3, 1, 1)  # normalised -> levels

    def expected(self) -> torch.Tensor:
        """``[N, 3, SIZE, SIZE]`` for the dataset's current epoch (computed once, then synchronised)."""
        rows = []
        for index in range(len(self.dataset)):
            sample = self.dataset[index]
            h, w = self.sizes[index]
            rows.append((self.bases[index], h, w, *sample.box, int(sample.flip), index))
        table = torch.tensor(rows, dtype=torch.int64, device=self.device)
        compute = torch.float16 if self.device.type == "cuda" else torch.float32
        parts = []
        for chunk in table.split(BATCH):
            images, _ = augment_batch(self.flat, chunk, self.scale, self.shift, SIZE, compute, "hwc", self.dtype, False)
            parts.append(images)
        out = torch.cat(parts)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return out


def busy(count: int, device: torch.device) -> None:
    """Queue ``count`` matmuls on freshly allocated inputs and free them while queued (allocator churn)."""
    if device.type != "cuda":
        return
    for _ in range(count):
        a = torch.empty(8192, 8192, dtype=torch.bfloat16, device=device).normal_()
        b = a @ a
        del a, b


def run_config(samples, spec: str, args, device: torch.device) -> dict:
    parts = spec.split(":")
    backend, augment, batches = parts[0], parts[1], int(parts[-1])
    unordered = "unordered" in parts[2:-1]
    dataset = EncodedImageDataset([(path, i) for i, (path, _) in enumerate(samples)], seed=args.seed)
    references = References(dataset, device, torch.bfloat16)
    epochs = max(1, -(-batches // args.epoch_batches))
    totals = {"images": 0, "failed": 0, "failed_batches": 0, "mean_levels_max": 0.0, "far_share_max": 0.0,
              "cpu_share": 0}  # fmt: skip
    mean_sum = 0.0
    first_failures: list[dict] = []
    decode_wall, barrier, taken = 0.0, 0.0, 0
    began = time.perf_counter()
    for epoch in range(epochs):
        todo = min(args.epoch_batches, batches - epoch * args.epoch_batches)
        dataset.set_epoch(epoch)
        expected = references.expected()
        sampler = RandomSampler(range(len(dataset)), replacement=True, num_samples=todo * BATCH)
        base = DataLoader(
            dataset, batch_size=BATCH, sampler=sampler, num_workers=args.workers, collate_fn=collate_encoded,
            persistent_workers=False, prefetch_factor=4 if args.workers else None, drop_last=True,
        )  # fmt: skip
        options = {"backend": backend} if device.type == "cuda" else {}
        loader = GpuDecodeLoader(
            base, device=device, size=SIZE, dtype=torch.bfloat16, graph_augment=augment == "graph",
            channels_last=True, gpu_share=args.gpu_share, **options,
        )  # fmt: skip
        decoder = loader.decoder
        if unordered and device.type == "cuda":
            if hasattr(decoder.backend, "ordered"):
                decoder.backend.ordered = False  # decode_jpeg on the decode stream, as a user would call it
            decoder.host_barrier, decoder._graphs = False, [None]  # no barrier, one graph buffer
        failed = torch.zeros(todo, dtype=torch.int64, device=device)
        worst = torch.zeros(2, device=device)  # max per-image mean difference, max share of far values
        total_mean = torch.zeros((), device=device)
        before = loader.stats()
        start = time.perf_counter()
        for step, (images, labels) in enumerate(loader):
            busy(args.busy, device)
            diff = (images.float() - expected[labels].float()).abs_().mul_(references.levels)
            means = diff.mean(dim=(1, 2, 3))
            far = (diff > args.far_levels).float().mean(dim=(1, 2, 3))
            bad = (means > args.tolerance) | (far > args.far_share)
            failed[step] = bad.sum()
            worst = torch.maximum(worst, torch.stack([means.max(), far.max()]))
            total_mean += means.sum()
        if device.type == "cuda":
            torch.cuda.synchronize()  # once per epoch: the counts are read here
        decode_wall += time.perf_counter() - start
        window = loader.stats().since(before)
        barrier += window.barrier_seconds
        totals["cpu_share"] += window.cpu_share
        taken += window.batches
        counts = failed.cpu()
        totals["images"] += todo * BATCH
        totals["failed"] += int(counts.sum())
        totals["failed_batches"] += int((counts > 0).sum())
        totals["mean_levels_max"] = max(totals["mean_levels_max"], float(worst[0]))
        totals["far_share_max"] = max(totals["far_share_max"], float(worst[1]))
        mean_sum += float(total_mean)
        for index in (counts > 0).nonzero().flatten().tolist()[: max(0, 5 - len(first_failures))]:
            first_failures.append({"epoch": epoch, "batch": index, "failed_images": int(counts[index])})
        loader.close()
        del expected
    return {
        "config": spec,
        "backend": backend,
        "augment": augment,
        "ordered": not unordered,
        "gpu_share": args.gpu_share,
        "batches": batches,
        **totals,
        "mean_levels_mean": mean_sum / max(1, totals["images"]),
        "img_per_s": totals["images"] / decode_wall if decode_wall else 0.0,
        "barrier_ms_per_batch": 1e3 * barrier / max(1, taken),
        "seconds": time.perf_counter() - began,
        "first_failures": first_failures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["torchvision:graph:10000"])
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--set", default="varied", choices=["varied", "uniform"])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--busy", type=int, default=3, help="8192^2 bf16 matmuls per batch on the training stream")
    parser.add_argument("--epoch-batches", type=int, default=2500)
    parser.add_argument("--tolerance", type=float, default=4.0, help="max mean |difference| per image, levels")
    parser.add_argument("--far-levels", type=float, default=48.0)
    parser.add_argument("--far-share", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpu-share", type=float, default=1.0, help="split decode: the GPU's share of each batch")
    parser.add_argument("--root", default=None)
    parser.add_argument("--name", default="gpu_decode_stress")
    parser.add_argument("--dry-run", action="store_true", help="CPU (PIL), 60 images, 2 configs of 3 batches")
    args = parser.parse_args()
    if args.dry_run:
        global BATCH  # noqa: PLW0603 (the dry run shrinks the batch)
        BATCH = 8
        args.images, args.workers, args.epoch_batches = 60, 0, 2
        args.configs = ["pil:eager:3", "pil:graph:3"]
    device = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    root = args.root or tempfile.mkdtemp(prefix="gpu_decode_stress_")
    begin = time.perf_counter()
    samples, mean_bytes = make_set(os.path.join(root, args.set), args.set, args.images)
    print(f"{args.set}: {len(samples)} JPEGs, mean {mean_bytes / 1e3:.1f} kB, {time.perf_counter() - begin:.1f} s")
    rows = []
    for spec in args.configs:
        row = run_config(samples, spec, args, device)
        rows.append(row)
        print(
            f"{spec}: {row['images']} images in {row['batches']} batches, {row['failed']} failed "
            f"({row['failed_batches']} batches); max mean diff {row['mean_levels_max']:.2f} levels, max far share "
            f"{row['far_share_max']:.4f}; {row['img_per_s']:.0f} img/s; barrier {row['barrier_ms_per_batch']:.3f} ms",
            flush=True,
        )
    headers = ["config", "ordered", "batches", "images", "failed images", "failed batches",
               "mean diff (levels)", "max per-image mean", "max far share", "img/s", "barrier ms/batch"]  # fmt: skip
    table = [
        (r["config"], r["ordered"], r["batches"], r["images"], r["failed"], r["failed_batches"],
         round(r["mean_levels_mean"], 3), round(r["mean_levels_max"], 2), round(r["far_share_max"], 4),
         round(r["img_per_s"]), round(r["barrier_ms_per_batch"], 3))
        for r in rows
    ]  # fmt: skip
    text = print_table(headers, table)
    write_json(args.name, {"args": vars(args), "rows": rows, "table": text})


if __name__ == "__main__":
    main()
