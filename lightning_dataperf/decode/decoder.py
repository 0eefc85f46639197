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
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

from lightning_dataperf.decode._backends import host_layout, make_backend, pil_decode, slot_view
from lightning_dataperf.decode._gather import augment_batch, compiled_augment, crop_resize_flip
from lightning_dataperf.decode._graph import GraphedAugment
from lightning_dataperf.decode._state import PreparedBatch, Telemetry, jpeg_utilisation
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
        #: Wait on the host, before each GPU decode, until the memory it writes is no longer read (see
        #: :meth:`_wait_writable`): where the backend's decoder writes at call time, not in stream order.
        self.host_barrier = bool(self._cuda and getattr(self.backend, "writes_at_call", True))
        self._graphs: list[GraphedAugment | None] = [None] * (2 if self.host_barrier else 1)
        self._turn = 0
        self.telemetry = Telemetry()
        self._keep: deque[tuple[torch.cuda.Event, Any]] = deque()
        self._warned = False

    def __call__(self, batch: EncodedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode and augment ``batch``: :meth:`prepare` then :meth:`run`, in the calling thread."""
        return self.run(self.prepare(batch))

    def prepare(self, batch: EncodedBatch) -> PreparedBatch:
        """The host-only half of a batch (no CUDA work is queued): the per-sample rows, the byte views,
        the layout of the flat buffer, the pinned per-sample table, the backend's own inputs, and the CPU
        decodes of the samples the header sent to the CPU. :class:`GpuDecodeLoader` runs it in a thread of
        its own, so the decode thread only decodes and augments."""
        started, cpu_started = time.perf_counter(), time.thread_time()
        meta = batch.meta if batch.meta.device.type == "cpu" else batch.meta.cpu()
        rows = meta.tolist()
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
        spans = [(offsets[i], offsets[i + 1]) for i in gpu]
        inputs = None
        prepare_inputs = getattr(self.backend, "prepare", None)
        if gpu and callable(prepare_inputs):
            inputs = prepare_inputs(data, spans)
        prepared = PreparedBatch(
            batch, rows, data, offsets, sizes, gpu, host, bad, bases, position, host_start, spans, inputs
        )
        if count and not bad:  # the table is final unless a sample turns out undecodable on the GPU
            prepared.table = self._table(prepared, 0, bad)
        prepared.seconds = time.perf_counter() - started
        prepared.cpu_seconds = time.thread_time() - cpu_started
        return prepared

    @property
    def can_submit(self) -> bool:
        """Can the decode call run apart from :meth:`run` (:meth:`submit`)? Where the backend decodes into
        buffers of its own and has a ``submit`` (torchvision's nvJPEG), not where it decodes into the flat buffer."""
        return callable(getattr(self.backend, "submit", None)) and getattr(self.backend, "ordered", True)

    def submit(self, prepared: PreparedBatch) -> PreparedBatch:
        """The decode library's call for a prepared batch, where :attr:`can_submit` (else nothing): what it returns
        goes with the batch to :meth:`run`, which then only copies it into the flat buffer and augments.
        :class:`GpuDecodeLoader` calls it in a thread of its own, so one batch's call (the GIL released) overlaps
        the previous batch's copy and augment and the next one's preparation."""
        if prepared.gpu and self.can_submit:
            started = time.perf_counter()
            parts = prepared.inputs if prepared.inputs is not None else [prepared.data[a:b] for a, b in prepared.spans]
            prepared.submitted = self.backend.submit(parts)
            prepared.call_seconds = time.perf_counter() - started
        return prepared

    def run(self, prepared: PreparedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The device half of a batch prepared by :meth:`prepare`: decode into the flat buffer, augment."""
        started, cpu_started = time.perf_counter(), time.thread_time()
        telemetry = self.telemetry
        if self._cuda:
            stream = torch.cuda.current_stream(self.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
        count = len(prepared.rows)
        flat, zero_base, graphed, fallback, bad, keep, waited = self._decode(prepared)
        if count:
            host_table = prepared.table
            if host_table is None or bad:
                host_table = self._table(prepared, zero_base, bad)
            if graphed is not None:
                images, labels = self._replay(graphed, host_table)
                graphed.readers_done = self._record()  # the next hardware decode into its buffer waits for this
            else:
                images, labels = self._augment(flat, host_table.to(self.device, non_blocking=True))
            self._release_after_use(keep)
        else:
            images = torch.empty(0, 3, self.size, self.size, device=self.device, dtype=self.dtype)
            labels = self._to_device(prepared.batch.meta[:, 0].cpu().contiguous())
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
            telemetry.prepare_s += prepared.seconds
            telemetry.prepare_cpu_s += prepared.cpu_seconds
            telemetry.barrier_s += waited
            telemetry.call_s += prepared.call_seconds
            if not self._cuda:
                telemetry.decode_s += elapsed + prepared.seconds
        return images, labels

    def _table(self, prepared: PreparedBatch, zero_base: int, undecodable: list[int]) -> torch.Tensor:
        """The pinned ``[B, 9]`` per-sample table (base, height, width, crop box, flip, label); the
        undecodable samples read the zero pixel at ``zero_base``."""
        bad = set(undecodable)
        table = [
            (zero_base, 1, 1, 0, 0, 1, 1, row[9], row[0]) if i in bad else (base, h, w, *row[5:10], row[0])
            for i, (row, base, (h, w)) in enumerate(zip(prepared.rows, prepared.bases, prepared.sizes, strict=True))
        ]  # fmt: skip
        return self._pinned(torch.tensor(table, dtype=torch.int64))

    def _record(self) -> torch.cuda.Event:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

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
            self._graphs, self.graph_augment = [None] * len(self._graphs), False
            return self._augment(graphed.flat, graphed.table)

    def _allocate(self, count: int, needed: int) -> tuple[torch.Tensor, int, GraphedAugment | None]:
        """The flat buffer (``needed`` bytes and a zero pixel), where the zero pixel is, and the graph using it.

        Graphs take turns (two where the decoder writes at call time, see :attr:`host_barrier`): the host
        barrier before a decode into one graph's buffer then waits for the batch before last, long done."""
        if self.graph_augment and self._cuda and count:
            turn = self._turn % len(self._graphs)
            graphed = self._graphs[turn]
            if graphed is None or (graphed.batch == count and not graphed.fits(count, needed)):
                self._release_after_use(graphed)  # replays of the old graph may still be queued
                capacity = needed * 5 // 4 + 3
                graphed = self._graphs[turn] = GraphedAugment(count, capacity, _TABLE_COLUMNS, self.device)
            if graphed.fits(count, needed):
                self._turn += 1
                return graphed.flat[:needed], graphed.zero_base, graphed
        flat = torch.empty(needed + 3, dtype=torch.uint8, device=self.device)
        flat[needed:].zero_()
        return flat, needed, None

    @property
    def _graphed(self) -> GraphedAugment | None:
        """The graph the last full batch used (``None`` before the first, or once capture failed)."""
        return self._graphs[(self._turn - 1) % len(self._graphs)] if self.graph_augment else None

    def _wait_writable(self, graphed: GraphedAugment | None) -> float:
        """Host barrier before a decoder that writes at call time (nvJPEG's hardware engine ignores stream
        order: meta-pytorch/torchcodec#1634; a device-side wait does not gate it): wait until the GPU has
        done every read of the memory it will write. The graph's static buffer: its last replay. A
        buffer just taken from the caching allocator: all work queued so far on this stream (a block freed
        on this stream is handed out again while kernels queued on it may still read it). Returns seconds."""
        if not (self._cuda and self.host_barrier):
            return 0.0
        if graphed is not None:
            event = graphed.readers_done
            if event is None:
                return 0.0
        else:
            event = self._record()
        started = time.perf_counter()
        event.synchronize()  # releases the GIL
        return time.perf_counter() - started

    def _pinned(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.pin_memory() if self._cuda else tensor

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._pinned(tensor).to(self.device, non_blocking=True) if self._cuda else tensor

    def _decode(self, prepared: PreparedBatch):
        """Every sample into one flat device buffer (GPU-decoded slots first, then host-decoded ones,
        a zero pixel for the undecodable): ``(flat, zero base, graph, cpu fallbacks, bad, keep-alive,
        seconds of host barrier)``."""
        batch, rows, data, offsets = prepared.batch, prepared.rows, prepared.data, prepared.offsets
        sizes, bases, gpu, host = list(prepared.sizes), list(prepared.bases), prepared.gpu, prepared.host
        bad = list(prepared.bad)
        position, host_start = prepared.needed, prepared.host_start
        flat, zero_base, graphed = self._allocate(len(rows), position)
        keep: Any = None
        waited = 0.0
        fallback = sum(1 for i in host if rows[i][2] != KIND_GPU or self.backend is not None)
        if gpu:
            assert self.backend is not None
            waited = self._wait_writable(graphed)
            extra: dict[str, Any] = {} if prepared.inputs is None else {"prepared": prepared.inputs}
            if prepared.submitted is not None:
                extra["submitted"] = prepared.submitted
            ok, keep = self.backend.decode(
                data, prepared.spans, [sizes[i] for i in gpu], flat, [bases[i] for i in gpu], **extra
            )
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
        return flat, zero_base, graphed, fallback, bad, keep, waited

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
                jpeg_util_percent=jpeg_utilisation(self.device),
                submit_cpu_seconds=telemetry.submit_cpu_s,
                backend=self.backend.name if self.backend is not None else "pil",
                prepare_seconds=telemetry.prepare_s,
                prepare_cpu_seconds=telemetry.prepare_cpu_s,
                barrier_seconds=telemetry.barrier_s,
                call_seconds=telemetry.call_s,
            )


_jpeg_utilisation = jpeg_utilisation  # the name benchmarks/decode_process_prototype.py imports
