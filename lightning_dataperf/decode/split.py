"""Split decode (issue 46): part of each batch decoded on the CPU in the loader's workers, the rest by the GPU path.

:class:`SplitCollate` is the workers' half; ``JpegDecoder`` augments both in the sampler's order (docs/gpu_decode.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.functional import interpolate

from lightning_dataperf.decode._slots import pil_decode
from lightning_dataperf.decode.encoded import EncodedBatch, collate_encoded
from lightning_dataperf.decode.headers import KIND_CPU, KIND_GPU

__all__ = [
    "CPU_DECODERS",
    "CpuDecoder",
    "SplitCollate",
    "check_share",
    "cpu_share",
    "crop_resize",
    "resolve_cpu_decoder",
    "share_count",
    "split_on_host",
]

#: ``bytes`` of one image -> its ``[H, W, 3]`` uint8 RGB pixels (a view is fine).
CpuDecoder = Callable[[bytes], torch.Tensor]
CPU_DECODERS = ("auto", "pil", "torchvision")
# per process (each worker resolves its own, at its first split batch)
_RESOLVED: dict[str, CpuDecoder] = {}


def check_share(share: Any) -> float:
    """``share`` as a float in [0, 1], or a ValueError saying what it means."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= float(share) <= 1.0:
        raise ValueError(
            f"gpu_share must be a number in [0, 1] (the share of each batch's images the GPU decodes: 0 = CPU "
            f"workers only, 1 = GPU only), not {share!r}"
        )
    return float(share)


def share_count(share: float, count: int) -> int:
    """How many of a batch's ``count`` images the CPU decodes at ``gpu_share=share``."""
    return round((1.0 - share) * count)


def _torchvision_decoder() -> CpuDecoder:
    from torchvision.io import ImageReadMode, decode_jpeg

    def decode(data: bytes) -> torch.Tensor:
        # bytearray: decode_jpeg wants a writable tensor
        encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return decode_jpeg(encoded, mode=ImageReadMode.RGB).permute(1, 2, 0)

    return decode


def resolve_cpu_decoder(choice: str | CpuDecoder = "auto") -> CpuDecoder:
    """The CPU JPEG decoder ``choice`` names: ``"auto"`` is ``torchvision.io.decode_jpeg`` (libjpeg-turbo) where
    torchvision imports, else PIL (Pillow bundles libjpeg-turbo too); ``"pil"``, ``"torchvision"``, or your own
    callable. Resolved once per process, at the first batch that needs it (in the worker)."""
    if callable(choice):
        return choice
    if choice not in CPU_DECODERS:
        raise ValueError(f"cpu_decoder must be one of {CPU_DECODERS} or a callable bytes -> [H, W, 3], not {choice!r}")
    if choice not in _RESOLVED:
        if choice == "pil":
            _RESOLVED[choice] = pil_decode
        elif choice == "torchvision":
            try:
                _RESOLVED[choice] = _torchvision_decoder()
            except Exception as error:
                # a torchvision built for another torch fails with more than an ImportError
                message = f"cpu_decoder='torchvision' needs torchvision matching your torch: {error}"
                raise ImportError(message) from error
        else:
            try:
                _RESOLVED[choice] = _torchvision_decoder()
            except Exception:
                # no (working) torchvision: Pillow is always there
                _RESOLVED[choice] = pil_decode
    return _RESOLVED[choice]


def crop_resize(image: torch.Tensor, box: Sequence[int], flip: bool, size: int) -> torch.Tensor:
    """``image``'s crop ``box`` (top, left, height, width), bilinearly resized to ``size`` (``align_corners=False``,
    no antialias: the GPU gather's arithmetic, in PyTorch's uint8 kernel, within one level of 255) and flipped:
    ``[size, size, 3]`` uint8."""
    top, left, height, width = (int(value) for value in box)
    # NCHW with channels-last strides: PyTorch's vectorised uint8 bilinear kernel
    crop = image[top : top + height, left : left + width].permute(2, 0, 1)[None]
    crop = crop.contiguous(memory_format=torch.channels_last)
    out = interpolate(crop, size=(size, size), mode="bilinear", align_corners=False, antialias=False)
    if flip:
        out = out.flip(-1)
    return out[0].permute(1, 2, 0)


