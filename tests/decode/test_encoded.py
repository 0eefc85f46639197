"""Encoded-JPEG batches on the CPU: header parse, packing, reproducible parameters, CPU decode, bad files."""

from __future__ import annotations

import ctypes
import struct

import pytest
import torch
from torch.utils.data import DataLoader, Subset

from lightning_dataperf.decode import DecodeError, GpuDecodeLoader, JpegDecoder
from lightning_dataperf.decode.encoded import EncodedImageDataset, collate_encoded
from lightning_dataperf.decode.headers import KIND_BAD, KIND_CPU, KIND_GPU, probe_image

pytest.importorskip("PIL")
from helpers import encode, odd_files, reference, smooth_pixels, write_files

IDENTITY = {"mean": (0.0, 0.0, 0.0), "std": (1 / 255, 1 / 255, 1 / 255)}  # output in 0..255 units


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def _minimal_jpeg(marker: int, height: int, width: int, components: int) -> bytes:
    """SOI, an APP0 segment, a frame header; no scan (enough for the header parser)."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    frame = struct.pack(">BHHB", 8, height, width, components) + b"\x01\x22\x00" * components
    sof = bytes([0xFF, marker]) + struct.pack(">H", 2 + len(frame)) + frame
    return b"\xff\xd8" + app0 + sof + b"\xff\xd9"


def test_header_parse_hand_made():
    assert probe_image(_minimal_jpeg(0xC0, 333, 517, 3)) == probe_image(_minimal_jpeg(0xC0, 333, 517, 3))
    probe = probe_image(_minimal_jpeg(0xC0, 333, 517, 3))
    assert (probe.kind, probe.height, probe.width) == (KIND_GPU, 333, 517)
    assert probe_image(_minimal_jpeg(0xC1, 10, 20, 3)).kind == KIND_GPU
    progressive = probe_image(_minimal_jpeg(0xC2, 40, 50, 3))
    assert (progressive.kind, progressive.height, progressive.width) == (KIND_CPU, 40, 50)
    assert "progressive" in progressive.reason
    assert probe_image(_minimal_jpeg(0xC0, 40, 50, 1)).kind == KIND_CPU
    assert probe_image(_minimal_jpeg(0xC0, 40, 50, 4)).kind == KIND_CPU
    assert probe_image(b"").kind == KIND_BAD
    assert probe_image(b"\xff\xd8\xff\xda\x00\x02").kind == KIND_BAD  # scan before any frame header


def test_header_parse_real_files(tmp_path):
    pixels = smooth_pixels(61, 83, 0)
    probe = probe_image(encode(pixels))
    assert (probe.kind, probe.height, probe.width) == (KIND_GPU, 61, 83)
    paths = odd_files(str(tmp_path))
    kinds = {name: probe_image(_read(path)) for name, path in paths.items()}
    for name in ("progressive", "grayscale", "cmyk", "png", "truncated"):
        assert kinds[name].kind == KIND_CPU, (name, kinds[name])
        assert (kinds[name].height, kinds[name].width) == (72, 90), name
    assert kinds["zero"].kind == KIND_BAD and "zero-byte" in kinds["zero"].reason
    assert kinds["garbage"].kind == KIND_BAD


def test_packing_round_trip(tmp_path):
    samples = write_files(str(tmp_path), 6)
    dataset = EncodedImageDataset(samples, seed=3)
    batch = collate_encoded([dataset[i] for i in range(6)])
    assert batch.data.dtype == torch.uint8 and batch.data.dim() == 1
    assert batch.offsets.tolist()[0] == 0 and batch.offsets.tolist()[-1] == batch.data.numel()
    for i, part in enumerate(batch.split()):
        assert part.numpy().tobytes() == _read(samples[i][0])
        assert torch.equal(batch.encoded(i), part)
    assert batch.labels.tolist() == [label for _, label in samples]
    assert batch.indices.tolist() == list(range(6))
    assert batch.sizes.tolist()[0] == [96, 128]
    top, left, height, width = batch.boxes.unbind(1)
    assert bool(((top + height) <= batch.sizes[:, 0]).all() and ((left + width) <= batch.sizes[:, 1]).all())
    moved = batch.to("cpu")
    assert torch.equal(moved.meta, batch.meta) and moved.paths == batch.paths


def _params_by_index(loader: DataLoader) -> dict[int, list[int]]:
    found = {}
    for batch in loader:
        for row in batch.meta.tolist():
            found[row[1]] = row
    return found


def test_params_identical_across_workers_epochs_and_resume(tmp_path):
    samples = write_files(str(tmp_path), 12)
    dataset = EncodedImageDataset(samples, seed=7)
    serial = _params_by_index(DataLoader(dataset, batch_size=4, collate_fn=collate_encoded))
    parallel = _params_by_index(DataLoader(dataset, batch_size=3, num_workers=2, collate_fn=collate_encoded))
    assert serial == parallel
    shuffled = _params_by_index(DataLoader(dataset, batch_size=5, shuffle=True, collate_fn=collate_encoded))
    assert shuffled == serial  # any order
    resumed = _params_by_index(DataLoader(Subset(dataset, range(7, 12)), batch_size=2, collate_fn=collate_encoded))
    assert all(resumed[i] == serial[i] for i in range(7, 12))
    dataset.set_epoch(1)
    epoch1 = _params_by_index(DataLoader(dataset, batch_size=4, collate_fn=collate_encoded))
    assert epoch1 != serial


def test_persistent_workers_follow_set_epoch(tmp_path):
    samples = write_files(str(tmp_path), 8)
    dataset = EncodedImageDataset(samples, seed=1)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, persistent_workers=True, collate_fn=collate_encoded)
    first = _params_by_index(loader)
    dataset.set_epoch(1)
    second = _params_by_index(loader)
    expected = EncodedImageDataset(samples, seed=1)
    expected.set_epoch(1)
    assert second == _params_by_index(DataLoader(expected, batch_size=8, collate_fn=collate_encoded))
    assert first != second


def test_cpu_decode_matches_reference(tmp_path, no_leaked_threads):
    samples = write_files(str(tmp_path), 10)
    dataset = EncodedImageDataset(samples, seed=5)
    loader = GpuDecodeLoader(
        DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=collate_encoded), device="cpu", size=40, **IDENTITY
    )
    seen = 0
    for images, labels in loader:
        assert images.shape[1:] == (3, 40, 40) and images.is_contiguous(memory_format=torch.channels_last)
        for image, label in zip(images, labels.tolist(), strict=True):
            sample = dataset[seen]
            assert label == sample.label
            expected = reference(sample.data, sample.box, sample.flip, 40)
            torch.testing.assert_close(image, expected, atol=2e-3, rtol=0)
            seen += 1
    assert seen == 10
    stats = loader.stats()
    assert stats.images == 10 and stats.cpu_fallback == 0 and stats.batches == 3
    assert set(stats.to_metrics()) >= {"Decode/images_per_sec", "Decode/cpu_fallback", "Decode/lookahead_mean"}


def test_odd_files_decode_on_cpu_or_fail_clearly(tmp_path):
    paths = odd_files(str(tmp_path))
    good = ["progressive", "grayscale", "cmyk", "png"]
    dataset = EncodedImageDataset([(paths[name], 0) for name in good], seed=2)
    decoder = JpegDecoder("cpu", size=16, **IDENTITY)
    images, _ = decoder(collate_encoded([dataset[i] for i in range(len(good))]))
    for i in range(len(good)):
        sample = dataset[i]
        torch.testing.assert_close(images[i], reference(sample.data, sample.box, sample.flip, 16), atol=2e-3, rtol=0)
    assert decoder.stats().cpu_fallback == len(good)
    for name in ("zero", "garbage", "truncated"):
        bad = EncodedImageDataset([(paths["progressive"], 0), (paths[name], 1)])
        with pytest.raises(DecodeError, match=rf"dataset index 1 \(.*{name}\.img\)"):
            decoder(collate_encoded([bad[0], bad[1]]))


def test_all_bad_batch_zeros_or_raise(tmp_path):
    paths = odd_files(str(tmp_path))
    dataset = EncodedImageDataset([(paths["zero"], 3), (paths["garbage"], 4)])
    batch = collate_encoded([dataset[0], dataset[1]])
    decoder = JpegDecoder("cpu", size=8, on_error="zeros")
    images, labels = decoder(batch)
    assert images.shape == (2, 3, 8, 8) and labels.tolist() == [3, 4]
    expected = -torch.tensor([0.485, 0.456, 0.406]) / torch.tensor([0.229, 0.224, 0.225])
    torch.testing.assert_close(images[:, :, 0, 0], expected.expand(2, 3))
    assert decoder.stats().undecodable == 2
    with pytest.raises(DecodeError, match="zero-byte"):
        JpegDecoder("cpu", size=8)(batch)


def test_loader_error_reaches_the_step_and_threads_end(tmp_path, no_leaked_threads):
    paths = odd_files(str(tmp_path))
    samples = [*write_files(str(tmp_path / "ok"), 4), (paths["zero"], 0)]
    loader = GpuDecodeLoader(
        DataLoader(EncodedImageDataset(samples), batch_size=2, collate_fn=collate_encoded), device="cpu", size=8
    )
    with pytest.raises(DecodeError, match="dataset index 4"):
        for _ in loader:
            pass
    partial = iter(loader)  # abandoned mid-epoch: close() stops the thread
    next(partial)
    loader.close()


def test_epoch_relay_reaches_dataset(tmp_path):
    dataset = EncodedImageDataset(write_files(str(tmp_path), 2))
    loader = GpuDecodeLoader(DataLoader(dataset, collate_fn=collate_encoded), device="cpu")
    loader.sampler.set_epoch(4)  # what Lightning's fit loop calls
    assert dataset.epoch == 4 and len(loader) == 2


class _FakeNvImageCodec:
    """Stands in for ``nvidia.nvimgcodec`` on the CPU: PIL decodes, into the given images or into new ones."""

    class BackendKind:
        HW_GPU_ONLY, GPU_ONLY = "hw", "gpu"

    class ColorSpec:
        SRGB = "srgb"

    class SampleFormat:
        I_RGB = "i_rgb"

    class _Wrapped:  # what as_images returns: the caller's buffer (here host memory, written with memmove)
        def __init__(self, slot):
            self.__cuda_array_interface__ = slot.__cuda_array_interface__
            self.shape = self.__cuda_array_interface__["shape"]

        def write(self, pixels):
            assert tuple(pixels.shape) == self.shape
            ctypes.memmove(self.__cuda_array_interface__["data"][0], pixels.numpy().ctypes.data, pixels.numel())

    def __init__(self, into: bool, broken: int = -1) -> None:
        self.into, self.broken, self.calls = into, broken, []

    def Backend(self, kind):  # noqa: N802  (nvImageCodec's names)
        return kind

    def DecodeParams(self, **kwargs):  # noqa: N802
        return kwargs

    def CodeStream(self, array):  # noqa: N802
        return array.tobytes()

    def Decoder(self, **kwargs):  # noqa: N802
        return self

    def as_images(self, slots, cuda_stream=0):
        if not self.into:
            raise TypeError("external buffers not supported")
        return [self._Wrapped(slot) for slot in slots]

    def decode(self, streams, images=None, params=None, cuda_stream=0):
        from lightning_dataperf.decode._prepare import pil_decode

        self.calls.append("into" if images is not None else "copy")
        out = []
        for k, data in enumerate(streams):
            if data == self.broken:
                out.append(None)
                continue
            pixels = pil_decode(data)
            if images is None or self.into == "own":  # "own": ignores the buffers it was given
                out.append(pixels.clone())
            else:
                images[k].write(pixels)
                out.append(images[k])
        return out


@pytest.mark.parametrize("into", [True, False, "own"])
def test_nvimgcodec_backend_fills_the_flat_buffer(tmp_path, into):
    from lightning_dataperf.decode._nvimgcodec import NvImageCodecBackend

    paths = odd_files(str(tmp_path))
    samples = [*write_files(str(tmp_path / "ok"), 5), (paths["progressive"], 0)]
    dataset = EncodedImageDataset(samples, seed=4)
    batch = collate_encoded([dataset[i] for i in range(len(samples))])
    broken = _read(samples[2][0])  # the "GPU" fails this one: it is retried on the CPU
    codec = _FakeNvImageCodec(into, broken)
    backend = NvImageCodecBackend(torch.device("cpu"), threads=1, codec=codec)
    decoder = JpegDecoder("cpu", size=24, backend=backend, **IDENTITY)
    images, labels = decoder(batch)
    expected, expected_labels = JpegDecoder("cpu", size=24, **IDENTITY)(batch)
    torch.testing.assert_close(images, expected, atol=1e-4, rtol=0)
    assert torch.equal(labels, expected_labels)
    assert decoder.stats().cpu_fallback == 2  # the progressive file and the one the "GPU" failed
    assert backend.into is (into is True)  # decoding in place is kept only where it happened
    assert codec.calls == (["into", "copy"] if into else ["copy"])  # the copy call: only the failure / all


def test_flat_gather_layouts_agree():
    from lightning_dataperf.decode.decoder import crop_resize_flip

    generator = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (h, w, 3), generator=generator, dtype=torch.uint8) for h, w in ((9, 13), (20, 7))]
    sizes = torch.tensor([[9, 13], [20, 7]])
    bases = torch.tensor([0, 9 * 13 * 3])
    boxes, flips = torch.tensor([[1, 2, 6, 9], [3, 0, 15, 7]]), torch.tensor([True, False])
    hwc = torch.cat([image.reshape(-1) for image in images])
    chw = torch.cat([image.permute(2, 0, 1).reshape(-1) for image in images])
    a = crop_resize_flip(hwc, bases, sizes, boxes, flips, 5, layout="hwc")
    b = crop_resize_flip(chw, bases, sizes, boxes, flips, 5, layout="chw")
    torch.testing.assert_close(a, b)
    crop = images[0][1:7, 2:11].permute(2, 0, 1)[None].float()
    resized = torch.nn.functional.interpolate(crop, size=(5, 5), mode="bilinear", align_corners=False)
    torch.testing.assert_close(a[0], resized[0].flip(-1).permute(1, 2, 0), atol=1e-4, rtol=0)


def test_backend_choice_names_the_extra():
    from lightning_dataperf.decode._backends import make_backend

    with pytest.raises(ValueError, match="backend must be one of"):
        make_backend("dali", torch.device("cpu"))
    try:
        from nvidia import nvimgcodec  # noqa: F401
    except Exception:
        with pytest.raises(ImportError, match=r"lightning-dataperf\[gpu-decode-nvimgcodec\]"):
            make_backend("nvimgcodec", torch.device("cpu"))
    else:
        pytest.skip("nvImageCodec is installed here")
