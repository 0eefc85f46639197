"""The one place a DataLoader's (in a worker, its dataset's) class is swapped: iterator wrappers in one order."""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import DataLoader

__all__ = ["Layer", "MakeIterator", "WrapIterator", "add_iterator_wrapper", "follow_fetches", "wrap_iterators"]

#: A wrapper of an iterator: the inner iterator in, the wrapped one out.
MakeIterator = Callable[[Iterator], Iterator]
#: A wrapper given the loader and a factory of the iterator beneath it (it may call it again to rebuild it).
WrapIterator = Callable[[DataLoader, Callable[[], Iterator]], Iterator]
#: The one attribute a wrapped loader carries: its :class:`_Wrappers`.
WRAPPERS = "_dataperf_wrappers"


class Layer(enum.IntEnum):
    """Where a wrapper sits, innermost first; the order is the same whichever was added first."""

    #: ``num_workers=0``: each batch fetched seeded (loader/seeding.py); one at most.
    SEEDING = 0
    #: ``autotune=OnlineTuning()``: the loop that rebuilds the iterator beneath it (datamodule/online.py); one at most.
    ONLINE = 1
    #: the probe's unwrapping of timed batches (loader/probe.py).
    PROBE = 2
    #: the look-ahead copy to the device (transfer/lookahead.py).
    LOOKAHEAD = 3


@dataclass
class _Wrappers:
    owner: int
    entries: list[tuple[int, int, WrapIterator]] = field(default_factory=list)


_ORDER = itertools.count()
_WRAPPING_CLASSES: dict[type, type] = {}
_FOLLOWING: dict[type, type] = {}


def _wrapping_class(loader_class: type[DataLoader]) -> type[DataLoader]:
    """A subclass of the user's DataLoader class (same name) whose iterators pass through the loader's wrappers.

    A class made here is returned as it is: Lightning may rebuild a loader from ``type(loader)`` (e.g.
    for ``predict``), and the rebuilt one must neither nest a second subclass nor fail without wrappers.
    """
    if loader_class in _WRAPPING_CLASSES.values():
        return loader_class
    if loader_class not in _WRAPPING_CLASSES:

        def __iter__(self: DataLoader) -> Iterator:  # noqa: N807
            make: Callable[[], Iterator] = super(subclass, self).__iter__
            for _, _, wrap in _own_wrappers(self).entries:
                # each layer's factory rebuilds everything beneath it (the online loop's switch)
                make = _factory(wrap, self, make)
            return make()

        namespace = {"__iter__": __iter__, "__module__": loader_class.__module__}
        subclass = type(loader_class.__name__, (loader_class,), namespace)
        _WRAPPING_CLASSES[loader_class] = subclass
    return _WRAPPING_CLASSES[loader_class]


def _factory(wrap: WrapIterator, loader: DataLoader, inner: Callable[[], Iterator]) -> Callable[[], Iterator]:
    return lambda: wrap(loader, inner)


def _own_wrappers(loader: DataLoader) -> _Wrappers:
    wrappers = vars(loader).get(WRAPPERS)
    # a copy Lightning rebuilt from a wrapped loader may carry the original's record: it iterates plainly
    return wrappers if isinstance(wrappers, _Wrappers) and wrappers.owner == id(loader) else _Wrappers(id(loader))


def wrap_iterators(loader: DataLoader, wrap: WrapIterator, layer: Layer, replace: bool = False) -> None:
    """Pass every iterator of ``loader`` through ``wrap`` at ``layer``; later ones sit outside earlier ones of a layer.

    The loader keeps its class's behaviour and ``isinstance`` checks: its class is swapped once for a
    subclass made once per loader class. ``replace`` drops what ``layer`` held first.

    Example::

        wrap_iterators(loader, lambda loader, inner: Counting(inner()), Layer.PROBE)
    """
    wrappers = _own_wrappers(loader)
    if vars(loader).get(WRAPPERS) is not wrappers:
        loader.__class__ = _wrapping_class(type(loader))
        # not through DataLoader.__setattr__: Lightning would replay it on the copies it rebuilds
        object.__setattr__(loader, WRAPPERS, wrappers)
    if replace:
        wrappers.entries[:] = [entry for entry in wrappers.entries if entry[0] != layer]
    wrappers.entries.append((int(layer), next(_ORDER), wrap))
    wrappers.entries.sort(key=lambda entry: entry[:2])


def add_iterator_wrapper(loader: DataLoader, wrap: MakeIterator, inner: bool = False) -> None:
    """Wrap every iterator of ``loader`` in ``wrap``: ``inner`` at :attr:`Layer.PROBE`, else :attr:`Layer.LOOKAHEAD`.

    Example::

        add_iterator_wrapper(loader, probe.unwrap, inner=True)
    """
    wrap_iterators(loader, lambda _, make: wrap(make()), Layer.PROBE if inner else Layer.LOOKAHEAD)


def follow_fetches(dataset: Any, before: Callable[[Any, Any], None]) -> bool:
    """In a worker, call ``before(dataset, indices)`` ahead of each fetch of its own ``dataset`` copy (``indices``:
    ``None`` for ``__getitem__``); ``False`` where the class cannot be swapped (``__slots__``, extension types)."""
    base = type(dataset)
    follower = _FOLLOWING.get(base)
    if follower is None:
        follower = _FOLLOWING[base] = _make_follower(base)
    try:
        dataset.__class__ = follower
        dataset._dataperf_before_fetch = before
    except (TypeError, AttributeError):
        if type(dataset) is follower:
            dataset.__class__ = base
        return False
    return True


def _make_follower(base: type) -> type:
    def __getitem__(self: Any, index: Any) -> Any:  # noqa: N807
        self._dataperf_before_fetch(self, None)
        return base.__getitem__(self, index)

    def __getitems__(self: Any, indices: Any) -> Any:  # noqa: N807
        self._dataperf_before_fetch(self, indices)
        if hasattr(base, "__getitems__"):
            return base.__getitems__(self, indices)
        return [base.__getitem__(self, index) for index in indices]

    return type(base.__name__, (base,), {"__getitem__": __getitem__, "__getitems__": __getitems__})
