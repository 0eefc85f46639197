"""Which decode library :class:`~lightning_dataperf.decode.decoder.JpegDecoder` uses: :func:`make_backend`."""

from __future__ import annotations

from typing import Any

import torch

from lightning_dataperf.decode._nvimgcodec import NvImageCodecBackend
from lightning_dataperf.decode._nvjpeg import NvJpegBackend
from lightning_dataperf.decode._slots import EXTRA, NVIMGCODEC_EXTRA, NVJPEG_EXTRA
from lightning_dataperf.decode._torchvision import TorchvisionBackend

__all__ = ["BACKENDS", "make_backend"]

BACKENDS = ("auto", "nvimgcodec", "nvjpeg", "torchvision")


def make_backend(name: Any, device: torch.device, threads: int | None = None) -> Any:
    """The backend called ``name``, or ``name`` itself if it is a backend object (``layout`` and
    ``decode(data, spans, sizes, flat, bases)``; optional: ``prepare(data, spans)``, whose result comes back as
    ``decode(..., prepared=...)``, and ``writes_at_call``: ``False`` where the decoder writes ``flat`` in
    stream order; otherwise the decoder waits on the host before each decode, ``JpegDecoder._wait_writable``).

    ``auto``: the first that loads of torchvision's CUDA decode, nvJPEG called directly, nvImageCodec (the order
    of their rates in the decode path on an H200, benchmarks/README.md)."""
    if hasattr(name, "decode") and hasattr(name, "layout"):
        return name
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {name!r}")
    makers = {
        "torchvision": lambda: TorchvisionBackend(device),
        "nvjpeg": lambda: NvJpegBackend(device),
        "nvimgcodec": lambda: NvImageCodecBackend(device, threads),
    }
    if name != "auto":
        return makers[name]()
    errors = []
    for make in makers.values():
        try:
            return make()
        except ImportError as error:
            errors.append(str(error))
    raise ImportError(
        f"GPU JPEG decoding needs a CUDA build of torchvision (pip install '{EXTRA}'), libnvjpeg (pip install "
        f"'{NVJPEG_EXTRA}') or nvImageCodec (pip install '{NVIMGCODEC_EXTRA}'): {'; '.join(errors)}"
    )
