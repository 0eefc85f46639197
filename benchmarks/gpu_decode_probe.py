"""Where the GPU-decode path's host time goes, and who holds the GIL (issue 17): one process, side by side.

Per variant (decode, or decode + augment, of pre-collated batches of 128, no workers), run in a
background thread as the loader does:

- ``img/s``: images per second of the variant alone (``torch.cuda.synchronize`` only at the end);
- ``thread ms``: CPU time of the calling thread per batch (``time.thread_time``; GIL-holding Python
  and C++ alike); ``proc ms``: CPU time of the whole process per batch (the library's own threads too);
- ``gpu ms``: CUDA-event time per batch on the calling stream;
- ``spin %``: how fast a pure-Python spinning thread (the stand-in for a 100%-busy training step's
  main thread) counts while the variant runs, as a share of its rate alone, measured right before
  and right after the variant (their mean; the earlier single baseline at start-up read 110-195%):
  100% means the variant takes no GIL time from it; ``img/s spin``: the variant's own rate meanwhile.

Then end to end (``e2e`` lines): ResNet-18/50 bf16 channels-last, batch 128, on a batch already on the
GPU (the ceiling) vs ``GpuDecodeLoader`` for each ``--paths`` entry (``backend:compiled|graph|eager``) and
each ``--workers`` count. Prints a table, writes ``gpu_decode_probe.json`` to ``$OUT`` (or
``benchmarks/results``). ``--skip-micro`` runs only the end-to-end rows; ``--dry-run`` builds every
end-to-end loader on the CPU (PIL fallback) and takes 2 batches from each: argument errors show up
on a machine without a GPU.

    PYTHONPATH=$PWD python benchmarks/gpu_decode_probe.py --images 2000
    PYTHONPATH=$PWD python benchmarks/gpu_decode_probe.py --dry-run --images 300 --workers 2 4
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import threading
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_decode import BATCH, SIZE, gpu_loader, make_model, make_set, measure

from lightning_dataperf.decode._graph import GraphedAugment
from lightning_dataperf.decode._nvimgcodec import import_nvimgcodec
from lightning_dataperf.decode.decoder import JpegDecoder
from lightning_dataperf.decode.encoded import EncodedImageDataset, collate_encoded

DEFAULT_INTERVAL_MS = 5.0  # Python's sys.getswitchinterval() default


class Spinner:
    """A pure-Python thread that counts as fast as the GIL lets it."""

    def __init__(self) -> None:
        self.count, self._stop = 0, threading.Event()

    def _run(self) -> None:
        count, stop = 0, self._stop
        while not stop.is_set():
            for _ in range(200):
                count += 1
            self.count = count

    def rate_during(self, work) -> tuple[float, object]:
        self.count, self._stop = 0, threading.Event()
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        time.sleep(0.05)
        start_count, start = self.count, time.perf_counter()
        result = work()
        rate = (self.count - start_count) / (time.perf_counter() - start)
        self._stop.set()
        thread.join()
        return rate, result


def run_variant(fn, batches, iters: int, time_cap: float = 4.0, warmup: int = 2) -> dict:
    """``fn(batch)`` on ``iters`` batches in a background thread with its own stream."""
    out: dict = {}

    def body() -> None:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for batch in batches[:warmup]:
                fn(batch)
            torch.cuda.synchronize()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            wall, thread0, proc0 = time.perf_counter(), time.thread_time(), time.process_time()
            begin.record(stream)
            done = 0
            while done < iters and (done < 3 or time.perf_counter() - wall < time_cap):
                fn(batches[done % len(batches)])
                done += 1
            end.record(stream)
            host_thread, host_proc = time.thread_time() - thread0, time.process_time() - proc0
            torch.cuda.synchronize()
            wall = time.perf_counter() - wall
            out.update(
                batches=done, images_per_s=done * BATCH / wall, thread_ms=1e3 * host_thread / done,
                proc_ms=1e3 * host_proc / done, gpu_ms=begin.elapsed_time(end) / done, wall_ms=1e3 * wall / done,
            )  # fmt: skip

    def threaded() -> None:
        worker = threading.Thread(target=body)
        worker.start()
        worker.join()

    threaded()
    return out


def _region(nvi, top: int, left: int, h: int, w: int):
    try:
        return nvi.Region(top, left, top + h, left + w)
    except TypeError:  # another constructor spelling
        return nvi.Region(start=(top, left), end=(top + h, left + w))


def variants(batches, nvi, holders: dict) -> dict:
    """name -> fn(batch); the package's decoders go into ``holders[name]["d"]`` once made."""
    from torchvision.io import decode_jpeg

    table: dict = {}
    split = [b.split() for b in batches]  # 128 views each, made once
    index = {id(b): i for i, b in enumerate(batches)}
    table["py_split_128_views"] = lambda b: b.split()
    table["tv_decode"] = lambda b: decode_jpeg(split[index[id(b)]], device="cuda")
    if nvi is not None:
        for threads in (1, 4, 8):
            kinds = [nvi.Backend(nvi.BackendKind.HW_GPU_ONLY), nvi.Backend(nvi.BackendKind.GPU_ONLY)]
            decoder = nvi.Decoder(max_num_cpu_threads=threads, backends=kinds)

            def nvi_decode(b, decoder=decoder):
                streams = [nvi.CodeStream(p.numpy()) for p in split[index[id(b)]]]
                return decoder.decode(streams, cuda_stream=torch.cuda.current_stream().cuda_stream)

            table[f"nvi_decode_t{threads}"] = nvi_decode
        decoder = nvi.Decoder(max_num_cpu_threads=4, backends=kinds)
        table["nvi_codestreams_only"] = lambda b: [nvi.CodeStream(p.numpy()) for p in split[index[id(b)]]]

        def nvi_roi(b, decoder=decoder):
            meta = b.meta.tolist()
            streams = []
            for p, row in zip(split[index[id(b)]], meta, strict=True):
                top, left, h, w = row[5:9]
                region = _region(nvi, top, left, h, w)
                streams.append(nvi.CodeStream(p.numpy()).get_sub_code_stream(region=region))
            images = decoder.decode(streams, cuda_stream=torch.cuda.current_stream().cuda_stream)
            missing = sum(image is None for image in images)
            if missing:  # run 1: all 128 came back None (the HW decoder refuses ROI with fancy upsampling)
                raise RuntimeError(f"{missing} of {len(images)} ROI decodes returned None")
            return images

        table["nvi_decode_roi_t4"] = nvi_roi
        try:  # the option nvImageCodec's warning names (edge pixels may differ with nvJPEG < 13.2)
            option = "nvjpeg_hw_decoder:enable_roi_fancy_upsampling=1"
            roi_decoder = nvi.Decoder(max_num_cpu_threads=4, backends=kinds, options=option)
            table["nvi_decode_roi_t4_fancy_ok"] = lambda b, d=roi_decoder: nvi_roi(b, d)
        except Exception as error:
            print(f"no ROI decoder with {option!r}: {error}", flush=True)
    for backend in ("torchvision", "nvimgcodec"):
        if backend == "nvimgcodec" and nvi is None:
            continue
        for graph in (False, True):
            holder: dict = {}

            def full(b, backend=backend, graph=graph, holder=holder):
                if "d" not in holder:  # made in the thread that uses it
                    holder["d"] = JpegDecoder(
                        "cuda", size=SIZE, dtype=torch.bfloat16, backend=backend, graph_augment=graph
                    )
                return holder["d"](b)

            name = f"pkg_{backend}_{'graph' if graph else 'eager'}"
            table[name] = full
            holders[name] = holder
    return table


