"""Which sampler each of TunedDataModule's loaders gets: seeded and resume-exact for training, unpadded for eval."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.utils.data import IterableDataset, RandomSampler, Sampler, SequentialSampler

from lightning_dataperf.loader.policy import seeded_over_generator
from lightning_dataperf.loader.sampler import (
    EpochAwareDistributedSampler,
    EpochAwareSamplerWrapper,
    EpochPublishingSampler,
    UnpaddedDistributedSampler,
)
from lightning_dataperf.loader.seeding import SharedEpoch
from lightning_dataperf.loader.settings import LoaderPlan

__all__ = ["Sharding", "plan_sampler"]


@dataclass(frozen=True)
class Sharding:
    """What the sampler of a TunedDataModule's loader is made from, beside the loader's own arguments."""

    rank: int
    world: int
    seed: int
    #: ``TunedDataModule(shard_drop_last=...)``: trim the training set rather than repeat samples.
    drop_last: bool
    #: ``TunedDataModule(unpadded_eval=...)``: shard validation and test without padding.
    unpadded_eval: bool
    #: The training loop's position (epoch, batches taken), for a resume; ``None`` without a trainer.
    position: Callable[[], tuple[int, int]] | None
    #: The dataset may load in the training process (no workers, or the online loop's later switch to none): its
    #: ``set_epoch`` follows the epochs too.
    loads_here: bool


def plan_sampler(
    stage: str, explicit: dict[str, Any], plan: LoaderPlan, shared: SharedEpoch, sharding: Sharding
) -> dict[str, Any]:
    """The loader arguments that set its sampler (none where it keeps its own), and ``plan.sampler`` said."""
    dataset = explicit.get("dataset")
    if isinstance(dataset, IterableDataset) or explicit.get("batch_sampler") is not None:
        plan.sampler = "unchanged (iterable dataset or your batch_sampler)"
        return {}
    sampler = explicit.get("sampler")
    custom = sampler is not None and not isinstance(sampler, (RandomSampler, SequentialSampler))
    if stage == "train":
        return _train_sampler(explicit, plan, shared, sampler if custom else None, sharding)
    rank, world = sharding.rank, sharding.world
    if stage in {"val", "test"} and world > 1 and not custom:
        length = len(dataset)  # type: ignore[arg-type]
        if sharding.unpadded_eval:
            unpadded = UnpaddedDistributedSampler(dataset, num_replicas=world, rank=rank)  # type: ignore[arg-type]
            plan.sampler = f"UnpaddedDistributedSampler (rank {rank} of {world}, no duplicates)"
            plan.padded_samples_avoided = unpadded.padded_samples_avoided
            return {"sampler": unpadded, "shuffle": None}
        plan.sampler = "Lightning's DistributedSampler (pads with duplicates; unpadded_eval=True avoids it)"
        plan.padded_samples = -(-length // world) * world - length
    return {}


def _train_sampler(
    explicit: dict[str, Any], plan: LoaderPlan, shared: SharedEpoch, custom: Sampler | None, sharding: Sharding
) -> dict[str, Any]:
    dataset = explicit.get("dataset")
    rank, world, seed, drop_last = sharding.rank, sharding.world, sharding.seed, sharding.drop_last
    listeners = [shared.set]
    if sharding.loads_here and callable(getattr(dataset, "set_epoch", None)):
        listeners.append(dataset.set_epoch)  # type: ignore[union-attr]
    options = dict(position=sharding.position, batch_size=explicit.get("batch_size", 1) or 1, on_epoch=listeners)
    if custom is not None and world > 1:
        plan.sampler = f"your sampler, sharded across {world} ranks (EpochAwareSamplerWrapper)"
        wrapper = EpochAwareSamplerWrapper(custom, num_replicas=world, rank=rank, shuffle=False, **options)
        plan.padded_samples, plan.dropped_samples = wrapper.padded_samples, wrapper.dropped_samples
        return {"sampler": wrapper}
    if custom is not None:
        plan.sampler = "your sampler (epoch published to workers)"
        return {"sampler": EpochPublishingSampler(custom, **options)}
    shuffle = bool(explicit.get("shuffle") or isinstance(explicit.get("sampler"), RandomSampler))
    sampler = EpochAwareDistributedSampler(
        dataset,  # type: ignore[arg-type]
        num_replicas=world,
        rank=rank,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
        **options,
    )
    order = "new order each epoch" if shuffle else "the same order every epoch (shuffle=False)"
    plan.sampler = (
        f"EpochAwareDistributedSampler(rank {rank} of {world}, shuffle={shuffle}, seed={seed}, "
        f"drop_last={drop_last}): {order}, same order after a resume{seeded_over_generator(explicit)}"
    )
    plan.padded_samples, plan.dropped_samples = sampler.padded_samples, sampler.dropped_samples
    return {"sampler": sampler, "shuffle": None}
