"""Encoded JPEG batches decoded and augmented on the GPU, with their stats."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_dataperf._lazy import attach

__all__ = [
    "BackendBase",
    "DecodeBackend",
    "DecodeError",
    "DecodeStats",
    "EncodedImageDataset",
    "GpuDecodeLoader",
    "GpuDecodeOptions",
    "JpegDecoder",
    "SplitCollate",
    "collate_encoded",
]

if TYPE_CHECKING:
    from lightning_dataperf.decode.backend import BackendBase, DecodeBackend
    from lightning_dataperf.decode.decoder import DecodeError, JpegDecoder
    from lightning_dataperf.decode.encoded import EncodedImageDataset, collate_encoded
    from lightning_dataperf.decode.loader import GpuDecodeLoader
    from lightning_dataperf.decode.options import GpuDecodeOptions
    from lightning_dataperf.decode.split import SplitCollate
    from lightning_dataperf.decode.stats import DecodeStats

__getattr__, __dir__ = attach(
    __name__,
    {
        "BackendBase": "backend",
        "DecodeBackend": "backend",
        "DecodeError": "decoder",
        "JpegDecoder": "decoder",
        "GpuDecodeLoader": "loader",
        "GpuDecodeOptions": "options",
        "EncodedImageDataset": "encoded",
        "collate_encoded": "encoded",
        "DecodeStats": "stats",
        "SplitCollate": "split",
    },
)
