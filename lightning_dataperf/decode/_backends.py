"""Which decode library :class:`~lightning_dataperf.decode.decoder.JpegDecoder` uses: :func:`make_backend`."""

from __future__ import annotations

from typing import Any

import torch

from lightning_dataperf.decode._nvimgcodec import NvImageCodecBackend
from lightning_dataperf.decode._nvjpeg import NvJpegBackend
from lightning_dataperf.decode._slots import EXTRA, NVIMGCODEC_EXTRA
from lightning_dataperf.decode._torchvision import TorchvisionBackend

__all__ = ["BACKENDS", "make_backend"]

BACKENDS = ("auto", "nvimgcodec", "nvjpeg", "torchvision")


def make_backend(name: Any, device: torch.device, threads: int | None = None) -> Any:
    """The backend called ``name`` (``auto``: torchvision's CUDA decode if it imports, else nvImageCodec; the order
    measured end to end on an H200), or ``name`` itself if it is a backend object (``layout`` and
    ``decode(data, spans, sizes, flat, bases)``; optional: ``prepare(data, spans)``, whose result comes back as
    ``decode(..., prepared=...)``, and ``writes_at_call``: ``False`` where the decoder writes ``flat`` in
    stream order; otherwise the decoder waits on the host before each decode, ``JpegDecoder._wait_writable``)."""
    if hasattr(name, "decode") and hasattr(name, "layout"):
        return name
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {name!r}")
    if name == "nvimgcodec":
        return NvImageCodecBackend(device, threads)
    if name == "nvjpeg":
        return NvJpegBackend(device)
    if name == "torchvision":
        return TorchvisionBackend(device)
    try:
        return TorchvisionBackend(device)
    except ImportError as torchvision_error:
        try:
            return NvImageCodecBackend(device, threads)
        except ImportError as nvimgcodec_error:
            raise ImportError(
                f"GPU JPEG decoding needs a CUDA build of torchvision (pip install '{EXTRA}') or nvImageCodec "
                f"(pip install '{NVIMGCODEC_EXTRA}'): {torchvision_error}; {nvimgcodec_error}"
            ) from nvimgcodec_error
