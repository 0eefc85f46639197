"""A decoder's running state: its telemetry, a batch prepared on the host, the JPEG engines' utilisation."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import torch

__all__ = ["PreparedBatch", "Telemetry", "jpeg_utilisation"]


class Telemetry:
    """A decoder's running totals (under ``lock``) and the CUDA events of batches not read back yet."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches = self.images = self.cpu_fallback = self.undecodable = 0
        self.decode_s = self.submit_s = self.submit_cpu_s = self.wait_s = 0.0
        self.prepare_s = self.prepare_cpu_s = self.barrier_s = self.call_s = 0.0
        # images of the split's CPU share (decoded in the workers, or in the prepare thread)
        self.cpu_share = 0
        self.depth_sum = self.depth_n = 0
        self.pending: deque[tuple[torch.cuda.Event, torch.cuda.Event, int]] = deque()

    def drain(self) -> None:
        while self.pending and self.pending[0][1].query():
            start, end, _ = self.pending.popleft()
            self.decode_s += start.elapsed_time(end) / 1e3


class PreparedBatch:
    """What :meth:`JpegDecoder.prepare` made of a batch on the host, for :meth:`JpegDecoder.run`."""

    __slots__ = (
        "bad", "bases", "batch", "call_seconds", "cpu_seconds", "data", "gpu", "host", "host_start", "inputs",
        "needed", "offsets", "pixels", "reserve", "rows", "seconds", "share_start", "sizes", "spans", "submitted",
        "table",
    )  # fmt: skip

    def __init__(self, batch, rows, data, offsets, sizes, gpu, host, bad, bases, needed, host_start, spans, inputs):
        self.batch, self.rows, self.data, self.offsets = batch, rows, data, offsets
        self.sizes, self.gpu, self.host, self.bad, self.bases = sizes, gpu, host, bad, bases
        self.needed, self.host_start, self.spans, self.inputs = needed, host_start, spans, inputs
        self.table: torch.Tensor | None = None
        # what the backend's submit returned (JpegDecoder.submit), if it ran
        self.submitted: Any = None
        # split decode: the CPU share's pixels (pinned on CUDA), copied to flat[share_start:needed]
        self.pixels: torch.Tensor | None = None
        self.share_start = needed
        # the flat buffer's bytes were every sample decoded at its header's size (a CUDA graph's buffer is sized by it)
        self.reserve = needed
        self.seconds = self.cpu_seconds = self.call_seconds = 0.0

    def __len__(self) -> int:
        return len(self.rows)


def jpeg_utilisation(device: torch.device) -> float | None:
    """NVML JPEG-engine utilisation (%) of ``device`` (by its UUID); ``None`` where NVML or the engine is missing."""
    if device.type != "cuda":
        return None
    try:
        import pynvml

        from lightning_dataperf.telemetry.sources import nvml_handle

        pynvml.nvmlInit()
        handle = nvml_handle(pynvml, device.index if device.index is not None else torch.cuda.current_device())
        return float(pynvml.nvmlDeviceGetJpgUtilization(handle)[0])
    except Exception:
        # no NVML, no JPEG engine, or an old driver
        return None
