"""Side-stream transfer on a real GPU. Skips without CUDA; run on the H200 (see benchmarks/README.md)."""

import lightning.pytorch as pl
import pytest
import torch
from helpers import Checksummed, ChecksumModel, seeded_image, trainer_kwargs
from torch.utils.data import DataLoader, Dataset

from lightning_dataperf import DataPerfCallback, SideStreamStrategy
from lightning_dataperf.testing import calibrate_cuda_sleep
from lightning_dataperf.transfer.copier import SideStreamCopier
from lightning_dataperf.transfer.stats import CopyStats

pytestmark = pytest.mark.cuda


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


def test_one_copy_in_timing_every_is_timed():
    copier = SideStreamCopier(torch.device("cuda", 0), min_bytes=0, timing_every=3)
    host = torch.arange(1 << 16, dtype=torch.float32).pin_memory()
    results = [copier.hand_over(copier.issue({"x": host, "n": 3})) for _ in range(7)]
    torch.cuda.synchronize()
    assert all(torch.equal(result["x"].cpu(), host) and result["n"] == 3 for result in results)
    timings = copier.completed()
    assert len(timings) == 3 and all(timing.bytes == host.nbytes and timing.copy > 0 for timing in timings)


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


def test_reused_events_keep_every_copy_exact_and_the_compute_stream_current():
    device = torch.device("cuda", 0)
    copier = SideStreamCopier(device, min_bytes=0, timing_every=2)
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
