"""The host half of :class:`~lightning_dataperf.decode.decoder.JpegDecoder`, its CPU (PIL) decode and DecodeError."""

from __future__ import annotations

import time

import torch

from lightning_dataperf.decode._slots import pil_decode
from lightning_dataperf.decode._state import PreparedBatch
from lightning_dataperf.decode.backend import DecodeBackend
from lightning_dataperf.decode.encoded import EncodedBatch
from lightning_dataperf.decode.headers import KIND_BAD, KIND_GPU
from lightning_dataperf.decode.split import CpuDecoder, share_count, split_on_host

__all__ = ["DecodeError", "HostStages", "pil_decode"]


class DecodeError(RuntimeError):
    """A sample that neither the GPU nor the CPU can decode (names its dataset index and path)."""


class HostStages:
    """What :class:`~lightning_dataperf.decode.decoder.JpegDecoder` does before the device half of a batch.

    :meth:`prepare` (host only) and :meth:`submit` (the decode library's call, where it can run apart);
    :class:`GpuDecodeLoader` runs each in a thread of its own.
    """

    backend: DecodeBackend | None
    on_error: str
    size: int
    #: The share of each batch the device path decodes; the rest comes decoded from the workers (split decode).
    gpu_share: float
    cpu_decoder: str | CpuDecoder
    _cuda: bool

    def prepare(self, batch: EncodedBatch) -> PreparedBatch:
        """The host-only half of a batch (no CUDA work is queued): the per-sample rows, the byte views,
        the layout of the flat buffer, the pinned per-sample table, the backend's own inputs, and the CPU
        decodes of the samples the header sent to the CPU. :class:`GpuDecodeLoader` runs it in a thread of
        its own, so the decode thread only decodes and augments.

        Split decode: the samples a worker decoded (``batch.pixels``: cropped, resized and flipped already) take
        slots of their own after the others, with a table row that copies them through the augment unchanged (the
        whole ``size`` square, no flip), so the same augment normalises them and the batch comes out in its order;
        where no worker split a batch and ``gpu_share < 1``, the split is made here."""
        started, cpu_started = time.perf_counter(), time.thread_time()
        share = self.gpu_share
        if batch.pixels is None and share < 1 and share_count(share, len(batch)):
            batch = split_on_host(batch.to("cpu"), share, self.size, self.cpu_decoder)
        meta = batch.meta if batch.meta.device.type == "cpu" else batch.meta.cpu()
        rows = meta.tolist()
        data = batch.data if batch.data.device.type == "cpu" else batch.data.cpu()
        offsets = batch.offsets.tolist()
        count = len(rows)
        sizes = [(row[3], row[4]) for row in rows]
        # room for every sample at its header's size, whatever the share (a CUDA graph's buffer is sized once)
        reserve = 3 * sum(h * w for h, w in sizes)
        positions = [] if batch.positions is None else batch.positions.tolist()
        ready = set(positions)
        gpu = (
            [i for i, row in enumerate(rows) if row[2] == KIND_GPU and i not in ready]
            if self.backend is not None
            else []
        )
        on_gpu = set(gpu)
        host: dict[int, torch.Tensor] = {}
        bad: list[int] = []
        for i in range(count):
            if i not in on_gpu and i not in ready:
                self._host_decode(batch, data, offsets, rows, i, host, bad)
        bases, position = [0] * count, 0
        for i in gpu:
            bases[i] = position
            position += 3 * sizes[i][0] * sizes[i][1]
        host_start = position
        for i, image in host.items():
            sizes[i], bases[i] = (image.shape[0], image.shape[1]), position
            position += image.numel()
        share_start, side = position, self.size
        for i in positions:
            # cropped, resized and flipped in the worker: the gather copies the whole square at scale 1
            sizes[i], bases[i], rows[i][5:10] = (side, side), position, [0, 0, side, side, 0]
            position += 3 * side * side
        spans = [(offsets[i], offsets[i + 1]) for i in gpu]
        inputs = self.backend.prepare(data, spans) if gpu and self.backend is not None else None
        prepared = PreparedBatch(
            batch, rows, data, offsets, sizes, gpu, host, bad, bases, position, host_start, spans, inputs
        )
        prepared.reserve, prepared.share_start = max(reserve, position), share_start
        if positions:
            assert batch.pixels is not None
            prepared.pixels = self._pinned(batch.pixels.cpu())
        # the table is final unless a sample turns out undecodable on the GPU
        if count and not bad:
            prepared.table = self._table(prepared, 0, bad)
        prepared.seconds = time.perf_counter() - started
        prepared.cpu_seconds = time.thread_time() - cpu_started
        return prepared

    @property
    def can_submit(self) -> bool:
        """Can the decode call run apart from :meth:`run` (:meth:`submit`)? Where the backend decodes into
        buffers of its own and has a ``submit`` (torchvision's nvJPEG), not where it decodes into the flat buffer."""
        return self.backend is not None and self.backend.can_submit and self.backend.ordered

    def submit(self, prepared: PreparedBatch) -> PreparedBatch:
        """The decode library's call for a prepared batch, where :attr:`can_submit` (else nothing): what it returns
        goes with the batch to :meth:`run`, which then only copies it into the flat buffer and augments.
        :class:`GpuDecodeLoader` calls it in a thread of its own, so one batch's call (the GIL released) overlaps
        the previous batch's copy and augment and the next one's preparation."""
        if prepared.gpu and self.can_submit:
            started = time.perf_counter()
            parts = prepared.inputs if prepared.inputs is not None else [prepared.data[a:b] for a, b in prepared.spans]
            assert self.backend is not None
            prepared.submitted = self.backend.submit(parts)
            prepared.call_seconds = time.perf_counter() - started
        return prepared

    def _table(self, prepared: PreparedBatch, zero_base: int, undecodable: list[int]) -> torch.Tensor:
        """The pinned ``[B, 9]`` per-sample table (base, height, width, crop box, flip, label); the
        undecodable samples read the zero pixel at ``zero_base``."""
        bad = set(undecodable)
        table = [
            (zero_base, 1, 1, 0, 0, 1, 1, row[9], row[0]) if i in bad else (base, h, w, *row[5:10], row[0])
            for i, (row, base, (h, w)) in enumerate(zip(prepared.rows, prepared.bases, prepared.sizes, strict=True))
        ]  # fmt: skip
        return self._pinned(torch.tensor(table, dtype=torch.int64))

    def _pinned(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.pin_memory() if self._cuda else tensor

    def _host_decode(self, batch, data, offsets, rows, i, out, bad) -> None:
        """PIL decode of sample ``i`` into ``out[i]`` (``[H, W, 3]``), or mark it bad / raise."""
        reason = batch.reasons[i] if i < len(batch.reasons) else ""
        if rows[i][2] != KIND_BAD:
            try:
                out[i] = pil_decode(data[offsets[i] : offsets[i + 1]].numpy().tobytes())
                return
            except Exception as error:
                # the CPU cannot decode it either
                reason = f"{type(error).__name__}: {error}"
        self._fail(batch, i, reason, bad)

    def _fail(self, batch: EncodedBatch, i: int, reason: str, bad: list[int]) -> None:
        if self.on_error == "raise":
            index = int(batch.meta[i, 1])
            path = batch.paths[i] if i < len(batch.paths) else "?"
            raise DecodeError(f"cannot decode dataset index {index} ({path}): {reason or 'undecodable'}")
        bad.append(i)
