"""Host-to-device copies on a side CUDA stream: the copier, look-ahead iterator, Lightning strategies, copy stats."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_dataperf._lazy import attach

__all__ = [
    "CopyStats",
    "CopyTiming",
    "SideStreamCopier",
    "SideStreamDDPStrategy",
    "SideStreamStrategy",
    "SideStreamTransferMixin",
]

if TYPE_CHECKING:
    from lightning_dataperf.transfer.copier import SideStreamCopier
    from lightning_dataperf.transfer.stats import CopyStats, CopyTiming
    from lightning_dataperf.transfer.strategies import (
        SideStreamDDPStrategy,
        SideStreamStrategy,
        SideStreamTransferMixin,
    )

__getattr__, __dir__ = attach(
    __name__,
    {
        "SideStreamCopier": "copier",
        "CopyStats": "stats",
        "CopyTiming": "stats",
        "SideStreamDDPStrategy": "strategies",
        "SideStreamStrategy": "strategies",
        "SideStreamTransferMixin": "strategies",
    },
)
