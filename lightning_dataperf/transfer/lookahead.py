"""Look-ahead: a loader whose iterator yields batch N on the device while N+1..N+depth are copied."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader

from lightning_dataperf.loader.wrapping import MakeIterator, add_iterator_wrapper
from lightning_dataperf.transfer.copier import SideStreamCopier, _InFlight

__all__ = ["LookaheadIterator", "with_lookahead"]


class LookaheadIterator(Iterator):
    """Yields batch N already on the device while batches N+1..N+depth are being copied."""

    def __init__(self, iterator: Iterator, copier: SideStreamCopier, depth: int) -> None:
        self._iterator = iterator
        self._copier = copier
        self._depth = depth
        self._queue: deque[_InFlight] = deque()
        self._exhausted = False
        self._error: BaseException | None = None

    def __next__(self) -> Any:
        # depth batches in flight besides the one handed over now.
        while not self._exhausted and self._error is None and len(self._queue) <= self._depth:
            try:
                host_batch = next(self._iterator)
            except StopIteration:
                self._exhausted = True
            except Exception as error:  # hand over what is queued first; nothing is lost
                self._error = error
            else:
                self._queue.append(self._copier.issue(host_batch))
        # Queued batches go out before the end or the error: nothing is lost or reordered.
        if self._queue:
            return self._copier.hand_over(self._queue.popleft())
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        raise StopIteration

    def __getattr__(self, name: str) -> Any:  # public attributes of the wrapped iterator
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._iterator, name)


class _LookaheadIterable:
    """Wraps a non-DataLoader iterable; attributes are delegated to it."""

    def __init__(self, iterable: Any, make_iterator: Callable[[Iterator], Iterator]) -> None:
        self._iterable = iterable
        self._make_iterator = make_iterator

    def __iter__(self) -> Iterator:
        return self._make_iterator(iter(self._iterable))

    def __len__(self) -> int:
        return len(self._iterable)

    def __getattr__(self, name: str) -> Any:  # e.g. `sampler`, `dataset` of the wrapped iterable
        # Looked up before __init__ has set them (copy, pickle), these would recurse forever.
        if name.startswith("__") or name in ("_iterable", "_make_iterator"):
            raise AttributeError(name)
        return getattr(self._iterable, name)


def with_lookahead(loader: Any, make_iterator: MakeIterator) -> Any:
    """``loader`` whose iterators are ``make_iterator(inner iterator)``; a DataLoader keeps its class.

    Example::

        loader = with_lookahead(loader, lambda inner: LookaheadIterator(inner, copier, depth=2))
        for batch in loader:          # on the device, copied on the side stream ahead of time
            ...
    """
    if isinstance(loader, DataLoader):
        # A subclass is swapped in, so isinstance checks and attributes still hold.
        add_iterator_wrapper(loader, make_iterator)
        return loader
    return _LookaheadIterable(loader, make_iterator)
