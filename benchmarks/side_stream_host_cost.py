"""Host time per batch of the side-stream copy path vs a stock ``.to(non_blocking=True)``.

    PYTHONPATH=$PWD python benchmarks/side_stream_host_cost.py

When a run is host-bound (tiny batches, a GPU step shorter than Lightning's own per-step host work),
every microsecond the transfer path spends on the host is a microsecond of step time. This measures,
for a pinned two-tensor batch (features + labels) of several sizes, the host time of: the stock copy
(what Lightning's ``batch_to_device`` does per tensor), ``SideStreamCopier.issue`` + ``hand_over``,
and the pieces the latter is made of (pin check, event record, ``wait_event``, ``record_stream``).
Median over ``--batches`` batches after a warm-up; the GPU is kept busy with ``torch.cuda._sleep`` so
that the copies queue behind work the way they do in training. Writes ``side_stream_host_cost.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import _common
import torch

from lightning_dataperf.transfer import SideStreamCopier


def host_us(action: Callable[[], object], batches: int) -> float:
    times = []
    for index in range(batches + 10):
        if index % 50 == 0:
            torch.cuda._sleep(10_000_000)  # keep the GPU ahead-busy; the host never waits on it here
        started = time.perf_counter_ns()
        action()
        if index >= 10:
            times.append(time.perf_counter_ns() - started)
    torch.cuda.synchronize()
    return statistics.median(times) / 1e3


def operations(copier: SideStreamCopier, device: torch.device, kib: int) -> dict[str, Callable[[], object]]:
    """The timed operations for a pinned (features, labels) batch of ``kib`` KiB."""
    sampled = SideStreamCopier(device, min_bytes=0, timing_every=8)
    side_pool = SideStreamCopier(device, min_bytes=0, allocate_on_compute=False)
    direct = SideStreamCopier(device, min_bytes=1 << 40)
    features = torch.randn(kib * 256 // 2).pin_memory()
    labels = torch.zeros(kib * 256 // 2, dtype=torch.int32).pin_memory()
    batch = (features, labels)
    stream = copier.stream
    event = torch.cuda.Event()
    device_tensor = features.to(device)
    return {
        "stock .to() per tensor": lambda: tuple(t.to(device, non_blocking=True) for t in batch),
        "side stream issue+hand_over, every copy timed": lambda: copier.hand_over(copier.issue(batch)),
        "side stream issue+hand_over, 1 in 8 timed": lambda: sampled.hand_over(sampled.issue(batch)),
        "every copy timed, side-pool memory + record_stream": lambda: side_pool.hand_over(side_pool.issue(batch)),
        "below min_bytes: stock copy at hand_over": lambda: direct.hand_over(direct.issue(batch)),
        "is_pinned() x2": lambda: (features.is_pinned(), labels.is_pinned()),
        "event record": lambda: event.record(stream),
        "timing event create+record": lambda: torch.cuda.Event(enable_timing=True).record(stream),
        "wait_event": lambda: torch.cuda.current_stream(device).wait_event(event),
        "record_stream": lambda: device_tensor.record_stream(torch.cuda.current_stream(device)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=400)
    args = parser.parse_args()
    device = torch.device("cuda", 0)
    copier = SideStreamCopier(device, min_bytes=0)
    rows, results = [], []
    for kib in (64, 1024, 32 * 1024):
        pieces = operations(copier, device, kib)
        measured = {name: host_us(action, args.batches) for name, action in pieces.items()}
        copier.completed()
        results.append({"batch_KiB": kib, "host_us": measured})
        rows.extend([[kib, name, value] for name, value in measured.items()])
    table = _common.print_table(["batch KiB", "operation", "host us (median)"], rows)
    _common.write_json("side_stream_host_cost", {"args": vars(args), "results": results, "table": table})


if __name__ == "__main__":
    main()
