"""GPU JPEG decode vs the best CPU loader vs the compute-only ceiling (issue 17).

Generates two JPEG sets locally (uniform 320 px ~78 kB; ImageNet-like 200-500 px sides, mixed aspect,
~100 kB), then measures images/s of a bf16 channels-last training step (ResNet-18 and ResNet-50,
batch 128, SGD) side by side in one run:

- ceiling: the step on a batch already on the GPU;
- cpu: PIL decode + RandomResizedCrop + flip in ``--cpu-workers`` workers, pinned, persistent;
- gpu: ``EncodedImageDataset`` + ``collate_encoded`` in ``--workers`` workers + ``GpuDecodeLoader``.

Also: batched nvJPEG decode alone (CPU vs CUDA byte tensors), and three ways to crop+resize a
batch of decoded images of varied sizes (the flat gather used here, per-image ``interpolate``,
padding + ``roi_align``). Prints a table and writes JSON (``$OUT`` or ``benchmarks/results``).

    PYTHONPATH=$PWD python benchmarks/gpu_decode.py --images 5000 --steps 150
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import sys
import tempfile
import threading
import time

import numpy as np
import psutil
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, RandomSampler

from lightning_dataperf.decode import GpuDecodeLoader
from lightning_dataperf.decode.decoder import crop_resize_flip
from lightning_dataperf.decode.encoded import EncodedImageDataset, collate_encoded, random_resized_crop_params

BATCH, SIZE = 128, 224
MEAN = torch.tensor([0.485, 0.456, 0.406]) * 255
STD = torch.tensor([0.229, 0.224, 0.225]) * 255


def _make_image(job: tuple[str, int, int, int, float, int]) -> int:
    path, seed, height, width, sigma, quality = job
    rng = np.random.default_rng(seed)
    low = rng.integers(0, 255, (max(2, height // 32), max(2, width // 32), 3), dtype=np.uint8)
    base = np.asarray(Image.fromarray(low).resize((width, height), Image.BICUBIC), dtype=np.float32)
    pixels = np.clip(base + rng.normal(0, sigma, (height, width, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, format="JPEG", quality=quality)
    return os.path.getsize(path)


def make_set(root: str, kind: str, count: int) -> tuple[list[tuple[str, int]], float]:
    os.makedirs(root, exist_ok=True)
    rng = random.Random(kind)
    jobs = []
    for i in range(count):
        if kind == "uniform":
            height = width = 320
            sigma = 21.0
        else:
            height, width = rng.randint(200, 500), rng.randint(200, 500)
            sigma = 22.0
        jobs.append((os.path.join(root, f"{i:06d}.jpg"), i, height, width, sigma, 95))
    with multiprocessing.get_context("fork").Pool(16) as pool:
        sizes = pool.map(_make_image, jobs, chunksize=32)
    return [(job[0], i % 1000) for i, job in enumerate(jobs)], sum(sizes) / len(sizes)


class PilDataset(Dataset):
    """The CPU baseline: PIL decode, RandomResizedCrop (crop+resize in one PIL call), flip."""

    def __init__(self, samples: list[tuple[str, int]]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        rng = random.Random(index * 7919 + time.perf_counter_ns())
        with Image.open(path) as source:
            rgb = source.convert("RGB")
        top, left, h, w = random_resized_crop_params(rng, rgb.height, rgb.width)
        image = rgb.resize((SIZE, SIZE), Image.BILINEAR, box=(left, top, left + w, top + h))
        if rng.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(image).copy()), label


class JpegUtil:
    """Mean NVML JPEG-engine utilisation while running."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle, self._nvml = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml
            self._nvml.nvmlDeviceGetJpgUtilization(self._handle)
        except Exception:
            self._nvml = None

    def __enter__(self):
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.samples.append(float(self._nvml.nvmlDeviceGetJpgUtilization(self._handle)[0]))

    def __exit__(self, *exc) -> None:
        self._stop.set()

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else float("nan")


def make_model(name: str):
    import torchvision

    model = getattr(torchvision.models, name)(num_classes=1000).cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()

    return step


