"""Batch transfer: tensor walking, the look-ahead, copy stats, the strategies; on a GPU (marked cuda, run on the H200:
benchmarks/README.md), the side-stream copy itself."""

import dataclasses
import warnings
from collections import OrderedDict, namedtuple

import lightning.pytorch as pl
import pytest
import torch
from helpers import Checksummed, ChecksumModel, SleepyModel, seeded_image, sleepy_loader, trainer_kwargs
from lightning.pytorch.strategies import StrategyRegistry
from torch.utils.data import DataLoader, Dataset

from lightning_dataperf import DataPerfCallback, SideStreamStrategy
from lightning_dataperf.batches import iter_tensors, map_tensors
from lightning_dataperf.testing import calibrate_cuda_sleep
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
            "val/Transfer/copy_gbps": 50.0,
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


# ---------------------------------------------------------------------------------------------- on a GPU
# Side-stream transfer on a real GPU (marked cuda: skipped without one).


@pytest.mark.cuda
@pytest.mark.parametrize("lookahead", [0, 1, 3])
@pytest.mark.parametrize("pin_memory", [False, True])
def test_side_stream_batches_are_exact_and_complete(tmp_path, lookahead, pin_memory):
    model = ChecksumModel()
    perf = DataPerfCallback(print_summary=False)
    trainer = pl.Trainer(
        max_epochs=2,
        strategy=SideStreamStrategy(lookahead=lookahead, min_bytes=0),  # 96 KiB batches: side stream forced
        callbacks=[perf],
        log_every_n_steps=2,
        **trainer_kwargs(tmp_path, accelerator="cuda"),
    )
    trainer.fit(model, DataLoader(Checksummed(), batch_size=8, shuffle=True, pin_memory=pin_memory))
    assert trainer.strategy.side_stream_active
    assert int(torch.stack(model.mismatches).sum()) == 0
    per_epoch = [torch.cat(model.seen[i * 8 : (i + 1) * 8]).sort().values.tolist() for i in range(2)]
    assert per_epoch == [list(range(64))] * 2
    copies = perf.summaries[-1].copies
    assert copies.copies == 2, "8 batches an epoch, one copy in timing_every=4 timed"
    assert copies.gbps > 0 and copies.copy_s > 0  # 96 KiB copies: latency-bound, well below the link's GB/s


@pytest.mark.cuda
@pytest.mark.parametrize("lookahead", [0, 2])
def test_small_batches_take_the_stock_copy_exactly(tmp_path, lookahead):
    model = ChecksumModel()
    perf = DataPerfCallback(print_summary=False)
    strategy = SideStreamStrategy(lookahead=lookahead, timing_every=2)  # 96 KiB < the 2 MiB default
    kwargs = trainer_kwargs(tmp_path, accelerator="cuda")
    trainer = pl.Trainer(max_epochs=1, strategy=strategy, callbacks=[perf], **kwargs)
    trainer.fit(model, DataLoader(Checksummed(), batch_size=8, shuffle=True))
    assert int(torch.stack(model.mismatches).sum()) == 0
    assert torch.cat(model.seen).sort().values.tolist() == list(range(64))
    assert strategy.copier._side_copies == 0 and perf.summaries[-1].copies is None


@pytest.mark.cuda
def test_one_copy_in_timing_every_is_timed():
    copier = SideStreamCopier(torch.device("cuda", 0), min_bytes=0, timing_every=3)
    host = torch.arange(1 << 16, dtype=torch.float32).pin_memory()
    results = [copier.hand_over(copier.issue({"x": host, "n": 3})) for _ in range(7)]
    torch.cuda.synchronize()
    assert all(torch.equal(result["x"].cpu(), host) and result["n"] == 3 for result in results)
    timings = copier.completed()
    assert len(timings) == 3 and all(timing.bytes == host.nbytes and timing.copy > 0 for timing in timings)


