"""Per-worker random streams from (seed, epoch, rank, worker id), and the epoch inside workers.

PyTorch seeds each worker from a base seed drawn from the main process's RNG, so the streams depend
on everything else that consumed random numbers before the iterator was made, and they do not
survive a resume. Here every worker's ``random``, NumPy and torch generators are seeded from
``(seed, epoch, rank, worker_id)`` alone: workers never repeat each other's augmentations, and a
rerun or a resumed run draws the same numbers.

Persistent workers live across epochs, so the epoch reaches them through shared memory
(:class:`SharedEpoch`): on the first sample of a new epoch a worker reseeds itself and calls the
dataset's ``set_epoch(epoch)`` if it has one (in the worker's own copy of the dataset).

Example::

    shared = SharedEpoch()
    loader = DataLoader(dataset, num_workers=4, persistent_workers=True,
                        worker_init_fn=EpochSeededWorkerInit(seed=42, rank=0, shared=shared))
    shared.set(epoch)                     # before iterating each epoch (the samplers here do it)
"""

from __future__ import annotations

import hashlib
import multiprocessing
import random
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["EpochSeededWorkerInit", "SharedEpoch", "worker_seed"]


def worker_seed(seed: int, epoch: int, rank: int, worker_id: int) -> int:
    """A 64-bit seed that depends only on its four inputs."""
    digest = hashlib.blake2b(f"{seed}/{epoch}/{rank}/{worker_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def seed_everything_here(seed: int) -> None:
    """Seed ``random``, NumPy (if installed) and torch in this process."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is optional
        return
    numpy.random.seed(seed % 2**32)


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
    """

    def __init__(self, seed: int, rank: int, shared: SharedEpoch, user_init: Callable[[int], Any] | None = None):
        self.seed, self.rank, self.shared, self.user_init = seed, rank, shared, user_init

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

    def sync(self, dataset: Any) -> None:
        epoch = self.init.shared.value
        if epoch == self.epoch:
            return
        self.epoch = epoch
        seed_everything_here(worker_seed(self.init.seed, epoch, self.init.rank, self.worker_id))
        set_epoch = getattr(dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)


_FOLLOWING: dict[type, type] = {}


def _follow_epochs(dataset: Any, state: _WorkerEpochState) -> None:
    """In this worker only, make the dataset check the shared epoch before each sample.

    The worker's dataset is its own copy, so swapping its class to a subclass is invisible to the
    main process. Datasets whose class cannot be swapped (``__slots__``, extension types) keep the
    seeding done at worker start.
    """
    base = type(dataset)
    if not hasattr(base, "__getitem__") or isinstance(dataset, torch.utils.data.IterableDataset):
        return
    follower = _FOLLOWING.get(base)
    if follower is None:
        follower = _FOLLOWING[base] = _make_follower(base)
    try:
        dataset.__class__ = follower
        dataset._dataperf_epoch_state = state
    except (TypeError, AttributeError):
        if type(dataset) is follower:
            dataset.__class__ = base


def _make_follower(base: type) -> type:
    def __getitem__(self: Any, index: Any) -> Any:  # noqa: N807
        self._dataperf_epoch_state.sync(self)
        return base.__getitem__(self, index)

    namespace: dict[str, Any] = {"__getitem__": __getitem__}
    if hasattr(base, "__getitems__"):

        def __getitems__(self: Any, indices: Any) -> Any:  # noqa: N807
            self._dataperf_epoch_state.sync(self)
            return base.__getitems__(self, indices)

        namespace["__getitems__"] = __getitems__
    return type(base.__name__, (base,), namespace)
