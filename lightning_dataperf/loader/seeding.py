"""Per-worker random streams from (seed, epoch, rank, worker id), and the epoch inside workers.

PyTorch's own worker seeds depend on what drew from the main RNG before and do not survive a resume (docs/loader.md).
"""

from __future__ import annotations

import hashlib
import itertools
import multiprocessing
import random
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler

from lightning_dataperf.loader.main_rng import MainGenerators, numpy_key, numpy_module
from lightning_dataperf.loader.wrapping import Layer, follow_fetches, wrap_iterators

__all__ = [
    "MAIN_PROCESS_SEEDING",
    "UNSEEDED_DRAW",
    "EpochSeededWorkerInit",
    "NumberedBatch",
    "NumberedBatchSampler",
    "SharedEpoch",
    "batch_seed",
    "number_batches",
    "seed_batches_in_main_process",
    "worker_seed",
]

#: The loader plan's note where batches are fetched seeded in the training process.
MAIN_PROCESS_SEEDING = (
    "num_workers=0: each batch is fetched with random/NumPy/torch seeded from (seed, epoch, rank, batch), your"
    " generators restored after it (same draws after a resume; random and NumPy only where the epoch's first"
    " batches draw from them; 11-26 us per batch on a 2-core machine)"
)

#: The warning where a batch drew from a generator no batch of its iterator's first ones had drawn from.
UNSEEDED_DRAW = (
    "lightning_dataperf: batch {batch} of epoch {epoch} drew from `{name}` in the training process, which the"
    " epoch's first batches did not, so it drew unseeded from your stream (your state is put back) and is not"
    " reproduced after a resume; `{name}` is seeded for every later batch of this epoch. To have every batch exact,"
    " draw from `{name}` in every batch (e.g. a draw whose result you ignore) or use num_workers > 0."
)

#: Returns ``(epoch, batches already consumed in that epoch)`` when an iterator starts (sampler.Position).
Position = Callable[[], tuple[int, int]]


