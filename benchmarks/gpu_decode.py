"""GPU JPEG decode: the decode path against batched nvJPEG, and end to end against the ceiling (issues 17, 38).

Generates two JPEG sets locally (uniform 320 px ~78 kB; ImageNet-like 200-500 px sides, mixed aspect,
~100 kB). ``--part`` picks what runs; everything prints a table and writes JSON (``$OUT`` or
``benchmarks/results``):

- ``decode`` (issue 38): images/s of batched nvJPEG decode-only on the same images (torchvision's
  ``decode_jpeg(list, device="cuda")``; nvImageCodec's ``Decoder.decode`` where it imports) against the
  package's decode path alone (``EncodedImageDataset`` in 4 workers + ``GpuDecodeLoader``, no model), for
  ``prepare_ahead`` 0 (one decode thread takes, prepares, decodes and augments each batch, as before issue 38)
  and 2 (a prepare thread and, for torchvision, a thread for the decode call ahead of the decode thread), and
  for nvImageCodec with its host barrier on and off (the cost of the ordering).
- ``e2e`` (issue 38): ResNet-18/50, bf16-mixed, batch 128, channels-last, SGD, in a real ``Trainer``; eager and
  ``torch.compile(mode="reduce-overhead")``: the ceiling (the same LightningModule fed a batch already on
  the GPU) and the package's path (``GpuDecodeLoader`` over 4 workers, ``prepare_ahead`` 2 and 0) on both
  sets, side by side in one run. Images/s from CUDA events recorded at the first timed step and after the
  last one (read after the fit; no synchronize per step).
- ``dali`` rows (issue 38; ``--paths``): DALI's pipeline over the same files with the same crop, flip and
  normalise (``benchmarks/gpu_decode_dali.py``), alone and end to end; ``package-nvimgcodec``: the package's
  path on nvImageCodec. ``--part all``: the decode rows, then the e2e rows, in one run and one JSON.
- ``legacy`` (issue 17, sessions 6-8): the step in a plain loop, the CPU loader, the decode micro-benchmarks.

    PYTHONPATH=$PWD python benchmarks/gpu_decode.py --part decode --images 2000
    PYTHONPATH=$PWD python benchmarks/gpu_decode.py --part e2e --images 2000 --steps 150
    PYTHONPATH=$PWD python benchmarks/gpu_decode.py --part e2e --dry-run   # CPU, tiny: the code paths only
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import random
import sys
import tempfile
import threading
import time
import traceback

import numpy as np
import psutil
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, RandomSampler

from lightning_dataperf.decode import GpuDecodeLoader
from lightning_dataperf.decode.decoder import crop_resize_flip
from lightning_dataperf.decode.encoded import EncodedImageDataset, collate_encoded
from lightning_dataperf.decode.headers import random_resized_crop_params

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


def legacy_main(argv: list[str]) -> None:
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
    args = parser.parse_args(argv)
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


# --- issue 38: the decode path against batched nvJPEG, and end to end in a Trainer ----------------------------


def read_batches(samples, count: int, seed: int = 0) -> list[list[bytes]]:
    """``count`` batches of encoded bytes drawn from ``samples`` (with replacement, seeded)."""
    rng = random.Random(seed)
    cache: dict[str, bytes] = {}
    batches = []
    for _ in range(count):
        batch = []
        for path, _ in rng.choices(samples, k=BATCH):
            if path not in cache:
                with open(path, "rb") as file:
                    cache[path] = file.read()
            batch.append(cache[path])
        batches.append(batch)
    return batches


def torchvision_decode_only(batches: list[list[bytes]], warmup: int = 3) -> float:
    """images/s of ``decode_jpeg(list, device="cuda")`` over ``batches`` (host byte tensors made beforehand)."""
    from torchvision.io import decode_jpeg

    tensors = [[torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in batch] for batch in batches]
    for batch in tensors[:warmup]:
        decode_jpeg(batch, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for batch in tensors:
        decode_jpeg(batch, device="cuda")
    torch.cuda.synchronize()
    return len(tensors) * BATCH / (time.perf_counter() - start)


def nvimgcodec_decode_only(batches: list[list[bytes]], warmup: int = 3) -> float | None:
    """images/s of nvImageCodec's batched decode (hardware engines first) over ``batches``; None if it is absent."""
    try:
        from lightning_dataperf.decode._nvimgcodec import NvImageCodecBackend, import_nvimgcodec

        codec = import_nvimgcodec()
        backend = NvImageCodecBackend(torch.device("cuda", 0))
    except ImportError as error:
        print(f"nvImageCodec decode-only: not measured ({error})"[:200], flush=True)
        return None
    decoder, params = backend._decoder, backend._params
    arrays = [[np.frombuffer(b, dtype=np.uint8) for b in batch] for batch in batches]
    stream = torch.cuda.current_stream().cuda_stream

    def one(batch):
        streams = [codec.CodeStream(array) for array in batch]
        return decoder.decode(streams, params=params, cuda_stream=stream)

    for batch in arrays[:warmup]:
        one(batch)
    torch.cuda.synchronize()
    start = time.perf_counter()
    kept = [one(batch) for batch in arrays]
    torch.cuda.synchronize()
    del kept
    return len(arrays) * BATCH / (time.perf_counter() - start)


