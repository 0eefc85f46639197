"""``TunedDataModule(autotune="online")``: loader settings tried on the run's own training steps, the best kept."""

from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch.utils.data import DataLoader

from lightning_dataperf._lightning_hooks import (
    forget_persistent_iterator,
    queued_batches,
    set_persistent_workers,
    shutdown_loader_iterator,
    validation_batches_seen,
)
from lightning_dataperf.autotune.online import (
    OnlineLoop,
    OnlineResult,
    Phase,
    Segment,
    Setting,
    SettingSpace,
    burst_of,
    planned_batches,
)
from lightning_dataperf.datamodule.online_ddp import WATCH_EVERY, Decision, DistributedResult, RankSync
from lightning_dataperf.datamodule.threads import set_threads
from lightning_dataperf.loader.wrapping import Layer, wrap_iterators

__all__ = ["OnlineIterator", "OnlineTuner", "make_online"]

Position = Callable[[], tuple[int, int]]


class OnlineTuner:
    """The glue between the training loader and :class:`~lightning_dataperf.autotune.online.loop.OnlineLoop`: it
    reads the trainer (the step's mark, the planned steps), feeds the loop each step's start and applies what it
    returns (the intra-op threads here, the loader's settings in :class:`OnlineIterator`). It decides nothing.

    Example::

        tuner = OnlineTuner(trainer, start, space, position=sampler.position, **(options or {}))
        sampler.position = tuner.position
        make_online(loader, tuner)
    """

    def __init__(
        self,
        trainer: Any,
        start: Setting,
        space: SettingSpace,
        position: Position,
        precision: float = 0.03,
        max_batches: int = 200,
        max_cost: float = 0.05,
        min_seconds: float = 1.0,
        max_seconds: float = 10.0,
    ) -> None:
        self.trainer, self._position = trainer, position
        self.loop = OnlineLoop(
            start,
            space,
            precision=precision,
            max_batches=max_batches,
            max_cost=max_cost,
            min_seconds=min_seconds,
            max_seconds=max_seconds,
            planned=self._planned,
            taken=self._taken,
        )
        self.override: tuple[int, int] | None = None
        self.user_threads = torch.get_num_threads()
        self.sync: RankSync | None = None
        """Under DDP (:meth:`distribute`): the sync points where rank zero's decisions reach every rank."""
        self.on_decided: Callable[[Setting], None] | None = None
        """Called with the kept setting when the search ends (rank zero saves it for the next run)."""
        self.current = start
        """The setting in use on this rank."""
        self.share_target: Callable[[float], None] | None = None
        """A split-decode loader's ``set_gpu_share`` (set once the ``GpuDecodeLoader`` wraps the loader)."""
        self.held: Setting | None = None
        """Under DDP, rank zero's decision waiting for the next sync point (the loop is not fed meanwhile: those
        steps belong to neither setting)."""

    def distribute(self, sync: RankSync) -> None:
        """Under DDP, before the first step: rank zero's loop decides for every rank at ``sync``'s points."""
        self.sync = sync
        self.loop.result = DistributedResult(world_size=sync.world_size)

    @property
    def result(self) -> OnlineResult:
        return self.loop.result

    @property
    def trial(self) -> Segment | None:
        """The setting on trial and its step periods (``None`` once the search has ended)."""
        return self.loop.trial

    @property
    def max_cost(self) -> float:
        return self.loop.max_cost

    @max_cost.setter
    def max_cost(self, share: float) -> None:
        self.loop.max_cost = share

    @property
    def queued(self) -> Callable[[], int]:
        """Batches the loader's workers made that training has not taken yet (set by the iterator in use)."""
        return self.loop.queued

    @queued.setter
    def queued(self, count: Callable[[], int]) -> None:
        self.loop.queued = count

    def position(self) -> tuple[int, int]:
        """Where the sampler starts: the tuner's own count while it rebuilds, else Lightning's loop counters."""
        return self.override if self.override is not None else self._position()

    def restart_segment(self, burst: int) -> None:
        """A new iterator (an epoch's, or a switch's): the next ``burst`` periods are its start-up."""
        self.loop.restart(burst)

    def step(self, now: float, has_batch: bool = True) -> Setting | None:
        """Called before each batch is fetched: feeds the loop the step that ended; the setting to switch to.

        Under DDP the setting comes only at a sync point, the same on every rank; ``has_batch``: a batch follows
        in this epoch on every rank (a sync point waits for one).
        """
        sync = self.sync
        if sync is None:
            return self._feed(now)
        if sync.rank == 0 and self.held is None:
            self.held = self._feed(now)
        if not sync.due(has_batch):
            return None
        return self._exchange()

    def _feed(self, now: float) -> Setting | None:
        loop = self.loop
        if loop.phase is Phase.DONE:
            return None
        # a period with validation or an epoch's end in it is not a training step's
        mark = (self.trainer.current_epoch, validation_batches_seen(self.trainer))
        done = loop.result.done
        setting = loop.step(now, mark)
        if loop.result.done and not done:
            self._decided()
        return setting

    def _decided(self) -> None:
        result = self.loop.result
        rank_zero_info(result.summary())
        if self.on_decided is not None and result.kept is not None:
            self.on_decided(result.kept.setting)

    def _exchange(self) -> Setting | None:
        """A sync point: rank zero's held decision and its result to every rank, each rank's wait to rank zero."""
        sync, loop = self.sync, self.loop
        assert sync is not None
        decision = None
        if sync.rank == 0:
            phase = loop.phase
            every = sync.every * (WATCH_EVERY if phase is Phase.WATCHING else 1)
            decision = Decision(self.held, phase is not Phase.DONE, every, loop.result)
        received = sync.exchange(decision, self.current)
        self.held = None
        loop.result = received.result
        return received.setting

    def fetched(self, wait_s: float) -> None:
        """A batch came after ``wait_s`` seconds of waiting (each rank's wait is gathered at the sync points)."""
        if self.sync is not None:
            self.sync.fetched(wait_s)

    def _planned(self) -> float | None:
        trainer = self.trainer
        max_steps = getattr(trainer, "max_steps", None)
        # max_steps counts optimizer steps: each takes accumulate_grad_batches batches
        batches = max_steps * getattr(trainer, "accumulate_grad_batches", 1) if max_steps and max_steps > 0 else None
        return planned_batches(
            getattr(trainer, "max_epochs", None), batches, getattr(trainer, "num_training_batches", None)
        )

    def _taken(self) -> float:
        """Batches of the planned run already taken: a resumed fit starts part way through it."""
        trainer = self.trainer
        return float(getattr(trainer, "global_step", 0) * getattr(trainer, "accumulate_grad_batches", 1))

    def switched(self, switch_s: float, setting: Setting) -> None:
        # the job's stall is rank zero's (the steps are synchronous): counted once
        if self.sync is None or self.sync.rank == 0:
            self.loop.switched(switch_s)
        self.current = setting
        set_threads(setting.threads)

    def finish(self) -> None:
        """At the fit's normal end, on every rank: a search still running ends on the best it measured (said);
        under DDP, rank zero's result (and the last waits) everywhere."""
        if (self.sync is None or self.sync.rank == 0) and self.loop.conclude():
            self._decided()
        if self.sync is not None:
            decision = Decision(None, False, 0, self.loop.result) if self.sync.rank == 0 else None
            self.loop.result = self.sync.exchange(decision, self.current).result

    def close(self) -> None:
        """At teardown: the user's intra-op threads back (the kept setting lasts as long as the fit)."""
        set_threads(self.user_threads)


