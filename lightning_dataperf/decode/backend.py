"""What a GPU decode library offers :class:`~lightning_dataperf.decode.JpegDecoder`: :class:`DecodeBackend`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from lightning_dataperf.decode._slots import Sizes, Spans

__all__ = ["LAYOUTS", "REQUIRED", "BackendBase", "DecodeBackend", "adopt_backend"]

LAYOUTS = ("chw", "hwc")
#: The members a backend object of your own must have; :class:`BackendBase` gives the others.
REQUIRED = ("layout", "decode")
_OPTIONAL = ("name", "writes_at_call", "ordered", "can_submit", "prepare", "submit")


@runtime_checkable
class DecodeBackend(Protocol):
    """Everything :class:`~lightning_dataperf.decode.JpegDecoder` reads of a decode library (docs/gpu_decode.md).

    Attributes:
        name: shown as ``DecodeStats.backend``.
        layout: ``"chw"`` (planar) or ``"hwc"`` (interleaved) slots in the flat buffer.
        writes_at_call: ``True`` where the library writes ``flat`` when called, not in stream order: the decoder
            then waits on the host before each decode until the buffer's last readers are done.
        ordered: ``False`` only in benchmarks' controls (torchvision's decode on the caller's stream).
        can_submit: the decode call can run apart from the copy into ``flat`` (:meth:`submit`).
    """

    name: str
    layout: str
    writes_at_call: bool
    ordered: bool
    can_submit: bool

    def prepare(self, data: torch.Tensor, spans: Spans) -> Any:
        """Host-only work per batch (in the prepare thread); what it returns (unless ``None``) comes back as
        ``decode(..., prepared=...)``."""

    def submit(self, parts: list[torch.Tensor]) -> Any:
        """The decode call alone (where :attr:`can_submit`); its result comes back as ``decode(..., submitted=...)``."""

    def decode(
        self, data: torch.Tensor, spans: Spans, sizes: Sizes, flat: torch.Tensor, bases: Sequence[int], **extra: Any
    ) -> tuple[list[bool], Any]:
        """Decode ``data[a:b]`` for each span into ``flat[base:]``; ``(ok per image, what to keep alive until the
        current stream has read flat)``."""


class BackendBase:
    """The optional members of :class:`DecodeBackend` with their defaults: subclass it and give ``layout`` and
    ``decode``.

    Example::

        class MyBackend(BackendBase):
            name, layout, writes_at_call = "mine", "hwc", False

            def decode(self, data, spans, sizes, flat, bases, prepared=None):
                ...
                return [True] * len(spans), None
    """

    name: str = "custom"
    writes_at_call: bool = True
    ordered: bool = True
    can_submit: bool = False

    def prepare(self, data: torch.Tensor, spans: Spans) -> Any:
        del data, spans
        return None

    def submit(self, parts: list[torch.Tensor]) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no separate decode call (can_submit is False)")


class _Adopted(BackendBase):
    """A backend object of your own that does not subclass :class:`BackendBase`: its members, the defaults where
    it has none (read once, here)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.layout: str = inner.layout
        self.decode = inner.decode
        present = {member: getattr(inner, member) for member in _OPTIONAL if hasattr(inner, member)}
        self.name = str(present.get("name", "custom"))
        self.writes_at_call = bool(present.get("writes_at_call", True))
        self.ordered = bool(present.get("ordered", True))
        if callable(present.get("prepare")):
            self.prepare = present["prepare"]  # type: ignore[method-assign]
        submit = present.get("submit")
        # a separate call where the object has one (as torchvision's backend does) and does not say otherwise
        self.can_submit = bool(present.get("can_submit", callable(submit)))
        if callable(submit):
            self.submit = submit  # type: ignore[method-assign]


def adopt_backend(backend: Any) -> DecodeBackend:
    """``backend`` as a :class:`DecodeBackend`; a clear error naming what a backend object of your own lacks."""
    missing = [member for member in REQUIRED if not hasattr(backend, member)]
    if not missing and not callable(backend.decode):
        missing = ["decode (callable)"]
    if missing:
        raise TypeError(
            f"backend {backend!r} is not a decode backend: it has no {', '.join(missing)}. A backend object needs "
            f"`layout` ('chw' or 'hwc') and `decode(data, spans, sizes, flat, bases)` returning (ok per image, "
            "keep-alive); subclass lightning_dataperf.decode.BackendBase for the optional members, or pass one of "
            "'auto', 'torchvision', 'nvjpeg', 'nvimgcodec' (docs/gpu_decode.md)"
        )
    if backend.layout not in LAYOUTS:
        raise ValueError(f"backend {backend!r}: layout must be one of {LAYOUTS}, not {backend.layout!r}")
    if isinstance(backend, BackendBase):
        return backend  # type: ignore[return-value]
    return _Adopted(backend)  # type: ignore[return-value]
