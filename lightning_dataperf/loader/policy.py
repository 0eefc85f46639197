"""DataLoader settings from the hardware this process really has, each with the reason it was chosen.

The rules, and where they depart from the source article's tree, are in docs/loader.md (section 1).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

from torch.utils.data import IterableDataset

from lightning_dataperf.loader.settings import LoaderSettings
from lightning_dataperf.telemetry.hardware import Hardware, probe_hardware

__all__ = [
    "HANDOVER_FLOOR_S",
    "LoaderSettings",
    "article_settings",
    "check_loader_kwargs",
    "first_workers",
    "intra_op_threads",
    "iterable_workers",
    "rank_workers",
    "recommend_loader_settings",
    "seeded_over_generator",
    "workers_needed",
]

#: Why CPU training's workers take every core of the rank (benchmarks/online.py, 2 cores, 8 pipelines).
CPU_TRAINING = (
    "CPU training, where the step and the workers share the cores (the step waits for its batch part of the time);"
    " on 2 cores 2 workers + 1 thread read 43-100% of the best grid point, 1 worker + 1 thread 25-91% (above on 6"
    " of 8 pipelines, level on the 2 that load fastest in the training process)"
)

#: Share of free ``/dev/shm`` (and of available RAM) that batches in flight may take.
MEMORY_SHARE = 0.25
MAX_WORKERS = 16
_MB = 2**20


def recommend_loader_settings(
    hardware: Hardware | None = None,
    *,
    batch_bytes: int | None = None,
    max_epochs: int | None = None,
    accelerator: str | None = None,
) -> LoaderSettings:
    """The settings this package recommends for this hardware (the rules: docs/loader.md, section 1).

    Args:
        hardware: from :func:`~lightning_dataperf.probe_hardware` (probed now when ``None``).
        batch_bytes: size of one batch, to bound ``prefetch_factor`` by memory.
        max_epochs: planned epochs (``None``: unknown, assume several).
        accelerator: where batches go (``"cuda"``, ``"mps"``, ``"cpu"``); default the hardware's.

    Example::

        from lightning_dataperf import recommend_loader_settings

        settings = recommend_loader_settings(batch_bytes=64 * 3 * 224 * 224 * 4)
        loader = DataLoader(dataset, batch_size=64, **settings.as_kwargs())
        print(settings.explain())
    """
    hardware = hardware or probe_hardware()
    accelerator = accelerator or hardware.accelerator
    reasons: dict[str, str] = {}

    budget = hardware.cpus_per_rank
    main = _main_cores(accelerator)
    workers = rank_workers(budget, accelerator)
    reasons["num_workers"] = (
        f"{hardware.usable_cpus} usable CPUs ({hardware.usable_cpus_source}) / {hardware.local_world_size} "
        f"local rank(s) = {budget} per rank"
        + (", minus 1 for the main process" if main else f", all of them: {CPU_TRAINING}")
        + (f", capped at {MAX_WORKERS}" if budget - main > MAX_WORKERS else "")
        + (" (at least 1 so loading overlaps the step)" if budget - main < 1 else "")
    )

    pin = accelerator == "cuda"
    reasons["pin_memory"] = (
        "a CUDA device receives the batches: pinned pages allow asynchronous DMA copies"
        if pin
        else f"no CUDA device ({accelerator}): pinning would only cost RAM and time"
    )

    prefetch, reasons["prefetch_factor"] = _prefetch(hardware, workers, batch_bytes)

    persistent = max_epochs != 1
    reasons["persistent_workers"] = (
        f"keep workers alive across epochs: a restart repeats worker start-up ({hardware.start_method} start "
        "method) every epoch"
        if persistent
        else "a single epoch: nothing to keep alive"
    )
    return LoaderSettings(workers, pin, persistent, prefetch, reasons)


def rank_workers(cpus: int, accelerator: str) -> int:
    """The policy's workers for a rank of ``cpus`` cores: all of them on CPU training, else all but the training
    process's, between 1 and :data:`MAX_WORKERS`.

    Example::

        rank_workers(16, "cuda")   # 15
    """
    return min(MAX_WORKERS, max(1, cpus - _main_cores(accelerator)))


def _main_cores(accelerator: str) -> int:
    """Cores the policy leaves to the training process: none on CPU training (the step waits for its batch part of
    the time, so a core for the main process alone idles), else one."""
    return 0 if accelerator == "cpu" else 1


def intra_op_threads(workers: int, cpus: int, current: int) -> tuple[int, str] | None:
    """CPU training: the intra-op threads to set beside ``workers`` loader workers on ``cpus`` cores, and why;
    ``None`` where the two already fit (docs/loader.md, section 1).

    Example::

        intra_op_threads(workers=1, cpus=2, current=2)   # (1, "CPU training: 1 workers and ...")
    """
    threads = max(1, cpus - workers)
    if workers + current <= cpus or threads == current:
        return None
    # benchmarks/online.py, 2 cores: at 1 worker one thread read 12-16% faster than two on two pipelines, and
    # two threads beside one busy process read 20x slower (OpenMP threads spin for a core that is taken)
    return threads, (
        f"CPU training: {workers} workers and this process's {current} intra-op threads would share {cpus} cores;"
        f" {threads} beside the workers"
    )


def iterable_workers(dataset: Any, workers: int) -> str | None:
    """Why a loader over ``dataset`` gets one worker where the policy chose ``workers`` (``None``: it keeps them).

    Every worker runs an ``IterableDataset``'s whole iterator: three workers trained each sample three times (a
    4-core machine's policy) unless the dataset splits its stream itself.
    """
    if workers <= 1 or not isinstance(dataset, IterableDataset):
        return None
    return (
        f"an IterableDataset: every worker runs its whole iterator, so {workers} would repeat each sample unless the"
        " dataset splits its stream by torch.utils.data.get_worker_info(); one worker overlaps loading with the step"
        " (set num_workers yourself where yours splits)"
    )


#: Loading a batch in the training process cheaper than this is about what a worker's hand-over of it costs:
#: benchmarks/online.py's dict of small tensors (batch 8) read 0.46x at one worker (issue 37's: 0.34x).
HANDOVER_FLOOR_S = 0.002


def first_workers(load_s: float, compute_s: float, cpus: int) -> list[tuple[int, int]]:
    """CPU training at ``num_workers=0``: the ``(workers, intra-op threads)`` pairs the measured load and compute
    per batch point to, the likeliest first; the verdict advises the first, the online loop tries them first.

    Enough workers that loading keeps up with the step (``ceil(load / compute) + 1``, at most ``cpus``), then each
    other count up to ``cpus``, nearest first; each beside the cores the workers leave as threads. Empty where a
    batch loads in less than :data:`HANDOVER_FLOOR_S` (a worker's hand-over costs about as much).

    Example::

        first_workers(load_s=0.030, compute_s=0.050, cpus=2)   # [(2, 1), (1, 1)]
    """
    if load_s < HANDOVER_FLOOR_S or cpus < 1:
        return []
    # benchmarks/online.py, 2 cores: at the same workers one intra-op thread beat two on every pipeline
    needed = workers_needed(load_s, compute_s, cpus)
    counts = sorted(range(1, cpus + 1), key=lambda count: (abs(count - needed), -count))
    return [(count, max(1, cpus - count)) for count in counts]


def workers_needed(load_s: float, compute_s: float, cpus: int) -> int:
    """Workers that keep loading up with the step: ``ceil(load / compute) + 1`` (one making the batch after next),
    between 1 and ``cpus``."""
    return max(1, min(cpus, math.ceil(load_s / max(compute_s, 1e-6)) + 1))


def _prefetch(hardware: Hardware, workers: int, batch_bytes: int | None) -> tuple[int, str]:
    slow_storage = hardware.storage is not None and hardware.storage.kind in {"network", "hdd"}
    prefetch = 4 if slow_storage else 2
    reason = (
        f"{hardware.storage.kind} storage: more reads in flight hide its latency"  # type: ignore[union-attr]
        if slow_storage
        else "PyTorch's default of 2 batches per worker keeps the queue full once loading keeps up"
    )
    if batch_bytes:
        budgets = [hardware.ram_available_mb * MEMORY_SHARE]
        if hardware.shm_free_mb is not None:
            budgets.append(hardware.shm_free_mb * MEMORY_SHARE)
        fits = int(min(budgets) * _MB // (batch_bytes * max(1, workers)))
        if fits < prefetch:
            prefetch = max(1, fits)
            reason = (
                f"bounded by memory: {workers} workers x {prefetch} x {batch_bytes / _MB:.1f} MB batches must fit "
                f"in {100 * MEMORY_SHARE:.0f}% of free /dev/shm and RAM ({min(budgets) / MEMORY_SHARE:.0f} MB)"
            )
    return prefetch, reason


def article_settings(cpu_cores: int, batch_size: int, ddp: bool = False, epochs: int = 10) -> LoaderSettings:
    """The source article's decision tree, verbatim (a baseline for benchmarks, not a recommendation)."""
    if cpu_cores <= 4:
        workers = min(2, cpu_cores)
    elif cpu_cores <= 16:
        workers = cpu_cores // 2
    else:
        workers = 8
    pin = batch_size <= (8 if ddp else 16)
    persistent = epochs > 100
    prefetch = 2 if workers <= 4 else 3 if workers < 8 else 4  # the article lists 8 under both "5~8" and ">=8"
    return LoaderSettings(workers, pin, persistent, prefetch, {"all": "the article's decision tree"})


def seeded_over_generator(explicit: Mapping[str, Any]) -> str:
    """The words a plan adds where its seeded sampler and worker seeds take the place of your ``generator=``.

    Example::

        seeded_over_generator({"generator": torch.Generator()})   # "; your generator= stays on the loader, ..."
    """
    if explicit.get("generator") is None:
        return ""
    return "; your generator= stays on the loader, but this seed orders the samples and seeds the workers (seed=)"


def check_loader_kwargs(explicit: Mapping[str, Any], hardware: Hardware, accelerator: str | None = None) -> None:
    """Refuse or warn about settings the user passed that cannot work or will hurt.

    Raises:
        ValueError: negative ``num_workers``, ``prefetch_factor`` without workers or below 1.
    """
    workers = explicit.get("num_workers")
    if workers is not None and workers < 0:
        raise ValueError(f"DataLoader(num_workers={workers}): must be >= 0; use 0 to load in the main process.")
    prefetch = explicit.get("prefetch_factor")
    if prefetch is not None:
        if workers == 0:
            raise ValueError(
                f"DataLoader(prefetch_factor={prefetch}, num_workers=0): prefetch_factor needs worker processes; "
                "drop prefetch_factor or set num_workers > 0."
            )
        if prefetch < 1:
            raise ValueError(f"DataLoader(prefetch_factor={prefetch}): must be >= 1 batch per worker.")
    accelerator = accelerator or hardware.accelerator
    if explicit.get("pin_memory") and accelerator != "cuda":
        warnings.warn(
            f"DataLoader(pin_memory=True) without a CUDA device ({accelerator}): pinning costs RAM and time for "
            "nothing here; set pin_memory=False or leave it out and let TunedDataModule decide.",
            stacklevel=3,
        )
    if workers is not None and workers > hardware.cpus_per_rank:
        warnings.warn(
            f"DataLoader(num_workers={workers}) is more than the {hardware.cpus_per_rank} CPUs this rank may use "
            f"({hardware.usable_cpus} usable / {hardware.local_world_size} local ranks): workers will time-share "
            f"the cores. Use at most {max(1, hardware.cpus_per_rank - 1)}, or leave it out.",
            stacklevel=3,
        )
