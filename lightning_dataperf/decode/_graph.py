"""The batched crop/resize/flip/normalise captured as ONE CUDA graph: :class:`GraphedAugment` (issue 17)."""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["GraphedAugment", "release_collected"]

Augment = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

#: The graphs of augments collected since the last :func:`release_collected`: a CUDA graph destroyed in a thread that
#: is capturing one (a garbage collection inside a compiled step's recording) invalidates that recording, 40 of 40
#: times on an H100 (benchmarks/capture_beside_decode.py, ``graph_freed_inside``).
_COLLECTED: list[torch.cuda.CUDAGraph] = []


def release_collected() -> int:
    """Destroy the graphs of collected augments now, unless this thread's stream is capturing; how many.

    :class:`~lightning_dataperf.decode.loader.GpuDecodeLoader` calls it where no step runs (an epoch's start, its
    ``close``), in the training thread."""
    if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
        return 0
    released = 0
    while True:
        try:
            _COLLECTED.pop()  # one at a time: another thread may be releasing too
        except IndexError:
            return released
        released += 1


class GraphedAugment:
    """``augment(flat, table) -> (images, labels)`` captured as a CUDA graph over static buffers.

    Args:
        batch: the batch size the graph is captured for.
        capacity: bytes of the static flat buffer; its last 3 bytes stay zero (the undecodable pixel).
        columns: columns of the ``int64`` per-sample table.
        device: the CUDA device.

    Example::

        graphed = GraphedAugment(batch=128, capacity=needed * 3 // 2, columns=9, device=device)
        flat = graphed.flat[:needed]                          # decode into this
        images, labels = graphed.run(table_pinned, augment)   # on the current stream
    """

    def __init__(self, batch: int, capacity: int, columns: int, device: torch.device) -> None:
        # made at a decoder's first batch, outside any step: earlier decoders' graphs go now, not at the loader's
        release_collected()
        self.batch, self.capacity, self.device = batch, capacity, device
        self.flat = torch.zeros(capacity, dtype=torch.uint8, device=device)
        self.table = torch.zeros(batch, columns, dtype=torch.int64, device=device)
        self._graph: torch.cuda.CUDAGraph | None = None
        self._out: tuple[torch.Tensor, torch.Tensor] | None = None
        #: Recorded by the decoder after the last replay: once it has passed, nothing reads :attr:`flat`.
        self.readers_done: torch.cuda.Event | None = None

    @property
    def zero_base(self) -> int:
        """Where the all-zero pixel lies in :attr:`flat`."""
        return self.capacity - 3

    def fits(self, count: int, needed: int) -> bool:
        """Can a batch of ``count`` samples and ``needed`` decoded bytes use this graph?"""
        return count == self.batch and needed <= self.zero_base

    def run(self, table: torch.Tensor, augment: Augment) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy ``table`` (pinned host, ``[batch, columns]``) in, replay, and return fresh outputs.

        ``augment(flat, table)`` is captured at the first call (it must only launch kernels: no host
        sync, no ``.item()``); later calls replay that capture and do not call it."""
        self.table.copy_(table, non_blocking=True)
        self.capture(augment)
        assert self._graph is not None and self._out is not None
        self._graph.replay()
        images, labels = self._out
        return images.clone(memory_format=torch.preserve_format), labels.clone()

    def __del__(self) -> None:
        # never destroyed here: this may be a garbage collection inside another graph's capture
        graph = getattr(self, "_graph", None)
        if graph is not None:
            _COLLECTED.append(graph)

    def capture(self, augment: Augment) -> None:
        """Capture ``augment`` over the static buffers now (their contents need not be ready), unless done."""
        if self._graph is not None:
            return
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            # warm up first, so one-time initialisation stays out of the capture
            augment(self.flat, self.table)
            graph = torch.cuda.CUDAGraph()
            # thread_local: the training step's CUDA calls in other threads go on during the capture
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                out = augment(self.flat, self.table)
            finally:
                graph.capture_end()
        current.wait_stream(side)
        self._graph, self._out = graph, out
