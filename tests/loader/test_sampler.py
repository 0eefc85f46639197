"""The samplers on their own: epoch and resume offset read at iteration, padding counts, custom samplers."""

from __future__ import annotations

from torch.utils.data import SequentialSampler

from lightning_dataperf.loader.sampler import (
    EpochAwareDistributedSampler,
    EpochAwareSamplerWrapper,
    EpochPublishingSampler,
    UnpaddedDistributedSampler,
)


class Reversed(SequentialSampler):
    def __iter__(self):
        return iter(range(len(self.data_source) - 1, -1, -1))


def test_position_sets_the_epoch_and_skips_done_batches():
    data = list(range(31))
    seen_epochs = []
    position = {"value": (3, 0)}
    sampler = EpochAwareDistributedSampler(
        data,
        position=lambda: position["value"],
        batch_size=4,
        on_epoch=[seen_epochs.append],
        num_replicas=2,
        rank=1,
        shuffle=True,
        seed=9,
    )
    plain = EpochAwareDistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=9)
    plain.set_epoch(3)
    assert list(sampler) == list(plain) and seen_epochs == [3]
    position["value"] = (3, 2)
    assert list(sampler) == list(plain)[8:], "two batches of four were done before the checkpoint"
    assert sampler.padded_samples == 1 and sampler.dropped_samples == 0
    trimmed = EpochAwareDistributedSampler(data, num_replicas=2, rank=0, drop_last=True)
    assert trimmed.padded_samples == 0 and trimmed.dropped_samples == 1


def test_custom_sampler_sharded_across_ranks_and_published_in_one_process():
    data = list(range(10))
    shards = [
        list(EpochAwareSamplerWrapper(Reversed(data), num_replicas=2, rank=rank, shuffle=False)) for rank in (0, 1)
    ]
    assert sorted(shards[0] + shards[1]) == data and not set(shards[0]) & set(shards[1])
    assert shards[0] == [9, 7, 5, 3, 1], "the custom order is kept, interleaved across ranks"
    epochs = []
    published = EpochPublishingSampler(Reversed(data), position=lambda: (5, 1), batch_size=3, on_epoch=[epochs.append])
    assert list(published) == list(range(6, -1, -1)) and epochs == [5] and len(published) == 10


def test_unpadded_evaluation_counts_every_sample_once():
    data = list(range(11))
    shards = [UnpaddedDistributedSampler(data, num_replicas=2, rank=rank) for rank in (0, 1)]
    assert [list(shard) for shard in shards] == [list(range(0, 11, 2)), list(range(1, 11, 2))]
    assert [len(shard) for shard in shards] == [6, 5] and shards[0].padded_samples_avoided == 1