def encoded_loader(samples, workers: int, batches: int, seed: int = 0) -> DataLoader:
    dataset = EncodedImageDataset(samples, seed=seed)
    sampler = RandomSampler(range(len(samples)), replacement=True, num_samples=batches * BATCH)
    return DataLoader(
        dataset, batch_size=BATCH, sampler=sampler, num_workers=workers, collate_fn=collate_encoded,
        persistent_workers=False, prefetch_factor=4 if workers else None, drop_last=True,
    )  # fmt: skip


def decode_path_alone(samples, workers: int, warmup: int, batches: int, barrier: bool = True, **options) -> dict:
    """images/s of the package's decode path with no model: a consumer that only takes the batches."""
    device = options.pop("device", "cuda")
    loader = package_loader(encoded_loader(samples, workers, warmup + batches), device=device, dtype=torch.bfloat16,
                            **options)  # fmt: skip
    if not barrier:  # the cost of the ordering only: unsafe where the decoder writes at call time
        loader.decoder.host_barrier, loader.decoder._graphs = False, [None]
    iterator = iter(loader)
    for _ in range(warmup):
        next(iterator)
    if device == "cuda":
        torch.cuda.synchronize()
    before, start = loader.stats(), time.perf_counter()
    taken = sum(1 for _ in iterator)
    if device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    window = loader.stats().since(before)
    loader.close()
    per = 1e3 / max(1, window.batches)
    return {
        "images_per_s": taken * BATCH / wall,
        "batches": taken,
        "decode_thread_ms": window.submit_seconds * per,
        "decode_thread_cpu_ms": window.submit_cpu_seconds * per,
        "prepare_ms": window.prepare_seconds * per,
        "prepare_cpu_ms": window.prepare_cpu_seconds * per,
        "barrier_ms": window.barrier_seconds * per,
        "call_ms": window.call_seconds * per,
        "gpu_ms": window.decode_seconds * per,
        "lookahead_mean": window.lookahead_mean,
        "backend": window.backend,
    }


def package_loader(loader, priority: str = "normal", **options) -> GpuDecodeLoader:
    """The package's loader; ``priority="high"``: its decode stream at the highest priority (run e of issue 38:
    no gain measured, so the package keeps the default priority)."""
    package = GpuDecodeLoader(loader, **options)
    if priority == "high" and package._stream is not None:
        package._stream = torch.cuda.Stream(package.device, priority=-100)
    return package


def _wanted(name: str, paths: list[str]) -> bool:
    """Is the package row ``name`` among ``--paths`` (``package``: torchvision; ``package-nvimgcodec``;
    ``serial``: prepare_ahead=0; ``unbarriered``: nvImageCodec without its host barrier)?"""
    if "prepare_ahead=0" in name:
        return "serial" in paths
    if "no host barrier" in name:
        return "unbarriered" in paths
    for backend in ("nvimgcodec", "nvjpeg"):
        if backend in name:
            return f"package-{backend}" in paths
    return "package" in paths


