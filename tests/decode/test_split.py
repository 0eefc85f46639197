"""Split decode on the CPU (issue 46): the workers' share and the decoder's share assembled in the sampler's order,
the same draws whatever ``gpu_share``; bad files as before; the ``DecodeBackend`` protocol's checks."""

from __future__ import annotations

import pathlib

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler

from lightning_dataperf.decode import BackendBase, DecodeBackend, DecodeError, GpuDecodeLoader, JpegDecoder
from lightning_dataperf.decode._backends import make_backend
from lightning_dataperf.decode.encoded import EncodedImageDataset, collate_encoded
from lightning_dataperf.decode.split import SplitCollate, share_count
from lightning_dataperf.loader.probe import TimedCollate

pytest.importorskip("PIL")
from helpers import odd_files, reference, write_files

# outputs in levels of 255
IDENTITY = {"mean": (0.0, 0.0, 0.0), "std": (1 / 255, 1 / 255, 1 / 255)}
# the CPU share resizes in PyTorch's uint8 bilinear kernel, the decoder's path gathers in float32 (then rounds
# for a uint8 output): the same arithmetic within one level per value (docs/gpu_decode.md, split decode)
MAX_LEVELS, MEAN_LEVELS = 1.0 + 1e-3, 0.35
SIZES = ((96, 128), (120, 80), (64, 64), (150, 110), (200, 90))


def _indexed(root: pathlib.Path, count: int, seed: int = 3, extra=()) -> EncodedImageDataset:
    """Files labelled by their dataset index, so a batch's labels are the sampler's order."""
    samples = [(path, i) for i, (path, _) in enumerate([*write_files(str(root), count, sizes=SIZES), *extra])]
    return EncodedImageDataset(samples, seed=seed)


def _epoch(dataset, share: float, workers: int, dtype=torch.float32, **options) -> tuple[list, GpuDecodeLoader]:
    sampler = RandomSampler(range(len(dataset)), generator=torch.Generator().manual_seed(5))
    base = DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=workers, collate_fn=collate_encoded)
    loader = GpuDecodeLoader(base, device="cpu", size=40, dtype=dtype, gpu_share=share, **options)
    return [(images.clone(), labels.clone()) for images, labels in loader], loader


@pytest.mark.parametrize("workers", [0, 2])
def test_every_share_gives_the_same_samples_order_and_draws(tmp_path, workers):
    dataset = _indexed(tmp_path, 36)
    order = list(RandomSampler(range(36), generator=torch.Generator().manual_seed(5)))
    whole, _ = _epoch(dataset, 1.0, workers, **IDENTITY)
    assert [label for _, labels in whole for label in labels.tolist()] == order
    for share in (0.0, 0.5):
        split, loader = _epoch(dataset, share, workers, **IDENTITY)
        assert loader.split_in == "workers"
        stats = loader.stats()
        # 4 batches of 8 and one of 4
        assert stats.cpu_share == 4 * share_count(share, 8) + share_count(share, 4) and stats.images == 36
        assert stats.cpu_fallback == 0
        for (images, labels), (expected, expected_labels) in zip(split, whole, strict=True):
            assert torch.equal(labels, expected_labels)
            assert images.shape == expected.shape and images.is_contiguous(memory_format=torch.channels_last)
            difference = (images - expected).abs()
            assert difference.max().item() <= MAX_LEVELS and difference.mean().item() <= MEAN_LEVELS
        # each image is its index's file with its own crop and flip (not merely close to the other share's)
        for images, labels in split[:2]:
            for image, index in zip(images, labels.tolist(), strict=True):
                sample = dataset[index]
                expected = reference(sample.data, sample.box, sample.flip, 40)
                assert (image - expected).abs().max().item() <= MAX_LEVELS


def test_the_cpu_share_equals_the_cpu_decoder_within_one_level(tmp_path):
    """The stated tolerance against ``GpuDecodeLoader(device="cpu")``'s own path (PIL, the gather): uint8 outputs."""
    dataset = _indexed(tmp_path, 40, seed=9)
    whole, _ = _epoch(dataset, 1.0, 0, dtype=torch.uint8)
    split, _ = _epoch(dataset, 0.0, 0, dtype=torch.uint8)
    differences = torch.cat([(a.int() - b.int()).abs().flatten() for (a, _), (b, _) in zip(split, whole, strict=True)])
    print(f"CPU share vs the decoder's path: max {differences.max().item()}, mean {differences.float().mean():.4f}")
    assert differences.max().item() <= 1 and differences.float().mean().item() <= MEAN_LEVELS


