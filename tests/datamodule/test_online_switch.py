"""What a switch of the online loop applies beyond workers and prefetch: the split-decode share and the workers kept
across epochs."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from helpers import IndexedDataset
from torch.utils.data import DataLoader

from lightning_dataperf.autotune.online import Setting, SettingSpace
from lightning_dataperf.datamodule.online import OnlineTuner, make_online
from lightning_dataperf.loader.sampler import EpochAwareDistributedSampler


def _trainer():
    progress = SimpleNamespace(total=SimpleNamespace(ready=0))
    loop = SimpleNamespace(epoch_loop=SimpleNamespace(val_loop=SimpleNamespace(batch_progress=progress)))
    return SimpleNamespace(current_epoch=0, fit_loop=loop, max_epochs=2, num_training_batches=6, max_steps=-1)


def test_a_switch_sets_the_gpu_share_and_keeps_the_new_workers_across_epochs():
    dataset = IndexedDataset(24)
    sampler = EpochAwareDistributedSampler(dataset, batch_size=4, num_replicas=1, rank=0, shuffle=False)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler)
    threads = torch.get_num_threads()
    # at 0 workers the preference for persistent workers waits for a count of workers
    start = Setting(0, None, False, threads, gpu_share=1.0, persistent_workers=True)
    space = SettingSpace(max_workers=2, cpus=2, tune_threads=False, tune_pinning=False, tune_share=True)
    tuner = OnlineTuner(_trainer(), start, space, position=lambda: (0, 0))
    # the sampler starts where the tuner says: after a switch, at the next unconsumed batch
    sampler.position = tuner.position
    shares: list[float] = []
    tuner.share_target = shares.append
    make_online(loader, tuner)
    iterator = iter(loader)
    first = next(iterator)
    assert not loader.persistent_workers and shares == []
    iterator._switch(Setting(1, 2, False, threads, gpu_share=0.0, persistent_workers=True))
    rest = list(iterator)
    assert shares == [0.0], "the decode loader's share set before the new workers start"
    assert loader.num_workers == 1 and loader.persistent_workers
    batches = [first, *rest]
    assert torch.cat([batch[:, 0] for batch in batches]).tolist() == list(range(24)), "no batch lost or repeated"
    iterator.close()


def test_a_share_is_only_searched_for_a_split_decode_loader():
    space = SettingSpace(max_workers=2, cpus=2, tune_threads=False, tune_pinning=False, tune_share=True)
    split = list(space.neighbours(Setting(1, 2, False, 1, gpu_share=1.0)))
    assert {setting.gpu_share for setting in split} >= {0.0, 1.0}
    assert all(setting.gpu_share is None for setting in space.neighbours(Setting(1, 2, False, 1)))


def test_a_split_decode_loader_tries_where_to_decode_before_its_worker_count():
    """The GPU share's ends come first among the neighbours: on the H200 they moved a compiled ResNet-50 from 78% to
    99% of its ceiling, more than any worker move; a loop whose cost cap ran out on worker counts never tried them."""
    space = SettingSpace(max_workers=15, cpus=16, tune_threads=False, tune_pinning=True, tune_share=True)
    order = list(space.neighbours(Setting(15, 2, True, 1, gpu_share=1.0)))
    assert [setting.gpu_share for setting in order[:2]] == [0.0, 0.5]
    assert all(setting.num_workers == 15 for setting in order[:2])


def test_a_switch_at_the_epochs_end_does_not_empty_the_epochs_after_it():
    """The loop can switch in the ``next()`` that finds the epoch over (Lightning fetches one ahead; a decode thread
    reads ahead): the new iterator, placed after the epoch's last batch, was empty, and its position outlived it, so
    every later epoch started there too, empty: a fit spinning through epochs without a step. Seen on the CPU run
    of benchmarks/decode_placement.py."""
    dataset = IndexedDataset(24)
    sampler = EpochAwareDistributedSampler(dataset, batch_size=4, num_replicas=1, rank=0, shuffle=False)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler)
    threads = torch.get_num_threads()
    start = Setting(0, None, False, threads)
    space = SettingSpace(max_workers=2, cpus=2, tune_threads=False, tune_pinning=False)
    trainer = _trainer()
    consumed = [0]
    tuner = OnlineTuner(trainer, start, space, position=lambda: (trainer.current_epoch, consumed[0]))
    sampler.position = tuner.position
    make_online(loader, tuner)
    iterator = iter(loader)
    first = [next(iterator) for _ in range(6)]
    iterator._switch(Setting(1, 2, False, threads))  # the epoch's six batches taken: the switch finds none left
    assert list(iterator) == []
    iterator.close()
    trainer.current_epoch = 1  # Lightning's counters: the next epoch, from its start
    second = list(iter(loader))
    assert len(first) == 6 and len(second) == 6, "the next epoch has its batches"
    assert torch.cat([batch[:, 0] for batch in second]).tolist() == list(range(24))


def test_a_switch_of_the_threads_alone_keeps_the_workers_and_their_queue():
    """The intra-op threads are the training process's: a trial of them restarted the workers (a stall and a burst
    of start-up on every thread trial of a run with workers)."""
    dataset = IndexedDataset(24)
    sampler = EpochAwareDistributedSampler(dataset, batch_size=4, num_replicas=1, rank=0, shuffle=False)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=1)
    threads = torch.get_num_threads()
    start = Setting(1, 2, False, threads)
    space = SettingSpace(max_workers=2, cpus=2, tune_threads=True, tune_pinning=False)
    tuner = OnlineTuner(_trainer(), start, space, position=lambda: (0, 0))
    sampler.position = tuner.position
    make_online(loader, tuner)
    iterator = iter(loader)
    try:
        first = next(iterator)
        inner = iterator.inner
        other = 1 if threads != 1 else 2
        iterator._switch(Setting(1, 2, False, other))
        assert iterator.inner is inner, "the same workers go on"
        assert torch.get_num_threads() == other and tuner.current.threads == other
        rest = list(iterator)
        assert torch.cat([batch[:, 0] for batch in [first, *rest]]).tolist() == list(range(24))
    finally:
        iterator.close()
        tuner.close()
    assert torch.get_num_threads() == threads, "the user's threads back at teardown"
