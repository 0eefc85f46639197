"""Turn one epoch's timings (and, when available, telemetry) into a plain-words verdict (docs/diagnosis.md)."""

from __future__ import annotations

from lightning_dataperf.diagnosis.evidence import Evidence
from lightning_dataperf.diagnosis.findings import Diagnosis
from lightning_dataperf.diagnosis.rules import FALLBACK, RULES, Rule
from lightning_dataperf.diagnosis.rules.thresholds import SIGNIFICANT_SHARE

__all__ = ["MIN_STEPS", "RULES", "diagnose"]

#: Fewer steady steps than this in an epoch are too few to judge: a mean of fewer steps is one slow batch's.
MIN_STEPS = 5


def diagnose(evidence: Evidence, rules: tuple[Rule, ...] = RULES) -> Diagnosis:
    """Apply every rule of ``rules`` (the registry, ``rules/__init__.py``); the largest share is the bottleneck.
    Where none reaches ``SIGNIFICANT_SHARE``, the compute-bound fallback comes first.

    An epoch of fewer than ``MIN_STEPS`` steady steps gets no verdict, only a note saying so.

    Args:
        evidence: one epoch's measurements and the loader's settings.
        rules: the rules to apply, in order (findings of equal share keep it); every registered rule by default.

    Example::

        diagnosis = diagnose(Evidence(summary=callback.last_summary, loader=LoaderFacts.of(dataloader)))
        print(diagnosis.format())
    """
    summary = evidence.summary
    if summary.steps < MIN_STEPS:
        note = f"too few steps to judge ({summary.steps} measured, {MIN_STEPS} needed)"
        return Diagnosis(stage=summary.stage, epoch=summary.epoch, findings=[], note=note)
    findings = [finding for rule in rules if (finding := rule(evidence)) is not None]
    # a stable sort: findings of equal share stay in the registry's order
    findings.sort(key=lambda finding: finding.share, reverse=True)
    if not any(finding.share >= SIGNIFICANT_SHARE for finding in findings):
        compute = FALLBACK(evidence)
        if compute is not None:
            findings.insert(0, compute)
    return Diagnosis(stage=summary.stage, epoch=summary.epoch, findings=findings)
