"""The verdict's records: a :class:`Finding` per diagnosed cause, a :class:`Diagnosis` per epoch."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Diagnosis", "Finding"]


@dataclass(frozen=True)
class Finding:
    """One diagnosed cause, with the numbers behind it and what to do."""

    kind: str
    headline: str
    share: float
    evidence: dict[str, float]
    advice: list[str]

    @property
    def ceiling_speedup(self) -> float:
        """Upper bound on the speed-up if this stage cost nothing: 1 / (1 - share)."""
        return math.inf if self.share >= 1 else 1.0 / (1.0 - self.share)


@dataclass(frozen=True)
class Diagnosis:
    """The verdict for one epoch: the binding stage first, then secondary findings.

    ``findings`` is empty when too few steps were measured to judge (:attr:`bottleneck` is then
    ``"unknown"``).

    Example::

        diagnosis = Diagnosis.from_dict(record["diagnosis"])
        print(diagnosis.bottleneck)       # "input_bound_workers"
        print(diagnosis.format())
    """

    stage: str
    epoch: int
    findings: list[Finding]
    note: str | None = None  # why there is no verdict, or what was not measured

    @property
    def bottleneck(self) -> str:
        return self.findings[0].kind if self.findings else "unknown"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for finding, raw in zip(self.findings, data["findings"], strict=True):
            raw["ceiling_speedup"] = finding.ceiling_speedup
        data["bottleneck"] = self.bottleneck
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Diagnosis:
        """The inverse of :meth:`to_dict` (derived keys are ignored)."""
        findings = [
            Finding(
                kind=raw["kind"],
                headline=raw["headline"],
                share=float(raw["share"]),
                evidence=dict(raw.get("evidence", {})),
                advice=list(raw.get("advice", [])),
            )
            for raw in data.get("findings", [])
        ]
        return cls(stage=data["stage"], epoch=int(data["epoch"]), findings=findings, note=data.get("note"))

    def format(self) -> str:
        if not self.findings:
            return (
                f"DataPerf verdict ({self.stage} epoch {self.epoch}): {self.note or 'not enough steps measured yet'}."
            )
        lines = [f"DataPerf verdict ({self.stage} epoch {self.epoch}): {self.findings[0].headline}"]
        for index, finding in enumerate(self.findings):
            if index:
                lines.append(f"  also: {finding.headline}")
            numbers = ", ".join(f"{key}={_fmt(value)}" for key, value in finding.evidence.items())
            lines.append(f"    evidence: {numbers}")
            if finding.kind != "compute_bound":
                lines.append(f"    ceiling speed-up if removed: {finding.ceiling_speedup:.2f}x")
            lines.extend(f"    -> {advice}" for advice in finding.advice)
        return "\n".join(lines)


def _fmt(value: float) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
