"""The GPU decode path against the CPU reference; bad inputs; no leaks across epochs (CUDA only)."""

from __future__ import annotations

import threading

import pytest
import torch
from torch.utils.data import DataLoader

from lightning_dataperf.decode import DecodeError, GpuDecodeLoader, JpegDecoder
from lightning_dataperf.decode.encoded import EncodedImageDataset, collate_encoded

pytestmark = pytest.mark.cuda
pytest.importorskip("PIL")
from helpers import decode_backends, odd_files, write_files  # noqa: E402

IDENTITY = {"mean": (0.0, 0.0, 0.0), "std": (1 / 255, 1 / 255, 1 / 255)}
# nvJPEG and libjpeg differ in IDCT and chroma upsampling: torchvision's own test allows a mean of 2 levels.
MEAN_TOLERANCE, P99_TOLERANCE = 2.0, 16.0


BACKENDS = decode_backends()


def _compare(gpu: torch.Tensor, cpu: torch.Tensor) -> tuple[float, float]:
    difference = (gpu.float().cpu() - cpu.float()).abs()
    return difference.mean().item(), difference.flatten().quantile(0.99).item()


@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_batch_matches_cpu_reference(tmp_path, backend):
    samples = write_files(str(tmp_path), 24, sizes=((200, 320), (480, 260), (333, 333), (250, 500)))
    dataset = EncodedImageDataset(samples, seed=11)
    batch = collate_encoded([dataset[i] for i in range(24)])
    gpu = JpegDecoder("cuda", size=224, backend=backend, **IDENTITY)
    images, labels = gpu(batch)
    images, labels = gpu(batch)  # twice: the nvImageCodec backend settles on decoding in place or copying
    torch.cuda.synchronize()
    assert images.device.type == "cuda" and images.is_contiguous(memory_format=torch.channels_last)
    reference, reference_labels = JpegDecoder("cpu", size=224, **IDENTITY)(batch)
    mean, p99 = _compare(images, reference)
    into = getattr(gpu.backend, "into", None)
    print(f"{backend} vs CPU decode: mean abs {mean:.3f}, p99 {p99:.2f} (0..255), decodes in place: {into}")
    assert mean < MEAN_TOLERANCE and p99 < P99_TOLERANCE
    assert torch.equal(labels.cpu(), reference_labels)
    assert gpu.stats().cpu_fallback == 0
    bf16, _ = JpegDecoder("cuda", size=224, dtype=torch.bfloat16, backend=backend, graph_augment=False)(batch)
    assert bf16.dtype == torch.bfloat16 and bf16.is_contiguous(memory_format=torch.channels_last)
    fp32, _ = JpegDecoder("cuda", size=224, backend=backend)(batch)
    torch.testing.assert_close(bf16.float(), fp32, atol=0.05, rtol=0.01)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_inputs_fall_back_or_fail_clearly(tmp_path, backend):
    paths = odd_files(str(tmp_path))
    good = write_files(str(tmp_path / "ok"), 3)
    odd = ["progressive", "grayscale", "cmyk", "png"]
    dataset = EncodedImageDataset(good + [(paths[name], 0) for name in odd], seed=1)
    batch = collate_encoded([dataset[i] for i in range(len(dataset))])
    decoder = JpegDecoder("cuda", size=32, backend=backend, **IDENTITY)
    images, _ = decoder(batch)
    reference, _ = JpegDecoder("cpu", size=32, **IDENTITY)(batch)
    mean, _ = _compare(images, reference)
    assert mean < MEAN_TOLERANCE
    assert decoder.stats().cpu_fallback == len(odd)
    for name in ("zero", "garbage", "truncated"):
        bad = EncodedImageDataset([good[0], (paths[name], 0)])
        with pytest.raises(DecodeError, match=r"dataset index 1"):
            decoder(collate_encoded([bad[0], bad[1]]))
    everything_bad = EncodedImageDataset([(paths["zero"], 0), (paths["garbage"], 1)])
    zeros = JpegDecoder("cuda", size=8, on_error="zeros", backend=backend)
    images, labels = zeros(collate_encoded([everything_bad[0], everything_bad[1]]))
    assert images.shape == (2, 3, 8, 8) and labels.tolist() == [0, 1] and zeros.stats().undecodable == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_corrupt_scan_data_does_not_kill_the_batch(tmp_path, backend):
    good = write_files(str(tmp_path), 4)
    with open(good[1][0], "rb") as file:
        data = bytearray(file.read())
    middle = len(data) // 2
    data[middle : middle + 200] = bytes(range(200))  # header intact, entropy-coded data garbled
    with open(good[1][0], "wb") as file:
        file.write(bytes(data))
    dataset = EncodedImageDataset(good)
    decoder = JpegDecoder("cuda", size=16, on_error="zeros", backend=backend)
    images, _ = decoder(collate_encoded([dataset[i] for i in range(4)]))
    assert images.shape == (4, 3, 16, 16) and torch.isfinite(images.float()).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_loader_epochs_no_leaks(tmp_path, backend):
    samples = write_files(str(tmp_path), 40, sizes=((100, 140), (160, 90)))
    dataset = EncodedImageDataset(samples, seed=3)
    loader = DataLoader(dataset, batch_size=8, shuffle=True, num_workers=2, collate_fn=collate_encoded)
    train = GpuDecodeLoader(loader, device="cuda", size=64, dtype=torch.bfloat16, lookahead=2, backend=backend)
    before = set(threading.enumerate())
    allocated = []
    for epoch in range(3):
        train.set_epoch(epoch)
        count = 0
        for images, labels in train:
            assert images.dtype == torch.bfloat16 and images.shape[1:] == (3, 64, 64) and labels.is_cuda
            (images.float().mean() + labels.float().mean()).item()  # use them on the compute stream
            count += images.shape[0]
        assert count == 40
        del images, labels
        torch.cuda.synchronize()
        allocated.append(torch.cuda.memory_allocated())
        left = [t for t in threading.enumerate() if t not in before and t.name == "dataperf-gpu-decode"]
        assert not [t for t in left if t.is_alive()]
    assert allocated[2] <= allocated[0] + (1 << 20), allocated
    stats = train.stats()
    assert stats.images == 120 and stats.decode_seconds > 0 and stats.backend == backend
    print("stats:", stats.to_metrics())


