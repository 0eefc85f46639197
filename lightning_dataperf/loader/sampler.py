"""Distributed samplers that know the epoch, resume exactly, and can shard evaluation without padding.

Lightning's ``set_epoch`` comes after the first iterator of a fit, so a resume replays the wrong order (docs/loader.md).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sized
from typing import Any

from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.utils.data import DistributedSampler, Sampler

__all__ = [
    "EpochAwareDistributedSampler",
    "EpochAwareSamplerWrapper",
    "EpochPublishingSampler",
    "LoaderResumeState",
    "UnpaddedDistributedSampler",
    "make_resumable",
]

#: Returns ``(epoch, batches already consumed in that epoch)`` at the moment iteration starts.
Position = Callable[[], tuple[int, int]]
EpochListener = Callable[[int], None]


class _ResumeExact:
    """Shared logic: read the epoch and the resume offset when iteration starts, then skip what was done."""

    position: Position | None
    batch_size: int
    on_epoch: list[EpochListener]
    epoch: int
    started_batch: int = 0  # the epoch's batch the last iteration started at

    def _follow(self, position: Position | None, batch_size: int, on_epoch: list[EpochListener] | None) -> None:
        self.position, self.batch_size, self.on_epoch = position, batch_size, list(on_epoch or [])

    def _start(self) -> int:
        """Bring ``self.epoch`` up to date and return how many leading samples to skip."""
        skip = self.started_batch = 0
        if self.position is not None:
            epoch, done_batches = self.position()
            # Lightning's set_epoch comes after the first iterator of a fit, so the epoch is read here.
            self.set_epoch(epoch)  # type: ignore[attr-defined]
            skip, self.started_batch = done_batches * self.batch_size, done_batches
        for listener in self.on_epoch:
            listener(self.epoch)
        return skip

    def _indices(self) -> Iterator[Any]:
        return super().__iter__()  # type: ignore[misc]

    def __iter__(self) -> Iterator[Any]:
        skip = self._start()
        return itertools.islice(self._indices(), skip, None)


class _PaddingCounts:
    """How many samples the equal-length shards repeat or leave out."""

    total_size: int
    dataset: Any

    @property
    def padded_samples(self) -> int:
        """Duplicated samples added so every rank gets the same count (``drop_last=False``)."""
        return max(0, self.total_size - len(self.dataset))

    @property
    def dropped_samples(self) -> int:
        """Samples left out so every rank gets the same count (``drop_last=True``)."""
        return max(0, len(self.dataset) - self.total_size)


class EpochAwareDistributedSampler(_ResumeExact, _PaddingCounts, DistributedSampler):
    """``DistributedSampler`` that reads its epoch (and resume offset) from ``position`` at iteration.

    Args:
        dataset: a sized dataset.
        position: returns ``(epoch, batches_done)``; ``None`` behaves like ``DistributedSampler``.
        batch_size: samples per batch, to turn ``batches_done`` into samples to skip.
        on_epoch: called with the epoch each time iteration starts (worker seeding, dataset ``set_epoch``).
        **kwargs: ``num_replicas``, ``rank``, ``shuffle``, ``seed``, ``drop_last`` as for ``DistributedSampler``.

    Example::

        sampler = EpochAwareDistributedSampler(dataset, num_replicas=2, rank=0, seed=42, shuffle=True)
        sampler.set_epoch(3)
        first_indices = list(sampler)
        print(sampler.padded_samples)        # duplicates added so every rank gets as many samples
    """

    def __init__(
        self,
        dataset: Sized,
        position: Position | None = None,
        batch_size: int = 1,
        on_epoch: list[EpochListener] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, **kwargs)  # type: ignore[arg-type]
        self._follow(position, batch_size, on_epoch)


class EpochAwareSamplerWrapper(_ResumeExact, _PaddingCounts, DistributedSamplerWrapper):
    """Shards a custom sampler's indices across ranks (like Lightning's wrapper), resume-exact."""

    def __init__(
        self,
        sampler: Sampler | Any,
        position: Position | None = None,
        batch_size: int = 1,
        on_epoch: list[EpochListener] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(sampler, **kwargs)
        self._follow(position, batch_size, on_epoch)


class EpochPublishingSampler(_ResumeExact, Sampler):
    """Wraps a custom single-process sampler: same indices, plus the epoch for workers and resume skipping."""

    def __init__(
        self,
        sampler: Sampler | Any,
        position: Position | None = None,
        batch_size: int = 1,
        on_epoch: list[EpochListener] | None = None,
    ) -> None:
        self.sampler, self.epoch = sampler, 0
        self._follow(position, batch_size, on_epoch)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        # The user's sampler may draw a new order per epoch too.
        if callable(inner := getattr(self.sampler, "set_epoch", None)):
            inner(epoch)

    def _indices(self) -> Iterator[Any]:
        return iter(self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


class UnpaddedDistributedSampler(DistributedSampler):
    """Evaluation sharding without padding: rank ``r`` gets ``indices[r::world]`` and nothing twice.

    Ranks may get one sample fewer than others, so per-step collectives in ``validation_step`` must
    be avoided (epoch-level ``self.log(..., sync_dist=True)`` and torchmetrics are fine).
    ``padded_samples_avoided`` is how many duplicates ``DistributedSampler`` would have added.
    """

    def __init__(self, dataset: Sized, num_replicas: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)  # type: ignore[arg-type]
        length = len(dataset)
        self.padded_samples_avoided = math.ceil(length / num_replicas) * num_replicas - length
        # Ranks may get one sample fewer: nothing is repeated to even them out.
        self.num_samples = len(range(rank, length, num_replicas))
        # No padding: together the shards hold the dataset exactly once.
        self.total_size = length

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.total_size, self.num_replicas))


class LoaderResumeState:
    """The part of a training loader's order that Lightning's loop counters do not hold.

    ``state_dict()`` records it when Lightning saves a checkpoint; ``load_state_dict()`` (called by
    Lightning when it restarts from one) warns, naming each change, when this run's loader differs, since
    the order after the resume is then not the one the interrupted run would have had.
    """

    # Saved with the state, so that a later layout can tell an old checkpoint's apart.
    FORMAT = 1

    def __init__(self, sampler: EpochAwareDistributedSampler, batch_size: int) -> None:
        self.sampler, self.batch_size = sampler, batch_size

    def state_dict(self) -> dict[str, Any]:
        sampler = self.sampler
        return {
            "format": self.FORMAT,
            "sampler": type(sampler).__name__,
            "seed": int(sampler.seed),
            "shuffle": bool(sampler.shuffle),
            "num_replicas": int(sampler.num_replicas),
            "drop_last": bool(sampler.drop_last),
            "dataset_length": len(sampler.dataset),  # type: ignore[arg-type]
            "batch_size": int(self.batch_size),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        current = self.state_dict()
        changed = [
            f"{name} {state_dict[name]!r} -> {value!r}"
            for name, value in current.items()
            # A key an older checkpoint lacks is no change to warn about.
            if name != "format" and name in state_dict and state_dict[name] != value
        ]
        if changed:
            rank_zero_warn(
                "lightning_dataperf: this run's training loader differs from the checkpoint's ("
                + ", ".join(changed)
                + "), so the order after the resume is not the one the interrupted run would have had."
            )


def make_resumable(loader: Any, sampler: EpochAwareDistributedSampler) -> LoaderResumeState:
    """Give ``loader`` (whose sampler is ``sampler``) ``state_dict`` / ``load_state_dict``.

    They are set on this loader object only: a loader Lightning re-creates from its arguments (to
    replace the sampler) is not stateful, and Lightning warns for it as for any other.
    """
    # A loader with a batch_sampler has batch_size None.
    state = LoaderResumeState(sampler, loader.batch_size or 1)
    loader.state_dict = state.state_dict
    loader.load_state_dict = state.load_state_dict
    return state
