"""Measurements one autotune trial takes besides batch arrivals: the workers' CPU and memory, open files."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import os
from collections.abc import Iterator, Mapping
from typing import Any

from lightning_dataperf.autotune.trial import Trial

__all__ = ["MEMORY_SAMPLE", "Drained", "WorkerCpu", "gc_frozen", "open_files", "pooled_error"]

_MB = 2**20
#: Workers whose unique memory a trial reads (:meth:`WorkerCpu.unique_mb`).
MEMORY_SAMPLE = 4


@dataclasses.dataclass
class Drained:
    """What one trial's consumption saw (see :func:`~lightning_dataperf.autotune.drain.drain`)."""

    arrivals: list[float] = dataclasses.field(default_factory=list)
    made_at: list[float] = dataclasses.field(default_factory=list)  # when the steady batches' collate ended
    startup: float = 0.0
    busy: float | None = None
    worker_mb: float | None = None
    wait_share: float | None = None
    work_s: float | None = None
    cpu_s: float | None = None
    main_s: float | None = None
    tree_cpu_s: float | None = None
    exhausted: bool = False


@contextlib.contextmanager
def gc_frozen() -> Iterator[None]:
    """Objects that exist on entry are left out of garbage collections until exit (:func:`gc.freeze`).

    A trial's loader is collected at once after its shutdown (its pinned and shared buffers freed before the
    next trial); frozen, a collection walks only what the search created. A freeze already in place (a training
    script's own ``gc.freeze()`` before forking workers, or an outer ``gc_frozen``) is extended to the objects
    alive since (one collection first, so no garbage is frozen), and stays so after exit: :func:`gc.unfreeze`
    cannot undo part of a freeze, so those objects, like the script's own frozen ones, are not collected if
    they later become cyclic garbage, until the script unfreezes. Otherwise everything made after that freeze
    was walked by every collection.

    Example::

        with gc_frozen():
            ...                 # trials; gc.collect() after each is cheap
    """
    outer = gc.get_freeze_count() > 0
    if outer:
        gc.collect()  # once, not frozen: the garbage made since the earlier freeze
    gc.freeze()
    try:
        yield
    finally:
        if not outer:
            gc.unfreeze()


def pooled_error(first: Trial, again: Trial, count: int) -> float | None:
    """Standard error of the mean of ``count`` earlier measurements and one more (``None`` if one is unknown)."""
    if first.precision is None or again.precision is None:
        return None
    total = (count * first.precision) ** 2 + again.precision**2
    return math.sqrt(total) / (count + 1)


class WorkerCpu:
    """CPU seconds and unique memory of this process's children (the trial loader's workers).

    Example::

        cpu = WorkerCpu()            # this process's children: the trial loader's workers
        before = cpu.seconds(); ...; busy = cpu.since(before) / (wall * workers)
    """

    def __init__(self) -> None:
        try:
            import psutil

            self._me = psutil.Process()
        except Exception:  # psutil missing or /proc unreadable: no busy share, no memory bound
            self._me = None

    @property
    def readable(self) -> bool:
        """Whether psutil could be set up for this process (each child's read may still fail; it is skipped)."""
        return self._me is not None

    def _children(self) -> list[Any]:
        if self._me is None:
            return []
        # psutil is there: self._me is a psutil.Process
        from lightning_dataperf.telemetry.processes import loader_worker_processes

        try:
            return loader_worker_processes(self._me)
        except Exception:
            return []

    def seconds(self) -> dict[int, float]:
        """CPU seconds (user + system) of each child now, by pid: pass it to :meth:`since`."""
        times: dict[int, float] = {}
        for child in self._children():
            with contextlib.suppress(Exception):
                spent = child.cpu_times()
                times[child.pid] = spent.user + spent.system
        return times

    def since(self, before: Mapping[int, float]) -> float:
        """CPU seconds the children alive now spent since ``before`` (:meth:`seconds`). Per pid: a previous
        trial's worker still exiting when ``before`` was read, gone now, must not make the sum negative."""
        return sum(max(0.0, spent - before.get(pid, 0.0)) for pid, spent in self.seconds().items())

    def unique_mb(self, sample: int = MEMORY_SAMPLE) -> float | None:
        """The largest unique memory (USS, MB) of up to ``sample`` children, spread over them in pid order.

        Reading a process's USS walks its page tables (``smaps_rollup``), so only a few are read: the workers of
        one loader are forks of one process running the same code, and a few tell a worker's memory.
        """
        children = self._children()
        if len(children) > sample > 0:
            step = len(children) / sample
            children = [children[int(index * step)] for index in range(sample)]
        sizes = []
        for child in children:
            with contextlib.suppress(Exception):
                sizes.append(child.memory_full_info().uss / _MB)
        return max(sizes) if sizes else None


def open_files() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0
