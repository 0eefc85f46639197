"""The flat device buffer's slots, and what every decode backend shares: spans, sizes, install extras."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["EXTRA", "NVIMGCODEC_EXTRA", "NVJPEG_EXTRA", "Sizes", "Spans", "host_layout", "slot_view"]

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
