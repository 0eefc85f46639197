"""``TunedDataModule(gpu_decode=...)``'s record: :class:`GpuDecodeOptions`, ``GpuDecodeLoader``'s keyword options."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lightning_dataperf._records import check, is_count, is_number, named_keys
from lightning_dataperf.decode._backends import BACKENDS
from lightning_dataperf.decode.loader import GpuDecodeLoader

__all__ = ["ON_ERROR", "GpuDecodeOptions"]

#: What ``on_error`` may be (:class:`~lightning_dataperf.decode.decoder.JpegDecoder`'s choices).
ON_ERROR = ("raise", "zeros")

# the defaults are the loader's own, read from its signature, so the two cannot drift apart
_DEFAULT = {
    name: parameter.default for name, parameter in inspect.signature(GpuDecodeLoader.__init__).parameters.items()
}


@named_keys
@dataclass(frozen=True, kw_only=True)
class GpuDecodeOptions:
    """How ``TunedDataModule(gpu_decode=...)`` decodes: the keyword options of
    :class:`~lightning_dataperf.decode.GpuDecodeLoader` (everything after ``loader`` and ``device``; the device is
    the Trainer's), with its defaults.

    Args:
        lookahead, size, dtype, channels_last, mean, std, on_error, backend, decode_threads, graph_augment,
            compile_augment, prepare_ahead, gpu_share, cpu_decoder: see
            :class:`~lightning_dataperf.decode.GpuDecodeLoader`.

    Example::

        from lightning_dataperf import GpuDecodeOptions, TunedDataModule

        datamodule = MyJpegData(gpu_decode=GpuDecodeOptions(size=224, dtype=torch.bfloat16))  # a TunedDataModule
    """

    lookahead: int = _DEFAULT["lookahead"]
    size: int = _DEFAULT["size"]
    dtype: torch.dtype = _DEFAULT["dtype"]
    channels_last: bool = _DEFAULT["channels_last"]
    mean: Sequence[float] = _DEFAULT["mean"]
    std: Sequence[float] = _DEFAULT["std"]
    on_error: str = _DEFAULT["on_error"]
    backend: Any = _DEFAULT["backend"]
    decode_threads: int | None = _DEFAULT["decode_threads"]
    graph_augment: bool = _DEFAULT["graph_augment"]
    compile_augment: bool = _DEFAULT["compile_augment"]
    prepare_ahead: int = _DEFAULT["prepare_ahead"]
    gpu_share: float = _DEFAULT["gpu_share"]
    cpu_decoder: Any = _DEFAULT["cpu_decoder"]

    def __post_init__(self) -> None:
        check(is_count(self.lookahead, 1), self, "lookahead", "give a whole number of batches, at least 1")
        check(is_count(self.size, 1), self, "size", "give the output side in pixels, e.g. 224")
        check(isinstance(self.dtype, torch.dtype), self, "dtype", "give a torch dtype, e.g. torch.bfloat16")
        for name in ("mean", "std"):
            values = getattr(self, name)
            low = 0.0 if name == "std" else -float("inf")
            ok = isinstance(values, Sequence) and len(values) == 3
            check(ok and all(is_number(v, low, above=name == "std") for v in values), self, name, "give 3 numbers")
            # a tuple: the record stays hashable and nobody changes it under the decoder
            object.__setattr__(self, name, tuple(values))
        check(self.on_error in ON_ERROR, self, "on_error", f"give one of {', '.join(map(repr, ON_ERROR))}")
        backend = self.backend
        custom = not isinstance(backend, str) and hasattr(backend, "decode") and hasattr(backend, "layout")
        check(
            custom or backend in BACKENDS,
            self,
            "backend",
            f"give one of {', '.join(map(repr, BACKENDS))}, or a backend object (with decode and layout)",
        )
        threads = self.decode_threads
        check(threads is None or is_count(threads, 1), self, "decode_threads", "give None or 1 or more threads")
        for name in ("channels_last", "graph_augment", "compile_augment"):
            check(isinstance(getattr(self, name), bool), self, name, "give True or False")
        check(is_count(self.prepare_ahead, 0), self, "prepare_ahead", "give a whole number of batches, 0 or more")
        share = self.gpu_share
        check(is_number(share, 0.0) and share <= 1, self, "gpu_share", "give a share in [0, 1]: 0 CPU only, 1 GPU only")
        decoder = self.cpu_decoder
        check(
            callable(decoder) or decoder in ("auto", "pil", "torchvision"),
            self,
            "cpu_decoder",
            "give 'auto', 'pil', 'torchvision' or a callable",
        )
