"""Host time per batch of the side-stream copy path vs a stock ``.to(non_blocking=True)``.

    PYTHONPATH=$PWD python benchmarks/side_stream_host_cost.py

When a run is host-bound (tiny batches, a GPU step shorter than Lightning's own per-step host work),
every microsecond the transfer path spends on the host is a microsecond of step time. This measures,
for a pinned two-tensor batch (features + labels) of several sizes, the host time of: the stock copy
(what Lightning's ``batch_to_device`` does per tensor), ``SideStreamCopier.issue`` + ``hand_over``,
and the pieces the latter is made of (pin check, event record, ``wait_event``, ``record_stream``).
Median over ``--batches`` batches after a warm-up; the GPU is kept busy with ``torch.cuda._sleep`` so
that the copies queue behind work the way they do in training. Writes ``side_stream_host_cost.json``.

``--baseline FILE`` also times the copier of another version of ``transfer.py`` in the same process,
e.g. ``git show 6fb40fa:lightning_dataperf/transfer.py > /tmp/old_transfer.py``.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable

import _common
import torch

from lightning_dataperf.batches import iter_tensors
from lightning_dataperf.transfer.copier import SideStreamCopier, _EventPool


def host_us(action: Callable[[], object], batches: int, between: Callable[[], object] = lambda: None) -> float:
    times = []
    for index in range(batches + 10):
        if index % 50 == 0:
            between()  # untimed: read back finished copy timings, as DataPerfCallback does at log points
            torch.cuda._sleep(10_000_000)  # keep the GPU ahead-busy; the host never waits on it here
        started = time.perf_counter_ns()
        action()
        if index >= 10:
            times.append(time.perf_counter_ns() - started)
    torch.cuda.synchronize()
    return statistics.median(times) / 1e3


def read_copy_timings(copiers: list) -> None:
    for copier in copiers:
        copier.completed()


def load_copier_class(path: str) -> type:
    spec = importlib.util.spec_from_file_location("baseline_transfer", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.SideStreamCopier


def operations(
    copier: SideStreamCopier, device: torch.device, kib: int, baseline: type | None = None
) -> tuple[dict[str, Callable[[], object]], list]:
    """The timed operations for a pinned (features, labels) batch of ``kib`` KiB, and the copiers used."""
    every = SideStreamCopier(device, min_bytes=0, timing_every=1)
    sampled = SideStreamCopier(device, min_bytes=0, timing_every=8)
    side_pool = SideStreamCopier(device, min_bytes=0, timing_every=1, allocate_on_compute=False)
    direct = SideStreamCopier(device, min_bytes=1 << 40)
    features = torch.randn(kib * 256 // 2).pin_memory()
    labels = torch.zeros(kib * 256 // 2, dtype=torch.int32).pin_memory()
    batch = (features, labels)
    stream = copier.stream
    event = torch.cuda.Event()
    device_tensor = features.to(device)
    compute = torch.cuda.current_stream(device)
    targets = [(torch.empty_like(tensor, device=device), tensor) for tensor in batch]
    pool = _EventPool()

    def stream_context() -> None:
        with torch.cuda.stream(stream):
            pass

    def set_stream_pair() -> None:
        torch.cuda.set_stream(stream)
        torch.cuda.set_stream(compute)

    def switched() -> None:
        copier._run_on(stream, compute, lambda: None)

    def mark_and_wait() -> None:
        stream.wait_event(copier._mark(compute))

    pieces = {
        "stock .to() per tensor": lambda: tuple(t.to(device, non_blocking=True) for t in batch),
        f"side stream issue+hand_over, default (1 in {copier.timing_every} timed)": lambda: copier.hand_over(
            copier.issue(batch)
        ),
        "side stream issue+hand_over, every copy timed": lambda: every.hand_over(every.issue(batch)),
        "side stream issue+hand_over, 1 in 8 timed": lambda: sampled.hand_over(sampled.issue(batch)),
        "every copy timed, side-pool memory + record_stream": lambda: side_pool.hand_over(side_pool.issue(batch)),
        "below min_bytes: stock copy at hand_over": lambda: direct.hand_over(direct.issue(batch)),
        "is_pinned() x2": lambda: (features.is_pinned(), labels.is_pinned()),
        "event record": lambda: event.record(stream),
        "timing event create+record": lambda: torch.cuda.Event(enable_timing=True).record(stream),
        "wait_event": lambda: torch.cuda.current_stream(device).wait_event(event),
        "record_stream": lambda: device_tensor.record_stream(torch.cuda.current_stream(device)),
        "torch.cuda.stream() enter+exit": stream_context,
        "set_stream(side) + set_stream(compute)": set_stream_pair,
        "copier._run_on (no work)": switched,
        "Stream.wait_stream": lambda: stream.wait_stream(compute),
        "reused event record + wait_event": mark_and_wait,
        "current_stream(device)": lambda: torch.cuda.current_stream(device),
        "empty_like x2 (compute pool)": lambda: [torch.empty_like(tensor, device=device) for tensor in batch],
        "copy_ x2 into device tensors": lambda: [target.copy_(source, non_blocking=True) for target, source in targets],
        "host bytes of the batch (iter_tensors)": lambda: sum(t.nbytes for t in iter_tensors(batch)),
        "event pool take+give x4": lambda: pool.give(*[pool.take(timing=True) for _ in range(4)], timing=True),
    }
    copiers = [copier, every, sampled, side_pool]
    if baseline is not None:
        old, old_sampled = baseline(device, min_bytes=0), baseline(device, min_bytes=0, timing_every=8)
        pieces["baseline copier, every copy timed"] = lambda: old.hand_over(old.issue(batch))
        pieces["baseline copier, 1 in 8 timed"] = lambda: old_sampled.hand_over(old_sampled.issue(batch))
        copiers += [old, old_sampled]
    return pieces, copiers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--baseline", help="another version's transfer.py, timed alongside")
    args = parser.parse_args()
    baseline = load_copier_class(args.baseline) if args.baseline else None
    device = torch.device("cuda", 0)
    copier = SideStreamCopier(device, min_bytes=0)
    rows, results = [], []
    for kib in (64, 1024, 32 * 1024):
        pieces, copiers = operations(copier, device, kib, baseline)
        read_back = functools.partial(read_copy_timings, copiers)
        measured = {name: host_us(action, args.batches, read_back) for name, action in pieces.items()}
        results.append({"batch_KiB": kib, "host_us": measured})
        rows.extend([[kib, name, value] for name, value in measured.items()])
    table = _common.print_table(["batch KiB", "operation", "host us (median)"], rows)
    _common.write_json("side_stream_host_cost", {"args": vars(args), "results": results, "table": table})


if __name__ == "__main__":
    main()
