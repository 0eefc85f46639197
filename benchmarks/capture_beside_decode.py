"""A CUDA-graph capture in the training thread beside GPU-decode work in another: which work invalidates it.

A compiled (``reduce-overhead``) step records CUDA graphs in the training thread while the GPU decode path works in
threads of its own. Each scenario runs in a subprocess of its own (a failed capture poisons the process): the main
thread captures ``--captures`` graphs of a long chain of kernels (``capture_error_mode`` as Inductor's CUDA-graph
trees use it, and ``global``) while one background thread repeats one kind of work (or, for the ``*_inside``
scenarios, while the capturing thread itself frees a CUDA object mid-capture). Prints a table (captures failed,
background errors, the first message) and writes JSON (``$OUT`` or ``benchmarks/results``). Needs a GPU; the
decode scenarios need torchvision.

    PYTHONPATH=$PWD python benchmarks/capture_beside_decode.py
    PYTHONPATH=$PWD python benchmarks/capture_beside_decode.py --scenarios idle tv_growing --captures 50
"""

from __future__ import annotations

import argparse
import ctypes
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SCENARIOS = [
    "idle",
    "alloc_growing",
    "empty_cache",
    "pinned_growing",
    "event_query",
    "event_sync",
    "h2d_copy",
    "tv_uniform",
    "tv_growing",
    "tv_growing_prewarmed",
    "device_sync",
    "concurrent_capture",
    "raw_malloc_free",
    "raw_host_alloc_free",
    "tv_growing_live",
    "loader_varied",
    "loader_varied_nograph",
    "graph_freed_inside",
    "augment_freed_inside",
    "event_freed_inside",
]
#: Scenarios whose work happens in the capturing thread, inside each capture (what a garbage collection there frees).
INSIDE = {"graph_freed_inside", "augment_freed_inside", "event_freed_inside"}


