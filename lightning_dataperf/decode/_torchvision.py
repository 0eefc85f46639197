"""The torchvision decode backend: batched nvJPEG through ``torchvision.io.decode_jpeg``, planar slots."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lightning_dataperf.decode._slots import EXTRA, NVIMGCODEC_EXTRA, Sizes, Spans
from lightning_dataperf.decode.backend import BackendBase

__all__ = ["TorchvisionBackend", "import_decode_jpeg"]


def import_decode_jpeg() -> Any:
    """``torchvision.io.decode_jpeg``, or an ImportError naming the extra."""
    try:
        from torchvision.io import decode_jpeg
    except Exception as error:
        # not only an ImportError: a torchvision built for another torch fails otherwise
        raise ImportError(
            f"the torchvision decode backend needs a CUDA build of torchvision "
            f"matching your torch (pip install '{EXTRA}', from your torch's CUDA wheel index; or the nvImageCodec "
            f"backend: pip install '{NVIMGCODEC_EXTRA}'); importing it failed: {error}"
        ) from error
    return decode_jpeg


class TorchvisionBackend(BackendBase):
    """Batched nvJPEG through ``torchvision.io.decode_jpeg``; planar (``chw``) slots.

    Ordering (pytorch/vision#9606): torchvision allocates its outputs on the caller's current stream and
    decodes on a private stream that never waits for it, and nvJPEG's hardware engine writes when the call
    is made (meta-pytorch/torchcodec#1634), so a block freed on the current stream while queued kernels
    still read it may be written at once. Here the current stream during the call is :attr:`_stream`, on
    which nothing else runs: its blocks are only torchvision's outputs, kept alive by the decoder until
    the host has seen their readers finish (``JpegDecoder._release_after_use``). The flat buffer itself
    is written by a stream-ordered copy, and torchvision host-synchronizes its private stream before it
    returns, so :attr:`writes_at_call` is ``False``: no host barrier is needed.
    """

    name = "torchvision"
    layout = "chw"
    writes_at_call = False
    # its decode call runs apart from the copy into the flat buffer (JpegDecoder.submit)
    can_submit = True

    def __init__(self, device: torch.device, ordered: bool = True) -> None:
        self.device = device
        self._decode_jpeg = import_decode_jpeg()
        self._stream = torch.cuda.Stream(device)
        # False in benchmarks only: decode_jpeg on the current stream, as users call it
        self.ordered = ordered

    def prepare(self, data: torch.Tensor, spans: Spans) -> list[torch.Tensor]:
        """The per-image byte views (host only; :class:`GpuDecodeLoader` makes them in its prepare thread)."""
        return _views(data, spans)

    def submit(self, parts: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """The decode call alone (torchvision host-synchronizes nvJPEG before it returns): one ``[3, H, W]``
        device tensor per image (``None`` where nvJPEG rejects it), allocated on :attr:`_stream`. Any thread
        may call it (:class:`GpuDecodeLoader` calls it in a thread of its own, the GIL released meanwhile)."""
        with torch.cuda.stream(self._stream if self.ordered else torch.cuda.current_stream(self.device)):
            try:
                return list(self._decode_jpeg(parts, device=self.device))
            except Exception:
                # one bad image fails nvJPEG's whole batch, so image by image
                decoded: list[torch.Tensor | None] = []
                for part in parts:
                    try:
                        decoded.append(self._decode_jpeg([part], device=self.device)[0])
                    except Exception:
                        decoded.append(None)
                return decoded

    def decode(
        self,
        data: torch.Tensor,
        spans: Spans,
        sizes: Sizes,
        flat: torch.Tensor,
        bases: Sequence[int],
        prepared: list[torch.Tensor] | None = None,
        submitted: list[torch.Tensor | None] | None = None,
    ) -> tuple[list[bool], list[Any]]:
        """Decode ``data[spans[i][0]:spans[i][1]]`` into ``flat[bases[i]:]`` (``submitted``: what :meth:`submit`
        returned for these images, copied in only); ``(ok per image, keep-alive)``."""
        current = torch.cuda.current_stream(self.device)
        if submitted is None:
            parts = prepared if prepared is not None else _views(data, spans)
            if self.ordered:
                self._stream.wait_stream(current)
            submitted = self.submit(parts)
        decoded = submitted
        if self.ordered:
            current.wait_stream(self._stream)
        ok = [
            image is not None and tuple(image.shape[1:]) == tuple(size)
            for image, size in zip(decoded, sizes, strict=True)
        ]
        contiguous = all(ok) and all(
            bases[i + 1] == bases[i] + 3 * sizes[i][0] * sizes[i][1] for i in range(len(bases) - 1)
        )
        if contiguous and decoded:
            total = 3 * sum(h * w for h, w in sizes)
            torch.cat([image.view(-1) for image in decoded], out=flat[bases[0] : bases[0] + total])  # type: ignore[union-attr]
        else:
            for image, base, good in zip(decoded, bases, ok, strict=True):
                if good:
                    flat[base : base + image.numel()].copy_(image.view(-1))  # type: ignore[union-attr]
        return ok, decoded


def _views(data: torch.Tensor, spans: Spans) -> list[torch.Tensor]:
    """``data[a:b]`` for each span; one ``torch.split`` when the spans are back to back."""
    if spans and all(spans[k][1] == spans[k + 1][0] for k in range(len(spans) - 1)):
        lengths = [b - a for a, b in spans]
        return list(torch.split(data[spans[0][0] : spans[-1][1]], lengths))
    return [data[a:b] for a, b in spans]
