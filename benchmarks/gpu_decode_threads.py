"""Does batched nvJPEG decode scale with concurrent decode threads, alone and next to a training step? (issue 17)

Pre-collated batches of 128 JPEGs (uniform 320 px set), decoded by ``T`` threads at once, each with
its own CUDA stream (nvImageCodec: its own ``Decoder`` on the hardware engines; torchvision: its one
global decoder). Per row: decode images/s, the calling threads' CPU per batch, the call's wall time
per batch, and -- with ``--model`` -- the same while the main thread trains ResNet bf16 channels-last
on a batch already on the GPU (its steps/s against alone). Input forms for nvImageCodec: ``codestream``
(a ``CodeStream`` per image, as the package does) and ``numpy`` (views straight into ``decode``).

    PYTHONPATH=$PWD python benchmarks/gpu_decode_threads.py --threads 1 2 4 --seconds 3

Prints a table, writes ``gpu_decode_threads.json`` to ``$OUT`` (or ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import write_json
from gpu_decode import BATCH, ceiling_batches, make_model, make_set

from lightning_dataperf.decode._nvimgcodec import _decode_params, import_nvimgcodec
from lightning_dataperf.decode.encoded import EncodedImageDataset, collate_encoded


def batches_of(samples, count: int):
    dataset = EncodedImageDataset(samples, seed=0)
    out = []
    for b in range(count):
        batch = collate_encoded([dataset[(b * BATCH + j) % len(dataset)] for j in range(BATCH)])
        offsets = batch.offsets.tolist()
        array = batch.data.numpy()
        out.append((batch.data, [(offsets[i], offsets[i + 1]) for i in range(BATCH)], array))
    return out


def make_decode(backend: str, form: str):
    """A per-thread ``decode(batch)`` that submits one batch on the thread's current stream."""
    if backend == "torchvision":
        from torchvision.io import decode_jpeg

        def decode(item):
            data, spans, _ = item
            return decode_jpeg([data[a:b] for a, b in spans], device="cuda")

        return decode
    nvi = import_nvimgcodec()
    decoder = nvi.Decoder(
        device_id=0, max_num_cpu_threads=1, backends=[nvi.Backend(nvi.BackendKind.HW_GPU_ONLY)]
    )  # fmt: skip
    params = _decode_params(nvi, getattr(nvi.ColorSpec, "SRGB", None) or nvi.ColorSpec.RGB)

    def decode(item):
        _, spans, array = item
        stream = torch.cuda.current_stream().cuda_stream
        views = [array[a:b] for a, b in spans]
        sources = views if form == "numpy" else [nvi.CodeStream(view) for view in views]
        return decoder.decode(sources, params=params, cuda_stream=stream)

    return decode


def run_threads(backend: str, form: str, threads: int, batches, seconds: float, busy=None) -> dict:
    """``threads`` decode threads for ``seconds``; ``busy()`` in the main thread meanwhile, if given."""
    stop, lock = threading.Event(), threading.Lock()
    totals = {"batches": 0, "cpu": 0.0, "call": 0.0, "errors": 0}
    decoders = [make_decode(backend, form) for _ in range(threads)]
    for decode in decoders:  # warm-up outside the window
        decode(batches[0])
    torch.cuda.synchronize()

    def body(k: int) -> None:
        stream = torch.cuda.Stream()
        done = cpu = call = 0
        with torch.cuda.stream(stream):
            while not stop.is_set():
                c0, t0 = time.thread_time(), time.perf_counter()
                try:
                    images = decoders[k](batches[(done + k) % len(batches)])
                except Exception:
                    with lock:
                        totals["errors"] += 1
                    images = None
                call += time.perf_counter() - t0
                stream.synchronize()
                cpu += time.thread_time() - c0
                done += 1
                del images
        with lock:
            totals["batches"] += done
            totals["cpu"] += cpu
            totals["call"] += call

    workers = [threading.Thread(target=body, args=(k,)) for k in range(threads)]
    steps, start = 0, time.perf_counter()
    for worker in workers:
        worker.start()
    while time.perf_counter() - start < seconds:
        if busy is None:
            time.sleep(0.01)
        else:
            busy()
            steps += 1
    stop.set()
    for worker in workers:
        worker.join()
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    n = max(1, totals["batches"])
    return {
        "backend": backend, "form": form, "threads": threads, "images_per_s": totals["batches"] * BATCH / wall,
        "cpu_ms_per_batch": 1e3 * totals["cpu"] / n, "call_ms_per_batch": 1e3 * totals["call"] / n,
        "errors": totals["errors"], "steps_per_s": steps / wall if busy is not None else None,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--model", default="resnet18", help="'' for decode alone only")
    variants = ["torchvision:list", "nvimgcodec:codestream", "nvimgcodec:numpy"]
    parser.add_argument("--variants", nargs="+", default=variants)
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    samples, mean = make_set(os.path.join(tempfile.mkdtemp(), "uniform"), "uniform", args.images)
    batches = batches_of(samples, 8)
    print(f"{args.images} JPEGs, mean {mean / 1e3:.1f} kB", flush=True)
    rows = []
    step = ceiling = None
    if args.model:
        step, ceiling = make_model(args.model), ceiling_batches()
        for _ in range(10):
            step(*next(ceiling))
        torch.cuda.synchronize()
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            step(*next(ceiling))
            count += 1
        torch.cuda.synchronize()
        alone = count / (time.perf_counter() - start)
        rows.append({"model": args.model, "steps_per_s_alone": alone})
        print(f"{args.model} alone: {alone:.1f} steps/s ({alone * BATCH:.0f} img/s)", flush=True)
    for variant in args.variants:
        backend, _, form = variant.partition(":")
        for threads in args.threads:
            for busy in [None] + ([lambda: step(*next(ceiling))] if step else []):
                try:
                    row = run_threads(backend, form, threads, batches, args.seconds, busy)
                except Exception as error:
                    row = {"backend": backend, "form": form, "threads": threads, "error": repr(error)[:300]}
                rows.append(row)
                if "error" in row:
                    print(f"{variant:24s} T={threads} ERROR {row['error']}", flush=True)
                    continue
                with_model = f"  with {args.model}: {row['steps_per_s']:.1f} steps/s" if busy else "  alone"
                print(
                    f"{variant:24s} T={threads} {row['images_per_s']:8.0f} img/s  cpu {row['cpu_ms_per_batch']:6.2f} ms"
                    f"  call {row['call_ms_per_batch']:6.2f} ms/batch  errors {row['errors']}{with_model}",
                    flush=True,
                )
    write_json("gpu_decode_threads", {"rows": rows})


if __name__ == "__main__":
    main()