def augment_variants(batches, backend: str) -> dict:
    """Augment alone on already-decoded flat buffers: eager (~90 PyTorch calls) and as one CUDA graph."""
    decoder = JpegDecoder("cuda", size=SIZE, dtype=torch.bfloat16, backend=backend, graph_augment=False)
    prepared = []
    for b in batches:
        rows = b.meta.tolist()
        flat, bases, sizes, *_ = decoder._decode(b, rows)
        table = [(base, h, w, *row[5:9], row[9], row[0]) for row, base, (h, w) in zip(rows, bases, sizes, strict=True)]
        prepared.append((flat, torch.tensor(table, dtype=torch.int64).pin_memory()))
    torch.cuda.synchronize()
    index = {id(b): i for i, b in enumerate(batches)}
    capacity = max(flat.numel() for flat, _ in prepared) + 3
    graphed = GraphedAugment(BATCH, capacity, 9, decoder.device)

    def eager(b):
        flat, table = prepared[index[id(b)]]
        return decoder._augment(flat, table.to("cuda", non_blocking=True))

    def graph(b):
        flat, table = prepared[index[id(b)]]
        graphed.flat[: flat.numel()].copy_(flat)  # the package decodes into graphed.flat directly (no copy)
        return graphed.run(table, decoder._augment)

    return {f"augment_eager_{decoder.layout}": eager, f"augment_cuda_graph_{decoder.layout}": graph}


