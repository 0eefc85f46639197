"""Autotune's cost model: pure functions of one trial's measurements (what the path could take, the workers it needs).

The decisions that use them are in :mod:`~lightning_dataperf.autotune.search` (docs/autotune.md, sections 4-5).
"""

from __future__ import annotations

import math

from lightning_dataperf.autotune.trial import Trial

__all__ = [
    "CONTENTION_SLACK",
    "HEADROOM",
    "IDLE_WORKERS",
    "MAX_JUMP",
    "PATH_BOUND",
    "SATURATED_WORKERS",
    "cpu_ceiling",
    "fewer_capacity",
    "main_thread_rate",
    "next_workers",
    "path_bound",
    "predicted_rate",
    "queue_starved",
    "smallest_step",
    "workers_needed",
]

#: A trial whose main thread waited less than this share of its time for batches is limited by the training path.
PATH_BOUND = 0.05
#: Share more than arrived that mostly idle workers must have made for :func:`handover_bound` (2.5 times the
#: 2 x noise a deeper queue is tried at).
HANDOVER_SHORTFALL = 0.15
#: Busy share under which workers are mostly idle (waiting on I/O, or on their full queue).
IDLE_WORKERS = 0.5
#: Busy share at and above which the workers themselves made what arrived: no hand-over can deliver more.
SATURATED_WORKERS = 0.9
#: Spare capacity the cost model adds to the workers a rate needs.
HEADROOM = 0.15
#: Largest factor between one worker count and the next (the model extrapolates from one point).
MAX_JUMP = 4
#: How much less CPU a batch may cost with fewer workers (less contention for cores and caches).
CONTENTION_SLACK = 0.25


def path_bound(trial: Trial) -> bool:
    """The training path, not the loader, limited this trial: its main thread hardly waited for batches."""
    return trial.wait_share is not None and trial.wait_share < PATH_BOUND and trial.refused is None


def queue_starved(trial: Trial, noise: float) -> bool:
    """The main thread waited although the workers could make more than they delivered: a deeper queue may help.

    Unknown (no in-loader timing): ``True``, so prefetch is tried.
    """
    capacity = trial.loader_capacity()
    if capacity is None or trial.wait_share is None:
        return True
    return not path_bound(trial) and capacity > trial.batches_per_sec * (1 + 2 * noise)


def handover_bound(trial: Trial) -> bool:
    """Workers mostly idle made :data:`HANDOVER_SHORTFALL` more than arrived, and the main thread waited for
    them: what holds the batches back is their hand-over to the main thread, not the workers. Unknown timing
    or CPU: ``False``.
    """
    capacity = trial.loader_capacity()
    if capacity is None or trial.worker_busy is None or trial.wait_share is None or path_bound(trial):
        return False
    return trial.worker_busy < IDLE_WORKERS and capacity > trial.batches_per_sec * (1 + HANDOVER_SHORTFALL)


def loader_headroom(trial: Trial) -> float | None:
    """The most any loader change (more workers, a deeper queue, another hand-over) can gain over ``trial``: the
    main thread's wait for batches is all a faster loader gives back, ``wait / (1 - wait)``; ``None`` unknown.

    The hand-over itself (unpickling, a connection per tensor) is inside that wait: the main thread's
    ``next()``. Example: waited 9% of the time, at most +10%.
    """
    if trial.wait_share is None:
        return None
    return math.inf if trial.wait_share >= 1 else trial.wait_share / (1 - trial.wait_share)


def main_thread_rate(trial: Trial) -> float:
    """Batches/s with 0 workers, predicted: the main thread does its own part and the workers' (0 unknown)."""
    if trial.main_s is None or trial.work_s is None:
        return 0.0
    return 1 / max(trial.main_s + trial.work_s, 1e-9)


def workers_needed(trial: Trial, minimum: int) -> int:
    """Workers that deliver ``trial``'s rate with ``HEADROOM`` to spare: rate x each worker's time per batch."""
    if not trial.work_s:
        return trial.num_workers
    return max(minimum, math.ceil(trial.batches_per_sec * trial.work_s * (1 + HEADROOM)))


