"""Which decode library :class:`~lightning_dataperf.decode.decoder.JpegDecoder` uses: :func:`make_backend`."""

from __future__ import annotations

from typing import Any

import torch

from lightning_dataperf.decode._nvimgcodec import NvImageCodecBackend
from lightning_dataperf.decode._nvjpeg import NvJpegBackend
from lightning_dataperf.decode._slots import EXTRA, NVIMGCODEC_EXTRA, NVJPEG_EXTRA
from lightning_dataperf.decode._torchvision import TorchvisionBackend
from lightning_dataperf.decode.backend import DecodeBackend, adopt_backend

__all__ = ["BACKENDS", "make_backend"]

BACKENDS = ("auto", "nvimgcodec", "nvjpeg", "torchvision")


def make_backend(name: str | Any, device: torch.device, threads: int | None = None) -> DecodeBackend:
    """The backend called ``name``, or ``name`` itself if it is a backend object: a
    :class:`~lightning_dataperf.decode.backend.DecodeBackend` (``layout`` and ``decode(data, spans, sizes, flat,
    bases)``; the optional members default as in :class:`~lightning_dataperf.decode.backend.BackendBase`), checked
    here with an error naming what it lacks.

    ``auto``: the first that loads of torchvision's CUDA decode, nvJPEG called directly, nvImageCodec (the order
    of their rates in the decode path on an H200, benchmarks/README.md)."""
    if not isinstance(name, str):
        return adopt_backend(name)
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {name!r}")
    makers: dict[str, Any] = {
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
