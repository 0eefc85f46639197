"""Decode and augment :class:`~lightning_dataperf.jpeg_batches.EncodedBatch` on the GPU (issue 17).

:class:`JpegDecoder` turns one encoded batch into ``(images, labels)``: batched nvJPEG
(``torchvision.io.decode_jpeg(list, device="cuda")``, the GPU's hardware JPEG engines where it has
them), then crop + resize + flip + normalise for the whole batch in a fixed number of kernel
launches (independent of the batch size): the decoded images are concatenated into one flat
buffer, and every output pixel gathers its four bilinear neighbours from it (the same arithmetic as
``F.interpolate(mode="bilinear", align_corners=False, antialias=False)`` on the crop). Samples the
header marked for the CPU (progressive, grayscale, CMYK, PNG, ...) are decoded with PIL and counted
(``Decode/cpu_fallback``). Without CUDA everything runs on the CPU (PIL), with the same arithmetic.

:class:`GpuDecodeLoader` is the one switch: it wraps a ``DataLoader`` of encoded batches and runs the
decoder ahead of the training step in a background thread on its own CUDA streams, with a bounded
look-ahead queue and CUDA-event hand-over (``record_stream`` on everything crossing streams, no
synchronize per step). The step receives ``(images, labels)`` on the device.

Example (plain PyTorch or a LightningModule's ``train_dataloader``)::

    dataset = EncodedImageDataset.from_folder("/data/train", seed=42)
    loader = DataLoader(dataset, batch_size=128, shuffle=True, num_workers=4,
                        collate_fn=collate_encoded, persistent_workers=True)
    train = GpuDecodeLoader(loader, device="cuda", size=224, dtype=torch.bfloat16)
    for images, labels in train:       # images: [128, 3, 224, 224] bf16 channels_last on cuda
        ...
    print(train.stats().to_metrics())  # {"Decode/images_per_sec": ..., "Decode/cpu_fallback": ...}

Requires torchvision for the GPU path: ``pip install "lightning-dataperf[gpu-decode]"``.
"""

from __future__ import annotations

import io
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lightning_dataperf.jpeg_batches import KIND_BAD, KIND_GPU, EncodedBatch

__all__ = ["DecodeError", "DecodeStats", "GpuDecodeLoader", "JpegDecoder", "crop_resize_flip"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_EXTRA = "lightning-dataperf[gpu-decode]"


class DecodeError(RuntimeError):
    """A sample that neither the GPU nor the CPU can decode (names its dataset index and path)."""


def _decode_jpeg_cuda() -> Any:
    try:
        from torchvision.io import decode_jpeg
    except Exception as error:  # ImportError, or a torchvision built for another torch
        raise ImportError(
            f"GPU JPEG decoding needs torchvision (install the extra: pip install '{_EXTRA}'); "
            f"importing it failed: {error}"
        ) from error
    return decode_jpeg


def _pil_decode(data: bytes) -> torch.Tensor:
    """``[3, H, W]`` uint8 RGB via PIL (CMYK, grayscale, palette... converted)."""
    try:
        from PIL import Image
    except ImportError as error:
        raise ImportError("CPU decoding needs Pillow (pip install pillow)") from error
    with Image.open(io.BytesIO(data)) as image:
        rgb = image.convert("RGB")
    array = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8)
    return array.view(rgb.height, rgb.width, 3).permute(2, 0, 1).contiguous()