class OnlineIterator(Iterator[Any]):
    """A training epoch's iterator that rebuilds the iterator beneath it (``make_inner``) at a batch boundary."""

    def __init__(self, loader: DataLoader, tuner: OnlineTuner, make_inner: Callable[[], Iterator[Any]]) -> None:
        self.loader, self.tuner, self.make_inner = loader, tuner, make_inner
        self.epoch, self.first = tuner.position()
        self.yielded = 0
        self.inner: Iterator[Any] | None = make_inner()
        own = weakref.ref(self)  # held weakly: an iterator kept alive by the tuner keeps its workers past the fit
        tuner.queued = lambda: queued_batches(iterator.inner) if (iterator := own()) is not None else 0
        tuner.loop.epoch_batches = _epoch_batches(loader)
        tuner.restart_segment(_burst(loader))

    def __next__(self) -> Any:
        tuner = self.tuner
        # every rank knows whether a batch follows (the shards have one length): a sync point needs one
        has_batch = self.first + self.yielded < getattr(tuner.trainer, "num_training_batches", float("inf"))
        setting = tuner.step(time.perf_counter(), has_batch)
        if setting is not None:
            self._switch(setting)
        assert self.inner is not None
        started = time.perf_counter()
        try:
            batch = next(self.inner)
        finally:
            # the sampler has read its start; a switch in the next() that ends the epoch leaves an empty iterator,
            # and its position, kept, started every later epoch after its last batch
            tuner.override = None
        tuner.fetched(time.perf_counter() - started)
        self.yielded += 1
        return batch

    def _switch(self, setting: Setting) -> None:
        started = time.perf_counter()
        if self.inner is not None and self.tuner.current.threads_alone(setting):
            # the intra-op threads are the training process's alone: the workers and their queue stay as they are
            self.tuner.switched(time.perf_counter() - started, setting)
            self.tuner.restart_segment(1)
            return
        self.close()
        loader = self.loader
        loader.num_workers = setting.num_workers
        loader.prefetch_factor = setting.prefetch_factor
        loader.pin_memory = setting.pin_memory
        # a new count of workers keeps them across epochs as the plan chose (restarts cost 7% of an H200 run's rate)
        set_persistent_workers(loader, setting.persistent_workers and setting.num_workers > 0)
        if setting.gpu_share is not None and self.tuner.share_target is not None:
            # the workers the new iterator starts split their batches at this share
            self.tuner.share_target(setting.gpu_share)
        self.tuner.override = (self.epoch, self.first + self.yielded)
        # a new iterator draws its base seed: from a forked generator, so the model's own draws do not move
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            # the loop's own trial of more workers than PyTorch suggests is not the user's setting
            warnings.filterwarnings("ignore", message=".*worker processes in total.*")
            self.inner = self.make_inner()
        self.tuner.switched(time.perf_counter() - started, setting)
        self.tuner.restart_segment(_burst(loader))

    def close(self) -> None:
        """Stop this iterator's workers now (a persistent loader's iterator is dropped, so it is not reused)."""
        if self.loader.persistent_workers:
            forget_persistent_iterator(self.loader)
        shutdown_loader_iterator(self.inner)
        self.inner = None

    def __del__(self) -> None:
        if getattr(self, "inner", None) is not None and not self.loader.persistent_workers:
            shutdown_loader_iterator(self.inner)


