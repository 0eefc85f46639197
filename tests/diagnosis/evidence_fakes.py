"""Epoch summaries and loader figures as the callback would have measured them, for the diagnosis tests."""

from __future__ import annotations

from lightning_dataperf.loader.stats import LoaderStats
from lightning_dataperf.timing.summary import EpochSummary, TimingSummary


def timing(mean: float) -> TimingSummary:
    return TimingSummary(mean, mean, mean, mean, mean, 100)


def summary(on_device=False, stall=0.0, wait_share=None, epoch_start=0.001, world=1, waits=(), **means):
    if on_device and "Compute" in means:  # on CUDA the callback records the step's work as its device span
        means["DeviceSpan"] = means.pop("Compute")
    return EpochSummary(
        stage="train",
        epoch=0,
        steps=100,
        timings={name: timing(value) for name, value in means.items()},
        input_stall_fraction=stall,
        data_wait_share=stall if wait_share is None else wait_share,
        samples_per_sec=1000.0,
        epoch_start=epoch_start,
        world_size=world,
        rank_data_wait=list(waits),
        slowest_rank=None if not waits else max(range(len(waits)), key=lambda rank: waits[rank]),
        straggler_ratio=None if not waits else max(waits) / max(min(waits), 1e-3),
        on_device=on_device,
    )


INPUT_BOUND = summary(stall=0.6, DataLoading=0.030, Transfer=0.0, Compute=0.018, Step=0.050)


def inside(busy, workers=2, fetch=0.040, collate=0.002, handover=0.001, pin=0.0):
    """Loader figures as the workers would have measured them."""
    return LoaderStats(
        batches=100,
        samples=8,
        fetch_s=fetch,
        collate_s=collate,
        pin_s=pin,
        worker_wait_s=0.025,
        handover_s=handover,
        wait_s=0.030,
        workers=workers,
        busy_fraction=busy,
        busy_min=busy,
        busy_max=busy,
    )
