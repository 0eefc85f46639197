"""CPU training: batches loaded in the training process as a loader is planned, to set its workers by measurement.

The rules and their readings are in docs/loader.md, section 1.
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from torch.utils.data import IterableDataset, default_collate

from lightning_dataperf.loader.main_rng import rng_restored
from lightning_dataperf.loader.policy import HANDOVER_FLOOR_S, MAX_WORKERS
from lightning_dataperf.loader.settings import LoaderSettings
from lightning_dataperf.telemetry.processes import threads_runqueue_wait

__all__ = [
    "TIMING_BUDGET_S",
    "WAITING_SHARE",
    "InProcessLoad",
    "in_process_workers",
    "time_in_process",
    "with_timed_workers",
]

#: Wall time a batch may take in the timing before it is cut (two batches at most are timed).
TIMING_BUDGET_S = 0.05
#: Above this share of its wall time off a CPU and not queued for one, loading waits on storage or the network:
#: workers beyond the cores pay.
WAITING_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class InProcessLoad:
    """Batches fetched and collated in this process, as the policy timed them before any worker starts.

    Attributes:
        batch_s: the fastest complete batch, or the time a batch had taken when the budget cut it (a lower bound).
        cpu_share: this process's CPU seconds over the wall seconds of everything timed (all its threads).
        blocked_share: the wall seconds neither on a CPU nor queued for one (Linux schedstat; elsewhere the queue
            is not seen), over the same: what the fetch waited on (storage, network, a sleep).
        batches: complete batches timed.
        cut: a batch passed the budget before it was complete.
    """

    batch_s: float
    cpu_share: float
    blocked_share: float
    batches: int
    cut: bool


def time_in_process(
    dataset: Any,
    batch_size: int,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    budget_s: float | None = None,
    batches: int = 2,
) -> InProcessLoad | None:
    """Up to ``batches`` batches of a map-style ``dataset`` (its first indices) loaded here, a batch cut once it has
    taken ``budget_s`` (default :data:`TIMING_BUDGET_S`); ``None`` where it cannot be timed (iterable, empty, or the
    fetch raised: training reports it).

    The fetch runs on a shallow copy, so a file a sample opens lazily stays out of the dataset the workers inherit,
    and the random generators are put back: the timed samples draw nothing from the run's streams.

    Example::

        load = time_in_process(dataset, batch_size=8)
        if load is not None and not load.cut and load.batch_s < 0.002:
            ...  # a worker's hand-over would cost about as much as the batch
    """
    if isinstance(dataset, IterableDataset) or batch_size < 1:
        return None
    try:
        length = len(dataset)
        probe = copy.copy(dataset)
    except Exception:  # no len() or not copyable: nothing timed, the policy's setting stands
        return None
    if length < 1:
        return None
    collate = collate_fn or default_collate
    many = getattr(probe, "__getitems__", None)
    # as the loader's fetcher: one __getitems__ call a batch where the dataset has it, else sample by sample
    fetch = many if many is not None else (lambda chunk: [probe[index] for index in chunk])
    budget = TIMING_BUDGET_S if budget_s is None else budget_s
    start = (time.perf_counter(), time.process_time(), threads_runqueue_wait(os.getpid())[0])
    fastest = math.inf
    try:
        with rng_restored(cuda=False):
            for number in range(batches):
                indices = [(number * batch_size + k) % length for k in range(batch_size)]
                began = time.perf_counter()
                samples: list[Any] = []
                for chunk in [indices] if many is not None else [[index] for index in indices]:
                    samples += fetch(chunk)
                    if (spent := time.perf_counter() - began) >= budget:
                        return _load(spent, number, True, start)
                collate(samples)
                if (spent := time.perf_counter() - began) >= budget:
                    return _load(spent, number, True, start)
                fastest = min(fastest, spent)
            return _load(fastest, batches, False, start)
    except Exception:  # the loader raises it again where training fetches, with the run's own context
        return None


def _load(batch_s: float, batches: int, cut: bool, start: tuple[float, float, float | None]) -> InProcessLoad:
    wall, cpu = time.perf_counter() - start[0], time.process_time() - start[1]
    queued = threads_runqueue_wait(os.getpid())[0]
    waited = queued - start[2] if queued is not None and start[2] is not None else 0.0
    if wall <= 0:
        return InProcessLoad(batch_s, 1.0, 0.0, batches, cut)
    return InProcessLoad(batch_s, min(1.0, cpu / wall), max(0.0, wall - cpu - waited) / wall, batches, cut)


def in_process_workers(explicit: Mapping[str, Any], cpus: int) -> tuple[int, str] | None:
    """CPU training: the workers a DataLoader built from ``explicit`` arguments gets by measurement, and why, or
    ``None`` where the hardware policy's count (a worker per core) stands.

    - ``0`` where a batch loads here in less than :data:`HANDOVER_FLOOR_S`: a worker's hand-over costs about as
      much (the verdict's rule);
    - ``2 x cpus`` (at most :data:`MAX_WORKERS`) where loading waits more than :data:`WAITING_SHARE` of its time,
      neither on a CPU nor queued for one (a busy machine's queue is not a wait that more workers hide): more
      workers than cores keep the step fed (the online loop's upper bound too).

    Example::

        in_process_workers({"dataset": dataset, "batch_size": 8}, cpus=2)   # (0, "a batch loaded in 0.31 ms ...")
    """
    if explicit.get("batch_sampler") is not None:
        return None
    batch = explicit.get("batch_size", 1) or 1
    load = time_in_process(explicit.get("dataset"), batch, explicit.get("collate_fn"))
    if load is None:
        return None
    measured = f"{'at least ' if load.cut else ''}{1e3 * load.batch_s:.2f} ms a batch"
    yours = " (num_workers=N in your DataLoader keeps yours)"
    if not load.cut and load.batch_s < HANDOVER_FLOOR_S:
        return 0, (
            f"loaded in this process as the loader was planned: {measured}, below a worker's hand-over cost "
            f"(~{1e3 * HANDOVER_FLOOR_S:.0f} ms), so loading stays in the training process" + yours
        )
    if load.blocked_share > WAITING_SHARE:
        workers = min(MAX_WORKERS, 2 * cpus)
        return workers, (
            f"loaded in this process as the loader was planned: {measured}, waiting (on storage or the network, "
            f"neither on a CPU nor queued for one) {100 * load.blocked_share:.0f}% of the time, so {workers} workers"
            f" on {cpus} cores" + yours
        )
    return None


def with_timed_workers(settings: LoaderSettings, explicit: Mapping[str, Any], cpus: int) -> LoaderSettings:
    """``settings`` with the workers :func:`in_process_workers` sets for a loader built from ``explicit``, and its
    reason; ``settings`` as they were where the timing leaves the policy's count.

    Example::

        settings = with_timed_workers(recommend_loader_settings(), {"dataset": dataset, "batch_size": 8}, cpus=2)
    """
    measured = in_process_workers(explicit, cpus)
    if measured is None:
        return settings
    workers, reason = measured
    return replace(settings, num_workers=workers, reasons={**settings.reasons, "num_workers": reason})
