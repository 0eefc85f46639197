"""What an encoded image's header says (its decode path and size, without decoding) and the crop drawn from it."""

from __future__ import annotations

import io
import math
import random
import struct
from dataclasses import dataclass

__all__ = [
    "KIND_BAD",
    "KIND_CPU",
    "KIND_GPU",
    "ImageProbe",
    "center_crop_params",
    "probe_image",
    "random_resized_crop_params",
]

KIND_GPU, KIND_CPU, KIND_BAD = 0, 1, 2
_SOF_MARKERS = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


@dataclass(frozen=True)
class ImageProbe:
    """What the header says: decode path (``KIND_*``), size (0 if unknown) and why not the GPU."""

    kind: int
    height: int
    width: int
    reason: str = ""


def probe_image(data: bytes) -> ImageProbe:
    """Classify encoded image bytes and read their size from the header, without decoding.

    JPEG: walks the markers up to the first SOF (start of frame). PNG: the IHDR chunk. Anything else
    is offered to PIL's lazy ``Image.open`` (header only) when PIL is installed.
    """
    if len(data) == 0:
        return ImageProbe(KIND_BAD, 0, 0, "zero-byte file")
    if data[:2] == b"\xff\xd8":
        return _probe_jpeg(data)
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return ImageProbe(KIND_CPU, height, width, "PNG")
    try:
        from PIL import Image
    except ImportError:
        return ImageProbe(KIND_BAD, 0, 0, "not a JPEG or PNG (and PIL is not installed)")
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            name = image.format or "unknown format"
    except Exception as error:
        # any PIL failure means not an image we can read
        return ImageProbe(KIND_BAD, 0, 0, f"not a readable image ({type(error).__name__}: {error})")
    return ImageProbe(KIND_CPU, height, width, name)


def _probe_jpeg(data: bytes) -> ImageProbe:
    position, size, adobe = 2, len(data), False
    while position + 4 <= size:
        if data[position] != 0xFF:
            return ImageProbe(KIND_BAD, 0, 0, f"corrupt JPEG: no marker at byte {position}")
        marker = data[position + 1]
        # a fill byte
        if marker == 0xFF:
            position += 1
            continue
        position += 2
        # markers without a length
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:
            continue
        if marker in (0xD9, 0xDA):
            return ImageProbe(KIND_BAD, 0, 0, "corrupt JPEG: no frame header before the scan")
        (length,) = struct.unpack(">H", data[position : position + 2])
        # Adobe APP14 marks CMYK/YCCK colour transforms
        if marker == 0xEE:
            adobe = True
        if marker in _SOF_MARKERS:
            if position + 8 > size:
                break
            precision, height, width, components = struct.unpack(">BHHB", data[position + 2 : position + 8])
            return _jpeg_kind(data, marker, precision, height, width, components, adobe)
        position += length
    return ImageProbe(KIND_BAD, 0, 0, "truncated JPEG: no frame header")


def _jpeg_kind(
    data: bytes, marker: int, precision: int, height: int, width: int, comps: int, adobe: bool
) -> ImageProbe:
    if height == 0 or width == 0:
        return ImageProbe(KIND_CPU, height, width, "JPEG without height in the frame header (DNL)")
    if marker not in (0xC0, 0xC1):
        kind = "progressive" if marker == 0xC2 else f"SOF{marker - 0xC0}"
        return ImageProbe(KIND_CPU, height, width, f"{kind} JPEG")
    if precision != 8:
        return ImageProbe(KIND_CPU, height, width, f"{precision}-bit JPEG")
    if comps != 3:
        name = {1: "grayscale", 4: "CMYK/YCCK"}.get(comps, f"{comps}-component")
        return ImageProbe(KIND_CPU, height, width, f"{name} JPEG")
    # Adobe APP14 with three components may be RGB, not YCbCr
    if adobe:
        return ImageProbe(KIND_CPU, height, width, "Adobe (APP14) JPEG")
    if data[-2:] != b"\xff\xd9":
        return ImageProbe(KIND_CPU, height, width, "JPEG without end marker (truncated?)")
    return ImageProbe(KIND_GPU, height, width)


def random_resized_crop_params(
    rng: random.Random,
    height: int,
    width: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """``(top, left, h, w)`` as torchvision's ``RandomResizedCrop.get_params`` draws it, from ``rng``."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        h, w = height, round(height * max(ratio))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, max(h, 1), max(w, 1)


def center_crop_params(height: int, width: int, crop_fraction: float = 0.875) -> tuple[int, int, int, int]:
    """Evaluation box: the centre square of ``crop_fraction`` times the short side (Resize 256 + CenterCrop 224)."""
    side = max(1, round(min(height, width) * crop_fraction))
    return (height - side) // 2, (width - side) // 2, side, side
