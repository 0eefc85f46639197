"""JPEG decode backends of :class:`~lightning_dataperf.decode.decoder.JpegDecoder` (issue 17).

Each backend decodes a list of encoded JPEGs (host ``uint8`` tensors) straight into slots of ONE flat
``uint8`` device buffer that the batched crop/resize reads, so no per-image tensor, copy or launch
is needed in Python:

- :class:`TorchvisionBackend` (the default, ``pip install "lightning-dataperf[gpu-decode]"``):
  ``torchvision.io.decode_jpeg(list, device="cuda")`` (planar ``chw``), one ``torch.cat`` into the flat
  buffer; ahead end to end on the H200 (benchmarks/README.md, GPU JPEG decode).
- :class:`NvImageCodecBackend` (``pip install "lightning-dataperf[gpu-decode-nvimgcodec]"``: NVIDIA nvImageCodec,
  ``nvidia-nvimgcodec-cu13`` + ``nvidia-nvjpeg``): batched nvJPEG on the hardware JPEG engines (CUDA
  cores for what the engine cannot take), header parsing on its own C++ thread pool, the GIL
  released for the whole batch; decodes interleaved RGB (``hwc``) into views of the flat buffer.

Example::

    backend = make_backend("auto", torch.device("cuda", 0))   # torchvision's CUDA decode if it imports
    flat = torch.empty(total_bytes, dtype=torch.uint8, device="cuda")
    ok, keep = backend.decode(data, spans, sizes, flat, bases)  # per image: decoded into its slot?
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["NvImageCodecBackend", "TorchvisionBackend", "host_layout", "make_backend", "pil_decode", "slot_view"]

EXTRA = "lightning-dataperf[gpu-decode]"  # torchvision, the default backend
NVIMGCODEC_EXTRA = "lightning-dataperf[gpu-decode-nvimgcodec]"
BACKENDS = ("auto", "nvimgcodec", "torchvision")
Spans = Sequence[tuple[int, int]]
Sizes = Sequence[tuple[int, int]]


# What nvImageCodec prints at import when its JPEG 2000 / TIFF extensions find no library: noise for JPEGs.
_IMPORT_NOISE = ("nvjpeg2k", "nvJPEG2000", "nvtiff", "nvTIFF")


def import_nvimgcodec() -> Any:
    """``nvidia.nvimgcodec``, or an ImportError naming the extra.

    Unless ``PYNVIMGCODEC_VERBOSITY`` is set, nvImageCodec is imported with its log off (it logs a
    warning per image it cannot decode, and errors for the JPEG 2000 / TIFF libraries it does not
    find): the decoder counts and handles every image nvJPEG rejects itself (CPU fallback, counted in
    ``Decode/cpu_fallback``, first one logged). Lines it prints at import that are not about the
    missing nvJPEG2000/nvTIFF libraries are passed on to stderr.
    """
    if "nvidia.nvimgcodec" in sys.modules:
        return sys.modules["nvidia.nvimgcodec"]
    quiet = "PYNVIMGCODEC_VERBOSITY" not in os.environ
    if quiet:
        os.environ["PYNVIMGCODEC_VERBOSITY"] = "0"  # read once, when the module loads
    try:
        with _StderrFiltered(quiet):
            from nvidia import nvimgcodec
    except Exception as error:  # ImportError, or libnvjpeg missing at load time
        raise ImportError(
            f"the nvImageCodec decode backend needs nvidia-nvimgcodec-cu13 and nvidia-nvjpeg "
            f"(install the extra: pip install '{NVIMGCODEC_EXTRA}', or '...-cu12' for CUDA 12); "
            f"importing it failed: {error}"
        ) from error
    finally:
        if quiet:
            del os.environ["PYNVIMGCODEC_VERBOSITY"]
    return nvimgcodec


class _StderrFiltered:
    """Capture file descriptor 2 (C++ output) while active; re-emit the lines that are not import noise."""

    def __init__(self, active: bool) -> None:
        self.active = active

    def __enter__(self) -> None:
        if not self.active:
            return
        try:
            sys.stderr.flush()
            self._file = tempfile.TemporaryFile()
            self._saved = os.dup(2)
            os.dup2(self._file.fileno(), 2)
        except (OSError, ValueError):  # no real fd 2 (e.g. an embedded interpreter)
            self.active = False

    def __exit__(self, *exc: object) -> None:
        if not self.active:
            return
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.seek(0)
        text = self._file.read().decode(errors="replace")
        self._file.close()
        kept = [line for line in text.splitlines() if line.strip() and not any(n in line for n in _IMPORT_NOISE)]
        if kept:
            print("\n".join(kept), file=sys.stderr)


def import_decode_jpeg() -> Any:
    """``torchvision.io.decode_jpeg``, or an ImportError naming the extra."""
    try:
        from torchvision.io import decode_jpeg
    except Exception as error:  # ImportError, or a torchvision built for another torch
        raise ImportError(
            f"the torchvision decode backend needs a CUDA build of torchvision "
            f"matching your torch (pip install '{EXTRA}', from your torch's CUDA wheel index; or the nvImageCodec "
            f"backend: pip install '{NVIMGCODEC_EXTRA}'); importing it failed: {error}"
        ) from error
    return decode_jpeg


class TorchvisionBackend:
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

    def __init__(self, device: torch.device, ordered: bool = True) -> None:
        self.device = device
        self._decode_jpeg = import_decode_jpeg()
        self._stream = torch.cuda.Stream(device)
        self.ordered = ordered  # False (benchmarks only): decode_jpeg on the current stream, as users call it

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
            except Exception:  # one bad image fails nvJPEG's whole batch: image by image
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


class NvImageCodecBackend:
    """Batched nvJPEG through nvImageCodec (hardware engines first); interleaved (``hwc``) slots.

    Ordering: it decodes straight into the flat buffer, and nvJPEG's hardware engine writes its outputs
    when the call is made, not in the order of the stream it is given (meta-pytorch/torchcodec#1634;
    a device-side event wait does not gate it either), so :attr:`writes_at_call` is ``True``: the decoder
    waits on the host until the buffer's previous readers are done (``JpegDecoder._wait_writable``).

    Args:
        device: the CUDA device.
        threads: nvImageCodec's CPU thread pool (header parsing, host-side Huffman where needed);
            default ``min(4, cpu count)``.
    """

    name = "nvimgcodec"
    layout = "hwc"
    writes_at_call = True

    def __init__(self, device: torch.device, threads: int | None = None, codec: Any = None) -> None:
        self.device = device
        codec = self._codec = codec if codec is not None else import_nvimgcodec()
        threads = threads if threads is not None else min(4, os.cpu_count() or 1)
        kinds = [getattr(codec.BackendKind, name, None) for name in ("HW_GPU_ONLY", "GPU_ONLY")]
        backends = [codec.Backend(kind) for kind in kinds if kind is not None]
        self._decoder = codec.Decoder(device_id=device.index or 0, max_num_cpu_threads=threads, backends=backends)
        color = getattr(codec.ColorSpec, "SRGB", None) or codec.ColorSpec.RGB
        self._params = _decode_params(codec, color)
        self.into = True  # decode into views of the flat buffer; False after it fails once

    def prepare(self, data: torch.Tensor, spans: Spans) -> tuple[list[Any], Any]:
        """Parse each image's header into a ``CodeStream`` (host only; in :class:`GpuDecodeLoader`'s prepare
        thread): ``(code streams, None for those it cannot parse; the byte array they view)``."""
        codec, array = self._codec, data.numpy()
        try:
            streams = [codec.CodeStream(array[a:b]) for a, b in spans]
        except Exception:  # a stream nvImageCodec cannot even parse: one by one, None for those
            streams = [_code_stream(codec, array[a:b]) for a, b in spans]
        return streams, array

    def decode(
        self,
        data: torch.Tensor,
        spans: Spans,
        sizes: Sizes,
        flat: torch.Tensor,
        bases: Sequence[int],
        prepared: tuple[list[Any], Any] | None = None,
    ) -> tuple[list[bool], list[Any]]:
        """Decode ``data[spans[i][0]:spans[i][1]]`` into ``flat[bases[i]:]``; ``(ok per image, keep-alive)``."""
        codec = self._codec
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0
        streams, array = prepared if prepared is not None else self.prepare(data, spans)
        keep: list[Any] = [streams, array]
        ok: list[bool] = [False] * len(spans)
        if self.into and all(code is not None for code in streams):
            pointer = flat.data_ptr()
            slots = [_Slot(pointer + base, h, w) for base, (h, w) in zip(bases, sizes, strict=True)]
            try:
                targets = _wrap(codec, slots, stream)
                images = self._decoder.decode(streams, images=targets, params=self._params, cuda_stream=stream)
                keep.append(targets)
            except Exception:  # this build does not decode into external buffers: copy from now on
                self.into, images = False, [None] * len(spans)
            for i, image in enumerate(images):
                if _fills(image, slots[i]):
                    ok[i] = True
                elif image is not None:  # decoded into a buffer of its own: copy, and stop trying
                    ok[i] = _copy(image, slot_view(flat, bases[i], sizes[i], "hwc"), keep)
                    self.into = False
        missing = [i for i, good in enumerate(ok) if not good]
        missing = [i for i in missing if streams[i] is not None]
        if missing:  # the copy path (in the decode-into path: a retry of the failures)
            try:
                images = self._decoder.decode([streams[i] for i in missing], params=self._params, cuda_stream=stream)
            except Exception:  # the batch call failed as a whole: image by image
                images = [self._decode_one(streams[i], stream) for i in missing]
            for i, image in zip(missing, images, strict=True):
                ok[i] = image is not None and _copy(image, slot_view(flat, bases[i], sizes[i], "hwc"), keep)
        return ok, keep

    def _decode_one(self, code: Any, stream: int) -> Any:
        try:
            return self._decoder.decode([code], params=self._params, cuda_stream=stream)[0]
        except Exception:
            return None


def _wrap(codec: Any, slots: list[_Slot], stream: int) -> Any:
    try:
        return codec.as_images(slots, cuda_stream=stream)
    except TypeError:  # a build whose as_images takes no stream
        return codec.as_images(slots)


class _Slot:
    """A ``[h, w, 3]`` uint8 slot of the flat device buffer, as ``__cuda_array_interface__`` (cheaper than a view)."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, pointer: int, height: int, width: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (height, width, 3), "typestr": "|u1", "data": (pointer, False), "version": 3, "strides": None,
        }  # fmt: skip


