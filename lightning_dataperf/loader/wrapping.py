"""Wrapping every iterator of a DataLoader while it keeps its class (for the probe and the look-ahead copy)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from torch.utils.data import DataLoader

__all__ = ["MakeIterator", "add_iterator_wrapper"]

MakeIterator = Callable[[Iterator], Iterator]

_WRAPPING_CLASSES: dict[type, type] = {}


def _wrapping_class(loader_class: type[DataLoader]) -> type[DataLoader]:
    """A subclass of the user's DataLoader class whose iterators are wrapped (keeps isinstance checks).

    A class made here is returned as it is: Lightning may rebuild a loader from ``type(loader)`` (e.g.
    for ``predict``), and the rebuilt one must neither nest a second subclass nor fail without wrappers.
    """
    if loader_class in _WRAPPING_CLASSES.values():
        return loader_class
    if loader_class not in _WRAPPING_CLASSES:

        def __iter__(self: DataLoader) -> Iterator:  # noqa: N807
            iterator = super(subclass, self).__iter__()
            for wrap in getattr(self, "_dataperf_wrappers", ()):
                iterator = wrap(iterator)
            return iterator

        subclass = type(f"DataPerf{loader_class.__name__}", (loader_class,), {"__iter__": __iter__})
        _WRAPPING_CLASSES[loader_class] = subclass
    return _WRAPPING_CLASSES[loader_class]


def add_iterator_wrapper(loader: DataLoader, wrap: MakeIterator, inner: bool = False) -> None:
    """Wrap every iterator of ``loader`` in ``wrap``; ``inner`` wrappers sit closest to the loader's own iterator.

    The loader keeps its class's behaviour and ``isinstance`` checks: a subclass is swapped in once,
    and wrappers compose (the loader probe's unwrapping inside, the look-ahead copy outside).
    """
    if "_dataperf_wrappers" not in vars(loader):  # a rebuilt loader may carry a copied list: start afresh
        loader.__class__ = _wrapping_class(type(loader))
        loader._dataperf_wrappers = []  # type: ignore[attr-defined]
    wrappers: list[MakeIterator] = loader._dataperf_wrappers  # type: ignore[attr-defined]
    if inner:
        wrappers.insert(0, wrap)
    else:
        wrappers.append(wrap)
