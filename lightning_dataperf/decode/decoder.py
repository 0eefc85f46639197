"""Decode and augment an :class:`~lightning_dataperf.decode.encoded.EncodedBatch` on the GPU: :class:`JpegDecoder`."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

from lightning_dataperf.decode._backends import make_backend
from lightning_dataperf.decode._gather import augment_batch, compiled_augment, crop_resize_flip
from lightning_dataperf.decode._graph import GraphedAugment
from lightning_dataperf.decode._prepare import DecodeError, HostStages
from lightning_dataperf.decode._slots import host_layout, slot_view
from lightning_dataperf.decode._state import PreparedBatch, Telemetry, jpeg_utilisation
from lightning_dataperf.decode.backend import DecodeBackend
from lightning_dataperf.decode.encoded import EncodedBatch
from lightning_dataperf.decode.headers import KIND_GPU
from lightning_dataperf.decode.split import CPU_DECODERS, CpuDecoder, check_share
from lightning_dataperf.decode.stats import DecodeStats

__all__ = ["DecodeError", "DecodeStats", "JpegDecoder", "crop_resize_flip"]

# columns of the per-sample table: base, height, width, crop top, left, height, width, flip, label
_TABLE_COLUMNS = 9
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_EXTRA = "lightning-dataperf[gpu-decode]"
_log = logging.getLogger(__name__)


class JpegDecoder(HostStages):
    """Decodes and augments one :class:`EncodedBatch` into ``(images, labels)`` on ``device``.

    Args:
        device: ``"cuda"``/``"cuda:N"`` (nvJPEG) or ``"cpu"`` (PIL).
        size: output side (RandomResizedCrop / centre crop boxes come with the batch).
        dtype: output dtype (e.g. ``torch.bfloat16``); ``torch.uint8`` skips normalisation.
        channels_last: return NCHW with channels-last strides (free here), else contiguous NCHW.
        mean, std: normalisation in 0..1 units.
        on_error: ``"raise"`` a :class:`DecodeError` naming index and path for an undecodable sample,
            or ``"zeros"``: an all-zero image (after normalisation), counted as ``Decode/undecodable``.
        backend: ``"auto"`` (torchvision's CUDA decode if it imports, else nvJPEG directly, else nvImageCodec),
            ``"torchvision"``, ``"nvjpeg"`` or ``"nvimgcodec"`` (ignored on CPU), or a backend object (see
            ``_backends.make_backend``).
        decode_threads: nvImageCodec's CPU thread pool (default ``min(4, cores)``).
        graph_augment: on CUDA, run the augment as one CUDA graph (:mod:`._graph`; eager if
            the capture fails, and for a batch of another size).
        compile_augment: in that graph, the augment compiled by ``torch.compile`` (fused gathers: about a
            tenth of its GPU time, left to the JPEG engines and the step); compiled at the first batch, in the
            calling thread (:class:`GpuDecodeLoader` decodes each epoch's first batch there: PyTorch's compile
            stack is not thread-safe), seconds the first time; uncompiled (with a warning) where Triton or the
            compile is not available.
        gpu_share: split decode, the share of each batch's images this decoder decodes, in [0, 1]; the rest come
            decoded by the loader's workers (:class:`~lightning_dataperf.decode.split.SplitCollate`, installed by
            :class:`GpuDecodeLoader`), or, in a batch no worker split, are decoded on the CPU in :meth:`prepare`.
            ``1`` (the default): all of them; ``0``: the CPU decodes everything and this decoder normalises.
        cpu_decoder: the CPU share's JPEG decoder: ``"auto"`` (torchvision's libjpeg-turbo decode where torchvision
            imports, else PIL), ``"pil"``, ``"torchvision"`` or a callable ``bytes -> [H, W, 3] uint8``.

    Calls on CUDA run on the current stream; :class:`GpuDecodeLoader` calls it in the calling thread for each
    epoch's first batch, then in its background threads.

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
        backend: str | DecodeBackend = "auto",
        decode_threads: int | None = None,
        graph_augment: bool = True,
        compile_augment: bool = True,
        gpu_share: float = 1.0,
        cpu_decoder: str | CpuDecoder = "auto",
    ) -> None:
        if on_error not in ("raise", "zeros"):
            raise ValueError(f"on_error must be 'raise' or 'zeros', not {on_error!r}")
        self.gpu_share = check_share(gpu_share)
        if isinstance(cpu_decoder, str) and cpu_decoder not in CPU_DECODERS:
            raise ValueError(f"cpu_decoder must be one of {CPU_DECODERS} or a callable, not {cpu_decoder!r}")
        self.cpu_decoder = cpu_decoder
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.size, self.dtype, self.channels_last, self.on_error = size, dtype, channels_last, on_error
        scale = torch.tensor([1 / (255 * s) for s in std], dtype=torch.float32)
        self._scale = scale.to(self.device)
        self._shift = (-torch.tensor(mean, dtype=torch.float32) / torch.tensor(std)).to(self.device)
        self._cuda = self.device.type == "cuda"
        custom = not isinstance(backend, str)
        self.backend: DecodeBackend | None = None
        if self._cuda or custom:
            self.backend = make_backend(backend, self.device, decode_threads)
        self.layout = self.backend.layout if self.backend is not None else "hwc"
        self.graph_augment = graph_augment and self._cuda
        self.compile_augment = compile_augment and self.graph_augment
        #: Wait on the host before each GPU decode (:meth:`_wait_writable`): the backend writes at call time.
        self.host_barrier = self._cuda and self.backend is not None and self.backend.writes_at_call
        self._graphs: list[GraphedAugment | None] = [None] * (2 if self.host_barrier else 1)
        self._turn = 0
        self.telemetry = Telemetry()
        self._keep: deque[tuple[torch.cuda.Event, Any]] = deque()
        self._warned = False

    def __call__(self, batch: EncodedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode and augment ``batch``: :meth:`prepare` then :meth:`run`, in the calling thread."""
        return self.run(self.prepare(batch))

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
                # the next hardware decode into its buffer waits for this
                graphed.readers_done = self._record()
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
            telemetry.cpu_share += 0 if prepared.pixels is None else len(prepared.pixels)
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
        """Replay ``graphed`` for this batch; at the first batch, capture every graph (one thread, one time)."""
        if self.compile_augment:
            try:
                out = graphed.run(table, self._fused)
                self._capture_rest(self._fused)
                return out
            except Exception as error:
                # no Triton or compiler, or the compiled code cannot be captured
                self.compile_augment = False
                _log.warning(
                    "torch.compile of the GPU augment failed (%s); using the uncompiled augment "
                    "(compile_augment=False skips the attempt)",
                    error,
                )
        try:
            out = graphed.run(table, self._augment)
            self._capture_rest(self._augment)
            return out
        except Exception:
            # the capture failed: eager from now on, from the static buffers that hold this batch
            self._graphs, self.graph_augment = [None] * len(self._graphs), False
            return self._augment(graphed.flat, graphed.table)

    def _capture_rest(self, augment: Callable[..., Any]) -> None:
        for other in self._graphs:
            if other is not None:
                other.capture(augment)

    def _allocate(self, count: int, needed: int, reserve: int) -> tuple[torch.Tensor, int, GraphedAugment | None]:
        """The flat buffer (``needed`` bytes and a zero pixel), where the zero pixel is, and the graph using it.

        Graphs take turns (two where the decoder writes at call time, see :attr:`host_barrier`): the host
        barrier before a decode into one graph's buffer then waits for the batch before last, long done.
        Every graph is made and captured at the first full batch (:meth:`_replay`), with half as much room
        again: a capture later in the run could overlap a CUDA-graph recording of a compiled training step in
        the main thread, whose ``torch.cuda.synchronize`` fails while any stream captures (seen on the H200,
        issue 38). A batch that does not fit is augmented eagerly instead. The room is counted from ``reserve``
        (every sample at its header's size), so a split batch's smaller CPU share does not size the buffer for
        that share only: another ``gpu_share`` later still fits."""
        if self.graph_augment and self._cuda and count:
            if self._graphs[0] is None:
                capacity = max(needed, reserve) * 3 // 2 + 3
                self._graphs = [GraphedAugment(count, capacity, _TABLE_COLUMNS, self.device) for _ in self._graphs]
            graphed = self._graphs[self._turn % len(self._graphs)]
            assert graphed is not None
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
        # releases the GIL while it waits
        event.synchronize()
        return time.perf_counter() - started

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._pinned(tensor).to(self.device, non_blocking=True) if self._cuda else tensor

    def _decode(self, prepared: PreparedBatch):
        """Every sample into one flat device buffer (GPU-decoded slots first, then host-decoded ones,
        a zero pixel for the undecodable): ``(flat, zero base, graph, cpu fallbacks, bad, keep-alive,
        seconds of host barrier)``."""
        batch, rows, data, offsets = prepared.batch, prepared.rows, prepared.data, prepared.offsets
        sizes, bases, gpu, host = list(prepared.sizes), list(prepared.bases), prepared.gpu, prepared.host
        bad = list(prepared.bad)
        position, host_start, share_start = prepared.needed, prepared.host_start, prepared.share_start
        flat, zero_base, graphed = self._allocate(len(rows), position, prepared.reserve)
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
            flat[host_start:share_start].copy_(self._pinned(joined), non_blocking=True)
        if prepared.pixels is not None:
            self._copy_share(flat[share_start:position], prepared.pixels)
        return flat, zero_base, graphed, fallback, bad, keep, waited

    def _copy_share(self, slots: torch.Tensor, pixels: torch.Tensor) -> None:
        """The CPU share's ``[k, size, size, 3]`` uint8 pixels into their slots: one copy (pinned, non-blocking) for
        interleaved slots; for planar ones, to the device first and transposed there, not on the host."""
        count, side = len(pixels), self.size
        if self.layout == "hwc":
            slots.view(count, side, side, 3).copy_(pixels, non_blocking=True)
        else:
            staged = pixels.to(self.device, non_blocking=True)
            slots.view(count, 3, side, side).copy_(staged.permute(0, 3, 1, 2))

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
                cpu_share=telemetry.cpu_share,
            )


# the name benchmarks/decode_process_prototype.py imports
_jpeg_utilisation = jpeg_utilisation
