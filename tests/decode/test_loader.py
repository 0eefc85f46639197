"""GpuDecodeLoader on CPU: it takes every JpegDecoder option, leaves no reference cycle, and forked
workers never collect what they inherit (the cause of the worker segfaults on the H200)."""

from __future__ import annotations

import gc
import inspect
import multiprocessing
import os
import weakref

import pytest
from torch.utils.data import DataLoader

from lightning_dataperf.decode import GpuDecodeLoader, JpegDecoder
from lightning_dataperf.decode.encoded import EncodedImageDataset, collate_encoded
from lightning_dataperf.decode.loader import guard_forked_workers

pytest.importorskip("PIL")
from helpers import write_files


def test_loader_takes_every_decoder_option(tmp_path):
    decoder_options = set(inspect.signature(JpegDecoder.__init__).parameters) - {"self"}
    loader_options = set(inspect.signature(GpuDecodeLoader.__init__).parameters)
    assert decoder_options <= loader_options, decoder_options - loader_options
    dataset = EncodedImageDataset(write_files(str(tmp_path), 4), seed=0)
    base = DataLoader(dataset, batch_size=2, collate_fn=collate_encoded)
    loader = GpuDecodeLoader(base, device="cpu", size=8, graph_augment=False, decode_threads=1, backend="auto")
    assert [images.shape for images, _ in loader] == [(2, 3, 8, 8)] * 2


def test_a_dropped_loader_is_freed_without_the_cycle_collector(tmp_path):
    dataset = EncodedImageDataset(write_files(str(tmp_path), 6), seed=0)
    loader = GpuDecodeLoader(DataLoader(dataset, batch_size=2, collate_fn=collate_encoded), device="cpu", size=8)
    iterator = iter(loader)
    next(iterator)
    iterator.close()
    references = [weakref.ref(loader), weakref.ref(loader.decoder), weakref.ref(iterator)]
    gc.disable()
    try:
        del loader, iterator
        assert [ref() for ref in references] == [None, None, None]
    finally:
        gc.enable()


class _Marked:
    """Cyclic garbage whose finaliser leaves a file behind (stands in for a CUDA graph's destructor)."""

    def __init__(self, path: str) -> None:
        self.path, self.cycle = path, self

    def __del__(self) -> None:
        with open(self.path, "w") as file:
            file.write(str(os.getpid()))


def _collect_in_child() -> None:
    gc.collect()


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="no fork")
def test_forked_children_do_not_collect_inherited_garbage(tmp_path):
    guard_forked_workers()
    marker = str(tmp_path / "finalised")
    gc.disable()
    try:
        _Marked(marker)  # unreachable at once, but only the cycle collector can free it
        child = multiprocessing.get_context("fork").Process(target=_collect_in_child)
        child.start()
        child.join(30)
        assert child.exitcode == 0
        assert not os.path.exists(marker), "the forked child ran a finaliser of the parent's garbage"
    finally:
        gc.enable()
    gc.collect()  # here, in the parent, it is freed
    assert os.path.exists(marker)
    with open(marker) as file:
        assert file.read() == str(os.getpid())


def _reachable(*roots: object) -> list[object]:
    seen, todo, found = set(), list(roots), []
    while todo:
        item = todo.pop()
        if id(item) in seen or isinstance(item, type) or inspect.ismodule(item):
            continue
        seen.add(id(item))
        found.append(item)
        todo.extend(gc.get_referents(item))
    return found


def test_workers_get_no_decoder(tmp_path):
    """What a worker receives (dataset, collate function) reaches no decoder object."""
    dataset = EncodedImageDataset(write_files(str(tmp_path), 2), seed=0)
    base = DataLoader(dataset, batch_size=2, num_workers=1, collate_fn=collate_encoded)
    loader = GpuDecodeLoader(base, device="cpu", size=8)
    reachable = _reachable(base.dataset, base.collate_fn, base.sampler)
    assert not [item for item in reachable if isinstance(item, (JpegDecoder, GpuDecodeLoader))]
    assert loader.decoder in _reachable(loader)  # the walk does find a decoder where there is one


def test_an_iterator_never_advanced_decodes_nothing(tmp_path):
    """Lightning calls ``iter()`` on a non-DataLoader once only to check that it is iterable: that must start
    no decode thread (nor workers), so the epoch's figures count the epoch's batches only."""
    dataset = EncodedImageDataset(write_files(str(tmp_path), 12), seed=0)
    train = GpuDecodeLoader(DataLoader(dataset, batch_size=4, collate_fn=collate_encoded), device="cpu", size=8)
    checked = iter(train)
    assert checked._thread is None and checked._source is None
    assert sum(len(images) for images, _ in train) == 12
    stats = train.stats()
    assert stats.batches == stats.takes == 3 and stats.images == 12


def test_a_loader_dropped_mid_epoch_stops_its_decode_thread(tmp_path):
    """``max_steps`` or an exception can leave an epoch unfinished: dropping the loader and its iterator must
    stop the decode thread (it holds neither), and the sampler relay must copy without recursing."""
    import copy
    import threading

    dataset = EncodedImageDataset(write_files(str(tmp_path), 40), seed=0)
    train = GpuDecodeLoader(DataLoader(dataset, batch_size=2, collate_fn=collate_encoded), device="cpu", size=8)
    iterator = iter(train)
    next(iterator)
    thread = iterator._thread
    assert thread is not None and thread.is_alive()
    copy.copy(train.sampler)  # an _EpochRelay without its owner must not recurse in __getattr__
    del train, iterator
    gc.collect()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert not [t for t in threading.enumerate() if t is thread]