def part_decode(sets: dict, args) -> dict:
    rows = []
    cuda = torch.cuda.is_available() and not args.dry_run
    variants = [
        ("package torchvision, prepare_ahead=0", {"backend": "torchvision", "prepare_ahead": 0}),
        ("package torchvision, prepare_ahead=2", {"backend": "torchvision", "prepare_ahead": 2}),
        ("package nvimgcodec, prepare_ahead=2", {"backend": "nvimgcodec", "prepare_ahead": 2}),
        ("package nvimgcodec, no host barrier", {"backend": "nvimgcodec", "prepare_ahead": 2, "barrier": False}),
        ("package nvjpeg, prepare_ahead=2", {"backend": "nvjpeg", "prepare_ahead": 2}),
    ]
    variants = [(name, options) for name, options in variants if _wanted(name, args.paths)]
    variants = [
        (name + _suffix(augment, priority), {**options, **_augment(augment), "priority": priority})
        for name, options in variants for augment in args.augment for priority in args.priority
    ]  # fmt: skip
    if not cuda:
        variants = [("package pil, prepare_ahead=0", {"prepare_ahead": 0, "device": "cpu"}),
                    ("package pil, prepare_ahead=2", {"prepare_ahead": 2, "device": "cpu"})]  # fmt: skip
    for kind, samples in sets.items():
        reference = None
        if cuda:
            batches = read_batches(samples, args.decode_batches)
            reference = torchvision_decode_only(batches)
            rows.append({"set": kind, "path": "nvJPEG decode-only (torchvision, batched)", "images_per_s": reference})
            rate = nvimgcodec_decode_only(batches)
            if rate is not None:
                rows.append({"set": kind, "path": "nvJPEG decode-only (nvImageCodec, batched)", "images_per_s": rate})
            if "engines" in args.paths:
                from gpu_decode_engines import engine_rows

                try:
                    rows += [{"set": kind, **row} for row in engine_rows(batches)]
                except Exception:  # diagnostics only: the other rows go on
                    traceback.print_exc()
            merged = [batches[i] + batches[i + 1] for i in range(0, len(batches) - 1, 2)]
            rate = torchvision_decode_only(merged, warmup=2)
            rows.append({"set": kind, "path": "nvJPEG decode-only (torchvision, 256 a call)", "images_per_s": rate})
        for name, options in variants:
            try:
                row = decode_path_alone(samples, args.workers, args.warmup, args.decode_batches, **options)
            except ImportError as error:
                print(f"{kind} {name}: not measured ({error})"[:200], flush=True)
                continue
            rows.append({"set": kind, "path": name, **row})
        if "dali" in args.paths:
            for name, fused in (("DALI decoders.image (mixed)", False), ("DALI decoders.image_random_crop", True)):
                try:
                    from gpu_decode_dali import dali_alone

                    row = dali_alone(
                        samples,
                        BATCH,
                        SIZE,
                        args.warmup,
                        args.decode_batches,
                        cuda,
                        threads=max(1, args.workers),
                        fused_crop=fused,
                    )
                except Exception:  # DALI absent or failing must not lose the other rows
                    traceback.print_exc()
                    continue
                rows.append({"set": kind, "path": name, **row})
        for row in rows:
            if row["set"] == kind and reference:
                row["share_of_decode_only"] = row["images_per_s"] / reference
        for row in rows:
            if row["set"] == kind:
                keys = ("decode_thread_ms", "prepare_ms", "call_ms", "barrier_ms", "gpu_ms")
                extra = "".join(f" {key} {row[key]:.2f}" for key in keys if key in row)
                share = row.get("share_of_decode_only")
                print(
                    f"{kind:8s} {row['path']:45s} {row['images_per_s']:8.0f} img/s"
                    + (f" {100 * share:5.1f}%" if share else "") + extra, flush=True,
                )  # fmt: skip
    return {"rows": rows}


class _OnGpu:
    """The ceiling's loader: the same batch, already on the GPU, ``length`` times."""

    def __init__(self, length: int, device: str) -> None:
        self.length = length
        images = torch.randn(BATCH, 3, SIZE, SIZE, device=device)
        self.images = images.to(torch.bfloat16, memory_format=torch.channels_last)
        self.labels = torch.randint(0, 1000, (BATCH,), device=device)

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        for _ in range(self.length):
            yield self.images, self.labels


def e2e_module(arch: str, compiled: bool, tiny: bool = False):
    """The LightningModule every e2e row of one model and mode shares (the ceiling's and the package's)."""
    import lightning.pytorch as pl

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            if tiny:
                net = torch.nn.Sequential(
                    torch.nn.Conv2d(3, 8, 3, stride=4), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                    torch.nn.Linear(8, 1000),
                )  # fmt: skip
            else:
                import torchvision

                net = getattr(torchvision.models, arch)(num_classes=1000)
            net = net.to(memory_format=torch.channels_last)
            self.net = torch.compile(net, mode="reduce-overhead") if compiled else net

        def training_step(self, batch, batch_idx):
            images, labels = batch
            return torch.nn.functional.cross_entropy(self.net(images), labels)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    return Net()


