"""The direct nvJPEG backend: batched decode on the hardware engines through ``ctypes``, on the caller's stream."""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import sys
from collections.abc import Sequence
from typing import Any

import torch

from lightning_dataperf.decode._slots import NVJPEG_EXTRA, Sizes, Spans
from lightning_dataperf.decode.backend import BackendBase

__all__ = ["NvJpegBackend", "load_nvjpeg"]

_HARDWARE = 3  # NVJPEG_BACKEND_HARDWARE
_RGBI = 5  # NVJPEG_OUTPUT_RGBI: interleaved RGB into channel[0]
_ARCH_MISMATCH = 7  # NVJPEG_STATUS_ARCH_MISMATCH: no hardware engine on this GPU
_LOADED: list[Any] = []


class _Image(ctypes.Structure):
    """``nvjpegImage_t``: four channel pointers and their pitches."""

    _fields_ = [("channel", ctypes.c_void_p * 4), ("pitch", ctypes.c_size_t * 4)]


def _candidates() -> list[str]:
    """Where libnvjpeg may be: the ``nvidia-nvjpeg`` wheels of this torch's CUDA major, then the loader's path."""
    major = (torch.version.cuda or "13").split(".")[0]
    found: list[str] = []
    for root in sys.path:
        for pattern in (f"nvidia/cu{major}/lib/libnvjpeg.so.{major}", f"nvidia/nvjpeg/lib/libnvjpeg.so.{major}"):
            found += glob.glob(os.path.join(root, pattern))
    return [*found, f"libnvjpeg.so.{major}"]


def load_nvjpeg() -> Any:
    """libnvjpeg as a ``ctypes.CDLL`` (its calls release the GIL), loaded once; an ImportError naming the extra."""
    if _LOADED:
        return _LOADED[0]
    errors = []
    for path in _candidates():
        try:
            library = ctypes.CDLL(path)
            break
        except OSError as error:
            errors.append(str(error))
    else:
        raise ImportError(
            f"the nvjpeg decode backend needs a CUDA build of torch and its libnvjpeg (CUDA {torch.version.cuda}) "
            f"(pip install '{NVJPEG_EXTRA}'); loading it failed: {'; '.join(errors)[:300]}"
        )
    for name in ("nvjpegCreateEx", "nvjpegJpegStateCreate", "nvjpegJpegStreamCreate", "nvjpegDecodeBatchedInitialize",
                 "nvjpegDecodeBatched", "nvjpegJpegStreamParseHeader", "nvjpegDecodeBatchedSupported"):  # fmt: skip
        getattr(library, name).restype = ctypes.c_int
    library.nvjpegJpegStateCreate.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    library.nvjpegJpegStreamCreate.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    library.nvjpegCreateEx.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p]
    library.nvjpegDecodeBatchedInitialize.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                                      ctypes.c_int]  # fmt: skip
    library.nvjpegDecodeBatched.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                            ctypes.c_void_p, ctypes.c_void_p]  # fmt: skip
    library.nvjpegJpegStreamParseHeader.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    library.nvjpegDecodeBatchedSupported.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    for name in ("nvjpegJpegStateDestroy", "nvjpegJpegStreamDestroy", "nvjpegDestroy"):
        getattr(library, name).argtypes = [ctypes.c_void_p]
    _LOADED.append(library)
    return library


