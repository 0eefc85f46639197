"""Consuming one autotune trial's batches: their arrivals, the start-up, what the workers and the main thread did."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from lightning_dataperf.autotune.measures import Drained, WorkerCpu
from lightning_dataperf.autotune.trial import MIN_ROUNDS, MIN_STEADY_BATCHES, Trial, decided, steady_rate
from lightning_dataperf.loader.probe import TimedBatch

if TYPE_CHECKING:
    from lightning_dataperf.autotune.bounds import Resources
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.trial import Limits

__all__ = ["DrainSource", "drain"]


class DrainSource(Protocol):
    """What :func:`drain` reads of the trial runner that calls it."""

    path: TransferPath
    limits: Limits
    resources: Resources
    listener: Callable[[str, Any], None]

    @property
    def remaining(self) -> float: ...

    def learn_footprint(self, batch: Any) -> None: ...


def drain(
    runner: DrainSource,
    iterator: Iterator[Any],
    started: float,
    workers: int,
    skip: int,
    in_flight: int,
    scale: float,
    against: Trial | None,
) -> Drained:
    """Consume batches until the rate is known (or decided against ``against``): arrivals, start-up, what
    the workers and the main thread did.

    The trial's cap counts from the end of the burst (``skip`` batches after the first), and a trial
    always sees one whole round after it, and the batches in flight after that (``workers x prefetch``:
    the rate then also counts only the batches made inside the window,
    :func:`~lightning_dataperf.autotune.trial.made_rate`), unless the search's budget runs out: many
    workers on few cores take seconds to start, and a trial cut short then measures only their
    staggered arrival.

    Example::

        drained = drain(runner, iter(loader), time.perf_counter(), workers=4, skip=7, in_flight=8, scale=1.0,
                        against=None)
        drained.arrivals, drained.startup, drained.busy
    """
    out = Drained()
    arrivals, timings = out.arrivals, []
    consume = runner.path.consumer()
    limits = runner.limits
    cap, batch_cap = limits.trial_cap * scale, limits.batch_budget * scale
    workers_cpu = WorkerCpu() if workers else None
    cpu_start = wall_start = main_cpu_start = None
    last_report = started
    round_size = max(1, workers)
    waited = 0.0
    while True:
        asked = time.perf_counter()
        try:
            item = next(iterator)
        except StopIteration:
            out.exhausted = True
            break
        got = time.perf_counter()
        batch = item.batch if type(item) is TimedBatch else item
        if not arrivals:
            out.startup = got - started
            if runner.resources.batch_bytes is None:
                runner.learn_footprint(batch)
        elif len(arrivals) > skip:  # steady: what the main thread waited, what the workers did
            waited += got - asked
            if type(item) is TimedBatch:
                timings.append(item.timing)
        consume(batch)
        now = time.perf_counter()
        arrivals.append(now)
        count = len(arrivals)
        if count == skip + 1:
            wall_start = now
            if workers_cpu is not None:
                cpu_start = workers_cpu.seconds()
            main_cpu_start = time.process_time()  # after the scan of the workers: not counted in the trial
        if count > 1 and now - last_report > 0.25:
            last_report = now
            runner.listener("progress", (count - 1) / (now - arrivals[0]))
        if runner.remaining <= 0:
            break
        if count < skip + 1 + round_size + in_flight or count < 3:
            continue  # not one steady round yet, or not the batches in flight after it (see made_rate)
        if now - arrivals[skip] > cap or count > batch_cap + skip + in_flight:
            break
        if (count - skip - 1) % round_size == 0:
            rate, error, counted = steady_rate(arrivals, workers, skip)
            enough_rounds = counted >= max(MIN_STEADY_BATCHES, MIN_ROUNDS * round_size)
            known = error <= limits.precision / scale or decided(rate, error, against, limits.noise)
            if enough_rounds and known:
                break
    consume.finish()
    end = time.perf_counter()
    if arrivals:
        arrivals[-1] = end  # the last batch is consumed once the device is done
    else:
        out.startup = end - started
    if wall_start is not None and end > wall_start and len(arrivals) > skip + 1:
        wall, steady = end - wall_start, len(arrivals) - skip - 1
        out.wait_share = min(1.0, waited / wall)
        out.main_s = max(0.0, wall - waited) / steady
        tree_cpu = time.process_time() - (main_cpu_start or 0.0)
        # an iterator that ran out has shut its workers down (their CPU time is gone with them)
        gone = workers_cpu is not None and out.exhausted
        if workers_cpu is not None and workers_cpu.readable and cpu_start is not None and not gone:
            spent = workers_cpu.since(cpu_start)  # unreadable (no psutil): no busy share, not 0
            out.busy = min(1.0, spent / (wall * workers))
            tree_cpu += spent
        if (workers_cpu is None or workers_cpu.readable) and not gone:
            out.tree_cpu_s = tree_cpu / steady
    if workers_cpu is not None:  # after the clock stopped: reading the workers' smaps took 0.3 s for 16
        out.worker_mb = workers_cpu.unique_mb()
    out.made_at = [timing.produced_at for timing in timings]  # for made_rate
    if timings:
        out.work_s = sum(timing.fetch_s + timing.collate_s for timing in timings) / len(timings)
        out.cpu_s = sum(timing.work_cpu_s for timing in timings) / len(timings)
    return out