def _jpegs(sides: list[tuple[int, int]]) -> list[torch.Tensor]:
    import numpy as np
    from PIL import Image

    out = []
    rng = np.random.default_rng(0)
    for height, width in sides:
        low = rng.integers(0, 255, (max(2, height // 32), max(2, width // 32), 3), dtype=np.uint8)
        base = np.asarray(Image.fromarray(low).resize((width, height), Image.BICUBIC), dtype=np.float32)
        pixels = np.clip(base + rng.normal(0, 22, (height, width, 3)), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=95)
        out.append(torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8))
    return out


def _work(name: str) -> Callable[[], None]:
    """One repeat of the background work ``name`` (set up here, outside the captures)."""
    device = torch.device("cuda")
    side = torch.cuda.Stream()
    state: dict[str, Any] = {"i": 0}
    if name == "idle":
        return lambda: time.sleep(0.001)
    if name == "alloc_growing":

        def alloc() -> None:
            state["i"] += 1
            with torch.cuda.stream(side):
                # a new size a repeat: the caching allocator maps a new segment (cudaMalloc)
                torch.empty(((state["i"] % 400) + 1) * (1 << 20) + state["i"], dtype=torch.uint8, device=device)

        return alloc
    if name == "empty_cache":

        def free() -> None:
            with torch.cuda.stream(side):
                torch.empty(64 << 20, dtype=torch.uint8, device=device)
            torch.cuda.empty_cache()

        return free
    if name == "pinned_growing":

        def pin() -> None:
            state["i"] += 1
            torch.empty(((state["i"] % 200) + 1) * (1 << 16) + state["i"], dtype=torch.uint8, pin_memory=True)

        return pin
    if name in ("event_query", "event_sync"):

        def event() -> None:
            with torch.cuda.stream(side):
                torch.ones(1 << 16, device=device).mul_(2)
            done = torch.cuda.Event()
            done.record(side)
            if name == "event_query":
                while not done.query():
                    pass
            else:
                done.synchronize()

        return event
    if name == "h2d_copy":
        host = torch.empty(8 << 20, dtype=torch.uint8).pin_memory()

        def copy() -> None:
            with torch.cuda.stream(side):
                host.to(device, non_blocking=True)
            side.synchronize()

        return copy
    if name.startswith("tv_"):
        from torchvision.io import decode_jpeg

        if name == "tv_uniform":
            batches = [_jpegs([(320, 320)] * 32)]
        else:
            # each batch larger than the last, so nvJPEG and the allocator grow again and again
            batches = [_jpegs([(200 + 40 * k + j, 200 + 40 * k + 2 * j) for j in range(32)]) for k in range(20)]
        if name.endswith("prewarmed"):
            with torch.cuda.stream(side):
                decode_jpeg(batches[-1], device=device)

        def decode() -> None:
            state["i"] += 1
            with torch.cuda.stream(side):
                decode_jpeg(batches[state["i"] % len(batches)], device=device)

        return decode
    if name.startswith("raw_"):
        cudart = _cudart()
        pointer = ctypes.c_void_p()
        device_memory = name == "raw_malloc_free"

        def raw() -> None:
            # as a library with its own buffers grows them: a free and a larger allocation
            if device_memory:
                codes = cudart.cudaMalloc(ctypes.byref(pointer), 64 << 20), cudart.cudaFree(pointer)
            else:
                codes = cudart.cudaHostAlloc(ctypes.byref(pointer), 8 << 20, 0), cudart.cudaFreeHost(pointer)
            if any(codes):
                raise RuntimeError(f"cudart returned {codes}")

        return raw
    if name == "tv_growing_live":
        from torchvision.io import decode_jpeg

        # never a size seen before while the captures run: nvJPEG and the allocators grow at every batch
        batches = [_jpegs([(200 + 24 * k, 220 + 24 * k)] * 4) for k in range(90)]

        def grow() -> None:
            state["i"] = min(state["i"] + 1, len(batches) - 1)
            with torch.cuda.stream(side):
                decode_jpeg(batches[state["i"]], device=device)

        return grow
    if name in INSIDE:
        return lambda: time.sleep(0.001)
    if name == "device_sync":
        return torch.cuda.synchronize
    if name == "concurrent_capture":
        flat = torch.zeros(1 << 20, device=device)

        def capture() -> None:
            # as GraphedAugment captures the augment in the decode thread: thread_local, on a stream of its own
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(side):
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    (flat * 2 + 1).sum()
                finally:
                    graph.capture_end()
            graph.replay()

        return capture
    if name.startswith("loader_varied"):
        import gpu_decode as gd

        root = tempfile.mkdtemp(prefix="capture_varied_")
        samples, _ = gd.make_set(root, "varied", 512)
        graphs = name == "loader_varied"
        loader = gd.gpu_loader(samples, 4, 10_000, graph_augment=graphs)
        iterator = iter(loader)
        next(iterator)  # started here, before the captures: its first batch and graphs in this thread

        def batch() -> None:
            assert loader is not None  # held here: a loader collected closes its iterators
            images, _ = next(iterator)
            images.float().sum().item()

        return batch
    raise ValueError(f"unknown scenario {name!r}; choose from {SCENARIOS}")


def one(name: str, mode: str, captures: int, kernels: int) -> dict:
    """Run one scenario here: ``captures`` graph captures beside the background work."""
    stop = threading.Event()
    work = _work(name)
    errors: list[str] = []
    repeats = [0]

    go = threading.Event()

    def background() -> None:
        go.wait()
        while not stop.is_set():
            try:
                work()
                repeats[0] += 1
            except Exception as error:
                where = traceback.extract_tb(error.__traceback__)[-1]
                errors.append(f"{type(error).__name__}: {error} ({where.name}:{where.lineno})".splitlines()[0][:240])
                time.sleep(0.01)

    x = torch.randn(1 << 16, device="cuda")
    stream = torch.cuda.Stream()
    failed, first, seconds = 0, "", 0.0
    doomed = _doomed(name, captures)
    thread = threading.Thread(target=background, daemon=True)
    thread.start()
    go.set()
    time.sleep(0.05)
    for _ in range(captures):
        graph = torch.cuda.CUDAGraph()
        started = time.perf_counter()
        try:
            with torch.cuda.graph(graph, stream=stream, capture_error_mode=mode):
                y = x
                for index in range(kernels):
                    y = y * 1.0001 + 0.5
                    if doomed and index == kernels // 2:
                        doomed.pop()  # its last reference: destroyed here, mid-capture
            graph.replay()
        except Exception as error:
            failed += 1
            first = first or f"{type(error).__name__}: {error}".splitlines()[0][:200]
        seconds += time.perf_counter() - started
    stop.set()
    thread.join(timeout=30)
    return {
        "scenario": name,
        "mode": mode,
        "captures": captures,
        "failed": failed,
        "first_failure": first,
        "capture_ms": 1e3 * seconds / captures,
        "background_repeats": repeats[0],
        "background_errors": len(errors),
        "first_background_error": errors[0] if errors else "",
    }


def _doomed(name: str, captures: int) -> list[Any]:
    """CUDA objects made before the captures, one freed inside each (``INSIDE`` scenarios), else none."""
    if name not in INSIDE:
        return []
    made: list[Any] = []
    x = torch.ones(1 << 10, device="cuda")
    for _ in range(captures):
        if name == "graph_freed_inside":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                x.mul(2)
            made.append(graph)
        elif name == "augment_freed_inside":
            from lightning_dataperf.decode._graph import GraphedAugment

            # the GPU decode path's graph, as a collected decoder leaves it
            graphed = GraphedAugment(batch=4, capacity=1 << 10, columns=3, device=torch.device("cuda"))
            graphed.run(torch.zeros(4, 3, dtype=torch.int64), lambda flat, table: (flat * 2, table + 1))
            made.append(graphed)
        else:
            event = torch.cuda.Event()
            event.record()
            made.append(event)
    torch.cuda.synchronize()
    return made


def _cudart() -> Any:
    """The CUDA runtime torch loaded, through ``ctypes`` (its calls as any library makes them, no caching)."""
    import ctypes.util
    import glob

    major = (torch.version.cuda or "13").split(".")[0]
    found = [path for root in sys.path for path in glob.glob(os.path.join(root, f"nvidia/**/libcudart.so.{major}*"))]
    for path in [*found, f"libcudart.so.{major}", ctypes.util.find_library("cudart") or "libcudart.so"]:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    raise RuntimeError("libcudart not found")


def inductor_mode() -> str:
    """The ``capture_error_mode`` Inductor's CUDA-graph trees pass (read from its source)."""
    import inspect

    from torch._inductor import cudagraph_trees

    lines = [line.strip() for line in inspect.getsource(cudagraph_trees).splitlines() if "capture_error_mode" in line]
    return " | ".join(lines) or "not passed (torch's default: global)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", default=SCENARIOS, choices=SCENARIOS)
    parser.add_argument("--modes", nargs="+", default=["thread_local", "global"], choices=["thread_local", "global"])
    parser.add_argument("--captures", type=int, default=60)
    parser.add_argument("--kernels", type=int, default=1500, help="kernels in each captured graph")
    parser.add_argument("--one", nargs=2, metavar=("SCENARIO", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--name", default="capture_beside_decode")
    args = parser.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(one(args.one[0], args.one[1], args.captures, args.kernels)), flush=True)
        return
    rows: list[dict] = []
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; Inductor: {inductor_mode()}")
    print(f"{'scenario':<22} {'mode':<13} {'failed':>9} {'bg errors':>10} {'bg reps':>8}  first message")
    for name in args.scenarios:
        for mode in args.modes:
            command = [sys.executable, os.path.abspath(__file__), "--one", name, mode]
            command += ["--captures", str(args.captures), "--kernels", str(args.kernels)]
            done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300)
            found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if found:
                row = json.loads(found[-1][len("RESULT ") :])
            else:
                tail = (done.stderr or done.stdout).strip().splitlines()[-6:] or ["no output"]
                crashed = " | ".join(tail)[-600:]
                row = {"scenario": name, "mode": mode, "crashed": crashed, "returncode": done.returncode}
            rows.append(row)
            if "crashed" in row:
                print(f"{name:<22} {mode:<13} crashed (rc {row['returncode']}): {row['crashed']}")
            else:
                message = row["first_failure"] or row["first_background_error"]
                print(
                    f"{name:<22} {mode:<13} {row['failed']:>4}/{row['captures']:<4} {row['background_errors']:>10}"
                    f" {row['background_repeats']:>8}  {message}"
                )
    folder = os.environ.get("OUT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{args.name}.json"), "w") as file:
        json.dump({"torch": torch.__version__, "inductor_mode": inductor_mode(), "rows": rows}, file, indent=1)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        raise