def measure(step, batches, warmup: int, steps: int) -> dict:
    """images/s over ``steps`` steps after ``warmup``; main-process and worker CPU over the window."""
    iterator = iter(batches)
    for _ in range(warmup):
        step(*next(iterator))
    torch.cuda.synchronize()
    me = psutil.Process()
    children = me.children(recursive=True)

    def worker_cpu() -> float:
        total = 0.0
        for child in children:
            try:
                times = child.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                pass
        return total

    cpu0, workers0, start, thread0 = time.process_time(), worker_cpu(), time.perf_counter(), time.thread_time()
    with JpegUtil() as util:
        for _ in range(steps):
            step(*next(iterator))
        torch.cuda.synchronize()
    wall, thread = time.perf_counter() - start, time.thread_time() - thread0
    cpu, workers = time.process_time() - cpu0, worker_cpu() - workers0
    if hasattr(iterator, "close"):
        iterator.close()
    return {
        "images_per_s": steps * BATCH / wall,
        "main_cpu_percent": 100 * cpu / wall,
        "workers_cpu_percent": 100 * workers / wall,
        "main_cpu_ms_per_step": 1e3 * cpu / steps,
        "main_thread_ms_per_step": 1e3 * thread / steps,
        "jpeg_util_percent": util.mean,
    }


def ceiling_batches():
    images = torch.randn(BATCH, 3, SIZE, SIZE, device="cuda").to(torch.bfloat16, memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (BATCH,), device="cuda")
    while True:
        yield images, labels


def cpu_batches(samples, workers: int, total: int):
    sampler = RandomSampler(range(len(samples)), replacement=True, num_samples=total * BATCH)
    loader = DataLoader(
        PilDataset(samples), batch_size=BATCH, sampler=sampler, num_workers=workers, pin_memory=True,
        persistent_workers=True, prefetch_factor=4, drop_last=True,
    )  # fmt: skip
    mean, std = MEAN.cuda().view(1, 3, 1, 1), STD.cuda().view(1, 3, 1, 1)
    for host_images, labels in loader:
        images = host_images.cuda(non_blocking=True).permute(0, 3, 1, 2).float().sub_(mean).div_(std)
        yield images.to(torch.bfloat16), labels.cuda(non_blocking=True)


def gpu_loader(samples, workers: int, total: int, wrapper=GpuDecodeLoader, **options) -> GpuDecodeLoader:
    dataset = EncodedImageDataset(samples, seed=0)
    sampler = RandomSampler(range(len(samples)), replacement=True, num_samples=total * BATCH)
    loader = DataLoader(
        dataset, batch_size=BATCH, sampler=sampler, num_workers=workers, collate_fn=collate_encoded,
        persistent_workers=workers > 0, prefetch_factor=4 if workers else None, drop_last=True,
    )  # fmt: skip
    options = {"device": "cuda", "lookahead": 3, "dtype": torch.bfloat16, **options}
    return wrapper(loader, **options)


