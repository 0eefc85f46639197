"""Decode and augment :class:`~lightning_dataperf.decode.encoded.EncodedBatch` on the GPU (issue 17).

:class:`JpegDecoder` turns one encoded batch into ``(images, labels)``: batched nvJPEG (nvImageCodec,
else ``torchvision.io.decode_jpeg``; the hardware JPEG engines where the GPU has them) straight into
one flat buffer, then crop + resize + flip + normalise of the whole batch in a fixed number of kernel
launches: every output pixel gathers its four bilinear neighbours from the flat buffer (the
arithmetic of ``F.interpolate(mode="bilinear", align_corners=False, antialias=False)`` on the crop).
Samples the header marked for the CPU (progressive, grayscale, CMYK, PNG, ...) are decoded with PIL
and counted (``Decode/cpu_fallback``). Without CUDA everything runs on the CPU (PIL), same arithmetic.

:class:`GpuDecodeLoader` is the one switch: it wraps a ``DataLoader`` of encoded batches and runs the
decoder ahead of the training step in a background thread on its own CUDA stream, with a bounded
look-ahead queue and CUDA-event hand-over (no synchronize per step).

Example (plain PyTorch or a LightningModule's ``train_dataloader``)::

    dataset = EncodedImageDataset.from_folder("/data/train", seed=42)
    loader = DataLoader(dataset, batch_size=128, shuffle=True, num_workers=4,
                        collate_fn=collate_encoded, persistent_workers=True)
    train = GpuDecodeLoader(loader, device="cuda", size=224, dtype=torch.bfloat16)
    for images, labels in train:       # images: [128, 3, 224, 224] bf16 channels_last on cuda
        ...
    print(train.stats().to_metrics())  # {"Decode/images_per_sec": ..., "Decode/cpu_fallback": ...}

GPU path: ``pip install "lightning-dataperf[gpu-decode]"`` (nvImageCodec; torchvision also works).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

from lightning_dataperf.decode._backends import host_layout, make_backend, pil_decode, slot_view
from lightning_dataperf.decode._gather import augment_batch, compiled_augment, crop_resize_flip
from lightning_dataperf.decode._graph import GraphedAugment
from lightning_dataperf.decode.encoded import KIND_BAD, KIND_GPU, EncodedBatch
from lightning_dataperf.decode.stats import DecodeStats

__all__ = ["DecodeError", "DecodeStats", "JpegDecoder", "crop_resize_flip"]

_TABLE_COLUMNS = 9  # base, height, width, crop top, left, height, width, flip, label
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_EXTRA = "lightning-dataperf[gpu-decode]"
_log = logging.getLogger(__name__)


class DecodeError(RuntimeError):
    """A sample that neither the GPU nor the CPU can decode (names its dataset index and path)."""


class _Telemetry:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches = self.images = self.cpu_fallback = self.undecodable = 0
        self.decode_s = self.submit_s = self.submit_cpu_s = self.wait_s = 0.0
        self.depth_sum = self.depth_n = 0
        self.pending: deque[tuple[torch.cuda.Event, torch.cuda.Event, int]] = deque()

    def drain(self) -> None:
        while self.pending and self.pending[0][1].query():
            start, end, _ = self.pending.popleft()
            self.decode_s += start.elapsed_time(end) / 1e3


class JpegDecoder:
    """Decodes and augments one :class:`EncodedBatch` into ``(images, labels)`` on ``device``.

    Args:
        device: ``"cuda"``/``"cuda:N"`` (nvJPEG) or ``"cpu"`` (PIL).
        size: output side (RandomResizedCrop / centre crop boxes come with the batch).
        dtype: output dtype (e.g. ``torch.bfloat16``); ``torch.uint8`` skips normalisation.
        channels_last: return NCHW with channels-last strides (free here), else contiguous NCHW.
        mean, std: normalisation in 0..1 units.
        on_error: ``"raise"`` a :class:`DecodeError` naming index and path for an undecodable sample,
            or ``"zeros"``: an all-zero image (after normalisation), counted as ``Decode/undecodable``.
        backend: ``"auto"`` (torchvision's CUDA decode if it imports, else nvImageCodec), ``"nvimgcodec"`` or
            ``"torchvision"`` (ignored on CPU), or a backend object (see ``_decode_backends``).
        decode_threads: nvImageCodec's CPU thread pool (default ``min(4, cores)``).
        graph_augment: on CUDA, run the augment as one CUDA graph (:mod:`._graph_augment`; eager if
            the capture fails, and for a batch of another size).
        compile_augment: in that graph, the augment compiled by ``torch.compile`` (fused gathers: about a
            tenth of its GPU time; compiled at the first batch, in the decode thread, seconds); uncompiled
            (with a warning) where Triton or the compile is not available. Off by default: PyTorch's compile
            stack is not thread-safe, so it may race with a ``torch.compile`` of your model in the main
            thread, and its end-to-end gain was within run-to-run spread but for one row (benchmarks/README.md).

    Calls on CUDA run on the current stream; :class:`GpuDecodeLoader` calls it from its background thread.

    Example::

        images, labels = JpegDecoder("cuda", size=224, dtype=torch.bfloat16)(encoded_batch)
    """

    def __init__(
        self,
        device: str | torch.device = "cuda",
        size: int = 224,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = True,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        on_error: str = "raise",
        backend: Any = "auto",
        decode_threads: int | None = None,
        graph_augment: bool = True,
        compile_augment: bool = False,
    ) -> None:
        if on_error not in ("raise", "zeros"):
            raise ValueError(f"on_error must be 'raise' or 'zeros', not {on_error!r}")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.size, self.dtype, self.channels_last, self.on_error = size, dtype, channels_last, on_error
        scale = torch.tensor([1 / (255 * s) for s in std], dtype=torch.float32)
        self._scale = scale.to(self.device)
        self._shift = (-torch.tensor(mean, dtype=torch.float32) / torch.tensor(std)).to(self.device)
        self._cuda = self.device.type == "cuda"
        custom = not isinstance(backend, str)
        self.backend = make_backend(backend, self.device, decode_threads) if self._cuda or custom else None
        self.layout = self.backend.layout if self.backend is not None else "hwc"
        self.graph_augment = graph_augment and self._cuda
        self.compile_augment = compile_augment and self.graph_augment
        self._graphed: GraphedAugment | None = None
        self.telemetry = _Telemetry()
        self._keep: deque[tuple[torch.cuda.Event, Any]] = deque()
        self._warned = False

    def __call__(self, batch: EncodedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        started, cpu_started = time.perf_counter(), time.thread_time()
        telemetry = self.telemetry
        if self._cuda:
            stream = torch.cuda.current_stream(self.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
        meta = batch.meta if batch.meta.device.type == "cpu" else batch.meta.cpu()
        rows = meta.tolist()
        flat, bases, sizes, fallback, bad, keep, graphed = self._decode(batch, rows)
        count = len(rows)
        if count:
            table = [
                (base, h, w, *((0, 0, 1, 1) if i in bad else row[5:9]), row[9], row[0])
                for i, (row, base, (h, w)) in enumerate(zip(rows, bases, sizes, strict=True))
            ]  # fmt: skip
            host_table = self._pinned(torch.tensor(table, dtype=torch.int64))
            if graphed is not None:
                images, labels = self._replay(graphed, host_table)
            else:
                images, labels = self._augment(flat, host_table.to(self.device, non_blocking=True))
            self._release_after_use(keep)
        else:
            images = torch.empty(0, 3, self.size, self.size, device=self.device, dtype=self.dtype)
            labels = self._to_device(meta[:, 0].contiguous())
        if self._cuda:
            end.record(stream)
        with telemetry.lock:
            if self._cuda:
                telemetry.pending.append((start, end, count))
            telemetry.batches += 1
            telemetry.images += count
            telemetry.cpu_fallback += fallback
            telemetry.undecodable += len(bad)
            elapsed = time.perf_counter() - started
            telemetry.submit_s += elapsed
            telemetry.submit_cpu_s += time.thread_time() - cpu_started
            if not self._cuda:
                telemetry.decode_s += elapsed
        return images, labels

    def _augment(
        self, flat: torch.Tensor, small: torch.Tensor, function: Callable[..., Any] = augment_batch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Crop/resize/flip/normalise from ``flat`` by the device table ``small``; launches kernels only."""
        compute = torch.float16 if self._cuda and self.dtype in (torch.bfloat16, torch.float16) else torch.float32
        arguments = (self.size, compute, self.layout, self.dtype, self.channels_last)
        return function(flat, small, self._scale, self._shift, *arguments)

    def _fused(self, flat: torch.Tensor, small: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._augment(flat, small, compiled_augment())

    def _replay(self, graphed: GraphedAugment, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.compile_augment:
            try:
                return graphed.run(table, self._fused)
            except Exception as error:  # no Triton / compiler, or the compiled code cannot be captured
                self.compile_augment = False
                _log.warning("torch.compile of the GPU augment failed (%s); using the uncompiled augment", error)
        try:
            return graphed.run(table, self._augment)
        except Exception:  # capture failed: eager from now on (the static buffers hold this batch)
            self._graphed, self.graph_augment = None, False
            return self._augment(graphed.flat, graphed.table)

    def _allocate(self, count: int, needed: int) -> tuple[torch.Tensor, int, GraphedAugment | None]:
        """The flat buffer (``needed`` bytes and a zero pixel), where the zero pixel is, and the graph using it."""
        if self.graph_augment and self._cuda and count:
            graphed = self._graphed
            if graphed is None or (graphed.batch == count and not graphed.fits(count, needed)):
                self._release_after_use(graphed)  # replays of the old graph may still be queued
                capacity = needed * 5 // 4 + 3
                graphed = self._graphed = GraphedAugment(count, capacity, _TABLE_COLUMNS, self.device)
            if graphed.fits(count, needed):
                return graphed.flat[:needed], graphed.zero_base, graphed
        flat = torch.empty(needed + 3, dtype=torch.uint8, device=self.device)
        flat[needed:].zero_()
        return flat, needed, None

    def _pinned(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.pin_memory() if self._cuda else tensor

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._pinned(tensor).to(self.device, non_blocking=True) if self._cuda else tensor

    def _decode(self, batch: EncodedBatch, rows: list[list[int]]):
        """Every sample into one flat device buffer (GPU-decoded slots first, then host-decoded ones,
        a zero pixel for the undecodable): ``(flat, bases, sizes, cpu fallbacks, bad, keep-alive, graph)``."""
        data = batch.data if batch.data.device.type == "cpu" else batch.data.cpu()
        offsets = batch.offsets.tolist()
        count = len(rows)
        sizes = [(row[3], row[4]) for row in rows]
        gpu = [i for i, row in enumerate(rows) if row[2] == KIND_GPU] if self.backend is not None else []
        on_gpu = set(gpu)
        host: dict[int, torch.Tensor] = {}
        bad: list[int] = []
        for i in range(count):
            if i not in on_gpu:
                self._host_decode(batch, data, offsets, rows, i, host, bad)
        bases, position = [0] * count, 0
        for i in gpu:
            bases[i] = position
            position += 3 * sizes[i][0] * sizes[i][1]
        host_start = position
        for i, image in host.items():
            sizes[i], bases[i] = (image.shape[0], image.shape[1]), position
            position += image.numel()
        flat, zero_base, graphed = self._allocate(count, position)
        keep: Any = None
        fallback = sum(1 for i in host if rows[i][2] != KIND_GPU or self.backend is not None)
        if gpu:
            assert self.backend is not None
            spans = [(offsets[i], offsets[i + 1]) for i in gpu]
            ok, keep = self.backend.decode(data, spans, [sizes[i] for i in gpu], flat, [bases[i] for i in gpu])
            for i, good in zip(gpu, ok, strict=True):
                if good:
                    continue
                if not self._warned:
                    self._warned = True
                    _log.warning(
                        "the GPU decoder rejected dataset index %d (%s); decoding it on the CPU (later ones are "
                        "only counted in Decode/cpu_fallback)",
                        int(rows[i][1]),
                        batch.paths[i] if i < len(batch.paths) else "?",
                    )
                slot = slot_view(flat, bases[i], sizes[i], self.layout)
                retried: dict[int, torch.Tensor] = {}
                self._host_decode(batch, data, offsets, rows, i, retried, bad)
                if i in retried and tuple(retried[i].shape[:2]) == sizes[i]:
                    slot.copy_(self._pinned(host_layout(retried[i], self.layout)), non_blocking=True)
                    fallback += 1
                elif i in retried:
                    self._fail(batch, i, f"decoded size {tuple(retried[i].shape[:2])} differs from the header's", bad)
        if host:
            joined = torch.cat([host_layout(host[i], self.layout).view(-1) for i in host])
            flat[host_start:position].copy_(self._pinned(joined), non_blocking=True)
        for i in bad:
            bases[i], sizes[i] = zero_base, (1, 1)
        return flat, bases, sizes, fallback, bad, keep, graphed

    def _host_decode(self, batch, data, offsets, rows, i, out, bad) -> None:
        """PIL decode of sample ``i`` into ``out[i]`` (``[H, W, 3]``), or mark it bad / raise."""
        reason = batch.reasons[i] if i < len(batch.reasons) else ""
        if rows[i][2] != KIND_BAD:
            try:
                out[i] = pil_decode(data[offsets[i] : offsets[i + 1]].numpy().tobytes())
                return
            except Exception as error:  # the CPU cannot decode it either
                reason = f"{type(error).__name__}: {error}"
        self._fail(batch, i, reason, bad)

    def _fail(self, batch: EncodedBatch, i: int, reason: str, bad: list[int]) -> None:
        if self.on_error == "raise":
            index = int(batch.meta[i, 1])
            path = batch.paths[i] if i < len(batch.paths) else "?"
            raise DecodeError(f"cannot decode dataset index {index} ({path}): {reason or 'undecodable'}")
        bad.append(i)

    def _release_after_use(self, keep: Any) -> None:
        """Keep the decoder's outputs and inputs alive until the current stream has read them (instead of
        ``record_stream`` per image: their blocks may belong to another stream)."""
        if not self._cuda or keep is None:
            return
        while self._keep and self._keep[0][0].query():
            self._keep.popleft()
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self._keep.append((event, keep))

    def stats(self) -> DecodeStats:
        """A snapshot of the telemetry so far (never blocks)."""
        telemetry = self.telemetry
        with telemetry.lock:
            telemetry.drain()
            depth = telemetry.depth_sum / telemetry.depth_n if telemetry.depth_n else 0.0
            return DecodeStats(
                batches=telemetry.batches,
                images=telemetry.images,
                decode_seconds=telemetry.decode_s,
                submit_seconds=telemetry.submit_s,
                wait_seconds=telemetry.wait_s,
                lookahead_mean=depth,
                takes=telemetry.depth_n,
                cpu_fallback=telemetry.cpu_fallback,
                undecodable=telemetry.undecodable,
                jpeg_util_percent=_jpeg_utilisation(self.device),
                submit_cpu_seconds=telemetry.submit_cpu_s,
                backend=self.backend.name if self.backend is not None else "pil",
            )


def _jpeg_utilisation(device: torch.device) -> float | None:
    """NVML JPEG-engine utilisation (%) of ``device`` (by its UUID); ``None`` where NVML or the engine is missing."""
    if device.type != "cuda":
        return None
    try:
        import pynvml

        from lightning_dataperf.telemetry.sources import nvml_handle

        pynvml.nvmlInit()
        handle = nvml_handle(pynvml, device.index if device.index is not None else torch.cuda.current_device())
        return float(pynvml.nvmlDeviceGetJpgUtilization(handle)[0])
    except Exception:  # no NVML, no JPEG engine, or an old driver
        return None
