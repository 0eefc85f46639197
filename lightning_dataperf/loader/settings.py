"""DataLoader settings: the ones recommended (:class:`LoaderSettings`), the ones a loader has (:class:`LoaderFacts`),
and what :class:`~lightning_dataperf.TunedDataModule` did to one loader, and why (:class:`LoaderPlan`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["POLICY_FIELDS", "LoaderFacts", "LoaderPlan", "LoaderSettings", "first_loader", "is_gpu_decode_loader"]

#: The DataLoader arguments the policy and autotune choose.
POLICY_FIELDS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")


@dataclass(frozen=True)
class LoaderSettings:
    """Recommended DataLoader settings; ``reasons`` says why, per field.

    Example::

        settings = recommend_loader_settings()
        loader = DataLoader(dataset, batch_size=32, **settings.as_kwargs())
        print(settings.explain())
    """

    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None
    reasons: Mapping[str, str] = field(default_factory=dict)

    def as_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``DataLoader`` (``prefetch_factor`` only with workers)."""
        kwargs: dict[str, Any] = {
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
            "persistent_workers": self.persistent_workers,
        }
        # DataLoader refuses a prefetch_factor without workers.
        if self.num_workers > 0:
            kwargs["prefetch_factor"] = self.prefetch_factor
        return kwargs

    def explain(self) -> str:
        lines = ["DataLoader settings:"]
        for name in POLICY_FIELDS:
            lines.append(f"  {name}={getattr(self, name)!r:<6} {self.reasons.get(name, '')}")
        return "\n".join(lines)


@dataclass(frozen=True)
class LoaderFacts:
    """The DataLoader settings that the advice refers to.

    Example::

        facts = LoaderFacts.of(trainer.train_dataloader)
        facts.num_workers, facts.pin_memory          # (4, True)
    """

    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    batch_size: int | None = None

    @classmethod
    def of(cls, loader: Any) -> LoaderFacts:
        """Read the settings of a ``DataLoader`` (anything else gives unknowns).

        A wrapper that names its ``DataLoader`` as ``.dataloader`` (Lightning's) or ``.loader``
        (:class:`~lightning_dataperf.decode.GpuDecodeLoader`) is read through.
        """
        loader = getattr(loader, "dataloader", loader)
        inner = getattr(loader, "loader", None)
        if not hasattr(loader, "num_workers") and hasattr(inner, "num_workers"):
            loader = inner
        return cls(
            num_workers=getattr(loader, "num_workers", None),
            pin_memory=getattr(loader, "pin_memory", None),
            persistent_workers=getattr(loader, "persistent_workers", None),
            prefetch_factor=getattr(loader, "prefetch_factor", None),
            batch_size=getattr(loader, "batch_size", None),
        )


def is_gpu_decode_loader(loader: Any) -> bool:
    """A :class:`~lightning_dataperf.decode.GpuDecodeLoader` (checked without importing the decode modules)."""
    # By name: loader/ sits below decode/ in the layer order (docs/architecture.md).
    return type(loader).__name__ == "GpuDecodeLoader" and type(loader).__module__.startswith("lightning_dataperf.")


def first_loader(loaders: Any) -> Any:
    """The first loader of what ``trainer.train_dataloader`` holds (a ``CombinedLoader`` or a loader)."""
    # A CombinedLoader lists its loaders in ``flattened``.
    flattened = getattr(loaders, "flattened", None)
    if flattened:
        return flattened[0]
    return loaders


@dataclass
class LoaderPlan:
    """What TunedDataModule did to one DataLoader, and why."""

    stage: str
    explicit: dict[str, Any]
    chosen: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    sampler: str = "unchanged"
    padded_samples: int = 0
    dropped_samples: int = 0
    padded_samples_avoided: int = 0
    notes: list[str] = field(default_factory=list)

    def format(self) -> str:
        lines = [f"TunedDataModule [{self.stage}]"]
        for name in POLICY_FIELDS:
            if name in self.chosen:
                lines.append(f"  {name}={self.chosen[name]!r}  <- {self.reasons.get(name, '')}")
            elif name in self.explicit:
                lines.append(f"  {name}={self.explicit[name]!r}  <- yours (kept)")
        lines.append(f"  sampler: {self.sampler}")
        if self.padded_samples:
            lines.append(f"  {self.padded_samples} samples are repeated so every rank gets as many (drop_last=False)")
        if self.dropped_samples:
            lines.append(f"  {self.dropped_samples} samples are left out so every rank gets as many (drop_last=True)")
        if self.padded_samples_avoided:
            lines.append(f"  unpadded evaluation: {self.padded_samples_avoided} duplicates avoided")
        lines.extend(f"  {note}" for note in self.notes)
        return "\n".join(lines)