def test_the_workers_send_pixels_not_bytes(tmp_path):
    dataset = _indexed(tmp_path, 8)
    base = DataLoader(dataset, batch_size=8, num_workers=2, collate_fn=collate_encoded)
    GpuDecodeLoader(base, device="cpu", size=32, gpu_share=0.25)
    assert isinstance(base.collate_fn, SplitCollate) and base.collate_fn.gpu_share == 0.25
    (batch,) = list(base)
    assert batch.pixels is not None and batch.pixels.dtype == torch.uint8 and batch.pixels.shape == (6, 32, 32, 3)
    positions = batch.positions.tolist()
    assert positions == [0, 1, 2, 3, 4, 5]
    lengths = (batch.offsets[1:] - batch.offsets[:-1]).tolist()
    assert [lengths[i] for i in positions] == [0] * 6 and all(lengths[i] > 0 for i in (6, 7))
    assert collate_encoded is not base.collate_fn  # the shared one is untouched
    # the decoder copies them through its augment unchanged (uint8 out: exactly the worker's pixels)
    images, labels = JpegDecoder("cpu", size=32, dtype=torch.uint8, gpu_share=0.25)(batch)
    assert torch.equal(images[:6], batch.pixels.permute(0, 3, 1, 2)) and labels.tolist() == list(range(8))


def test_the_share_reaches_the_workers_at_the_next_iterator(tmp_path):
    dataset = _indexed(tmp_path, 16)
    base = DataLoader(dataset, batch_size=8, num_workers=2, collate_fn=collate_encoded)
    loader = GpuDecodeLoader(base, device="cpu", size=16)
    assert loader.gpu_share == 1.0 and base.collate_fn is collate_encoded
    assert sum(len(images) for images, _ in loader) == 16 and loader.stats().cpu_share == 0
    loader.set_gpu_share(0.25)
    assert sum(len(images) for images, _ in loader) == 16 and loader.stats().cpu_share == 2 * 6
    loader.set_gpu_share(1)
    assert base.collate_fn is collate_encoded


def test_a_split_batch_reserves_room_for_every_sample_at_its_headers_size(tmp_path):
    dataset = _indexed(tmp_path, 8)
    samples = [dataset[i] for i in range(8)]
    header_bytes = 3 * sum(sample.height * sample.width for sample in samples)
    decoder = JpegDecoder("cpu", size=16, gpu_share=0.5)
    prepared = decoder.prepare(SplitCollate(0.5, size=16)(samples))
    # four decoded at their own size, four ready at 16 x 16; the graph's buffer is sized from the headers
    assert prepared.needed < header_bytes == prepared.reserve
    assert prepared.needed - prepared.share_start == 4 * 3 * 16 * 16


def test_a_loader_without_collate_encoded_splits_on_the_host(tmp_path):
    dataset = _indexed(tmp_path, 12)
    batches = [collate_encoded([dataset[i] for i in range(k, k + 4)]) for k in range(0, 12, 4)]
    expected = [JpegDecoder("cpu", size=24, **IDENTITY)(batch) for batch in batches]
    loader = GpuDecodeLoader(batches, device="cpu", size=24, gpu_share=0.5, **IDENTITY)
    assert loader.split_in == "host"
    for (images, labels), (reference_images, reference_labels) in zip(loader, expected, strict=True):
        assert torch.equal(labels, reference_labels)
        assert (images - reference_images).abs().max().item() <= MAX_LEVELS
    assert loader.stats().cpu_share == 3 * 2


def test_a_probes_timed_collate_gets_the_split_inside():
    base = DataLoader(list(range(4)), batch_size=2, collate_fn=TimedCollate(collate_encoded))
    GpuDecodeLoader(base, device="cpu", size=8, gpu_share=0.5)
    assert isinstance(base.collate_fn, TimedCollate) and isinstance(base.collate_fn.collate_fn, SplitCollate)


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_bad_files_are_handled_as_before_on_both_sides(tmp_path, share):
    paths = odd_files(str(tmp_path / "odd"))
    names = ["progressive", "zero", "grayscale", "garbage", "cmyk", "truncated", "png"]
    dataset = _indexed(tmp_path / "ok", 5, extra=[(paths[name], 0) for name in names])
    batch = [dataset[i] for i in range(len(dataset))]
    options = {"size": 24, "on_error": "zeros", **IDENTITY}
    expected, _ = JpegDecoder("cpu", **options)(collate_encoded(batch))
    decoder = JpegDecoder("cpu", gpu_share=share, **options)
    images, labels = decoder(SplitCollate(share, size=24)(batch))
    assert labels.tolist() == list(range(len(dataset)))
    assert (images - expected).abs().max().item() <= MAX_LEVELS
    # zero-byte, garbage and truncated: undecodable on either side, zeros as before
    assert decoder.stats().undecodable == 3
    for name in ("zero", "garbage", "truncated"):
        assert images[5 + names.index(name)].abs().max().item() == 0
    raising = JpegDecoder("cpu", size=24, gpu_share=share)
    with pytest.raises(DecodeError, match=r"dataset index 6 \(.*zero\.img\)"):
        raising(SplitCollate(share, size=24)(batch))


def test_a_share_out_of_range_is_a_clear_error(tmp_path):
    batches = [collate_encoded([_indexed(tmp_path, 2)[0]])]
    for share in (1.5, -0.1, "0.5", True, None):
        with pytest.raises(ValueError, match=r"gpu_share must be a number in \[0, 1\]"):
            GpuDecodeLoader(batches, device="cpu", gpu_share=share)
    loader = GpuDecodeLoader(batches, device="cpu")
    with pytest.raises(ValueError, match="gpu_share"):
        loader.set_gpu_share(2)
    assert loader.gpu_share == 1.0
    with pytest.raises(ValueError, match="gpu_share"):
        SplitCollate(-1)
    with pytest.raises(ValueError, match="cpu_decoder"):
        GpuDecodeLoader(batches, device="cpu", cpu_decoder="libjpeg")