def probe_set(name: str, samples, args, spinner: Spinner, nvi) -> list[dict]:
    dataset = EncodedImageDataset(samples, seed=0)
    count = min(len(samples) // BATCH, args.batches)
    batches = [collate_encoded([dataset[i] for i in range(k * BATCH, (k + 1) * BATCH)]) for k in range(count)]
    rows = []
    holders: dict = {}
    table = variants(batches, nvi, holders)
    for backend in ("torchvision", "nvimgcodec") if nvi is not None else ("torchvision",):
        try:
            table.update(augment_variants(batches, backend))
        except Exception as error:
            rows.append({"set": name, "variant": f"augment_{backend}", "error": repr(error)[:300]})
    for variant, fn in table.items():
        row = {"set": name, "variant": variant}
        try:
            row.update(run_variant(fn, batches, args.iters))
            before, _ = spinner.rate_during(lambda: time.sleep(0.5))
            rate, spun = spinner.rate_during(lambda fn=fn: run_variant(fn, batches, args.iters, 2.0, 0))
            after, _ = spinner.rate_during(lambda: time.sleep(0.5))
            row["spin_share"] = rate / ((before + after) / 2)
            row["spinner_alone_before_after"] = [before, after]
            row["images_per_s_with_spinner"] = spun["images_per_s"]
        except Exception as error:
            row["error"] = f"{type(error).__name__}: {error}"[:300]
            traceback.print_exc()
        decoder = holders.get(variant, {}).get("d")
        if decoder is not None:
            row["into"] = getattr(decoder.backend, "into", None)
            row["graph_kept"] = decoder.graph_augment
            row["cpu_fallback"] = decoder.stats().cpu_fallback
        rows.append(row)
        _print_row(row)
    return rows


def _print_row(row: dict) -> None:
    if "error" in row:
        print(f"{row['set']:8s} {row['variant']:32s} ERROR {row['error']}", flush=True)
        return
    extra = ""
    if "into" in row:
        extra = f"  into={row['into']} graph={row['graph_kept']} cpu_fallback={row['cpu_fallback']}"
    print(
        f"{row['set']:8s} {row['variant']:32s} {row['images_per_s']:9.0f} img/s  thread {row['thread_ms']:6.2f} ms  "
        f"proc {row['proc_ms']:6.2f} ms  gpu {row['gpu_ms']:6.2f} ms  spin {100 * row['spin_share']:5.1f}%  "
        f"img/s spin {row['images_per_s_with_spinner']:8.0f}{extra}",
        flush=True,
    )


def parse_paths(paths: list[str]) -> list[tuple[str, bool, str]]:
    """``["nvimgcodec:graph", "torchvision:compiled"]`` -> ``[("nvimgcodec", "graph", "thread"),
    ("torchvision", "compiled", "thread")]``; a third part, ``:process``, runs the decoder in a process of its
    own (``decode_process_prototype.py``, measured and not adopted)."""
    parsed = []
    for path in paths:
        backend, _, rest = path.partition(":")
        mode, _, where = rest.partition(":")
        where = where or "thread"
        if mode not in ("compiled", "graph", "eager") or where not in ("thread", "process"):
            raise SystemExit(f"--paths entries are backend:compiled|graph|eager[:thread|process], not {path!r}")
        parsed.append((backend, mode, where))
    return parsed


def path_name(backend: str, mode: str, where: str) -> str:
    return f"{backend}_{mode}" + ("_process" if where == "process" else "")


def build_loader(samples, workers: int, total: int, backend: str, mode: str, where: str, device: str = "cuda"):
    """The package path as the e2e rows run it (also what ``--dry-run`` builds on the CPU); ``mode``: eager,
    graph (the augment as a CUDA graph) or compiled (that graph of the torch.compile'd augment)."""
    options = {"graph_augment": mode != "eager", "compile_augment": mode == "compiled"}
    if where == "process" and device == "cuda":  # the prototype of decode_process_prototype.py
        from decode_process_prototype import ProcessDecodeLoader

        return gpu_loader(samples, workers, total, backend=backend, wrapper=ProcessDecodeLoader, **options)
    return gpu_loader(samples, workers, total, backend=backend, device=device, **options)


def end_to_end(sets, args, paths) -> list[dict]:
    from gpu_decode import ceiling_batches

    default_interval = sys.getswitchinterval()
    rows = []
    for model in args.models:
        step = make_model(model)
        ceiling = measure(step, ceiling_batches(), args.warmup, args.steps)
        for name, samples in sets.items():
            rows.append(
                {"model": model, "set": name, "path": "ceiling", "workers": 0, "share_of_ceiling": 1.0, **ceiling}
            )
            _print_e2e(rows[-1])
            for (backend, mode, where), workers, interval in itertools.product(
                paths, args.workers, args.switch_intervals
            ):
                loader = None
                sys.setswitchinterval(interval / 1e3)
                try:
                    loader = build_loader(samples, workers, args.warmup + args.steps, backend, mode, where)
                    row = measure(step, loader, args.warmup, args.steps)
                    row["decode"] = loader.stats().to_metrics()
                    if loader.decoder is not None:
                        row["graph_kept"] = loader.decoder.graph_augment
                        row["compiled_kept"] = loader.decoder.compile_augment
                        row["into"] = getattr(loader.decoder.backend, "into", None)
                except Exception as error:
                    row = {"error": f"{type(error).__name__}: {error}"[:300], "images_per_s": float("nan")}
                    traceback.print_exc()
                finally:
                    _shutdown(loader)
                    sys.setswitchinterval(default_interval)
                path = path_name(backend, mode, where)
                if interval != DEFAULT_INTERVAL_MS:
                    path += f"_si{interval:g}ms"
                row["switch_interval_ms"] = interval
                row.update(model=model, set=name, path=path, workers=workers)
                row["share_of_ceiling"] = row["images_per_s"] / ceiling["images_per_s"]
                rows.append(row)
                _print_e2e(row)
        del step
        torch.cuda.empty_cache()
    return rows


def dry_run(sets, args, paths) -> list[dict]:
    """Every e2e loader built on the CPU (the backend and graph options are taken, PIL decodes), 2 batches."""
    rows = []
    for name, samples in sets.items():
        for backend, mode, where in paths:
            for workers in args.workers:
                loader = build_loader(samples, workers, 2, backend, mode, where, device="cpu")
                try:
                    shapes = [tuple(images.shape) for images, _ in loader]
                finally:
                    _shutdown(loader)
                assert shapes == [(BATCH, 3, SIZE, SIZE)] * 2, shapes
                rows.append({"set": name, "backend": backend, "mode": mode, "workers": workers, "shapes": shapes})
                print(f"dry-run {name:8s} {path_name(backend, mode, where)} w={workers}: {shapes}", flush=True)
    return rows


def _shutdown(loader) -> None:
    if loader is None:
        return
    loader.close()
    iterator = getattr(loader.loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()


def _print_e2e(row: dict) -> None:
    decode, nan = row.get("decode", {}), float("nan")
    print(
        f"e2e {row['model']:9s} {row['set']:8s} {row['path']:18s} w={row['workers']} {row['images_per_s']:8.0f} img/s "
        f"{100 * row['share_of_ceiling']:5.1f}%  main {row.get('main_cpu_percent', nan):4.0f}%  "
        f"workers {row.get('workers_cpu_percent', nan):4.0f}%  "
        f"main thread {row.get('main_thread_ms_per_step', nan):5.2f} ms/step  "
        f"submit {1e3 * decode.get('Decode/submit_seconds', nan):5.2f} ms "
        f"(cpu {1e3 * decode.get('Decode/submit_cpu_seconds', nan):5.2f})  "
        f"lookahead {decode.get('Decode/lookahead_mean', nan):.2f}  "
        f"jpeg {row.get('jpeg_util_percent', nan):.0f}%  {row.get('error', '')}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=8, help="distinct pre-collated batches per set")
    parser.add_argument("--iters", type=int, default=24, help="batches per variant measurement")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--workers", type=int, nargs="+", default=[4])
    parser.add_argument("--models", nargs="+", default=["resnet18", "resnet50"])
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument(
        "--switch-intervals", type=float, nargs="+", default=[DEFAULT_INTERVAL_MS],
        help="Python's GIL switch interval (ms) during each e2e row (sys.setswitchinterval)",
    )  # fmt: skip
    parser.add_argument("--skip-micro", action="store_true", help="only the end-to-end rows")
    parser.add_argument(
        "--paths", nargs="+", help="e2e paths, backend:compiled|graph|eager (default: each backend found, each mode)"
    )
    parser.add_argument("--dry-run", action="store_true", help="build every e2e loader on the CPU, 2 batches each")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    started = time.perf_counter()
    info: dict = {"torch": torch.__version__, "python": sys.version.split()[0], "args": vars(args)}
    try:
        import torchvision

        info["torchvision"] = torchvision.__version__
    except Exception as error:
        info["torchvision"] = repr(error)
    try:
        nvi = import_nvimgcodec()
        info["nvimgcodec"] = getattr(nvi, "__version__", "?")
    except ImportError as error:
        nvi, info["nvimgcodec"] = None, str(error)[:300]
    print(json.dumps(info), flush=True)
    if args.paths:
        paths = parse_paths(args.paths)
    else:
        names = ["torchvision"] + (["nvimgcodec"] if nvi is not None else [])
        paths = [(name, mode, "thread") for name in names for mode in ("eager", "graph", "compiled")]
    root = tempfile.mkdtemp(prefix="gpu_decode_probe_")
    sets = {kind: make_set(os.path.join(root, kind), kind, args.images)[0] for kind in ("uniform", "varied")}
    print(f"generated {2 * args.images} JPEGs in {time.perf_counter() - started:.1f} s", flush=True)
    results: dict = {"info": info, "micro": [], "e2e": []}
    if args.dry_run:
        results["dry_run"] = dry_run(sets, args, paths)
    else:
        if not args.skip_micro:
            spinner = Spinner()
            for name, samples in sets.items():
                results["micro"] += probe_set(name, samples, args, spinner, nvi)
        if not args.skip_e2e:
            results["e2e"] = end_to_end(sets, args, paths)
    results["elapsed_s"] = time.perf_counter() - started
    out_dir = os.environ.get("OUT") or os.path.join(os.path.dirname(__file__), "results")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gpu_decode_probe.json"), "w") as file:
        json.dump(results, file, indent=1, default=str)
    print(f"done in {results['elapsed_s']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
