"""Hand-made image files for the JPEG-batch tests (PIL where installed)."""

from __future__ import annotations

import io
import os

import torch


def smooth_pixels(height: int, width: int, seed: int) -> torch.Tensor:
    """``[H, W, 3]`` uint8: low-frequency colour + a little noise (decoders agree closely on these)."""
    generator = torch.Generator().manual_seed(seed)
    low = torch.rand(1, 3, max(2, height // 16), max(2, width // 16), generator=generator) * 255
    base = torch.nn.functional.interpolate(low, size=(height, width), mode="bilinear", align_corners=False)[0]
    noise = torch.randn(3, height, width, generator=generator) * 4
    return (base + noise).clamp(0, 255).to(torch.uint8).permute(1, 2, 0).contiguous()


def encode(pixels: torch.Tensor, mode: str = "RGB", fmt: str = "JPEG", **options) -> bytes:
    from PIL import Image

    image = Image.fromarray(pixels.numpy())
    if mode != "RGB":
        image = image.convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, quality=options.pop("quality", 92), **options) if fmt == "JPEG" else image.save(
        buffer, format=fmt, **options
    )
    return buffer.getvalue()


def write_files(root: str, count: int, sizes=((96, 128), (120, 80), (64, 64), (150, 110))) -> list[tuple[str, int]]:
    """``count`` baseline RGB JPEGs of varied sizes; returns ``(path, label)``."""
    os.makedirs(root, exist_ok=True)
    samples = []
    for i in range(count):
        height, width = sizes[i % len(sizes)]
        path = os.path.join(root, f"{i:04d}.jpg")
        with open(path, "wb") as file:
            file.write(encode(smooth_pixels(height, width, i)))
        samples.append((path, i % 5))
    return samples


def odd_files(root: str) -> dict[str, str]:
    """One file of each kind that must not take the batched nvJPEG path."""
    os.makedirs(root, exist_ok=True)
    pixels = smooth_pixels(72, 90, 99)
    contents = {
        "progressive": encode(pixels, progressive=True),
        "grayscale": encode(pixels, mode="L"),
        "cmyk": encode(pixels, mode="CMYK"),
        "png": encode(pixels, fmt="PNG"),
        "truncated": encode(pixels)[:-600],
        "zero": b"",
        "garbage": b"this is not an image at all" * 10,
    }
    paths = {}
    for name, data in contents.items():
        paths[name] = os.path.join(root, f"{name}.img")
        with open(paths[name], "wb") as file:
            file.write(data)
    return paths


def reference(data: bytes, box, flip: bool, size: int) -> torch.Tensor:
    """PIL decode + ``F.interpolate`` of the crop (bilinear, no antialias) + flip: ``[3, size, size]`` float 0..255."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        rgb = torch.from_numpy(__import__("numpy").asarray(image.convert("RGB")).copy()).permute(2, 0, 1)
    top, left, height, width = box
    crop = rgb[None, :, top : top + height, left : left + width].float()
    out = torch.nn.functional.interpolate(crop, size=(size, size), mode="bilinear", align_corners=False)[0]
    return out.flip(-1) if flip else out