def decode_micro(samples) -> dict:
    """Batched nvJPEG alone, CPU vs CUDA byte tensors, and three crop+resize methods."""
    from torchvision.io import decode_jpeg
    from torchvision.ops import roi_align

    parts = []
    for path, _ in samples[:BATCH]:
        with open(path, "rb") as file:
            parts.append(torch.frombuffer(bytearray(file.read()), dtype=torch.uint8))
    result: dict = {}
    for _ in range(3):
        decode_jpeg(parts, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        decoded = decode_jpeg(parts, device="cuda")
    torch.cuda.synchronize()
    result["nvjpeg_batched_images_per_s"] = 20 * BATCH / (time.perf_counter() - start)
    try:
        decode_jpeg([p.cuda() for p in parts[:4]], device="cuda")
        result["cuda_byte_tensors"] = "accepted"
    except Exception as error:
        result["cuda_byte_tensors"] = f"rejected: {error}"[:160]
    rng = random.Random(0)
    boxes = [random_resized_crop_params(rng, d.shape[1], d.shape[2]) for d in decoded]
    flips = torch.tensor([rng.random() < 0.5 for _ in decoded], device="cuda")
    sizes = torch.tensor([list(d.shape[1:]) for d in decoded])
    bases = torch.zeros(BATCH, dtype=torch.int64)
    bases[1:] = (sizes.prod(1) * 3).cumsum(0)[:-1]
    bases, sizes, boxes_gpu = bases.cuda(), sizes.cuda(), torch.tensor(boxes).cuda()
    rois = torch.tensor([[i, x, t, x + w, t + h] for i, (t, x, h, w) in enumerate(boxes)], dtype=torch.float32).cuda()

    def gather(dtype=torch.float32):
        flat = torch.cat([d.view(-1) for d in decoded])
        return crop_resize_flip(flat, bases, sizes, boxes_gpu, flips, SIZE, dtype)

    def per_image():
        out = torch.empty(BATCH, 3, SIZE, SIZE, device="cuda")
        for i, (d, (t, x, h, w)) in enumerate(zip(decoded, boxes, strict=True)):
            out[i] = torch.nn.functional.interpolate(
                d[None, :, t : t + h, x : x + w].float(), size=(SIZE, SIZE), mode="bilinear", align_corners=False
            )[0]
        return torch.where(flips[:, None, None, None], out.flip(-1), out)

    def pad_roi_align():
        height = max(d.shape[1] for d in decoded)
        width = max(d.shape[2] for d in decoded)
        padded = torch.zeros(BATCH, 3, height, width, device="cuda", dtype=torch.uint8)
        for i, d in enumerate(decoded):
            padded[i, :, : d.shape[1], : d.shape[2]] = d
        out = roi_align(padded.float(), rois, (SIZE, SIZE), 1.0, 2, aligned=True)
        return torch.where(flips[:, None, None, None], out.flip(-1), out)

    methods = (
        ("gather", gather), ("gather_fp16", lambda: gather(torch.float16)),
        ("per_image_interpolate", per_image), ("pad_roi_align", pad_roi_align),
    )  # fmt: skip
    for name, fn in methods:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        host = time.perf_counter()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(10):
            fn()
        end.record()
        host = (time.perf_counter() - host) / 10
        torch.cuda.synchronize()
        result[f"resize_{name}_gpu_ms"] = begin.elapsed_time(end) / 10
        result[f"resize_{name}_host_ms"] = 1e3 * host
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 2])
    parser.add_argument("--cpu-workers", type=int, default=15)
    parser.add_argument("--models", nargs="+", default=["resnet18", "resnet50"])
    parser.add_argument("--root", default=None)
    parser.add_argument(
        "--switch-intervals", type=float, nargs="+", default=[0.0, 0.0005],
        help="sys.setswitchinterval for the GPU path (0: the interpreter's default)",
    )  # fmt: skip
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    out_dir = os.environ.get("OUT") or os.path.join(os.path.dirname(__file__), "results")
    root = args.root or tempfile.mkdtemp(prefix="gpu_decode_")
    sets = {}
    for kind in ("uniform", "varied"):
        begin = time.perf_counter()
        samples, mean_bytes = make_set(os.path.join(root, kind), kind, args.images)
        sets[kind] = samples
        print(
            f"{kind}: {len(samples)} JPEGs, mean {mean_bytes / 1e3:.1f} kB, {time.perf_counter() - begin:.1f} s",
            flush=True,
        )
    results: dict = {"args": vars(args), "rows": [], "micro": {}}
    total = args.warmup + args.steps
    for model_name in args.models:
        step = make_model(model_name)
        ceiling = measure(step, ceiling_batches(), args.warmup, args.steps)
        for kind, samples in sets.items():
            rows = [("ceiling", 0, ceiling)]
            rows.append(
                (
                    "cpu_pil",
                    args.cpu_workers,
                    measure(step, cpu_batches(samples, args.cpu_workers, total), args.warmup, args.steps),
                )
            )
            for workers in args.workers:
                for interval in args.switch_intervals:
                    default = sys.getswitchinterval()
                    sys.setswitchinterval(interval or default)
                    try:
                        loader = gpu_loader(samples, workers, total)
                        row = measure(step, loader, args.warmup, args.steps)
                    finally:
                        sys.setswitchinterval(default)
                    row["decode"] = loader.stats().to_metrics()
                    row["switch_interval_s"] = interval or default
                    name = "gpu_decode" if not interval else f"gpu_si{interval * 1e3:g}ms"
                    rows.append((name, workers, row))
            for path, workers, row in rows:
                row.update(model=model_name, set=kind, path=path, workers=workers,
                           share_of_ceiling=row["images_per_s"] / ceiling["images_per_s"])  # fmt: skip
                results["rows"].append(row)
                print(
                    f"{model_name:9s} {kind:8s} {path:14s} w={workers:2d} {row['images_per_s']:8.0f} img/s "
                    f"{100 * row['share_of_ceiling']:5.1f}%  main {row['main_cpu_percent']:5.0f}% "
                    f"({row['main_cpu_ms_per_step']:.1f} ms/step)  workers {row['workers_cpu_percent']:5.0f}%  "
                    f"jpeg {row['jpeg_util_percent']:.0f}%", flush=True,
                )  # fmt: skip
        del step
        torch.cuda.empty_cache()
    for kind, samples in sets.items():
        results["micro"][kind] = decode_micro(samples)
        print(kind, json.dumps(results["micro"][kind]), flush=True)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gpu_decode_h200.json"), "w") as file:
        json.dump(results, file, indent=1, default=str)


if __name__ == "__main__":
    main()
