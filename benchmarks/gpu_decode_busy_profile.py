"""What a batched nvJPEG decode launches on the GPU, idle and beside a busy GPU (issue 38): torch.profiler's view.

Decodes ``--batches`` batches of 128 with ``backend="nvjpeg"`` (the engines, called directly) on a stream of
default or highest priority, idle and beside :class:`gpu_decode_engines.BusyGpu`, and prints, per case, the
wall time per batch and every GPU activity the profiler saw (kernels, copies, memsets) with its count and
device time: which of them the busy GPU stretches.

    PYTHONPATH=$PWD python benchmarks/gpu_decode_busy_profile.py --images 512 --batches 10
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile
import time

import torch
from gpu_decode import make_set, read_batches
from gpu_decode_engines import BusyGpu, _packed
from PIL import Image
from torch.profiler import ProfilerActivity, profile

from lightning_dataperf.decode._nvjpeg import NvJpegBackend


def case(backend: NvJpegBackend, items: list, flat: torch.Tensor, stream: torch.cuda.Stream, busy: bool) -> dict:
    def run() -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.cuda.stream(stream):
            for data, spans, shapes, bases, _ in items:
                ok, _ = backend.decode(data, spans, shapes, flat, bases)
                assert all(ok)
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / len(items)

    run()  # warm-up
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        if busy:
            with BusyGpu():
                seconds = run()
        else:
            seconds = run()
    activities = {}
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", 0) or getattr(event, "cuda_time_total", 0)
        name = event.key.lower()
        load = name.startswith("aten::") or any(k in name for k in ("gemm", "nvjet", "xmma", "cutlass"))
        if device_us and not load:
            activities[event.key] = (event.count, device_us / 1e3)
    return {"ms_per_batch": 1e3 * seconds, "activities": activities}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batches", type=int, default=10)
    args = parser.parse_args()
    samples, _ = make_set(os.path.join(tempfile.mkdtemp(prefix="busy_profile_"), "uniform"), "uniform", args.images)
    batches = read_batches(samples, args.batches)
    sizes = {}
    for batch in batches:
        for part in batch:
            if part not in sizes:
                width, height = Image.open(io.BytesIO(part)).size
                sizes[part] = (height, width)
    items = [_packed(batch, sizes) for batch in batches]
    device = torch.device("cuda", torch.cuda.current_device())
    backend = NvJpegBackend(device)
    flat = torch.empty(max(item[4] for item in items) + 3, dtype=torch.uint8, device=device)
    for priority in (0, -100):
        stream = torch.cuda.Stream(device, priority=priority)
        for busy in (False, True):
            result = case(backend, items, flat, stream, busy)
            label = f"priority {'highest' if priority else 'default'}, {'busy GPU' if busy else 'idle'}"
            print(f"{label}: {result['ms_per_batch']:.2f} ms per batch of 128", flush=True)
            for key, (count, ms) in sorted(result["activities"].items(), key=lambda kv: -kv[1][1])[:8]:
                print(f"    {key[:70]:70s} x{count:<5d} {ms:8.2f} ms device", flush=True)


if __name__ == "__main__":
    main()
