"""Which decode engine holds its rate beside a busy GPU? Decode-only rows for benchmarks/gpu_decode.py (issue 38).

Each engine and way of calling it, idle and beside bf16 matrix products on another stream (as a compiled step).
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable

import numpy as np
import torch
from PIL import Image


class BusyGpu:
    """A thread queueing 8192^3 bf16 products (~1.4 ms each) on a side stream, ``depth`` outstanding at most."""

    def __init__(self, depth: int = 3) -> None:
        self._stop = threading.Event()
        self.products = 0
        self._thread = threading.Thread(target=self._run, args=(depth,), daemon=True)

    def _run(self, depth: int) -> None:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
            out = torch.empty_like(a)
            events: list[torch.cuda.Event] = []
            while not self._stop.is_set():
                torch.mm(a, a, out=out)
                event = torch.cuda.Event()
                event.record(stream)
                events.append(event)
                self.products += 1
                if len(events) > depth:
                    # bounds the queue; releases the GIL while it waits
                    events.pop(0).synchronize()
            stream.synchronize()

    def __enter__(self) -> BusyGpu:
        self._thread.start()
        time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def _images(item) -> int:
    """Images in one item: a batch (list of bytes or tensors), a packed batch (tuple), or a list of packed ones."""
    if isinstance(item, tuple):
        return len(item[1])
    if item and isinstance(item[0], tuple):
        return sum(len(packed[1]) for packed in item)
    return len(item)


def _rate(run: Callable[[list], None], items: list, warmup: int) -> float:
    for item in items[:warmup]:
        run(item)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for item in items:
        run(item)
    torch.cuda.synchronize()
    return sum(_images(item) for item in items) / (time.perf_counter() - start)


def _packed(batch: list[bytes], sizes: dict[bytes, tuple[int, int]]):
    """One shared-memory byte tensor, the spans, the sizes and the flat buffer's bases (``hwc``) of a batch."""
    data = torch.frombuffer(bytearray(b"".join(batch)), dtype=torch.uint8).clone().share_memory_()
    spans, bases, shapes, at, base = [], [], [], 0, 0
    for part in batch:
        spans.append((at, at + len(part)))
        at += len(part)
        height, width = sizes[part]
        shapes.append((height, width))
        bases.append(base)
        base += 3 * height * width
    return data, spans, shapes, bases, base


def packed_batches(batches: list[list[bytes]]) -> list:
    """Each batch as :func:`_packed` makes it, the image sizes read once per distinct file."""
    sizes: dict[bytes, tuple[int, int]] = {}
    for batch in batches:
        for part in batch:
            if part not in sizes:
                width, height = Image.open(io.BytesIO(part)).size
                sizes[part] = (height, width)
    return [_packed(batch, sizes) for batch in batches]


def _nvjpeg_runs(packed: list, on_high: Callable) -> list[tuple[str, Callable[[list], None], list]]:
    """The direct nvJPEG backend's call (ctypes, into one flat buffer), on the current and a high-priority stream."""
    try:
        from lightning_dataperf.decode._nvjpeg import NvJpegBackend

        backend = NvJpegBackend(torch.device("cuda", torch.cuda.current_device()))
    except ImportError as error:
        print(f"nvJPEG direct rows: not measured ({error})"[:200], flush=True)
        return []
    flat = torch.empty(max(p[4] for p in packed) + 3, dtype=torch.uint8, device="cuda")

    def into(item) -> None:
        data, spans, shapes, bases, _ = item
        ok, _ = backend.decode(data, spans, shapes, flat, bases, prepared=backend.prepare(data, spans))
        assert all(ok), "the engines rejected an image"

    return [("nvJPEG direct (ctypes), package call", into, packed),
            ("nvJPEG direct (ctypes), package call, high-priority stream", on_high(into), packed)]  # fmt: skip


def engine_rows(batches: list[list[bytes]], warmup: int = 3) -> list[dict]:
    """images/s per engine and way of calling it, idle and beside :class:`BusyGpu`; rows skipped where absent."""
    from torchvision.io import decode_jpeg

    rows: list[dict] = []
    # shared memory for the packed copies: a bounded number of batches
    batches = batches[:40]
    tensors = [[torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in batch] for batch in batches]
    # a large negative priority maps to the highest the device offers: its blocks go first on shared SMs
    high = torch.cuda.Stream(priority=-100)

    def on_high(run: Callable[[list], None]) -> Callable[[list], None]:
        def wrapped(item) -> None:
            with torch.cuda.stream(high):
                run(item)

        return wrapped

    def torchvision_run(batch) -> None:
        decode_jpeg(batch, device="cuda")

    runs: list[tuple[str, Callable[[list], None], list]] = [
        ("torchvision decode_jpeg, batched", torchvision_run, tensors),
        ("torchvision decode_jpeg, batched, high-priority current stream", on_high(torchvision_run), tensors),
    ]
    packed = packed_batches(batches)
    runs += _nvjpeg_runs(packed, on_high)
    try:
        from lightning_dataperf.decode._nvimgcodec import NvImageCodecBackend, import_nvimgcodec

        codec = import_nvimgcodec()
        device = torch.device("cuda", torch.cuda.current_device())
        backends = [NvImageCodecBackend(device), NvImageCodecBackend(device)]
    except ImportError as error:
        print(f"nvImageCodec engine rows: not measured ({error})"[:200], flush=True)
        backends = []
    if backends:
        decoder, params = backends[0]._decoder, backends[0]._params
        stream = torch.cuda.current_stream().cuda_stream

        def own(batch) -> None:
            decoder.decode([codec.CodeStream(part) for part in batch], params=params, cuda_stream=stream)

        flats = [torch.empty(max(p[4] for p in packed) + 3, dtype=torch.uint8, device="cuda") for _ in range(2)]

        def into(item, backend=backends[0], flat=flats[0]) -> None:
            data, spans, shapes, bases, _ = item
            backend.decode(data, spans, shapes, flat, bases, prepared=backend.prepare(data, spans))

        def two(items) -> None:
            # two decodes in flight: the halves of the list, each in its own thread, decoder and stream
            def half(k: int) -> None:
                with torch.cuda.stream(streams[k]):
                    for item in items[k::2]:
                        into(item, backends[k], flats[k])

            threads = [threading.Thread(target=half, args=(k,)) for k in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

        streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        for k in range(2):
            # each decoder's first call (its allocations) before any timing
            into(packed[0], backends[k], flats[k])
        arrays = [[np.frombuffer(part, dtype=np.uint8) for part in batch] for batch in batches]
        runs += [
            ("nvImageCodec, own buffers", own, arrays),
            ("nvImageCodec, package call (shm bytes, into slots)", into, packed),
            ("nvImageCodec, package call, high-priority stream", on_high(into), packed),
        ]
        # one call over every batch (the threads take turns), so the rate counts all of them
        runs.append(("nvImageCodec, package call, 2 in flight", two, [packed]))
    for name, run, items in runs:
        for busy in (False, True):
            try:
                if busy:
                    with BusyGpu() as load:
                        rate = _rate(run, items, 0 if len(items) == 1 else warmup)
                    products = load.products
                else:
                    rate = _rate(run, items, 0 if len(items) == 1 else warmup)
                    products = 0
            except Exception as error:  # one engine failing must not lose the other rows
                print(f"{name}: failed ({error})"[:200], flush=True)
                continue
            rows.append({"path": f"engine: {name}" + (", busy GPU" if busy else ""), "images_per_s": rate,
                         "busy_products": products})  # fmt: skip
    return rows
