"""The GPU decode path stays ordered against a busy training stream whose allocator reuses memory (issue 38;
pytorch/vision#9606, meta-pytorch/torchcodec#1634). CUDA only; benchmarks/gpu_decode_stress.py is the long run."""

from __future__ import annotations

import pytest
import torch

from lightning_dataperf.decode import GpuDecodeLoader, JpegDecoder
from lightning_dataperf.decode.encoded import EncodedImageDataset, collate_encoded

pytestmark = pytest.mark.cuda
pytest.importorskip("PIL")
from helpers import decode_backends, write_files  # noqa: E402

IDENTITY = {"mean": (0.0, 0.0, 0.0), "std": (1 / 255, 1 / 255, 1 / 255)}  # outputs in levels of 255


BACKENDS = decode_backends()


@pytest.mark.parametrize("graph", [True, False])
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_image_matches_the_cpu_decode_while_the_stream_is_busy(tmp_path, backend, graph):
    sizes = ((300, 420), (380, 260), (240, 320), (410, 330))
    dataset = EncodedImageDataset(write_files(str(tmp_path), 64, sizes=sizes), seed=7)
    batches = [collate_encoded([dataset[(k * 7 + i) % 64] for i in range(16)]) for k in range(40)]
    options = {"size": 64, "dtype": torch.float32, **IDENTITY}
    expected = [JpegDecoder("cpu", **options)(batch)[0] for batch in batches]
    loader = GpuDecodeLoader(batches, device="cuda", backend=backend, graph_augment=graph, lookahead=3, **options)
    assert loader.decoder.host_barrier == (backend in ("nvimgcodec", "nvjpeg"))
    worst = torch.zeros((), device="cuda")
    for (images, _), reference in zip(loader, expected, strict=True):
        for _ in range(2):  # queued work on freshly allocated blocks, freed at once: the allocator hands them out again
            a = torch.empty(4096, 4096, device="cuda").normal_()
            del a
        per_image = (images - reference.cuda(non_blocking=True)).abs().mean(dim=(1, 2, 3))
        worst = torch.maximum(worst, per_image.max())
    assert worst.item() < 4.0  # nvJPEG against libjpeg: ~1.4 levels on average (benchmarks/README.md)
    assert loader.stats().batches == len(batches)


def test_the_nvimgcodec_decoder_alternates_two_graph_buffers(tmp_path):
    pytest.importorskip("nvidia.nvimgcodec")
    dataset = EncodedImageDataset(write_files(str(tmp_path), 8), seed=1)
    batch = collate_encoded([dataset[i] for i in range(8)])
    decoder = JpegDecoder("cuda", size=32, backend="nvimgcodec")
    for _ in range(3):
        decoder(batch)
    first, second = decoder._graphs
    assert first is not None and second is not None and first.flat.data_ptr() != second.flat.data_ptr()
    assert first.readers_done is not None and decoder.stats().barrier_seconds >= 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_graph_is_captured_once_and_a_larger_batch_goes_eager(tmp_path, backend):
    # a capture mid-run could overlap a compiled step's CUDA-graph recording in the main thread (issue 38)
    small = EncodedImageDataset(write_files(str(tmp_path / "small"), 8, sizes=((64, 64),)), seed=1)
    large = EncodedImageDataset(write_files(str(tmp_path / "large"), 8, sizes=((256, 256),)), seed=1)
    batches = [collate_encoded([data[i] for i in range(8)]) for data in (small, small, large, small)]
    options = {"size": 32, "dtype": torch.float32, **IDENTITY}
    graphed = JpegDecoder("cuda", backend=backend, graph_augment=True, **options)
    eager = JpegDecoder("cuda", backend=backend, graph_augment=False, **options)
    captured = []
    for batch in batches:
        images, _ = graphed(batch)
        torch.testing.assert_close(images, eager(batch)[0], atol=1e-3, rtol=0)
        # every graph (two where the backend writes at call time) made and captured at the first batch
        assert all(graph is not None and graph._graph is not None for graph in graphed._graphs)
        captured.append([id(graph) for graph in graphed._graphs])
    assert graphed.graph_augment and all(ids == captured[0] for ids in captured)
