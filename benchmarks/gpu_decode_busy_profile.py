"""What a batched nvJPEG decode launches on the GPU, idle and beside a busy GPU (issue 38): torch.profiler's view.

Decodes ``--batches`` batches of 128 with ``backend="nvjpeg"`` (the engines, called directly) on a stream of
default or highest priority, idle and beside :class:`gpu_decode_engines.BusyGpu`, and prints, per case, the
wall time per batch and every GPU activity the profiler saw (kernels, copies, memsets) with its count and
device time: which of them the busy GPU stretches.

    PYTHONPATH=$PWD python benchmarks/gpu_decode_busy_profile.py --images 512 --batches 10
    PYTHONPATH=$PWD python benchmarks/gpu_decode_busy_profile.py --formats 5 3 1 8   # which output formats need kernels
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import tempfile
import time
from collections.abc import Callable

import torch
from gpu_decode import make_set, read_batches
from gpu_decode_engines import BusyGpu, packed_batches
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
        if device_us and not _is_load(event.key):
            activities[event.key] = (event.count, device_us / 1e3)
    return {"ms_per_batch": 1e3 * seconds, "activities": activities}


def format_run(backend: NvJpegBackend, items: list, fmt: int) -> Callable[[], None]:
    """A decode of every item into per-image buffers in nvJPEG output format ``fmt`` (planar: three planes of
    pitch ``w``; interleaved: one of pitch ``3 w``), through the backend's handle: which formats need kernels."""
    from lightning_dataperf.decode._nvjpeg import _Image

    lib, state = backend._lib, backend._states[0]
    planes = [[torch.empty(3, h, w, dtype=torch.uint8, device=backend.device) for h, w in item[2]] for item in items]

    def run() -> None:
        for item, buffers in zip(items, planes, strict=True):
            data, spans, shapes, _, _ = item
            count = len(spans)
            state.wait()
            if state.batch != (count, fmt):
                lib.nvjpegDecodeBatchedInitialize(backend._handle, state.state, count, 1, fmt)
                state.batch = (count, fmt)
            pointers = (ctypes.c_void_p * count)(*[data.data_ptr() + a for a, _ in spans])
            lengths = (ctypes.c_size_t * count)(*[b - a for a, b in spans])
            images = (_Image * count)()
            for k, ((_, w), buffer) in enumerate(zip(shapes, buffers, strict=True)):
                for c in range(1 if fmt in (5, 6) else 3):
                    images[k].channel[c] = buffer[c].data_ptr()
                    images[k].pitch[c] = 3 * w if fmt in (5, 6) else w
            stream = torch.cuda.current_stream(backend.device).cuda_stream
            status = lib.nvjpegDecodeBatched(backend._handle, state.state, pointers, lengths, images,
                                             ctypes.c_void_p(stream))  # fmt: skip
            assert status == 0, f"nvjpegDecodeBatched: {status}"
            state.done = torch.cuda.Event()
            state.done.record()

    return run


def formats(backend: NvJpegBackend, items: list, codes: list[int]) -> None:
    """Per output format, idle and beside a busy GPU: ms per batch and the GPU activities."""
    names = {0: "UNCHANGED", 1: "YUV", 3: "RGB", 5: "RGBI", 8: "NV12"}
    for fmt in codes:
        run = format_run(backend, items, fmt)
        for busy in (False, True):
            try:
                run()
            except AssertionError as error:  # a format the engines refuse: the next one
                print(f"format {names.get(fmt, fmt)}: {error}", flush=True)
                break
            torch.cuda.synchronize()
            activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
            with profile(activities=activities) as prof, BusyGpu() if busy else contextlib.nullcontext():
                start = time.perf_counter()
                run()
                torch.cuda.synchronize()
                seconds = (time.perf_counter() - start) / len(items)
            kernels = [(e.key, e.count, (getattr(e, "device_time_total", 0) or 0) / 1e3) for e in prof.key_averages()]
            kernels = [k for k in kernels if k[2] and not _is_load(k[0])]
            listed = "; ".join(f"{key[:48]} x{count} {ms:.2f} ms" for key, count, ms in kernels)
            label = f"format {names.get(fmt, fmt)}, {'busy' if busy else 'idle'}"
            print(f"{label}: {1e3 * seconds:.2f} ms/batch | {listed}", flush=True)


def _is_load(key: str) -> bool:
    name = key.lower()
    return name.startswith("aten::") or any(k in name for k in ("gemm", "nvjet", "xmma", "cutlass", "distribution"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--formats", type=int, nargs="*", default=[], help="nvJPEG output formats to profile instead")
    args = parser.parse_args()
    samples, _ = make_set(os.path.join(tempfile.mkdtemp(prefix="busy_profile_"), "uniform"), "uniform", args.images)
    batches = read_batches(samples, args.batches)
    items = packed_batches(batches)
    device = torch.device("cuda", torch.cuda.current_device())
    backend = NvJpegBackend(device)
    if args.formats:
        formats(backend, items, args.formats)
        return
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