def test_a_pluggable_cpu_decoder_is_used_in_the_share(tmp_path):
    from lightning_dataperf.decode._slots import pil_decode

    dataset = _indexed(tmp_path, 4)
    calls: list[int] = []

    def counting(data: bytes) -> torch.Tensor:
        calls.append(len(data))
        return pil_decode(data)

    batch = SplitCollate(0.0, size=16, cpu_decoder=counting)([dataset[i] for i in range(4)])
    assert len(calls) == 4 and batch.pixels is not None and len(batch.pixels) == 4


def test_split_stress_every_image_against_its_reference(tmp_path):
    """The CPU version of benchmarks/gpu_decode_stress.py --gpu-share: every image of 120 batches drawn with
    replacement (bad files among them, zeroed) against its index's reference, two workers, two epochs."""
    paths = odd_files(str(tmp_path / "odd"))
    dataset = _indexed(tmp_path / "ok", 24, extra=[(paths["zero"], 0), (paths["progressive"], 0)])
    bad = {len(dataset) - 2}
    sampler = RandomSampler(range(len(dataset)), replacement=True, num_samples=60 * 6)
    base = DataLoader(dataset, batch_size=6, sampler=sampler, num_workers=2, collate_fn=collate_encoded)
    loader = GpuDecodeLoader(base, device="cpu", size=16, on_error="zeros", gpu_share=0.5, **IDENTITY)
    seen = 0
    for epoch in range(2):
        loader.set_epoch(epoch)
        expected = {}
        for index in range(len(dataset)):
            sample = dataset[index]
            if index not in bad:
                expected[index] = reference(sample.data, sample.box, sample.flip, 16)
        for images, labels in loader:
            assert images.shape == (6, 3, 16, 16)
            for image, index in zip(images, labels.tolist(), strict=True):
                if index in bad:
                    assert image.abs().max().item() == 0
                else:
                    assert (image - expected[index]).abs().max().item() <= MAX_LEVELS, (epoch, index)
                seen += 1
    assert seen == 2 * 360
    stats = loader.stats()
    assert stats.images == 720 and stats.cpu_share > 0 and stats.batches == 120


class _Planar:
    """A backend object of one's own that does not subclass BackendBase."""

    layout = "chw"

    def decode(self, data, spans, sizes, flat, bases):
        return [True] * len(spans), None


def test_a_backend_object_is_checked_and_given_the_defaults():
    adopted = make_backend(_Planar(), torch.device("cpu"))
    assert isinstance(adopted, DecodeBackend) and adopted.layout == "chw"
    assert (adopted.name, adopted.writes_at_call, adopted.ordered, adopted.can_submit) == ("custom", True, True, False)
    assert adopted.prepare(torch.empty(0), []) is None

    class Own(BackendBase):
        layout, writes_at_call = "hwc", False

        def decode(self, data, spans, sizes, flat, bases, **extra):
            return [], None

    own = Own()
    assert make_backend(own, torch.device("cpu")) is own and isinstance(own, DecodeBackend)

    class NoDecode:
        layout = "hwc"

    class NoLayout:
        def decode(self, *args):
            return [], None

    with pytest.raises(TypeError, match=r"has no decode\b"):
        JpegDecoder("cpu", backend=NoDecode())
    with pytest.raises(TypeError, match=r"has no layout\b"):
        JpegDecoder("cpu", backend=NoLayout())
    with pytest.raises(TypeError, match=r"has no layout, decode"):
        JpegDecoder("cpu", backend=object())
    planar = _Planar()
    planar.layout = "rgb"
    with pytest.raises(ValueError, match="layout must be one of"):
        JpegDecoder("cpu", backend=planar)


def test_the_three_libraries_are_backends_with_their_own_ordering():
    from lightning_dataperf.decode._nvimgcodec import NvImageCodecBackend
    from lightning_dataperf.decode._nvjpeg import NvJpegBackend
    from lightning_dataperf.decode._torchvision import TorchvisionBackend

    expected = {TorchvisionBackend: ("chw", False, True), NvJpegBackend: ("hwc", True, False),
                NvImageCodecBackend: ("hwc", True, False)}  # fmt: skip
    for cls, (layout, writes_at_call, can_submit) in expected.items():
        assert issubclass(cls, BackendBase) and callable(cls.decode) and callable(cls.prepare)
        assert (cls.layout, cls.writes_at_call, cls.can_submit) == (layout, writes_at_call, can_submit), cls


def test_no_optional_backend_member_is_looked_up_by_getattr():
    root = pathlib.Path(__file__).resolve().parents[2] / "lightning_dataperf" / "decode"
    for name in ("decoder.py", "_prepare.py", "_pipeline.py", "_backends.py", "loader.py"):
        text = (root / name).read_text()
        assert "getattr(self.backend" not in text and "getattr(backend" not in text, name
