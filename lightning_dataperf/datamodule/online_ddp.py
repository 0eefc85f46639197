"""The online loop under DDP: rank zero decides, every rank switches at the same batch, and each rank's wait is read."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import torch

from lightning_dataperf.autotune.online import OnlineResult, Setting

__all__ = ["SYNC_EVERY", "WATCH_EVERY", "Decision", "DistributedResult", "RankSync", "RankWaits", "sync_every"]

#: Training batches between two sync points while the search runs, at most: a decision waits that long, and the
#: collectives (a CUDA synchronization on NCCL) come that rarely.
SYNC_EVERY = 16
#: Sync points while the kept setting is watched for drift are this many times further apart (a look again is rare).
WATCH_EVERY = 8


def sync_every(max_batches: int) -> int:
    """Batches between sync points for trials of ``max_batches`` at most: an eighth of a trial (a held decision
    wastes little of one), from 4 (the collectives' cost spread) to :data:`SYNC_EVERY`."""
    return max(4, min(SYNC_EVERY, max_batches // 8))


#: A rank waits this many times the other ranks' median wait per batch (and 1 ms more) under a setting: a straggler.
STRAGGLER = 2.0


@dataclass
class RankWaits:
    """Each rank's seconds waiting for its batches under one setting, and the batches they are over."""

    setting: Setting
    nodes: tuple[int, ...]
    """Each global rank's node (``global_rank // local ranks``)."""
    wait_s: list[float]
    batches: list[int]

    def per_batch(self) -> list[float]:
        return [wait / count if count else 0.0 for wait, count in zip(self.wait_s, self.batches, strict=True)]

    def stragglers(self) -> list[int]:
        """Ranks whose wait per batch is :data:`STRAGGLER` times the other ranks' median, and 1 ms more."""
        waits = self.per_batch()
        return [rank for rank, wait in enumerate(waits) if wait > STRAGGLER * _others(waits, rank) + 1e-3]

    def describe(self) -> str:
        """The stragglers in words (``""``: none); of several nodes, one whose every rank straggles is named."""
        ranks = self.stragglers()
        if not ranks:
            return ""
        waits = self.per_batch()
        others = (
            statistics.median(wait for rank, wait in enumerate(waits) if rank not in ranks)
            if len(ranks) < len(waits)
            else 0.0
        )
        nodes = set(self.nodes)
        whole = (
            {node for node in nodes if all(rank in ranks for rank in self._ranks_of(node))} if len(nodes) > 1 else set()
        )
        named = [f"node {node}" for node in sorted(whole)]
        named += [f"rank {rank} (node {self.nodes[rank]})" for rank in ranks if self.nodes[rank] not in whole]
        slowest = max(waits[r] for r in ranks)
        return (
            f"under {self.setting.describe()}, {', '.join(named)} waited for data up to {slowest * 1e3:.1f} ms per"
            f" batch against the other ranks' {others * 1e3:.1f} ms: a straggler the other ranks wait for"
        )

    def _ranks_of(self, node: int) -> list[int]:
        return [rank for rank, on in enumerate(self.nodes) if on == node]


@dataclass
class DistributedResult(OnlineResult):
    """:class:`~lightning_dataperf.autotune.online.OnlineResult` of a DDP run: rank zero's loop, each rank's waits."""

    world_size: int = 1
    waits: list[RankWaits] = field(default_factory=list)

    def stragglers(self) -> list[str]:
        """Each setting under which a rank or node straggled, in words."""
        return [words for waits in self.waits if (words := waits.describe())]

    def summary(self) -> str:
        kept = self.kept.setting if self.kept is not None else None
        # the kept setting's stragglers first; else the first setting tried that had one
        named = sorted(self.waits, key=lambda waits: waits.setting != kept)
        words = [text for waits in named if (text := waits.describe())]
        others = f"; a rank straggled under {len(words) - 1} other settings tried" if len(words) > 1 else ""
        first = f"; {words[0]}" if words else ""
        return f"{super().summary()}; one decision for all {self.world_size} ranks{first}{others}"


@dataclass(frozen=True)
class Decision:
    """What rank zero sends at a sync point: the setting every rank switches to, and whether syncs go on."""

    setting: Setting | None
    active: bool
    every: int
    result: OnlineResult


class RankSync:
    """The sync points of a DDP run: at the same training batch on every rank, through the strategy's collectives.

    Every rank counts the batches it fetched; at each count of :attr:`next_at` (a batch every rank fetches: the
    ranks' shards have one length) rank zero's decision is broadcast and each rank's data wait gathered.

    Example::

        sync = RankSync(trainer.strategy, local_ranks=trainer.num_devices)
        if sync.due(has_batch=True):
            decision = sync.exchange(Decision(held, True, sync.every, loop.result), in_use=setting)
    """

    def __init__(self, strategy: Any, local_ranks: int, every: int = SYNC_EVERY) -> None:
        self.strategy = strategy
        self.rank, self.world_size = strategy.global_rank, strategy.world_size
        self.node = self.rank // max(1, local_ranks)
        self.batches = 0
        """Batches fetched on this rank in this fit (the same count on every rank at each fetch)."""
        self.every = self.next_at = every
        self.active = True
        self.wait_s, self.waited = 0.0, 0

    def fetched(self, wait_s: float) -> None:
        """A batch was fetched after ``wait_s`` seconds of waiting for it."""
        self.batches += 1
        self.wait_s, self.waited = self.wait_s + wait_s, self.waited + 1

    def due(self, has_batch: bool) -> bool:
        """A sync point: only before a batch every rank will fetch (not the epoch's end), so none waits alone."""
        return self.active and has_batch and self.batches >= self.next_at

    def exchange(self, decision: Decision | None, in_use: Setting) -> Decision:
        """Every rank: its wait since the last sync point gathered, rank zero's ``decision`` received."""
        device = self.strategy.root_device
        mine = torch.tensor([self.wait_s, float(self.waited), float(self.node)], dtype=torch.float64, device=device)
        gathered = self.strategy.all_gather(mine).reshape(self.world_size, 3).tolist()
        self.wait_s, self.waited = 0.0, 0
        if self.rank == 0:
            assert decision is not None
            _add_waits(decision.result, in_use, gathered)
        received = self.strategy.broadcast(decision, src=0)
        self.active = received.active
        self.next_at = self.batches + received.every
        return received

    def finish(self, result: OnlineResult) -> OnlineResult:
        """At the fit's end (every rank, none after an exception): rank zero's result on every rank."""
        return self.strategy.broadcast(result, src=0)


def _others(waits: list[float], rank: int) -> float:
    """The median wait per batch of the ranks other than ``rank`` (0 on one rank alone)."""
    rest = waits[:rank] + waits[rank + 1 :]
    return statistics.median(rest) if rest else 0.0


def _add_waits(result: OnlineResult, in_use: Setting, gathered: list[list[float]]) -> None:
    """Adds the ranks' waits since the last sync point to those of ``in_use`` (the setting in use all along)."""
    if not isinstance(result, DistributedResult):
        return
    waits = next((waits for waits in result.waits if waits.setting == in_use), None)
    if waits is None:
        nodes = tuple(int(row[2]) for row in gathered)
        waits = RankWaits(in_use, nodes, [0.0] * len(gathered), [0] * len(gathered))
        result.waits.append(waits)
    for rank, (wait_s, count, _) in enumerate(gathered):
        waits.wait_s[rank] += wait_s
        waits.batches[rank] += int(count)