def cpu_share(
    kinds: Sequence[int],
    blob: Callable[[int], bytes],
    rows: Sequence[Sequence[int]],
    share: float,
    size: int,
    decoder: str | CpuDecoder,
) -> tuple[torch.Tensor, list[int]]:
    """Decode, crop, resize and flip the CPU's share of a batch: ``(pixels [k, size, size, 3] uint8, positions)``.

    The share's images: those the header sends to the CPU anyway, then the first of the others, in batch order.
    ``rows[i]`` is ``(height, width, top, left, box height, box width, flip)``. An image that fails here (or whose
    decoded size differs from its header) stays out of the share: the decoder then handles it as before (its
    ``on_error``)."""
    wanted = share_count(share, len(kinds))
    order = [i for i, kind in enumerate(kinds) if kind == KIND_CPU] + [
        i for i, kind in enumerate(kinds) if kind == KIND_GPU
    ]
    chosen = sorted(order[:wanted])
    decode = resolve_cpu_decoder(decoder)
    pixels = torch.empty(len(chosen), size, size, 3, dtype=torch.uint8)
    done: list[int] = []
    for i in chosen:
        height, width, *box, flip = rows[i]
        try:
            data = blob(i)
            image = decode(data) if kinds[i] == KIND_GPU else pil_decode(data)
        except Exception:
            # left to the decoder, which raises or zeros it as on_error says
            continue
        if tuple(image.shape) != (height, width, 3):
            continue
        pixels[len(done)] = crop_resize(image, box, bool(flip), size)
        done.append(i)
    return pixels[: len(done)], done


@dataclass(frozen=True)
class SplitCollate:
    """``collate_encoded`` that also decodes ``1 - gpu_share`` of the batch on the CPU (in the worker).

    The decoded images' bytes are left out of the batch (they need no copy), their pixels ride along as
    ``EncodedBatch.pixels`` (uint8, normalised later on the GPU) with ``positions``. :class:`GpuDecodeLoader`
    installs one on the loader it wraps (``set_gpu_share``); a worker started before keeps the one it got.

    Args:
        gpu_share: the share of each batch the GPU path decodes, in [0, 1].
        size: the output side (the decoder's).
        cpu_decoder: see :func:`resolve_cpu_decoder`.

    Example::

        loader = DataLoader(dataset, batch_size=128, num_workers=8, collate_fn=SplitCollate(0.5, size=224))
    """

    gpu_share: float = 1.0
    size: int = 224
    cpu_decoder: str | CpuDecoder = "auto"

    def __post_init__(self) -> None:
        check_share(self.gpu_share)

    def __call__(self, samples: Sequence[Any]) -> EncodedBatch:
        if not share_count(self.gpu_share, len(samples)):
            return collate_encoded(samples)
        kinds = [sample.kind for sample in samples]
        rows = [(s.height, s.width, *s.box, int(s.flip)) for s in samples]
        share, size = self.gpu_share, self.size
        pixels, positions = cpu_share(kinds, lambda i: samples[i].data, rows, share, size, self.cpu_decoder)
        decoded = set(positions)
        # their bytes stay behind: nothing to copy into shared memory, and the rest stay back to back
        kept = [dataclasses.replace(s, data=b"") if i in decoded else s for i, s in enumerate(samples)]
        batch = collate_encoded(kept)
        return dataclasses.replace(batch, pixels=pixels, positions=torch.tensor(positions, dtype=torch.int64))


def split_on_host(batch: EncodedBatch, share: float, size: int, decoder: str | CpuDecoder) -> EncodedBatch:
    """The same split where no worker made it (a loader without :class:`SplitCollate`): in the calling thread."""
    offsets = batch.offsets.tolist()
    meta = batch.meta.tolist()
    data = batch.data

    def blob(i: int) -> bytes:
        return data[offsets[i] : offsets[i + 1]].numpy().tobytes()

    kinds = [row[2] for row in meta]
    rows = [(row[3], row[4], *row[5:10]) for row in meta]
    pixels, positions = cpu_share(kinds, blob, rows, share, size, decoder)
    return dataclasses.replace(batch, pixels=pixels, positions=torch.tensor(positions, dtype=torch.int64))
