import dataclasses
import warnings
from collections import OrderedDict, namedtuple

import lightning.pytorch as pl
import pytest
import torch
from helpers import SleepyModel, sleepy_loader, trainer_kwargs
from lightning.pytorch.strategies import StrategyRegistry

from lightning_dataperf import DataPerfCallback, SideStreamStrategy
from lightning_dataperf.batches import iter_tensors, map_tensors
from lightning_dataperf.transfer.copier import SideStreamCopier
from lightning_dataperf.transfer.lookahead import LookaheadIterator
from lightning_dataperf.transfer.stats import CopyStats, CopyTiming

Pair = namedtuple("Pair", ["image", "label"])


@dataclasses.dataclass
class Sample:
    image: torch.Tensor
    meta: dict
    name: str = "x"


class Movable:
    def __init__(self, tensor):
        self.tensor = tensor

    def to(self, *args, **kwargs):
        return Movable(self.tensor.to(*args, **kwargs))


def nested_batch() -> dict:
    return {
        "pair": Pair(torch.ones(2), 3),
        "list": [torch.zeros(1), (torch.ones(1), "text")],
        "ordered": OrderedDict(a=torch.ones(3)),
        "sample": Sample(torch.ones(2), {"k": torch.zeros(2)}),
        "movable": Movable(torch.ones(1)),
    }


def test_map_tensors_keeps_every_structure():
    batch = nested_batch()
    doubled = map_tensors(batch, lambda value: value.to(torch.float64))
    assert isinstance(doubled["pair"], Pair) and doubled["pair"].label == 3
    assert doubled["pair"].image.dtype == torch.float64
    assert doubled["list"][1][1] == "text" and isinstance(doubled["list"][1], tuple)
    assert isinstance(doubled["ordered"], OrderedDict)
    assert isinstance(doubled["sample"], Sample) and doubled["sample"].meta["k"].dtype == torch.float64
    assert isinstance(doubled["movable"], Movable) and doubled["movable"].tensor.dtype == torch.float64
    assert batch["pair"].image.dtype == torch.float32  # the input is untouched


def test_iter_tensors_finds_what_map_tensors_moves():
    batch = nested_batch()
    visited = []
    map_tensors(batch, lambda value: visited.append(value) or value)
    # the object with .to() is the last leaf: its tensor attribute comes last
    expected = [value for value in visited if isinstance(value, torch.Tensor)] + [batch["movable"].tensor]
    assert [id(tensor) for tensor in iter_tensors(batch)] == [id(tensor) for tensor in expected]


class FakeCopier:
    """Stands in for the CUDA copier: records the order of issue and hand-over."""

    def __init__(self):
        self.log = []

    def issue(self, batch):
        self.log.append(("issue", batch))
        return batch

    def hand_over(self, inflight):
        self.log.append(("hand_over", inflight))
        return inflight


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_lookahead_yields_every_batch_once_in_order_and_copies_ahead(depth):
    copier = FakeCopier()
    out = list(LookaheadIterator(iter(range(7)), copier, depth))
    assert out == list(range(7))
    handed = [index for index, (kind, _) in enumerate(copier.log) if kind == "hand_over"]
    issued = [index for index, (kind, _) in enumerate(copier.log) if kind == "issue"]
    for batch in range(7 - depth):  # batch N+depth is issued before batch N is handed over
        assert issued[batch + depth] < handed[batch]