class NvJpegBackend(BackendBase):
    """Batched nvJPEG on the GPU's hardware JPEG engines, called through ``ctypes``; interleaved (``hwc``) slots.

    No per-image tensor or allocation: one call decodes the batch straight into the flat buffer, on the caller's
    current stream, and returns once the work is queued. Images the engines cannot take (by
    ``nvjpegDecodeBatchedSupported`` on their headers: progressive, 4:1:0 and 4:1:1 among them) are reported not
    decoded, and the decoder decodes them on the CPU.

    Ordering: the hardware engine writes when the call is made, not in stream order
    (meta-pytorch/torchcodec#1634), so :attr:`writes_at_call` is ``True``: the decoder waits on the host until the
    buffer's previous readers are done (``JpegDecoder._wait_writable``), as for nvImageCodec.

    Raises ImportError where libnvjpeg is missing or the GPU has no JPEG engine (the ``auto`` choice then
    moves on).
    """

    name = "nvjpeg"
    layout = "hwc"
    writes_at_call = True

    def __init__(self, device: torch.device) -> None:
        self.device = device
        lib = self._lib = load_nvjpeg()
        self._handle, self._stream = ctypes.c_void_p(), ctypes.c_void_p()
        with torch.cuda.device(device):
            status = lib.nvjpegCreateEx(_HARDWARE, None, None, 0, ctypes.byref(self._handle))
        if status == _ARCH_MISMATCH:
            raise ImportError(f"the nvjpeg backend needs a GPU with JPEG engines (A100, H100...): {device} has none")
        _check(status, "nvjpegCreateEx")
        _check(lib.nvjpegJpegStreamCreate(self._handle, ctypes.byref(self._stream)), "nvjpegJpegStreamCreate")
        # two decode states taking turns: one batch decodes while the next is submitted
        self._states = [_State(lib, self._handle) for _ in range(2)]
        self._turn = 0

    def __del__(self) -> None:
        # not at interpreter exit, where CUDA may be gone already
        if sys.is_finalizing() or not hasattr(self, "_states"):
            return
        with contextlib.suppress(Exception):
            lib = self._lib
            for state in self._states:
                state.wait()
                lib.nvjpegJpegStateDestroy(state.state)
            lib.nvjpegJpegStreamDestroy(self._stream)
            lib.nvjpegDestroy(self._handle)

    def prepare(self, data: torch.Tensor, spans: Spans) -> list[bool]:
        """Which images the engines take, from their headers (host only; in :class:`GpuDecodeLoader`'s prepare
        thread). Not thread-safe: one prepare at a time per backend, as the loader calls it."""
        lib, pointer, supported = self._lib, data.data_ptr(), []
        flag = ctypes.c_int(-1)
        for a, b in spans:
            ok = lib.nvjpegJpegStreamParseHeader(self._handle, pointer + a, b - a, self._stream) == 0
            ok = ok and lib.nvjpegDecodeBatchedSupported(self._handle, self._stream, ctypes.byref(flag)) == 0
            supported.append(ok and flag.value == 0)
        return supported

    def decode(
        self,
        data: torch.Tensor,
        spans: Spans,
        sizes: Sizes,
        flat: torch.Tensor,
        bases: Sequence[int],
        prepared: list[bool] | None = None,
    ) -> tuple[list[bool], list[Any]]:
        """Decode ``data[spans[i][0]:spans[i][1]]`` into ``flat[bases[i]:]``; ``(ok per image, keep-alive)``."""
        supported = prepared if prepared is not None else self.prepare(data, spans)
        chosen = [i for i, good in enumerate(supported) if good]
        if not chosen:
            return [False] * len(spans), []
        count = len(chosen)
        pointers = (ctypes.c_void_p * count)(*[data.data_ptr() + spans[i][0] for i in chosen])
        lengths = (ctypes.c_size_t * count)(*[spans[i][1] - spans[i][0] for i in chosen])
        images = (_Image * count)()
        target = flat.data_ptr()
        for k, i in enumerate(chosen):
            images[k].channel[0] = target + bases[i]
            images[k].pitch[0] = 3 * sizes[i][1]
        lib, state = self._lib, self._states[self._turn % 2]
        self._turn += 1
        # its buffers are reused: the batch it decoded last must be done
        state.wait()
        if count != state.batch:
            # nvJPEG's batched state is sized per batch size
            _check(lib.nvjpegDecodeBatchedInitialize(self._handle, state.state, count, 1, _RGBI), "initialize")
            state.batch = count
        current = torch.cuda.current_stream(self.device)
        status = lib.nvjpegDecodeBatched(
            self._handle, state.state, pointers, lengths, images, ctypes.c_void_p(current.cuda_stream)
        )
        if status != 0:
            # a failed batch leaves the state to be initialised again; its images go to the CPU
            state.batch = 0
            return [False] * len(spans), [data]
        state.done = torch.cuda.Event()
        state.done.record(current)
        ok = [False] * len(spans)
        for i in chosen:
            ok[i] = True
        # the host bytes are read by the engines after the call returns
        return ok, [data, pointers, lengths, images]


class _State:
    """One ``nvjpegJpegState_t``, the batch size it was initialised for, and the end of its last decode."""

    def __init__(self, lib: Any, handle: ctypes.c_void_p) -> None:
        self.state = ctypes.c_void_p()
        _check(lib.nvjpegJpegStateCreate(handle, ctypes.byref(self.state)), "nvjpegJpegStateCreate")
        self.batch = 0
        self.done: torch.cuda.Event | None = None

    def wait(self) -> None:
        if self.done is not None:
            # releases the GIL while it waits
            self.done.synchronize()


def _check(status: int, call: str) -> None:
    if status != 0:
        raise RuntimeError(f"{call} failed with nvjpegStatus_t {status}")
