"""The flat device buffer's slots, and what every decode path shares: spans, sizes, install extras, PIL's decode."""

from __future__ import annotations

import io
from collections.abc import Sequence

import torch

__all__ = ["EXTRA", "NVIMGCODEC_EXTRA", "NVJPEG_EXTRA", "Sizes", "Spans", "host_layout", "pil_decode", "slot_view"]

# the default backend's (torchvision's) extra, named in the import errors
EXTRA = "lightning-dataperf[gpu-decode]"
NVIMGCODEC_EXTRA = "lightning-dataperf[gpu-decode-nvimgcodec]"
NVJPEG_EXTRA = "lightning-dataperf[gpu-decode-nvjpeg]"
Spans = Sequence[tuple[int, int]]
Sizes = Sequence[tuple[int, int]]


def slot_view(flat: torch.Tensor, base: int, size: tuple[int, int], layout: str) -> torch.Tensor:
    """Sample's slot in ``flat`` as ``[3, H, W]`` (``chw``) or ``[H, W, 3]`` (``hwc``)."""
    h, w = size
    view = flat[base : base + 3 * h * w]
    return view.view(3, h, w) if layout == "chw" else view.view(h, w, 3)


def host_layout(image: torch.Tensor, layout: str) -> torch.Tensor:
    """``[H, W, 3]`` host pixels in ``layout``, contiguous."""
    return image.permute(2, 0, 1).contiguous() if layout == "chw" else image


def pil_decode(data: bytes) -> torch.Tensor:
    """``[H, W, 3]`` uint8 RGB via PIL (CMYK, grayscale, palette... converted)."""
    try:
        from PIL import Image
    except ImportError as error:
        raise ImportError("CPU decoding needs Pillow (pip install pillow)") from error
    with Image.open(io.BytesIO(data)) as image:
        rgb = image.convert("RGB")
    array = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8)
    return array.view(rgb.height, rgb.width, 3)
