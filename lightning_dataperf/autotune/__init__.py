"""A short measured search for DataLoader settings on the real dataset (no Trainer code)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_dataperf._lazy import attach

__all__ = [
    "AutotuneResult",
    "OnlineTuning",
    "SearchTuning",
    "TransferPath",
    "Trial",
    "autotune_loader",
    "default_cache_path",
]

if TYPE_CHECKING:
    from lightning_dataperf.autotune.cache import default_cache_path
    from lightning_dataperf.autotune.consumer import TransferPath
    from lightning_dataperf.autotune.options import OnlineTuning, SearchTuning
    from lightning_dataperf.autotune.result import AutotuneResult
    from lightning_dataperf.autotune.trial import Trial
    from lightning_dataperf.autotune.tune import autotune_loader

__getattr__, __dir__ = attach(
    __name__,
    {
        "autotune_loader": "tune",
        "AutotuneResult": "result",
        "OnlineTuning": "options",
        "SearchTuning": "options",
        "TransferPath": "consumer",
        "Trial": "trial",
        "default_cache_path": "cache",
    },
)
