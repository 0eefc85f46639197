"""Crop, bilinear resize, flip and normalise a batch of images of any sizes held in one flat buffer.

:func:`crop_resize_flip` is public through :mod:`lightning_dataperf.decode.decoder`; :func:`compiled_augment` fuses it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["augment_batch", "compiled_augment", "crop_resize_flip"]

_COMPILED: list[Callable[..., Any]] = []


def _axis(start: torch.Tensor, length: torch.Tensor, out: int, flip: torch.Tensor | None):
    """Source indices (absolute) and weights along one axis, as ``upsample_bilinear2d`` computes them."""
    scale = length.to(torch.float32) / out
    position = torch.arange(out, device=start.device, dtype=torch.float32).add_(0.5)
    # [B, out], clamped at 0 as upsample_bilinear2d does
    source = (position[None, :] * scale[:, None]).sub_(0.5).clamp_(min=0)
    first = source.floor()
    weight = source - first
    first = first.long()
    second = first + (first < (length - 1)[:, None]).long()
    if flip is not None:
        flipped = flip[:, None]
        first = torch.where(flipped, first.flip(1), first)
        second = torch.where(flipped, second.flip(1), second)
        weight = torch.where(flipped, weight.flip(1), weight)
    return first + start[:, None], second + start[:, None], weight


def crop_resize_flip(
    flat: torch.Tensor,
    bases: torch.Tensor,
    sizes: torch.Tensor,
    boxes: torch.Tensor,
    flips: torch.Tensor,
    size: int,
    compute_dtype: torch.dtype = torch.float32,
    layout: str = "chw",
) -> torch.Tensor:
    """Crop, bilinearly resize and flip a batch of images of any sizes held in one flat buffer.

    Args:
        flat: every image's uint8 pixels (``[3, H, W]`` for ``layout="chw"``, ``[H, W, 3]`` for ``"hwc"``),
            each at its base.
        bases: ``[B]`` where each image starts in ``flat``.
        sizes: ``[B, 2]`` height, width.
        boxes: ``[B, 4]`` crop top, left, height, width (source pixels).
        flips: ``[B]`` bool, flip horizontally after the resize.
        size: output side.
        compute_dtype: the interpolation's arithmetic (``float16`` halves the memory traffic; its
            rounding, about 0.1 of a level, is below a bfloat16 output's).
        layout: ``"chw"`` (planar) or ``"hwc"`` (interleaved) images in ``flat``.

    Returns:
        ``[B, size, size, 3]`` in ``compute_dtype``, 0..255 (channels last), equal to ``F.interpolate`` of each crop
        (bilinear, ``align_corners=False``, no antialias), then flipped.

    Example::

        pixels = crop_resize_flip(flat, bases, sizes, boxes, flips, 224, layout="hwc")  # [B, 224, 224, 3]
    """
    if layout not in ("chw", "hwc"):
        raise ValueError(f"layout must be 'chw' or 'hwc', not {layout!r}")
    top, left, box_h, box_w = boxes.unbind(1)
    heights, widths = sizes[:, 0], sizes[:, 1]
    y0, y1, wy = _axis(top, box_h, size, None)
    x0, x1, wx = _axis(left, box_w, size, flips)
    channels = torch.arange(3, device=flat.device)
    if layout == "chw":
        # [B, 3]: each channel's plane starts one image area after the last
        channel = bases[:, None] + (heights * widths)[:, None] * channels
        row_stride = widths[:, None]
    else:
        channel = bases[:, None] + channels
        row_stride = 3 * widths[:, None]
        x0, x1 = x0 * 3, x1 * 3
    row0 = (y0 * row_stride)[:, :, None, None]
    row1 = (y1 * row_stride)[:, :, None, None]
    col0, col1 = x0[:, None, :, None], x1[:, None, :, None]
    # [B, 1, 1, 3], to broadcast against rows [B, out, 1, 1] and columns [B, 1, out, 1]
    base = channel[:, None, None, :]
    top_row = base + row0
    bottom_row = base + row1
    wx = wx[:, None, :, None].to(compute_dtype)
    upper = flat[top_row + col0].to(compute_dtype).lerp_(flat[top_row + col1].to(compute_dtype), wx)
    lower = flat[bottom_row + col0].to(compute_dtype).lerp_(flat[bottom_row + col1].to(compute_dtype), wx)
    return upper.lerp_(lower, wy[:, :, None, None].to(compute_dtype))


def augment_batch(
    flat: torch.Tensor,
    table: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    size: int,
    compute_dtype: torch.dtype,
    layout: str,
    dtype: torch.dtype,
    channels_last: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images, labels)`` of a batch from its flat pixels and its ``[B, 9]`` device table (base, height,
    width, crop top, left, height, width, flip, label): cropped, resized, flipped, then ``x * scale + shift``
    per channel in ``dtype`` (``torch.uint8``: rounded pixels), NCHW (channels-last strides if asked)."""
    pixels = crop_resize_flip(
        flat, table[:, 0], table[:, 1:3], table[:, 3:7], table[:, 7].bool(), size, compute_dtype, layout
    )
    # in place, since full-size temporaries would stay in a CUDA graph's pool
    if dtype == torch.uint8:
        out = pixels.round_().clamp_(0, 255).to(torch.uint8)
    else:
        out = pixels.float().mul_(scale).add_(shift).to(dtype)
    # an NCHW view with channels-last strides, so no copy
    out = out.permute(0, 3, 1, 2)
    return (out if channels_last else out.contiguous()), table[:, 8].contiguous()


def compiled_augment() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """:func:`augment_batch` through ``torch.compile``, one per process (for the CUDA-graph path, whose
    buffers keep their sizes; a second size makes that dimension dynamic, so it compiles at most twice).
    Compiling happens at the first call (seconds; raises if Triton or a compiler is missing: the caller
    falls back to :func:`augment_batch`)."""
    if not _COMPILED:
        _COMPILED.append(torch.compile(augment_batch, fullgraph=True))
    return _COMPILED[0]
