"""``TunedDataModule(autotune="online")``'s loop, free of Lightning: its records, its search and its rules."""

from __future__ import annotations

from lightning_dataperf.autotune.online.loop import OnlineLoop, planned_batches, refusal
from lightning_dataperf.autotune.online.records import Measured, OnlineResult, Setting, SettingSpace
from lightning_dataperf.autotune.online.search import NeighbourSearch, Phase
from lightning_dataperf.autotune.online.segment import Segment, burst_of

__all__ = [
    "Measured",
    "NeighbourSearch",
    "OnlineLoop",
    "OnlineResult",
    "Phase",
    "Segment",
    "Setting",
    "SettingSpace",
    "burst_of",
    "planned_batches",
    "refusal",
]
