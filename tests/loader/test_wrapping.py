"""One wrapping mechanism: one subclass per loader class, wrappers in their layer's order whatever the call order."""

from __future__ import annotations

from torch.utils.data import DataLoader

from lightning_dataperf.loader.wrapping import Layer, add_iterator_wrapper, wrap_iterators


def _tagging(order, name):
    def wrap(loader, make):
        iterator = make()
        order.append(name)
        return iterator

    return wrap


def test_wrappers_sit_in_layer_order_whatever_order_they_were_added():
    loader = DataLoader(list(range(4)), batch_size=2)
    order = []
    add_iterator_wrapper(loader, lambda inner: order.append("lookahead") or inner)
    wrap_iterators(loader, _tagging(order, "online"), Layer.ONLINE)
    add_iterator_wrapper(loader, lambda inner: order.append("probe") or inner, inner=True)
    wrap_iterators(loader, _tagging(order, "seeding"), Layer.SEEDING)
    assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3]]
    # each wraps what the one beneath it made: innermost first
    assert order == ["seeding", "online", "probe", "lookahead"]
    assert type(loader).__mro__[1] is DataLoader and type(loader).__name__ == "DataLoader"


def test_one_subclass_per_loader_class_and_replace_keeps_one_per_layer():
    first, second = DataLoader(list(range(2))), DataLoader(list(range(2)))
    order = []
    for loader in (first, second):
        wrap_iterators(loader, _tagging(order, "old"), Layer.SEEDING)
        wrap_iterators(loader, _tagging(order, "new"), Layer.SEEDING, replace=True)
    assert type(first) is type(second)
    list(first)
    assert order == ["new"]


def test_a_copy_rebuilt_from_the_wrapped_loaders_class_iterates_plainly():
    loader = DataLoader(list(range(4)), batch_size=2)
    add_iterator_wrapper(loader, lambda inner: (batch * 10 for batch in inner))
    copy = type(loader)(list(range(4)), batch_size=2)  # as Lightning rebuilds a loader
    vars(copy)["_dataperf_wrappers"] = vars(loader)["_dataperf_wrappers"]  # a replayed attribute, say
    assert [batch.tolist() for batch in loader] == [[0, 10], [20, 30]]
    assert [batch.tolist() for batch in copy] == [[0, 1], [2, 3]]