class _Clock:
    """CUDA events at the first timed step and after the last one (read after the fit), and the host clock."""

    def __init__(self, warmup: int, cuda: bool) -> None:
        import lightning.pytorch as pl

        clock = self

        class Callback(pl.Callback):
            def on_train_batch_start(self, trainer, module, batch, batch_idx):
                if batch_idx == warmup:
                    clock.begin = clock._mark()

            def on_train_end(self, trainer, module):
                clock.end = clock._mark()

        self.cuda, self.callback = cuda, Callback()
        self.begin = self.end = None

    def _mark(self):
        event = None
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        return event, time.perf_counter()

    def seconds(self) -> float:
        if self.cuda:
            self.end[0].synchronize()
            return self.begin[0].elapsed_time(self.end[0]) / 1e3
        return self.end[1] - self.begin[1]


def e2e_fit(module, loader, warmup: int, steps: int, cuda: bool) -> dict:
    import lightning.pytorch as pl

    clock = _Clock(warmup, cuda)
    trainer = pl.Trainer(
        accelerator="gpu" if cuda else "cpu", devices=1, precision="bf16-mixed", max_steps=warmup + steps,
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, callbacks=[clock.callback],
    )  # fmt: skip
    thread0 = time.thread_time()
    trainer.fit(module, train_dataloaders=loader)
    seconds = clock.seconds()
    row = {"images_per_s": steps * BATCH / seconds, "seconds": seconds}
    row["main_thread_cpu_ms_per_step"] = 1e3 * (time.thread_time() - thread0) / (warmup + steps)
    if isinstance(loader, GpuDecodeLoader):
        stats = loader.stats()
        per = 1e3 / max(1, stats.batches)
        row.update(
            decode_thread_ms=stats.submit_seconds * per, decode_thread_cpu_ms=stats.submit_cpu_seconds * per,
            prepare_ms=stats.prepare_seconds * per, call_ms=stats.call_seconds * per, wait_ms=1e3 * stats.wait_per_take,
            lookahead_mean=stats.lookahead_mean, gpu_ms=stats.decode_seconds * per,
        )  # fmt: skip
        loader.close()
    return row


def part_e2e(sets: dict, args) -> dict:
    cuda = torch.cuda.is_available() and not args.dry_run
    device = "cuda" if cuda else "cpu"
    rows = []
    for arch in args.models:
        for compiled in args.modes:
            module = e2e_module(arch, compiled == "compiled", tiny=args.dry_run)
            warmup = args.warmup + (args.compile_warmup if compiled == "compiled" else 0)
            total = warmup + args.steps
            began = time.perf_counter()
            try:
                ceiling = e2e_fit(module, _OnGpu(total, device), warmup, args.steps, cuda)
            except Exception:  # one mode failing must not lose the other rows
                traceback.print_exc()
                continue
            ceiling.update(model=arch, mode=compiled, set="-", path="ceiling", setup_s=time.perf_counter() - began)
            rows.append(ceiling)
            _print_e2e(ceiling, ceiling)
            for kind, samples in sets.items():
                for path, make in _e2e_loaders(samples, args, compiled, total, device, cuda):
                    loader = None
                    try:
                        loader = make()
                        row = e2e_fit(module, loader, warmup, args.steps, cuda)
                    except Exception:  # one path failing (DALI absent, say) must not lose the other rows
                        traceback.print_exc()
                        if hasattr(loader, "close"):
                            loader.close()
                        continue
                    del loader
                    row.update(model=arch, mode=compiled, set=kind, path=path)
                    row["share_of_ceiling"] = row["images_per_s"] / ceiling["images_per_s"]
                    rows.append(row)
                    _print_e2e(row, ceiling)
            del module
            if cuda:
                torch.cuda.empty_cache()
    return {"rows": rows}


def _e2e_loaders(samples, args, compiled: str, total: int, device: str, cuda: bool):
    """``(row name, loader factory)`` for each of ``--paths`` in this mode: the package's backends, DALI."""
    backends = [("torchvision", "package"), ("nvimgcodec", "package-nvimgcodec"), ("nvjpeg", "package-nvjpeg")]
    for backend, path in backends:
        if path not in args.paths:
            continue
        aheads = [a for a in args.prepare_ahead if a or compiled in args.serial_modes]
        for ahead, augment, priority in itertools.product(aheads, args.augment, args.priority):
            options = {"device": device, "dtype": torch.bfloat16, "prepare_ahead": ahead, **_augment(augment)}
            if cuda:
                options["backend"] = backend
            name = f"{path}, prepare_ahead={ahead}" + _suffix(augment, priority)
            yield name, lambda o=options, p=priority: package_loader(encoded_loader(samples, args.workers, total),
                                                                     priority=p, **o)  # fmt: skip
    if "dali" in args.paths:
        from gpu_decode_dali import DaliLoader, dali_pipeline

        gpu = "gpu" if cuda else "cpu"
        yield (
            "DALI",
            lambda: DaliLoader(dali_pipeline(samples, BATCH, SIZE, threads=max(1, args.workers), device=gpu), total),
        )