def test_lightning_fit_receives_decoded_batches(tmp_path):
    import lightning.pytorch as pl

    samples = write_files(str(tmp_path / "data"), 32)
    dataset = EncodedImageDataset(samples, seed=0)
    seen = []

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Conv2d(3, 5, 3)

        def training_step(self, batch, batch_idx):
            images, labels = batch
            seen.append((images.device.type, images.dtype, images.is_contiguous(memory_format=torch.channels_last)))
            out = self.layer(images.float()).mean((2, 3))
            return torch.nn.functional.cross_entropy(out, labels)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            base = DataLoader(dataset, batch_size=8, shuffle=True, num_workers=2, collate_fn=collate_encoded)
            return GpuDecodeLoader(base, size=32, dtype=torch.bfloat16)

    trainer = pl.Trainer(
        accelerator="gpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, default_root_dir=str(tmp_path),
    )  # fmt: skip
    trainer.fit(Model())
    assert len(seen) == 8 and set(seen) == {("cuda", torch.bfloat16, True)}
    assert dataset.epoch == 1  # Lightning's set_epoch reached the dataset


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_graphed_augment_equals_eager(tmp_path, backend, compiled):
    """Batches of one size through the CUDA graph (growing its buffer once), a partial batch eagerly; the
    graph of the torch.compile'd augment within one bfloat16 step (its float rounding order differs)."""
    small = write_files(str(tmp_path / "small"), 8, sizes=((64, 80), (72, 60)))
    large = write_files(str(tmp_path / "large"), 8, sizes=((300, 420), (380, 260)))
    dataset = EncodedImageDataset(small + large, seed=5)
    batches = [
        collate_encoded([dataset[i] for i in chunk]) for chunk in (range(8), range(8, 16), range(4, 12), range(3))
    ]
    options = {"size": 48, "dtype": torch.bfloat16, "backend": backend}
    graphed = JpegDecoder("cuda", graph_augment=True, compile_augment=compiled, **options)
    eager = JpegDecoder("cuda", graph_augment=False, **options)
    outputs = [(graphed(batch), eager(batch)) for batch in batches]
    torch.cuda.synchronize()
    assert graphed.graph_augment, "the capture failed: the decoder fell back to eager"
    assert graphed.compile_augment == compiled, "torch.compile of the augment failed (see the warning)"
    assert graphed._graphed is not None and graphed._graphed.batch == 8
    for (images, labels), (expected, expected_labels) in outputs:
        assert images.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(labels, expected_labels)
        if compiled:  # normalised values within +-2.7: a bfloat16 step there is 2**-6
            torch.testing.assert_close(images.float(), expected.float(), atol=2**-6 + 1e-6, rtol=0)
        else:
            assert torch.equal(images, expected)


def _collect(_worker_id: int) -> None:
    import gc

    gc.collect()


@pytest.mark.parametrize("backend", BACKENDS)
def test_workers_survive_the_parents_cuda_garbage(tmp_path, backend):
    """The H200 worker segfaults: a forked worker's garbage collection ran the destructors of the parent's
    garbage (a dropped decoder's CUDA graph, nvImageCodec decoder). Here: such garbage, a worker that collects."""
    import gc

    samples = write_files(str(tmp_path), 16, sizes=((100, 140),))
    dataset = EncodedImageDataset(samples, seed=3)
    batch = collate_encoded([dataset[i] for i in range(8)])
    gc.disable()
    try:
        dropped = JpegDecoder("cuda", size=32, backend=backend, graph_augment=True)
        dropped(batch)
        torch.cuda.synchronize()
        dropped.cycle = dropped  # garbage only the cycle collector frees
        del dropped
        loader = DataLoader(dataset, batch_size=8, num_workers=2, collate_fn=collate_encoded, worker_init_fn=_collect)
        train = GpuDecodeLoader(loader, device="cuda", size=32, backend=backend)
        assert sum(images.shape[0] for images, _ in train) == 16
    finally:
        gc.enable()
