"""The augment's CUDA graphs are never destroyed by a garbage collection: one destroyed in a thread that is capturing
(a compiled step's recording) invalidates that capture (benchmarks/capture_beside_decode.py, ``graph_freed_inside``)."""

from __future__ import annotations

import gc

import pytest
import torch

from lightning_dataperf.decode import GpuDecodeLoader
from lightning_dataperf.decode._graph import _COLLECTED, GraphedAugment, release_collected


class _Graph:
    """Stands in for a captured ``torch.cuda.CUDAGraph``: says when it is destroyed."""

    destroyed = 0

    def __del__(self) -> None:
        _Graph.destroyed += 1


@pytest.fixture(autouse=True)
def _empty():
    release_collected()
    _Graph.destroyed = 0
    yield
    release_collected()


def test_a_collected_augment_keeps_its_graph_until_released():
    graphed = GraphedAugment(batch=2, capacity=16, columns=3, device=torch.device("cpu"))
    graphed._graph = _Graph()
    del graphed
    gc.collect()
    assert _Graph.destroyed == 0 and len(_COLLECTED) == 1, "not destroyed where it was collected"
    assert release_collected() == 1 and _Graph.destroyed == 1
    assert release_collected() == 0
    again = GraphedAugment(batch=2, capacity=16, columns=3, device=torch.device("cpu"))
    again._graph = _Graph()
    del again
    GraphedAugment(batch=2, capacity=16, columns=3, device=torch.device("cpu"))
    assert _Graph.destroyed == 2, "a decoder's first graphs made: the collected ones go (no loader needed)"


def test_the_loader_releases_collected_graphs_at_an_epochs_start_and_at_close_but_not_when_collected():
    loader = GpuDecodeLoader([], device="cpu", size=8)
    graphed = GraphedAugment(batch=2, capacity=16, columns=3, device=torch.device("cpu"))
    graphed._graph = _Graph()
    del graphed
    assert list(loader) == [] and _Graph.destroyed == 1, "released as the epoch starts"
    graphed = GraphedAugment(batch=2, capacity=16, columns=3, device=torch.device("cpu"))
    graphed._graph = _Graph()
    del graphed
    other = GpuDecodeLoader([], device="cpu", size=8)
    del other
    gc.collect()
    assert _Graph.destroyed == 1, "a loader collected releases nothing (it may be inside a capture)"
    loader.close()
    assert _Graph.destroyed == 2


@pytest.mark.cuda
def test_a_capture_survives_an_augment_collected_inside_it():
    data = torch.ones(1 << 10, device="cuda")

    def augment(flat: torch.Tensor, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return flat.float() * 2, table + 1

    graphed = GraphedAugment(batch=4, capacity=1 << 10, columns=3, device=torch.device("cuda"))
    graphed.run(torch.zeros(4, 3, dtype=torch.int64).pin_memory(), augment)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        out = data * 3
        del graphed  # a garbage collection here, mid-capture
        out = out + 1
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.full_like(data, 4.0))
    assert release_collected() == 1
