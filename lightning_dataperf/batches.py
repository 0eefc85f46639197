"""Walking nested batches: every tensor in a batch, a batch with every tensor replaced, its size.

Lightning's ``apply_to_collection`` refuses frozen dataclasses and deep-copies the others, so the copier uses
:func:`map_tensors`.

Example::

    batch = {"image": torch.zeros(8, 3, 32, 32), "label": torch.arange(8)}
    on_gpu = map_tensors(batch, lambda tensor: tensor.to("cuda", non_blocking=True))
    BatchFootprint.of(batch)        # BatchFootprint(bytes=98368, tensors=2)
    samples_in(batch)               # 8
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["BatchFootprint", "BatchSizer", "first_tensor", "iter_tensors", "map_tensors", "samples_in"]

#: Nesting deeper than this is not searched for the first tensor (a batch is not a deep tree).
_MAX_DEPTH = 8


def map_tensors(batch: Any, function: Callable[[Any], Any]) -> Any:
    """Apply ``function`` to every tensor (and every object with a ``.to()``) in a nested batch.

    Handles dicts and other mappings, lists, tuples, namedtuples and dataclasses; other leaves are
    returned unchanged.
    """
    if isinstance(batch, torch.Tensor):
        return function(batch)
    if isinstance(batch, Mapping):
        return _rebuild_mapping(batch, {key: map_tensors(value, function) for key, value in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        # A namedtuple takes its fields as arguments, not as one iterable.
        return type(batch)(*(map_tensors(value, function) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_tensors(value, function) for value in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        # replace() refuses fields outside __init__.
        changes = {f.name: map_tensors(getattr(batch, f.name), function) for f in dataclasses.fields(batch) if f.init}
        return dataclasses.replace(batch, **changes)
    if _movable(batch):
        return function(batch)
    return batch


def _movable(value: Any) -> bool:
    return callable(getattr(value, "to", None)) and not isinstance(value, (str, bytes))


def _rebuild_mapping(original: Mapping, values: dict) -> Mapping:
    """Same mapping type where it can be built empty and filled (dict, OrderedDict, ...), else a dict."""
    try:
        rebuilt = type(original)()
        rebuilt.update(values)  # type: ignore[attr-defined]
    except (TypeError, AttributeError):
        return values
    return rebuilt


def iter_tensors(batch: Any) -> list[torch.Tensor]:
    """Every tensor in a nested batch (including tensor attributes of objects with ``.to()``).

    Walks the same structures as :func:`map_tensors` without rebuilding them.
    """
    found: list[torch.Tensor] = []
    _collect_tensors(batch, found)
    return found


def _collect_tensors(value: Any, found: list[torch.Tensor]) -> None:
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            _collect_tensors(item, found)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_tensors(item, found)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for member in dataclasses.fields(value):
            if member.init:
                _collect_tensors(getattr(value, member.name), found)
    elif _movable(value) and hasattr(value, "__dict__"):
        found.extend(attribute for attribute in vars(value).values() if isinstance(attribute, torch.Tensor))


def first_tensor(batch: Any, depth: int = 0) -> torch.Tensor | None:
    """The first tensor in depth-first order through tensors, mappings, lists and tuples."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, (list, tuple)):
        values: Any = batch
    elif isinstance(batch, dict):
        values = batch.values()
    else:
        return None
    if depth > _MAX_DEPTH:
        return None
    for value in values:
        if (found := first_tensor(value, depth + 1)) is not None:
            return found
    return None


def samples_in(batch: Any) -> int | None:
    """Samples in a batch: the first tensor's first dimension (what Lightning's ``extract_batch_size`` finds).

    ``None`` when the batch holds no tensor. This runs every step: the common ``(inputs, targets)``
    shape is looked at first, about 20x cheaper than ``extract_batch_size``.
    """
    # The common (inputs, targets) shape first: this runs every step.
    first = batch[0] if isinstance(batch, (list, tuple)) and batch else batch
    if not isinstance(first, torch.Tensor):
        first = first_tensor(batch)
    if first is None:
        return None
    shape = first.shape
    return shape[0] if shape else 1


@dataclass(frozen=True)
class BatchFootprint:
    """Bytes and tensor count of one batch."""

    bytes: int
    tensors: int

    @classmethod
    def of(cls, batch: Any) -> BatchFootprint:
        tensors = iter_tensors(batch)
        return cls(sum(tensor.numel() * tensor.element_size() for tensor in tensors), len(tensors))


class BatchSizer:
    """Samples in a batch for throughput: ``batch_size_fn`` if given, else :func:`samples_in`, else Lightning's
    ``extract_batch_size``. A batch that cannot be sized gives ``None`` and one warning, never an error."""

    def __init__(self, batch_size_fn: Callable[[Any], int] | None = None) -> None:
        self.batch_size_fn = batch_size_fn
        self._warned = False

    def __call__(self, batch: Any) -> int | None:
        try:
            if self.batch_size_fn is not None:
                return int(self.batch_size_fn(batch))
            if (samples := samples_in(batch)) is not None:
                return samples
            from lightning.pytorch.utilities.data import extract_batch_size

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return extract_batch_size(batch)
        except Exception as error:  # a batch we cannot size must never stop training
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"DataPerfCallback could not tell the batch size ({error}); throughput is not logged. "
                    "Pass DataPerfCallback(batch_size_fn=lambda batch: ...) to fix this.",
                    stacklevel=2,
                )
            return None
