"""DataLoader settings and what happens around a loader: the policy, in-worker probe, sampling, seeding, sharing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_dataperf._lazy import attach

__all__ = [
    "LoaderFacts",
    "LoaderPlan",
    "LoaderProbe",
    "LoaderSettings",
    "LoaderStats",
    "ShareBy",
    "article_settings",
    "recommend_loader_settings",
]

if TYPE_CHECKING:
    from lightning_dataperf.loader.policy import article_settings, recommend_loader_settings
    from lightning_dataperf.loader.probe import LoaderProbe
    from lightning_dataperf.loader.settings import LoaderFacts, LoaderPlan, LoaderSettings
    from lightning_dataperf.loader.sharing import ShareBy
    from lightning_dataperf.loader.stats import LoaderStats

__getattr__, __dir__ = attach(
    __name__,
    {
        "LoaderFacts": "settings",
        "LoaderPlan": "settings",
        "LoaderSettings": "settings",
        "article_settings": "policy",
        "recommend_loader_settings": "policy",
        "LoaderProbe": "probe",
        "LoaderStats": "stats",
        "ShareBy": "sharing",
    },
)