def _suffix(augment: str, priority: str) -> str:
    """A row name's tail: the augment, and the stream's priority where it is not the default."""
    return f", {augment} augment" + (", high priority" if priority == "high" else "")


def _augment(kind: str) -> dict:
    """Loader options of ``--augment`` ``kind``: ``graph`` (one CUDA graph) or ``compiled`` (torch.compile in it)."""
    return {"compile_augment": kind == "compiled"}


def _print_e2e(row: dict, ceiling: dict) -> None:
    share = row["images_per_s"] / ceiling["images_per_s"]
    keys = ("decode_thread_ms", "prepare_ms", "call_ms", "wait_ms", "lookahead_mean")
    extra = "".join(f" {key} {row[key]:.2f}" for key in keys if key in row)
    print(
        f"{row['model']:9s} {row['mode']:8s} {row['set']:8s} {row['path']:26s} {row['images_per_s']:8.0f} img/s "
        f"{100 * share:5.1f}%  main {row['main_thread_cpu_ms_per_step']:.1f} ms/step{extra}", flush=True,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["decode", "e2e", "all", "legacy"], default="e2e")
    parser.add_argument(
        "--paths", nargs="+", default=["package", "package-nvimgcodec", "dali"],
        help="rows besides the references: package (torchvision), package-nvimgcodec, dali, serial, unbarriered, "
        "engines (decode-only per engine, idle and beside a busy GPU: benchmarks/gpu_decode_engines.py)",
    )  # fmt: skip
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--sets", nargs="+", default=["uniform", "varied"])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--compile-warmup", type=int, default=10, help="more warm-up steps for compiled rows")
    parser.add_argument("--decode-batches", type=int, default=150)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--models", nargs="+", default=["resnet18", "resnet50"])
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled"])
    parser.add_argument("--prepare-ahead", type=int, nargs="+", default=[2])
    parser.add_argument(
        "--priority", nargs="+", choices=["high", "normal"], default=["normal"],
        help="the package's decode stream: the default priority (the package's) or the highest",
    )  # fmt: skip
    parser.add_argument(
        "--augment", nargs="+", choices=["graph", "compiled"], default=["compiled"],
        help="the package's augment: one CUDA graph, or compiled by torch.compile inside it (compile_augment=True)",
    )  # fmt: skip
    parser.add_argument("--serial-modes", nargs="+", default=[], help="modes with prepare_ahead=0 rows")
    parser.add_argument("--root", default=None)
    parser.add_argument("--name", default=None)
    parser.add_argument("--dry-run", action="store_true", help="CPU, 40 images, tiny model, 2+2 steps")
    args, rest = parser.parse_known_args()
    if args.part == "legacy":
        legacy_main(rest)
        return
    if rest:
        parser.error(f"unknown arguments: {rest}")
    if args.dry_run:
        global BATCH  # noqa: PLW0603 (the dry run shrinks the batch)
        BATCH = 8
        args.images, args.steps, args.warmup, args.compile_warmup, args.decode_batches = 40, 2, 2, 0, 3
        args.workers, args.modes = 0, ["eager"]
        args.models = args.models[:1]
    torch.backends.cudnn.benchmark = True
    root = args.root or tempfile.mkdtemp(prefix="gpu_decode_")
    sets = {}
    for kind in args.sets:
        begin = time.perf_counter()
        samples, mean_bytes = make_set(os.path.join(root, kind), kind, args.images)
        sets[kind] = samples
        print(f"{kind}: {len(samples)} JPEGs, mean {mean_bytes / 1e3:.1f} kB, {time.perf_counter() - begin:.1f} s")
    result = {}
    if args.part in ("decode", "all"):
        result["decode"] = part_decode(sets, args)["rows"]
    if args.part in ("e2e", "all"):
        result["e2e"] = part_e2e(sets, args)["rows"]
    from _common import write_json

    write_json(args.name or f"gpu_decode_{args.part}", {"args": vars(args), **result})


if __name__ == "__main__":
    main()