def _views(data: torch.Tensor, spans: Spans) -> list[torch.Tensor]:
    """``data[a:b]`` for each span; one ``torch.split`` when the spans are back to back."""
    if spans and all(spans[k][1] == spans[k + 1][0] for k in range(len(spans) - 1)):
        lengths = [b - a for a, b in spans]
        return list(torch.split(data[spans[0][0] : spans[-1][1]], lengths))
    return [data[a:b] for a, b in spans]


def _code_stream(codec: Any, part: Any) -> Any:
    for source in (part, part.tobytes()):  # a numpy view, else a copy as bytes
        try:
            return codec.CodeStream(source)
        except Exception:
            continue
    return None


def _decode_params(codec: Any, color: Any) -> Any:
    layout = getattr(codec, "SampleFormat", None)
    attempts: list[dict[str, Any]] = []
    if layout is not None and hasattr(layout, "I_RGB"):
        attempts.append({"sample_format": layout.I_RGB})
    attempts.append({})
    for extra in attempts:
        try:
            return codec.DecodeParams(apply_exif_orientation=False, color_spec=color, allow_any_depth=False, **extra)
        except (TypeError, ValueError):  # an older DecodeParams without sample_format
            continue
    return codec.DecodeParams()


def _fills(image: Any, slot: _Slot) -> bool:
    """Did nvImageCodec decode into ``slot`` itself (not into a buffer of its own)?"""
    if image is None:
        return False
    try:
        pointer = image.__cuda_array_interface__["data"][0]
    except Exception:
        return False
    wanted = slot.__cuda_array_interface__
    return pointer == wanted["data"][0] and tuple(image.shape)[:2] == wanted["shape"][:2]