def _axis(start: torch.Tensor, length: torch.Tensor, out: int, flip: torch.Tensor | None):
    """Source indices (absolute) and weights along one axis, as ``upsample_bilinear2d`` computes them."""
    scale = length.to(torch.float32) / out  # [B]
    position = torch.arange(out, device=start.device, dtype=torch.float32).add_(0.5)
    source = (position[None, :] * scale[:, None]).sub_(0.5).clamp_(min=0)  # [B, out]
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
) -> torch.Tensor:
    """Crop, bilinearly resize and flip a batch of images of any sizes held in one flat buffer.

    Args:
        flat: every image's ``[3, H, W]`` uint8 pixels, concatenated.
        bases: ``[B]`` where each image starts in ``flat``.
        sizes: ``[B, 2]`` height, width.
        boxes: ``[B, 4]`` crop top, left, height, width (source pixels).
        flips: ``[B]`` bool, flip horizontally after the resize.
        size: output side.
        compute_dtype: the interpolation's arithmetic (``float16`` halves the memory traffic; its
            rounding, about 0.1 of a level, is below a bfloat16 output's).

    Returns:
        ``[B, size, size, 3]`` in ``compute_dtype``, 0..255 (channels last), equal to ``F.interpolate`` of each crop
        (bilinear, ``align_corners=False``, no antialias), then flipped.
    """
    top, left, box_h, box_w = boxes.unbind(1)
    heights, widths = sizes[:, 0], sizes[:, 1]
    y0, y1, wy = _axis(top, box_h, size, None)
    x0, x1, wx = _axis(left, box_w, size, flips)
    plane = heights * widths  # [B]
    channel = bases[:, None] + plane[:, None] * torch.arange(3, device=flat.device)  # [B, 3]
    row0 = (y0 * widths[:, None])[:, :, None, None]
    row1 = (y1 * widths[:, None])[:, :, None, None]
    col0, col1 = x0[:, None, :, None], x1[:, None, :, None]
    base = channel[:, None, None, :]  # [B, 1, 1, 3]
    top_row = base + row0
    bottom_row = base + row1
    wx = wx[:, None, :, None].to(compute_dtype)
    upper = flat[top_row + col0].to(compute_dtype).lerp_(flat[top_row + col1].to(compute_dtype), wx)
    lower = flat[bottom_row + col0].to(compute_dtype).lerp_(flat[bottom_row + col1].to(compute_dtype), wx)
    return upper.lerp_(lower, wy[:, :, None, None].to(compute_dtype))


@dataclass(frozen=True)
class DecodeStats:
    """Cumulative decode telemetry of a :class:`GpuDecodeLoader` (or a :class:`JpegDecoder`).

    ``decode_seconds`` is the device time from the start of the decode to the end of the augment
    (CUDA events, read back lazily; host time on CPU), ``submit_seconds`` the host time the decode
    thread spent submitting it, ``lookahead_mean`` the decoded batches already waiting when the step
    asked for one, ``wait_seconds`` the step's total wait for a decoded batch.
    """

    batches: int = 0
    images: int = 0
    decode_seconds: float = 0.0
    submit_seconds: float = 0.0
    wait_seconds: float = 0.0
    lookahead_mean: float = 0.0
    cpu_fallback: int = 0
    undecodable: int = 0
    jpeg_util_percent: float = float("nan")

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        """``{"Decode/...": float}`` for a logger's ``log_metrics``."""
        per_batch = self.decode_seconds / self.batches if self.batches else 0.0
        metrics = {
            "Decode/batch_seconds": per_batch,
            "Decode/images_per_sec": self.images / self.decode_seconds if self.decode_seconds else 0.0,
            "Decode/submit_seconds": self.submit_seconds / self.batches if self.batches else 0.0,
            "Decode/wait_seconds": self.wait_seconds / self.batches if self.batches else 0.0,
            "Decode/lookahead_mean": self.lookahead_mean,
            "Decode/cpu_fallback": float(self.cpu_fallback),
            "Decode/undecodable": float(self.undecodable),
            "Decode/images": float(self.images),
        }
        if self.jpeg_util_percent == self.jpeg_util_percent:  # not NaN
            metrics["Decode/jpeg_util_percent"] = self.jpeg_util_percent
        return {prefix + key: value for key, value in metrics.items()}


class _Telemetry:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches = self.images = self.cpu_fallback = self.undecodable = 0
        self.decode_s = self.submit_s = self.wait_s = 0.0
        self.depth_sum = self.depth_n = 0
        self.pending: deque[tuple[torch.cuda.Event, torch.cuda.Event, int]] = deque()

    def drain(self) -> None:
        while self.pending and self.pending[0][1].query():
            start, end, _ = self.pending.popleft()
            self.decode_s += start.elapsed_time(end) / 1e3


