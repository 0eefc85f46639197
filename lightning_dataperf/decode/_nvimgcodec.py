"""The nvImageCodec decode backend: batched nvJPEG (hardware engines first) into interleaved slots."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import torch

from lightning_dataperf.decode._slots import NVIMGCODEC_EXTRA, Sizes, Spans, slot_view
from lightning_dataperf.decode.backend import BackendBase

__all__ = ["NvImageCodecBackend", "import_nvimgcodec"]

# noise for JPEGs: what nvImageCodec prints at import when its JPEG 2000 / TIFF libraries are missing
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
        # nvImageCodec reads it once, when the module loads
        os.environ["PYNVIMGCODEC_VERBOSITY"] = "0"
    try:
        with _StderrFiltered(quiet):
            from nvidia import nvimgcodec
    except Exception as error:
        # not only an ImportError: a libnvjpeg missing at load time fails otherwise
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
        except (OSError, ValueError):
            # no real fd 2, e.g. in an embedded interpreter
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


class NvImageCodecBackend(BackendBase):
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
        # decode into views of the flat buffer until that fails once
        self.into = True

    def prepare(self, data: torch.Tensor, spans: Spans) -> tuple[list[Any], Any]:
        """Parse each image's header into a ``CodeStream`` (host only; in :class:`GpuDecodeLoader`'s prepare
        thread): ``(code streams, None for those it cannot parse; the byte array they view)``."""
        codec, array = self._codec, data.numpy()
        try:
            streams = [codec.CodeStream(array[a:b]) for a, b in spans]
        except Exception:
            # a stream nvImageCodec cannot even parse fails the batch, so one by one (None for those)
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
            except Exception:
                # this build does not decode into external buffers, so copy from now on
                self.into, images = False, [None] * len(spans)
            for i, image in enumerate(images):
                if _fills(image, slots[i]):
                    ok[i] = True
                elif image is not None:
                    # decoded into a buffer of its own, so copy, and stop trying
                    ok[i] = _copy(image, slot_view(flat, bases[i], sizes[i], "hwc"), keep)
                    self.into = False
        missing = [i for i, good in enumerate(ok) if not good]
        missing = [i for i in missing if streams[i] is not None]
        # the copy path, which in the decode-into path retries the failures
        if missing:
            try:
                images = self._decoder.decode([streams[i] for i in missing], params=self._params, cuda_stream=stream)
            except Exception:
                # the batch call failed as a whole, so image by image
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
    except TypeError:
        # a build whose as_images takes no stream
        return codec.as_images(slots)


class _Slot:
    """A ``[h, w, 3]`` uint8 slot of the flat device buffer, as ``__cuda_array_interface__`` (cheaper than a view)."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, pointer: int, height: int, width: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (height, width, 3), "typestr": "|u1", "data": (pointer, False), "version": 3, "strides": None,
        }  # fmt: skip


def _code_stream(codec: Any, part: Any) -> Any:
    # a numpy view, else a copy as bytes, for builds that take only one of them
    for source in (part, part.tobytes()):
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
        except (TypeError, ValueError):
            # an older DecodeParams without sample_format
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