def _copy(image: Any, view: torch.Tensor, keep: list[Any]) -> bool:
    tensor = torch.from_dlpack(image)
    keep.append((image, tensor))
    if tuple(tensor.shape) != tuple(view.shape):
        return False
    view.copy_(tensor)
    return True


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


def slot_view(flat: torch.Tensor, base: int, size: tuple[int, int], layout: str) -> torch.Tensor:
    """Sample's slot in ``flat`` as ``[3, H, W]`` (``chw``) or ``[H, W, 3]`` (``hwc``)."""
    h, w = size
    view = flat[base : base + 3 * h * w]
    return view.view(3, h, w) if layout == "chw" else view.view(h, w, 3)


def host_layout(image: torch.Tensor, layout: str) -> torch.Tensor:
    """``[H, W, 3]`` host pixels in ``layout``, contiguous."""
    return image.permute(2, 0, 1).contiguous() if layout == "chw" else image


def make_backend(name: Any, device: torch.device, threads: int | None = None) -> Any:
    """The backend called ``name`` (``auto``: torchvision's CUDA decode if it imports, else nvImageCodec; the order
    measured end to end on an H200), or ``name`` itself if it is a backend object (``layout`` and
    ``decode(data, spans, sizes, flat, bases)``; optional: ``prepare(data, spans)``, whose result comes back as
    ``decode(..., prepared=...)``, and ``writes_at_call``: ``False`` where the decoder writes ``flat`` in
    stream order; otherwise the decoder waits on the host before each decode, ``JpegDecoder._wait_writable``)."""
    if hasattr(name, "decode") and hasattr(name, "layout"):
        return name
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {name!r}")
    if name == "nvimgcodec":
        return NvImageCodecBackend(device, threads)
    if name == "torchvision":
        return TorchvisionBackend(device)
    try:
        return TorchvisionBackend(device)
    except ImportError as torchvision_error:
        try:
            return NvImageCodecBackend(device, threads)
        except ImportError as nvimgcodec_error:
            raise ImportError(
                f"GPU JPEG decoding needs a CUDA build of torchvision (pip install '{EXTRA}') or nvImageCodec "
                f"(pip install '{NVIMGCODEC_EXTRA}'): {torchvision_error}; {nvimgcodec_error}"
            ) from nvimgcodec_error