@pytest.mark.cuda
def test_copy_time_excludes_the_device_transform():
    """Ground truth: a transform that keeps the side stream busy 20 ms after an 8 MB copy (~0.15 ms)."""
    transform_ms = 20.0
    cycles = int(transform_ms * calibrate_cuda_sleep())

    def slow_transform(batch):
        torch.cuda._sleep(cycles)
        return batch * 2

    copier = SideStreamCopier(torch.device("cuda", 0), timing_every=1, device_transform=slow_transform)
    host = torch.arange(1 << 21, dtype=torch.float32).pin_memory()  # 8 MiB: above min_bytes
    results = [copier.hand_over(copier.issue(host)) for _ in range(4)]
    torch.cuda.synchronize()
    assert all(torch.equal(result.cpu(), host * 2) for result in results)
    timings = copier.completed()
    assert len(timings) == 4
    for timing in timings:
        assert timing.copy < 0.1 * transform_ms / 1e3, "the copy's time must not include the transform"
        assert timing.transform == pytest.approx(transform_ms / 1e3, rel=0.15)
    stats = CopyStats.of(timings)
    assert stats.gbps > 10 and stats.transform_s == pytest.approx(0.02, rel=0.15)


@pytest.mark.cuda
def test_reused_events_keep_every_copy_exact_and_the_compute_stream_current():
    device = torch.device("cuda", 0)
    # the side stream throughout: the test counts its timed copies
    copier = SideStreamCopier(device, min_bytes=0, timing_every=2, stock_when_host_bound=False)
    compute = torch.cuda.current_stream(device)
    sources = [torch.full((1 << 18,), float(value)).pin_memory() for value in range(5)]
    queue, sums, untimed_events, timings = [], [], set(), []
    for index in range(200):
        queue.append(copier.issue(sources[index % 5]))
        assert torch.cuda.current_stream(device) == compute
        if len(queue) > 2:  # two copies ahead of the one handed over
            inflight = queue.pop(0)
            if inflight.copy_start is None:
                untimed_events.add(id(inflight.copy_done))
            torch.cuda._sleep(200_000)  # the GPU lags behind the host, so events are re-recorded early
            sums.append(copier.hand_over(inflight).sum())
        if index % 10 == 0:
            timings += copier.completed()
    torch.cuda.synchronize()
    timings += copier.completed()
    expected = [float(index % 5) * (1 << 18) for index in range(len(sums))]
    assert torch.stack(sums).tolist() == expected
    assert len(timings) == 99 and all(timing.copy > 0 for timing in timings)  # timed copies handed over
    assert len(untimed_events) <= 4, "untimed copy events are taken from the pool again"


@pytest.mark.cuda
@pytest.mark.parametrize("gpu_bound", [False, True])
def test_host_bound_runs_take_the_stock_copy_and_gpu_bound_runs_the_side_stream_exactly(gpu_bound):
    device = torch.device("cuda", 0)
    copier = SideStreamCopier(device)
    step_cycles = int(2.0 * calibrate_cuda_sleep())  # a 2 ms GPU step
    sources = [torch.full((1 << 20,), float(value)).pin_memory() for value in range(7)]  # 4 MiB: above min_bytes
    inflight, sums = copier.issue(sources[0]), []
    for index in range(1, 129):
        if not gpu_bound:  # the GPU idles while the host prepares the next batch
            torch.cuda.current_stream(device).synchronize()
        ahead = copier.issue(sources[index % 7])
        batch = copier.hand_over(inflight)
        if gpu_bound:
            torch.cuda._sleep(step_cycles)
        sums.append(batch.sum())
        inflight = ahead
    torch.cuda.synchronize()
    assert torch.stack(sums).tolist() == [float(index % 7) * (1 << 20) for index in range(128)]
    assert copier.regime.stock is not gpu_bound
    assert (copier.regime.stock_batches > 64) is not gpu_bound


@pytest.mark.cuda
def test_registered_name_picks_the_gpu(tmp_path):
    trainer = pl.Trainer(max_epochs=1, strategy="side_stream", **trainer_kwargs(tmp_path, accelerator="cuda"))
    trainer.fit(ChecksumModel(), DataLoader(Checksummed(), batch_size=8))
    assert trainer.strategy.root_device.type == "cuda"


