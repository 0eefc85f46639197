"""RankSync's sync points with a stand-in strategy: when they come, what rank zero sends, whose waits are whose."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from lightning_dataperf.autotune.online import Setting
from lightning_dataperf.datamodule.online_ddp import Decision, DistributedResult, RankSync, sync_every

IN_USE, NEXT = Setting(2, 2, False, 1), Setting(4, 2, False, 1)


def strategy(rank, waits, sent=None):
    """Four ranks on two nodes; ``waits``: each rank's (seconds, batches) as the gather returns them."""

    def all_gather(tensor):
        rows = [[seconds, batches, node] for (seconds, batches), node in zip(waits, (0, 0, 1, 1), strict=True)]
        rows[rank] = tensor.tolist()
        return torch.tensor(rows, dtype=torch.float64)

    return SimpleNamespace(
        global_rank=rank,
        world_size=4,
        root_device=torch.device("cpu"),
        all_gather=all_gather,
        broadcast=lambda obj, src=0: obj if rank == src else sent,
    )


def test_sync_points_come_every_k_fetched_batches_and_only_before_a_batch_every_rank_fetches():
    sync = RankSync(strategy(0, [(0.0, 0)] * 4), local_ranks=2, every=4)
    due = []
    for batch in range(10):
        due.append(sync.due(has_batch=batch != 4))
        if due[-1]:
            sync.exchange(Decision(None, True, 4, DistributedResult(world_size=4)), IN_USE)
        sync.fetched(0.0)
    assert due == [False] * 4 + [False, True] + [False] * 3 + [True], (
        "the point at an epoch's end moves to the next batch"
    )
    assert sync_every(200) == 16 and sync_every(8) == 4 and sync_every(64) == 8


def test_rank_zero_sends_its_decision_and_its_result_holds_every_ranks_wait_under_the_setting_in_use():
    waits = [(0.0, 0), (0.1, 4), (2.0, 4), (2.2, 4)]
    sync = RankSync(strategy(0, waits), local_ranks=2, every=4)
    for _ in range(4):
        sync.fetched(0.025)
    result = DistributedResult(world_size=4)
    received = sync.exchange(Decision(NEXT, True, 4, result), IN_USE)
    assert received.setting == NEXT and sync.next_at == 8 and sync.active
    (recorded,) = result.waits
    assert recorded.setting == IN_USE and recorded.batches == [4, 4, 4, 4] and recorded.nodes == (0, 0, 1, 1)
    assert recorded.wait_s == [0.1, 0.1, 2.0, 2.2]
    assert "node 1 waited for data" in result.summary() and "one decision for all 4 ranks" in result.summary()
    assert sync.wait_s == 0.0 and sync.waited == 0, "each segment's wait counted once"


def test_another_rank_takes_rank_zeros_decision_and_stops_syncing_when_told():
    sent = Decision(NEXT, False, 4, DistributedResult(world_size=4))
    sync = RankSync(strategy(3, [(0.0, 0)] * 4, sent=sent), local_ranks=2, every=4)
    assert sync.node == 1
    for _ in range(4):
        sync.fetched(0.0)
    assert sync.exchange(None, IN_USE) is sent
    assert not sync.due(has_batch=True), "no sync point once rank zero's search has ended"