class JpegDecoder:
    """Decodes and augments one :class:`EncodedBatch` into ``(images, labels)`` on ``device``.

    Args:
        device: ``"cuda"``/``"cuda:N"`` (nvJPEG via torchvision) or ``"cpu"`` (PIL).
        size: output side (RandomResizedCrop / centre crop boxes come with the batch).
        dtype: output dtype (e.g. ``torch.bfloat16``); ``torch.uint8`` skips normalisation.
        channels_last: return NCHW with channels-last strides (free here), else contiguous NCHW.
        mean, std: normalisation in 0..1 units.
        on_error: ``"raise"`` a :class:`DecodeError` naming index and path for an undecodable sample,
            or ``"zeros"``: an all-zero image (after normalisation), counted as ``Decode/undecodable``.

    Calls on CUDA run on the current stream (the decoder's own decode stream is made to hand over
    with an event); :class:`GpuDecodeLoader` calls it from its background thread.
    """

    def __init__(
        self,
        device: str | torch.device = "cuda",
        size: int = 224,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = True,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        on_error: str = "raise",
    ) -> None:
        if on_error not in ("raise", "zeros"):
            raise ValueError(f"on_error must be 'raise' or 'zeros', not {on_error!r}")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.size, self.dtype, self.channels_last, self.on_error = size, dtype, channels_last, on_error
        scale = torch.tensor([1 / (255 * s) for s in std], dtype=torch.float32)
        self._scale = scale.to(self.device)
        self._shift = (-torch.tensor(mean, dtype=torch.float32) / torch.tensor(std)).to(self.device)
        self._cuda = self.device.type == "cuda"
        self._decode_jpeg = _decode_jpeg_cuda() if self._cuda else None
        self._decode_stream = torch.cuda.Stream(self.device) if self._cuda else None
        self.telemetry = _Telemetry()
        self._keep: deque[tuple[torch.cuda.Event, list[torch.Tensor]]] = deque()

    def __call__(self, batch: EncodedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        started = time.perf_counter()
        telemetry = self.telemetry
        if self._cuda:
            stream = torch.cuda.current_stream(self.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
        meta = batch.meta.cpu()
        kinds = meta[:, 2].tolist()
        decoded, fallback, bad = self._decode(batch, kinds)
        count = len(kinds)
        if decoded:
            sizes = meta[:, 3:5].clone()  # header sizes: what nvJPEG allocates
            for i, kind in enumerate(kinds):
                if kind != KIND_GPU or not self._cuda:
                    sizes[i, 0], sizes[i, 1] = decoded[i].shape[1], decoded[i].shape[2]
            boxes, flips = meta[:, 5:9].clone(), meta[:, 9:10]
            for i in bad:  # the zero image: any box inside a 1x1 image
                boxes[i] = torch.tensor([0, 0, 1, 1])
            bases = torch.zeros(count, 1, dtype=torch.int64)
            bases[1:, 0] = (sizes.prod(1) * 3).cumsum(0)[:-1]
            flat = torch.cat([image.view(-1) for image in decoded])
            self._release_after_use(decoded)
            small = self._to_device(torch.cat([bases, sizes, boxes, flips], 1))
            compute = torch.float16 if self._cuda and self.dtype in (torch.bfloat16, torch.float16) else torch.float32
            pixels = crop_resize_flip(
                flat, small[:, 0], small[:, 1:3], small[:, 3:7], small[:, 7].bool(), self.size, compute
            )
            images = self._finish(pixels)
        else:
            images = torch.empty(0, 3, self.size, self.size, device=self.device, dtype=self.dtype)
        labels = self._to_device(meta[:, 0].contiguous())
        if self._cuda:
            end.record(stream)
            with telemetry.lock:
                telemetry.pending.append((start, end, count))
        with telemetry.lock:
            telemetry.batches += 1
            telemetry.images += count
            telemetry.cpu_fallback += fallback
            telemetry.undecodable += len(bad)
            elapsed = time.perf_counter() - started
            telemetry.submit_s += elapsed
            if not self._cuda:
                telemetry.decode_s += elapsed
        return images, labels

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self._cuda:
            return tensor
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def _finish(self, pixels: torch.Tensor) -> torch.Tensor:
        if self.dtype == torch.uint8:
            out = pixels.round_().clamp_(0, 255).to(torch.uint8)
        else:
            out = pixels.float().mul_(self._scale).add_(self._shift).to(self.dtype)
        out = out.permute(0, 3, 1, 2)  # NCHW view, channels-last strides
        return out if self.channels_last else out.contiguous()

    def _decode(self, batch: EncodedBatch, kinds: list[int]) -> tuple[list[torch.Tensor], int, list[int]]:
        """Every sample as a ``[3, H, W]`` uint8 tensor on the device; the CPU-fallback count; bad samples."""
        data = batch.data if batch.data.device.type == "cpu" else batch.data.cpu()
        offsets = batch.offsets
        parts = list(torch.split(data[: int(offsets[-1])], (offsets[1:] - offsets[:-1]).tolist()))
        out: list[torch.Tensor | None] = [None] * len(kinds)
        gpu = [i for i, kind in enumerate(kinds) if kind == KIND_GPU] if self._cuda else []
        if gpu:
            decoded = self._gpu_decode([parts[i] for i in gpu])
            for i, image in zip(gpu, decoded, strict=True):
                out[i] = image
        fallback, bad = 0, []
        for i, kind in enumerate(kinds):
            if out[i] is not None:
                continue
            reason = batch.reasons[i] if i < len(batch.reasons) else ""
            if kind != KIND_BAD:
                try:
                    out[i] = self._to_device(_pil_decode(parts[i].numpy().tobytes()))
                    fallback += int(kind != KIND_GPU or self._cuda)
                    continue
                except Exception as error:  # the CPU cannot decode it either
                    reason = f"{type(error).__name__}: {error}"
            if self.on_error == "raise":
                index = int(batch.meta[i, 1])
                path = batch.paths[i] if i < len(batch.paths) else "?"
                raise DecodeError(f"cannot decode dataset index {index} ({path}): {reason or 'undecodable'}")
            bad.append(i)
            out[i] = torch.zeros(3, 1, 1, dtype=torch.uint8, device=self.device)
        return out, fallback, bad  # type: ignore[return-value]

    def _release_after_use(self, decoded: list[torch.Tensor]) -> None:
        """Keep nvJPEG's outputs alive until the current stream has read them (instead of ``record_stream``
        per image): their blocks belong to the decode stream, which nvJPEG's own stream does not wait on."""
        if not self._cuda:
            return
        while self._keep and self._keep[0][0].query():
            self._keep.popleft()
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self._keep.append((event, decoded))

    def _gpu_decode(self, parts: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """Batched nvJPEG on the decode stream; if the batch fails, image by image (``None``: failed)."""
        assert self._decode_stream is not None and self._decode_jpeg is not None
        current = torch.cuda.current_stream(self.device)
        # Outputs are allocated on the decode stream, which runs nothing else: a block freed on the
        # current stream can never be handed to nvJPEG's own stream while queued kernels still read it.
        with torch.cuda.stream(self._decode_stream):
            try:
                decoded: list[torch.Tensor | None] = list(self._decode_jpeg(parts, device=self.device))
            except Exception:  # one bad image fails nvJPEG's whole batch
                decoded = []
                for part in parts:
                    try:
                        decoded.append(self._decode_jpeg([part], device=self.device)[0])
                    except Exception:
                        decoded.append(None)
        current.wait_stream(self._decode_stream)
        return decoded

    def stats(self) -> DecodeStats:
        """A snapshot of the telemetry so far (never blocks)."""
        telemetry = self.telemetry
        with telemetry.lock:
            telemetry.drain()
            depth = telemetry.depth_sum / telemetry.depth_n if telemetry.depth_n else 0.0
            return DecodeStats(
                batches=telemetry.batches,
                images=telemetry.images,
                decode_seconds=telemetry.decode_s,
                submit_seconds=telemetry.submit_s,
                wait_seconds=telemetry.wait_s,
                lookahead_mean=depth,
                cpu_fallback=telemetry.cpu_fallback,
                undecodable=telemetry.undecodable,
                jpeg_util_percent=_jpeg_utilisation(self.device),
            )


def _jpeg_utilisation(device: torch.device) -> float:
    """NVML JPEG-engine utilisation (%) of ``device``; NaN where NVML or the engine is missing."""
    if device.type != "cuda":
        return float("nan")
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        return float(pynvml.nvmlDeviceGetJpgUtilization(handle)[0])
    except Exception:  # no NVML, no JPEG engine, or an old driver
        return float("nan")


from lightning_dataperf._gpu_decode_loader import GpuDecodeLoader  # noqa: E402  (re-export)