class Boxes:
    """A batch leaf that is not a tensor but moves with ``.to()`` (like torchvision's or detectron's)."""

    def __init__(self, corners: torch.Tensor) -> None:
        self.corners = corners

    def to(self, *args, **kwargs):
        return Boxes(self.corners.to(*args, **kwargs))


class TransformedData(Dataset):
    def __len__(self):
        return 48

    def __getitem__(self, index):
        image, generator = seeded_image(index)
        corners = torch.rand(4, generator=generator)
        expected = 2 * image.double().sum()  # what to_float_doubled gives, exactly (integers in float32)
        return {"image": image, "boxes": Boxes(corners), "expected": expected, "corners": corners}


def collate_with_boxes(samples):
    batch = torch.utils.data.default_collate([{k: v for k, v in s.items() if k != "boxes"} for s in samples])
    batch["boxes"] = Boxes(torch.stack([s["boxes"].corners for s in samples]))
    return batch


class TransformedModel(ChecksumModel):
    def training_step(self, batch, batch_idx):
        image, boxes = batch["image"], batch["boxes"]
        assert image.is_cuda and image.dtype == torch.float32 and boxes.corners.is_cuda
        wrong_image = image.double().sum(dim=(1, 2, 3)) != batch["expected"]
        wrong_boxes = (boxes.corners != batch["corners"]).any(dim=1)
        self.mismatches.append((wrong_image | wrong_boxes).sum())
        return self.layer(image.mean(dim=(1, 2, 3), keepdim=True)[:, :1] * 0).sum()


def to_float_doubled(batch):
    return {**batch, "image": batch["image"].float() * 2}


@pytest.mark.cuda
@pytest.mark.parametrize("lookahead", [0, 2])
def test_device_transform_and_to_objects_are_exact_on_both_allocation_paths(tmp_path, lookahead):
    model = TransformedModel()
    strategy = SideStreamStrategy(lookahead=lookahead, min_bytes=0, device_transform=to_float_doubled)
    kwargs = trainer_kwargs(tmp_path, accelerator="cuda")
    trainer = pl.Trainer(max_epochs=2, strategy=strategy, **kwargs)
    loader = DataLoader(TransformedData(), batch_size=8, shuffle=True, collate_fn=collate_with_boxes)
    trainer.fit(model, loader)
    assert len(model.mismatches) == 12 and int(torch.stack(model.mismatches).sum()) == 0


class Tagged(torch.Tensor):
    """A tensor subclass whose ``.to()`` and ``.pin_memory()`` carry metadata (as torchvision's tv_tensors do)."""

    def to(self, *args, **kwargs):
        moved = super().to(*args, **kwargs)
        moved.tag = self.tag
        return moved

    def pin_memory(self, *args, **kwargs):
        pinned = super().pin_memory(*args, **kwargs)
        pinned.tag = self.tag
        return pinned


@pytest.mark.cuda
def test_tensor_subclasses_and_grad_tensors_move_with_their_own_to():
    copier = SideStreamCopier(torch.device("cuda", 0), min_bytes=0)
    boxes = torch.arange(1024.0).as_subclass(Tagged)
    boxes.tag = "xyxy"
    weights = torch.ones(8, requires_grad=True)
    plain = torch.arange(1 << 16, dtype=torch.float32)
    moved = copier.hand_over(copier.issue({"boxes": boxes, "weights": weights, "plain": plain}))
    torch.cuda.synchronize()
    assert type(moved["boxes"]) is Tagged and moved["boxes"].tag == "xyxy" and moved["boxes"].is_cuda
    assert torch.equal(moved["boxes"].as_subclass(torch.Tensor).cpu(), boxes.as_subclass(torch.Tensor))
    assert moved["weights"].requires_grad and moved["weights"].is_cuda
    assert torch.equal(moved["plain"].cpu(), plain)
