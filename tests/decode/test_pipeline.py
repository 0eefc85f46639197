"""The decode path split in two (issue 38): the host half (``JpegDecoder.prepare``) in a prepare thread of its
own, the device half (``JpegDecoder.run``) in the decode thread; the ordering knobs; the new telemetry (CPU)."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from lightning_dataperf.decode import DecodeError, DecodeStats, GpuDecodeLoader, JpegDecoder
from lightning_dataperf.decode._prepare import pil_decode
from lightning_dataperf.decode._torchvision import TorchvisionBackend
from lightning_dataperf.decode.encoded import EncodedImageDataset, collate_encoded

pytest.importorskip("PIL")
from helpers import odd_files, write_files


def _batches(tmp_path, count: int = 12, size: int = 4) -> list:
    dataset = EncodedImageDataset(write_files(str(tmp_path), count), seed=3)
    return [collate_encoded([dataset[i] for i in range(k, k + size)]) for k in range(0, count, size)]


def test_prepare_then_run_is_the_call(tmp_path):
    batches = _batches(tmp_path)
    decoder = JpegDecoder("cpu", size=16)
    for batch in batches:
        prepared = decoder.prepare(batch)
        assert len(prepared) == len(batch) and prepared.table is not None and prepared.seconds >= 0
        images, labels = decoder.run(prepared)
        expected, expected_labels = decoder(batch)
        assert torch.equal(images, expected) and torch.equal(labels, expected_labels)
    stats = decoder.stats()
    assert stats.batches == 2 * len(batches) and stats.prepare_seconds > 0 and stats.barrier_seconds == 0


class _HostBackend:
    """A custom backend with a ``prepare`` step (decodes with PIL into the flat buffer's ``hwc`` slots)."""

    name, layout = "host", "hwc"

    def __init__(self) -> None:
        self.prepared = self.decoded = 0

    def prepare(self, data, spans):
        self.prepared += 1
        return [data[a:b].numpy().tobytes() for a, b in spans]

    def decode(self, data, spans, sizes, flat, bases, prepared=None):
        assert prepared is not None and len(prepared) == len(spans)
        self.decoded += 1
        for blob, base, (h, w) in zip(prepared, bases, sizes, strict=True):
            flat[base : base + 3 * h * w] = pil_decode(blob).reshape(-1)
        return [True] * len(spans), None


def test_a_backend_prepares_on_the_host_and_gets_it_back(tmp_path):
    batches = _batches(tmp_path)
    backend = _HostBackend()
    custom = JpegDecoder("cpu", size=16, backend=backend)
    assert custom.host_barrier is False  # no CUDA: nothing to order
    for batch in batches:
        images, _ = custom(batch)
        expected, _ = JpegDecoder("cpu", size=16)(batch)
        assert torch.equal(images, expected)
    assert backend.prepared == backend.decoded == len(batches)


class _CallingBackend(_HostBackend):
    """A backend whose decode call can run apart (``submit``), as torchvision's does."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def submit(self, parts):
        self.threads.append(threading.current_thread().name)
        return [pil_decode(blob) for blob in parts]

    def decode(self, data, spans, sizes, flat, bases, prepared=None, submitted=None):
        if submitted is None:  # no call thread: the call happens here
            submitted = self.submit(prepared)
        self.decoded += 1
        for image, base, (h, w) in zip(submitted, bases, sizes, strict=True):
            flat[base : base + 3 * h * w] = image.reshape(-1)
        return [True] * len(spans), None


@pytest.mark.parametrize("ahead", [0, 2])
def test_the_decode_call_runs_in_its_own_thread_where_it_can(tmp_path, ahead, no_leaked_threads):
    batches = _batches(tmp_path, count=16)
    reference = [JpegDecoder("cpu", size=16)(batch) for batch in batches]
    backend = _CallingBackend()
    loader = GpuDecodeLoader(batches, device="cpu", size=16, backend=backend, prepare_ahead=ahead)
    assert loader.decoder.can_submit
    for (images, labels), (expected, expected_labels) in zip(loader, reference, strict=True):
        assert torch.equal(images, expected) and torch.equal(labels, expected_labels)
    assert backend.decoded == len(batches)
    # the first batch in the calling thread: its graph captures and compile run in turn with the model's
    assert backend.threads[0] == threading.current_thread().name
    if ahead:
        assert set(backend.threads[1:]) == {"dataperf-gpu-call"} and loader.stats().call_seconds > 0
    else:
        assert set(backend.threads[1:]) == {"dataperf-gpu-decode"} and loader.stats().call_seconds == 0


def test_which_backends_need_the_host_barrier():
    assert TorchvisionBackend.writes_at_call is False  # its own allocation stream, a stream-ordered copy
    from lightning_dataperf.decode._nvimgcodec import NvImageCodecBackend

    assert NvImageCodecBackend.writes_at_call is True  # decodes into the buffer: the hardware engine ignores order
    from lightning_dataperf.decode._nvjpeg import NvJpegBackend

    assert NvJpegBackend.writes_at_call is True  # the same engines, called directly


@pytest.mark.parametrize("ahead", [0, 1, 2])
def test_the_prepare_thread_changes_nothing_in_what_comes_out(tmp_path, ahead, no_leaked_threads):
    batches = _batches(tmp_path, count=16)
    reference = [JpegDecoder("cpu", size=16)(batch) for batch in batches]
    loader = GpuDecodeLoader(batches, device="cpu", size=16, prepare_ahead=ahead)
    for _ in range(2):  # two epochs
        out = list(loader)
        assert len(out) == len(reference)
        for (images, labels), (expected, expected_labels) in zip(out, reference, strict=True):
            assert torch.equal(images, expected) and torch.equal(labels, expected_labels)
    assert loader.stats().prepare_seconds > 0
    with pytest.raises(ValueError, match="prepare_ahead"):
        GpuDecodeLoader(batches, device="cpu", prepare_ahead=-1)


def test_an_error_in_the_prepare_thread_reaches_the_step_in_order(tmp_path, no_leaked_threads):
    good = write_files(str(tmp_path / "ok"), 4)
    zero = odd_files(str(tmp_path / "odd"))["zero"]
    dataset = EncodedImageDataset([*good, (zero, 0)], seed=1)
    batches = [collate_encoded([dataset[0], dataset[1]]), collate_encoded([dataset[2], dataset[4]])]
    loader = GpuDecodeLoader(batches, device="cpu", size=8, prepare_ahead=2)  # held: a dropped loader closes
    iterator = iter(loader)
    images, _ = next(iterator)
    assert images.shape == (2, 3, 8, 8)
    with pytest.raises(DecodeError, match="dataset index 4"):
        next(iterator)
    with pytest.raises(StopIteration):
        next(iterator)


def test_a_first_batch_that_fails_or_an_empty_epoch_starts_no_thread(tmp_path, no_leaked_threads):
    good = write_files(str(tmp_path / "ok"), 2)
    zero = odd_files(str(tmp_path / "odd"))["zero"]
    dataset = EncodedImageDataset([*good, (zero, 0)], seed=1)
    bad_first = [collate_encoded([dataset[0], dataset[2]]), collate_encoded([dataset[0], dataset[1]])]
    for batches in (bad_first, []):
        loader = GpuDecodeLoader(batches, device="cpu", size=8, prepare_ahead=2)
        iterator = iter(loader)
        if batches:
            with pytest.raises(DecodeError, match="dataset index 2"):
                next(iterator)
        assert not [t for t in threading.enumerate() if t.name.startswith("dataperf-gpu")]
        with pytest.raises(StopIteration):
            next(iterator)


def test_closing_mid_epoch_stops_both_threads(tmp_path, no_leaked_threads):
    batches = _batches(tmp_path, count=40, size=2)
    loader = GpuDecodeLoader(batches, device="cpu", size=8, lookahead=1, prepare_ahead=1)
    iterator = iter(loader)
    next(iterator)
    names = {thread.name for thread in threading.enumerate()}
    assert {"dataperf-gpu-decode", "dataperf-gpu-prepare"} <= names
    loader.close()
    alive = [t.name for t in threading.enumerate() if t.name.startswith("dataperf-gpu") and t.is_alive()]
    assert not alive


def test_the_new_figures_are_a_window_too():
    before = DecodeStats(batches=10, prepare_seconds=0.01, prepare_cpu_seconds=0.008, barrier_seconds=0.002)
    now = dataclasses.replace(before, batches=30, prepare_seconds=0.05, prepare_cpu_seconds=0.04, barrier_seconds=0.004)
    window = now.since(before)
    assert window.prepare_seconds == pytest.approx(0.04) and window.barrier_seconds == pytest.approx(0.002)
    metrics = window.to_metrics()
    assert metrics["Decode/prepare_seconds"] == pytest.approx(0.002)
    assert metrics["Decode/barrier_seconds"] == pytest.approx(0.0001)
    assert "preparing 2.00 ms" in window.format() and "host barrier 0.10 ms" in window.format()


def test_the_nvjpeg_backend_names_its_extra_where_libnvjpeg_is_missing(monkeypatch):
    from lightning_dataperf.decode import _nvjpeg

    monkeypatch.setattr(_nvjpeg, "_LOADED", [])
    monkeypatch.setattr(_nvjpeg, "_candidates", lambda: ["/nonexistent/libnvjpeg.so.13"])
    with pytest.raises(ImportError, match=r"pip install 'lightning-dataperf\[gpu-decode-nvjpeg\]'"):
        _nvjpeg.load_nvjpeg()
    from lightning_dataperf.decode._backends import make_backend

    with pytest.raises(ImportError, match="gpu-decode-nvjpeg"):
        make_backend("nvjpeg", torch.device("cuda", 0))