def cpu_ceiling(trial: Trial, cpus: int) -> float:
    """Batches/s the rank's CPUs can make at most: the CPUs over the CPU seconds each batch cost.

    Measured from the OS (``tree_cpu_s``: this process and its workers, hand-over and queues included),
    this holds for any loader: a latency-bound one spends little CPU per batch, so its ceiling is high,
    until the hand-over of many workers' batches fills the CPUs. Without it, from the in-loader timing:
    the CPUs left by the main thread over a worker's CPU time per batch, when the workers compute
    (``inf`` when they mostly wait, or unknown). More workers cannot pass it: each batch costs its CPU
    time whoever makes it.
    """
    if trial.tree_cpu_s:
        return cpus / trial.tree_cpu_s
    if trial.cpu_s and trial.work_s and trial.cpu_s > 0.2 * trial.work_s:
        main_cpus = 1 - (trial.wait_share or 0)
        return max(0.5, cpus - main_cpus) / trial.cpu_s
    return math.inf


def predicted_rate(trial: Trial, cpus: int) -> float:
    """The most the path could take past this trial: what its main thread can take (``1 / main_s``) and what
    the CPUs can make (:func:`cpu_ceiling`); ``inf`` when neither is known."""
    limits = [cpu_ceiling(trial, cpus)]
    if trial.main_s:
        limits.append(1 / trial.main_s)
    return min(limits)


def fewer_capacity(trial: Trial, workers: int) -> float:
    """Batches/s ``workers`` workers could make at most, from what a batch cost ``trial``'s workers in CPU.

    Each worker process computes on one CPU at a time, and ``worker_busy`` (CPU time read from the OS over
    wall time, per worker) says how much of one each batch took: ``workers`` of them make at most
    ``workers / (busy x num_workers / rate)`` batches/s, with :data:`CONTENTION_SLACK` for a batch that costs
    less CPU with fewer workers. ``inf`` when unknown (no workers, no busy share): then fewer are tried.
    A worker that computes on several threads reads busy 100% (capped), which overstates this bound: the
    search then tries, as it would without it.
    """
    if not trial.worker_busy or not trial.num_workers or trial.batches_per_sec <= 0 or trial.refused is not None:
        return math.inf
    cpu_per_batch = trial.worker_busy * trial.num_workers / trial.batches_per_sec
    return workers / (cpu_per_batch * (1 - CONTENTION_SLACK))


def smallest_step(workers: int) -> int:
    """The fewest workers worth a trial above ``workers``: 20% more (a smaller gain is lost in noise)."""
    return max(workers + 1, math.ceil(workers * 1.2))


def next_workers(best: Trial, limit: int, cpus: int = 1) -> int:
    """The next worker count to try.

    With the trial's in-loader timing (each worker's time per batch) and the main thread's: the workers
    that the predicted rate needs (:func:`predicted_rate` x time per batch, plus ``HEADROOM``), at
    least 20% more than now and at most ``MAX_JUMP`` times. Without it: x2 while each worker is mostly
    idle (latency-bound), x1.5 when busy.

    Example::

        trial = Trial(4, 2, False, 50.0, batches=40, work_s=0.08, cpu_s=0.001, main_s=0.002, wait_share=0.9)
        next_workers(trial, limit=1000, cpus=2)       # 16: a latency loader, x MAX_JUMP at most
    """
    workers = best.num_workers
    if workers == 0:
        return min(limit, 1)
    floor = smallest_step(workers)
    if best.work_s and best.main_s is not None:
        target = predicted_rate(best, cpus)
        need = math.ceil(target * best.work_s * (1 + HEADROOM)) if math.isfinite(target) else math.inf
        return int(min(limit, max(floor, min(MAX_JUMP * workers, need))))  # the floor never passes the bound
    busy = best.worker_busy
    factor = 2.0 if busy is None or busy < 0.5 else 1.5
    return min(limit, max(workers + 1, round(workers * factor)))
