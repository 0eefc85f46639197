"""Where the GPU time of the GPU-decode path goes, kernel by kernel and stream by stream (issue 17).

Three profiles (torch.profiler, CUDA activity), each over ``--steps`` steps after a warm-up:

1. ``decode``: ``JpegDecoder`` alone on pre-collated batches of 128 (decode + augment), per batch:
   GPU time by kernel name, by stream, and the busy time (union of intervals) of the GPU;
2. ``ceiling``: a ResNet bf16 channels-last training step on a batch already on the GPU: the GPU
   time of the step's kernels per step;
3. ``pipeline``: the same step fed by ``GpuDecodeLoader`` (``--workers`` workers): per step, the
   kernel time on the training stream against the ceiling's (are the training kernels slowed by
   the decode's?), the decode streams' kernel time, and the GPU's busy time.

    PYTHONPATH=$PWD python benchmarks/gpu_decode_kernels.py --images 1000 --steps 20

Prints tables, writes ``gpu_decode_kernels.json`` to ``$OUT`` (or ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import write_json
from gpu_decode import BATCH, ceiling_batches, gpu_loader, make_model, make_set

from lightning_dataperf.decode.decoder import JpegDecoder
from lightning_dataperf.decode.encoded import EncodedImageDataset, collate_encoded


def gpu_events(prof) -> list[tuple[str, int, int, int]]:
    """``(name, start ns, end ns, stream)`` of every GPU activity (kernels, copies, memsets)."""
    out = []
    for event in prof.profiler.kineto_results.events():
        if str(event.device_type()).endswith("CUDA"):
            start = event.start_ns()
            out.append((event.name(), start, start + event.duration_ns(), event.device_resource_id()))
    return out


def busy_ns(events) -> int:
    """Union of the intervals: how long the GPU had at least one activity."""
    total, end = 0, None
    for _, start, stop, _ in sorted(events, key=lambda e: e[1]):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def summarize(events, per: int, top: int = 12) -> dict:
    by_name, by_stream = collections.Counter(), collections.Counter()
    for name, start, stop, stream in events:
        by_name[name[:90]] += stop - start
        by_stream[stream] += stop - start
    return {
        "busy_ms": busy_ns(events) / per / 1e6,
        "by_stream_ms": {str(k): v / per / 1e6 for k, v in by_stream.most_common()},
        "by_name_ms": {k: v / per / 1e6 for k, v in by_name.most_common(top)},
        "kernels_per": len(events) / per,
    }


def print_summary(title: str, summary: dict, extra: str = "") -> None:
    print(f"\n== {title}: GPU busy {summary['busy_ms']:.2f} ms, {summary['kernels_per']:.0f} activities {extra}")
    print("   by stream: " + ", ".join(f"{k}: {v:.2f} ms" for k, v in summary["by_stream_ms"].items()))
    for name, value in summary["by_name_ms"].items():
        print(f"   {value:8.3f} ms  {name}")


def profile_steps(fn, steps: int) -> tuple[list, float]:
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    return gpu_events(prof), wall / steps


def _event_ms(fn, repeats: int = 20) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def augment_variants(batch, backend: str) -> dict:
    """GPU time of the augment alone on one decoded batch: eager, and ``torch.compile``d (fused gathers)."""
    decoder = JpegDecoder("cuda", dtype=torch.bfloat16, backend=backend, graph_augment=False)
    rows = batch.meta.tolist()
    flat, bases, sizes, *_ = decoder._decode(batch, rows)
    table = [(base, h, w, *row[5:9], row[9], row[0]) for row, base, (h, w) in zip(rows, bases, sizes, strict=True)]
    table = torch.tensor(table, dtype=torch.int64, device="cuda")
    eager_out = decoder._augment(flat, table)[0]
    out = {"eager_ms": _event_ms(lambda: decoder._augment(flat, table))}
    try:
        started = time.perf_counter()
        compiled = torch.compile(decoder._augment, dynamic=False, fullgraph=True)
        fused = compiled(flat, table)[0]
        out["compile_s"] = time.perf_counter() - started
        out["compiled_ms"] = _event_ms(lambda: compiled(flat, table))
        out["compiled_max_abs_diff"] = (fused.float() - eager_out.float()).abs().max().item()
    except Exception as error:  # no Triton, or a graph break
        out["compile_error"] = f"{type(error).__name__}: {error}"[:400]
    print(f"\n== augment alone, GPU ms per batch: {out}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--backend", default="torchvision")
    parser.add_argument("--kind", default="uniform", choices=("uniform", "varied"))
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    root = tempfile.mkdtemp(prefix="gpu_decode_kernels_")
    samples, mean_bytes = make_set(os.path.join(root, args.kind), args.kind, args.images)
    print(f"{args.images} {args.kind} JPEGs, mean {mean_bytes / 1e3:.1f} kB", flush=True)
    results: dict = {"args": vars(args)}

    dataset = EncodedImageDataset(samples, seed=0)
    batches = [collate_encoded([dataset[i * BATCH + j] for j in range(BATCH)]) for i in range(6)]
    decoder = JpegDecoder("cuda", dtype=torch.bfloat16, backend=args.backend)
    stream = torch.cuda.Stream()
    count = [0]

    def decode_one() -> None:
        with torch.cuda.stream(stream):
            decoder(batches[count[0] % len(batches)])
        count[0] += 1

    for _ in range(4):
        decode_one()
    events, wall = profile_steps(decode_one, args.steps)
    results["decode"] = summarize(events, args.steps)
    results["decode"]["wall_ms"] = wall * 1e3
    print_summary(f"decode + augment alone ({args.backend}), per batch", results["decode"], f"wall {wall * 1e3:.2f} ms")

    results["augment"] = augment_variants(batches[0], args.backend)

    step = make_model(args.model)
    ceiling = ceiling_batches()
    for _ in range(10):
        step(*next(ceiling))
    events, wall = profile_steps(lambda: step(*next(ceiling)), args.steps)
    results["ceiling"] = summarize(events, args.steps)
    results["ceiling"]["wall_ms"] = wall * 1e3
    print_summary(f"{args.model} ceiling, per step", results["ceiling"], f"wall {wall * 1e3:.2f} ms")

    loader = gpu_loader(samples, args.workers, 10 + args.steps + 2, backend=args.backend)
    iterator = iter(loader)
    for _ in range(10):
        step(*next(iterator))
    events, wall = profile_steps(lambda: step(*next(iterator)), args.steps)
    summary = summarize(events, args.steps)
    summary["wall_ms"] = wall * 1e3
    results["pipeline"] = summary
    title = f"{args.model} fed by GpuDecodeLoader (w={args.workers}), per step"
    print_summary(title, summary, f"wall {wall * 1e3:.2f} ms")
    loader.close()

    write_json("gpu_decode_kernels", results)


if __name__ == "__main__":
    main()