def test_lookahead_hands_over_queued_batches_before_a_loader_error():
    def failing():
        yield from range(3)
        raise OSError("disk gone")

    iterator = LookaheadIterator(failing(), FakeCopier(), 2)
    assert [next(iterator) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(OSError, match="disk gone"):
        next(iterator)


def test_pinning_failure_falls_back_to_pageable_with_one_warning():
    copier = SideStreamCopier(torch.device("cuda", 0))
    tensor = torch.ones(4)
    if torch.cuda.is_available():
        pytest.skip("pinning works here; the fallback is exercised on machines without CUDA")
    with pytest.warns(UserWarning, match="Pinning a \\(4,\\) torch.float32 tensor failed"):
        assert copier._pinned(tensor) is tensor
    assert copier.pin is False
    with pytest.warns(UserWarning, match="synchronous"):
        copier._pinned(torch.ones(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        copier._pinned(torch.ones(2))  # said once only


def test_copy_stats():
    copies = [CopyTiming(copy=0.002, bytes=100_000_000, exposed=0.0005), CopyTiming(0.002, 100_000_000, 0.0)]
    stats = CopyStats.of(copies)
    assert stats.copies == 2
    assert stats.gbps == pytest.approx(50.0)
    assert stats.hidden_fraction == pytest.approx(0.875)
    assert stats.copy_s == pytest.approx(0.002) and stats.exposed_s == pytest.approx(0.00025)
    metrics = stats.to_metrics("val/")
    assert metrics == pytest.approx(
        {
            "val/Transfer/copy_s": 0.002,
            "val/Transfer/exposed_s": 0.00025,
            "val/Transfer/hidden_fraction": 0.875,
            "val/Transfer/GBps": 50.0,
        }
    )  # no transform: no transform_s
    assert CopyStats.of([]) is None


def test_copy_stats_keep_the_device_transform_apart_from_the_copy():
    transformed = CopyTiming(copy=0.002, bytes=100_000_000, exposed=0.001, transform=0.002)
    assert transformed.hidden_fraction == pytest.approx(0.75)  # 1 ms waited of 4 ms of side-stream work
    stats = CopyStats.of([transformed])
    assert stats.gbps == pytest.approx(50.0)  # bytes over the copy alone
    assert stats.copy_s == pytest.approx(0.002)
    assert stats.to_metrics()["Transfer/transform_s"] == pytest.approx(0.002)
    assert stats.hidden_fraction == pytest.approx(0.75)
    assert "with the device_transform's 2.00 ms" in stats.format()


def test_strategies_are_registered_and_cpu_falls_back_to_stock(tmp_path):
    assert "side_stream" in StrategyRegistry and "ddp_side_stream" in StrategyRegistry
    perf = DataPerfCallback(print_summary=False)
    model = SleepyModel()
    trainer = pl.Trainer(max_epochs=1, strategy="side_stream", callbacks=[perf], **trainer_kwargs(tmp_path))
    trainer.fit(model, sleepy_loader(20, 4, 0.0))
    assert isinstance(trainer.strategy, SideStreamStrategy) and not trainer.strategy.side_stream_active
    assert trainer.strategy.root_device == torch.device("cpu")
    assert torch.cat(model.seen).tolist() == [float(i) for i in range(20)]
    assert perf.summaries[0].copies is None


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="lookahead=-1 must be >= 0"):
        SideStreamStrategy(lookahead=-1)
    with pytest.raises(ValueError, match="min_bytes=-1 must be >= 0"):
        SideStreamStrategy(min_bytes=-1)
    with pytest.raises(ValueError, match="timing_every=0"):
        SideStreamStrategy(timing_every=0)
    with pytest.raises(ValueError, match="timing_every >= 1"):
        SideStreamCopier(torch.device("cuda", 0), timing_every=0)


@pytest.mark.parametrize("current_device", [0, 1])
def test_stream_switch_restores_the_compute_stream_even_on_error(monkeypatch, current_device):
    calls = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current_device)
    monkeypatch.setattr(torch.cuda, "set_stream", lambda stream: calls.append(("set", stream)))

    class FakeContext:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            calls.append(("enter", self.stream))

        def __exit__(self, *exc):
            calls.append(("exit", self.stream))

    monkeypatch.setattr(torch.cuda, "stream", FakeContext)
    copier = SideStreamCopier(torch.device("cuda", 0))

    def failing_copy():
        raise RuntimeError("copy failed")

    with pytest.raises(RuntimeError, match="copy failed"):
        copier._run_on("side", "compute", failing_copy)
    if current_device == 0:  # the copier's device is current: two bare set_stream calls
        assert calls == [("set", "side"), ("set", "compute")]
    else:  # another device is current: torch.cuda.stream saves and restores device and stream
        assert calls == [("enter", "side"), ("exit", "side")]
    assert copier._run_on("side", "compute", lambda: "copied") == "copied"


def test_event_pool_hands_back_what_it_was_given(monkeypatch):
    from lightning_dataperf.transfer.copier import _EventPool

    created = []

    class FakeEvent:
        def __init__(self, enable_timing=False):
            self.timing = enable_timing
            created.append(self)

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    pool = _EventPool()
    plain, timed = pool.take(timing=False), pool.take(timing=True)
    assert (plain.timing, timed.timing) == (False, True) and len(created) == 2
    pool.give(plain, timing=False)
    pool.give(timed, timing=True)
    assert pool.take(timing=True) is timed and pool.take(timing=False) is plain and len(created) == 2
    assert pool.take(timing=False) is not plain and len(created) == 3  # empty again: a new one