def worker_seed(seed: int, epoch: int, rank: int, worker_id: int) -> int:
    """A 64-bit seed that depends only on its four inputs."""
    digest = hashlib.blake2b(f"{seed}/{epoch}/{rank}/{worker_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def batch_seed(seed: int, epoch: int, rank: int, batch: int) -> int:
    """A 64-bit seed for batch ``batch`` of ``epoch`` on ``rank``, fetched in the main process.

    Its key never equals a worker's (:func:`worker_seed`), so the two kinds of streams do not collide.
    """
    digest = hashlib.blake2b(f"{seed}/{epoch}/{rank}/batch/{batch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class _SeededBatches:
    """A DataLoader iterator whose every ``next()`` (sampling, ``__getitem__``, collate) runs seeded."""

    def __init__(
        self,
        inner: Iterator[Any],
        seed: int,
        rank: int,
        position: Position,
        fetched: Callable[[float], None] | None = None,
    ) -> None:
        self._inner, self._seed, self._rank, self._position = inner, seed, rank, position
        self._epoch: int | None = None
        self._batch = 0
        self._generators = MainGenerators()
        self._fetched = fetched

    def __iter__(self) -> _SeededBatches:
        return self

    def __next__(self) -> Any:
        if self._epoch is None:  # the sampler reads the same position inside this first next()
            self._epoch, self._batch = self._position()
        started = time.perf_counter()
        batch = self._generators.fetch(batch_seed(self._seed, self._epoch, self._rank, self._batch), self._inner)
        for name in self._generators.missed:
            warnings.warn(UNSEEDED_DRAW.format(name=name, batch=self._batch, epoch=self._epoch), stacklevel=2)
        if self._fetched is not None:
            self._fetched(time.perf_counter() - started)
        self._batch += 1
        return batch

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:  # the wrapped iterator's own attributes
        if name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)


def seed_batches_in_main_process(
    loader: Any, seed: int, rank: int, position: Position, fetched: Callable[[float], None] | None = None
) -> None:
    """Make every iterator of ``loader`` (``num_workers=0``) fetch batch ``b`` of epoch ``e`` seeded
    from ``batch_seed(seed, e, rank, b)``, where ``position()`` gives ``(e, first b)`` when it starts;
    ``fetched``, where given, is told each batch's seconds of loading (the online loop's first moves read it).

    Its iterators pass through a wrapper at :attr:`~lightning_dataperf.loader.wrapping.Layer.SEEDING`
    (a second call replaces the first); a copy Lightning re-creates from the loader's arguments iterates unseeded.
    """

    def seeded(loader: Any, inner: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        iterator = inner()
        # with workers (the online loop may start them) the workers seed each batch themselves
        return iterator if loader.num_workers else _SeededBatches(iterator, seed, rank, position, fetched)

    wrap_iterators(loader, seeded, Layer.SEEDING, replace=True)


def seed_everything_here(seed: int) -> None:
    """Seed ``random``, NumPy (if installed) and torch in this process."""
    random.seed(seed)
    torch.manual_seed(seed)
    if (numpy := numpy_module()) is not None:
        numpy.random.seed(numpy_key(seed))


class SharedEpoch:
    """An epoch number in shared memory, readable from worker processes (fork, spawn, forkserver)."""

    def __init__(self, epoch: int = 0) -> None:
        self._value = multiprocessing.RawValue("q", epoch)

    @property
    def value(self) -> int:
        return int(self._value.value)

    def set(self, epoch: int) -> None:
        self._value.value = epoch


class EpochSeededWorkerInit:
    """A picklable ``worker_init_fn``: seeds from (seed, epoch, rank, worker id), tracks the epoch.

    Args:
        seed: the run's seed (``seed_everything``'s, or explicit).
        rank: global rank of this process.
        shared: where the main process publishes the epoch.
        user_init: the user's own ``worker_init_fn``, called afterwards (so its seeding wins).

    Example::

        shared = SharedEpoch()
        loader = DataLoader(dataset, num_workers=4, persistent_workers=True,
                            worker_init_fn=EpochSeededWorkerInit(seed=42, rank=0, shared=shared))
        shared.set(epoch)                     # before iterating each epoch (the samplers here do it)
    """

    def __init__(
        self,
        seed: int,
        rank: int,
        shared: SharedEpoch,
        user_init: Callable[[int], Any] | None = None,
        batch_seeded: bool = False,
    ):
        self.seed, self.rank, self.shared, self.user_init = seed, rank, shared, user_init
        # each numbered batch drawn from batch_seed(...): the same draws whatever the worker count
        self.batch_seeded = batch_seeded

    def __call__(self, worker_id: int) -> None:
        info = torch.utils.data.get_worker_info()
        state = _WorkerEpochState(self, worker_id)
        state.sync(info.dataset if info is not None else None)
        if info is not None:
            _follow_epochs(info.dataset, state)
        if self.user_init is not None:
            self.user_init(worker_id)


class _WorkerEpochState:
    def __init__(self, init: EpochSeededWorkerInit, worker_id: int) -> None:
        self.init, self.worker_id, self.epoch = init, worker_id, None

    def before_fetch(self, dataset: Any, indices: Any) -> None:
        """Ahead of each fetch in the worker: the shared epoch, and a numbered batch's own seed."""
        self.sync(dataset)
        number = getattr(indices, "number", None)
        if self.init.batch_seeded and number is not None:
            seed_everything_here(batch_seed(self.init.seed, self.epoch, self.init.rank, number))

    def sync(self, dataset: Any) -> None:
        epoch = self.init.shared.value
        if epoch == self.epoch:
            return
        self.epoch = epoch
        seed_everything_here(worker_seed(self.init.seed, epoch, self.init.rank, self.worker_id))
        set_epoch = getattr(dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)


def _follow_epochs(dataset: Any, state: _WorkerEpochState) -> None:
    """In this worker only, make the dataset check the shared epoch before each sample.

    The worker's dataset is its own copy, so swapping its class (:func:`follow_fetches`) is invisible to the
    main process. Datasets whose class cannot be swapped keep the seeding done at worker start.
    """
    if not hasattr(type(dataset), "__getitem__") or isinstance(dataset, torch.utils.data.IterableDataset):
        return
    follow_fetches(dataset, state.before_fetch)


class NumberedBatch(list):
    """One batch's sample indices and its number in the epoch (pickled with it to the worker)."""

    number: int


class NumberedBatchSampler(BatchSampler):
    """A ``BatchSampler`` whose batches carry their number, counted from where the sampler started.

    The sampler must record ``started_batch`` when its iteration starts (the resume-exact samplers do).
    """

    def __iter__(self) -> Iterator[list[int]]:
        batches = super().__iter__()
        first = next(batches, None)  # the sampler reads its start inside this
        if first is None:
            return
        start = getattr(self.sampler, "started_batch", 0)
        for number, indices in enumerate(itertools.chain([first], batches), start):
            batch = NumberedBatch(indices)
            batch.number = number
            yield batch


def number_batches(loader: Any) -> bool:
    """Give ``loader`` a :class:`NumberedBatchSampler` in place of its plain ``BatchSampler`` (``False``: none)."""
    if type(loader.batch_sampler) is not BatchSampler:
        return False
    numbered = NumberedBatchSampler(loader.sampler, loader.batch_size, loader.drop_last)
    # a built DataLoader refuses a new batch_sampler through its own __setattr__
    object.__setattr__(loader, "batch_sampler", numbered)
    return True