def _burst(loader: DataLoader) -> int:
    """:func:`burst_of` the loader as it is now."""
    return burst_of(loader.num_workers, loader.prefetch_factor, _epoch_batches(loader))


def _epoch_batches(loader: DataLoader) -> int | None:
    try:
        return len(loader)
    except TypeError:  # an iterable dataset without a length
        return None


class _OnlineWrapper:
    """The loop's wrapper of a loader's iterators (:attr:`~lightning_dataperf.loader.wrapping.Layer.ONLINE`)."""

    def __init__(self, tuner: OnlineTuner) -> None:
        # the last iterator, held weakly: one kept alive here would keep its workers alive past the fit
        self.tuner, self.active = tuner, None

    def __call__(self, loader: DataLoader, make_inner: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        if self.active is not None and (iterator := self.active()) is not None and not loader.persistent_workers:
            # last epoch's iterator, left unfinished (limit_train_batches); a persistent one is reused
            iterator.close()
        iterator = OnlineIterator(loader, self.tuner, make_inner)
        self.active = weakref.ref(iterator)
        return iterator


def make_online(loader: DataLoader, tuner: OnlineTuner) -> None:
    """Make ``loader``'s iterators :class:`OnlineIterator` (a copy Lightning rebuilt from it iterates plainly)."""
    wrap_iterators(loader, _OnlineWrapper(tuner), Layer.ONLINE, replace=True)
