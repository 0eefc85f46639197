"""A decoder's running state: its telemetry, a batch prepared on the host, the JPEG engines' utilisation."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["CpuPart", "PreparedBatch", "Telemetry", "jpeg_utilisation"]


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


@dataclass(frozen=True)
class CpuPart:
    """The CPU's share of a split batch (host tensors, pinned on CUDA): its ``[k, size, size, 3]`` uint8 ``pixels``,
    their ``positions`` in the batch, the positions of the ``rest`` (the device path's), every sample's label."""

    pixels: torch.Tensor
    positions: torch.Tensor
    rest: torch.Tensor
    labels: torch.Tensor


class PreparedBatch:
    """What :meth:`JpegDecoder.prepare` made of a batch on the host, for :meth:`JpegDecoder.run`."""

    __slots__ = (
        "bad", "bases", "batch", "call_seconds", "cpu_part", "cpu_seconds", "data", "gpu", "host", "host_start",
        "inputs", "needed", "offsets", "rows", "seconds", "sizes", "spans", "submitted", "table",
    )  # fmt: skip

    def __init__(self, batch, rows, data, offsets, sizes, gpu, host, bad, bases, needed, host_start, spans, inputs):
        self.batch, self.rows, self.data, self.offsets = batch, rows, data, offsets
        self.sizes, self.gpu, self.host, self.bad, self.bases = sizes, gpu, host, bad, bases
        self.needed, self.host_start, self.spans, self.inputs = needed, host_start, spans, inputs
        self.table: torch.Tensor | None = None
        # what the backend's submit returned (JpegDecoder.submit), if it ran
        self.submitted: Any = None
        # split decode: the share the workers decoded, assembled with the rest by JpegDecoder.run
        self.cpu_part: CpuPart | None = None
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
