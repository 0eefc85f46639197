"""``TunedDataModule``'s ``autotune`` and ``gpu_decode`` as records; the old spellings converted, with a warning."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, TypeVar

from lightning_dataperf._records import spelled
from lightning_dataperf.autotune.options import OnlineTuning, SearchTuning
from lightning_dataperf.decode.options import GpuDecodeOptions

__all__ = ["Tuning", "decode_options", "tuning_mode"]

Tuning = OnlineTuning | SearchTuning | None
_Made = TypeVar("_Made", OnlineTuning, SearchTuning, GpuDecodeOptions)

_TUNING_CHOICES = (
    "autotune=OnlineTuning(...) (the online loop on the run's own steps), SearchTuning(...) (a measured search "
    "before fit) or None (the policy's settings, nothing measured); from lightning_dataperf import OnlineTuning, "
    "SearchTuning"
)
# the warning points at the caller of TunedDataModule.__init__ (ours: 1, __init__: 2, its caller: 3)
_CALLER = 3


def tuning_mode(autotune: Any, autotune_options: Mapping[str, Any] | None) -> Tuning:
    """The record ``autotune`` stands for; ``True`` / ``"online"`` and ``autotune_options`` warn (deprecated), and a
    misspelt option fails here, at construction, with the valid ones named."""
    if isinstance(autotune, (OnlineTuning, SearchTuning)):
        if autotune_options is not None:
            raise TypeError(
                f"TunedDataModule(autotune={type(autotune).__name__}(...), autotune_options=...): give the options "
                f"in the record, {type(autotune).__name__}(...), and leave out autotune_options (deprecated)"
            )
        return autotune
    if autotune is None or autotune is False:
        if autotune_options is not None:
            warnings.warn(
                "TunedDataModule(autotune_options=...) is deprecated, and without a tuning mode it does nothing: "
                f"leave it out, or give the options in the mode's record: {_TUNING_CHOICES}",
                DeprecationWarning,
                stacklevel=_CALLER,
            )
        return None
    if autotune is True:
        record: type[OnlineTuning | SearchTuning] = SearchTuning
    elif isinstance(autotune, str) and autotune == "online":
        record = OnlineTuning
    else:
        raise TypeError(f"TunedDataModule(autotune={autotune!r}): use {_TUNING_CHOICES}")
    if autotune_options is not None and not isinstance(autotune_options, Mapping):
        raise TypeError(f"TunedDataModule(autotune_options={autotune_options!r}): give a dict, or better a record")
    old = f"autotune={autotune!r}" + (", autotune_options={...}" if autotune_options is not None else "")
    tuning = _made(record, dict(autotune_options or {}), old)
    warnings.warn(
        f"TunedDataModule({old}) is deprecated and goes in the next release: write "
        f"TunedDataModule(autotune={spelled(tuning)}) (from lightning_dataperf import {record.__name__})",
        DeprecationWarning,
        stacklevel=_CALLER,
    )
    return tuning


def decode_options(gpu_decode: Any) -> GpuDecodeOptions | None:
    """The record ``gpu_decode`` stands for; ``True`` and a dict warn (deprecated), a misspelt key fails here."""
    if gpu_decode is None or gpu_decode is False or isinstance(gpu_decode, GpuDecodeOptions):
        return gpu_decode or None
    if gpu_decode is not True and not isinstance(gpu_decode, Mapping):
        raise TypeError(
            f"TunedDataModule(gpu_decode={gpu_decode!r}): use gpu_decode=GpuDecodeOptions(...) to decode JPEGs on "
            "the GPU, or None; from lightning_dataperf import GpuDecodeOptions"
        )
    old = f"gpu_decode={'True' if gpu_decode is True else '{...}'}"
    options = _made(GpuDecodeOptions, {} if gpu_decode is True else dict(gpu_decode), old)
    warnings.warn(
        f"TunedDataModule({old}) is deprecated and goes in the "
        f"next release: write TunedDataModule(gpu_decode={spelled(options)}) "
        "(from lightning_dataperf import GpuDecodeOptions)",
        DeprecationWarning,
        stacklevel=_CALLER,
    )
    return options


def _made(record: type[_Made], options: dict[str, Any], old: str) -> _Made:
    """``record(**options)``; a bad key or value is said as the user wrote it, then as the record says it."""
    try:
        return record(**options)
    except (TypeError, ValueError) as error:
        raise type(error)(f"TunedDataModule({old}): {error}") from None
