"""The stall rule: one or two long waits in an otherwise steady epoch, apart from the steady share."""

from __future__ import annotations

from lightning_dataperf import tags
from lightning_dataperf.diagnosis.evidence import Evidence
from lightning_dataperf.diagnosis.findings import Finding

__all__ = ["stalls"]


def stalls(evidence: Evidence) -> Finding | None:
    """One or two long waits in an otherwise steady epoch: reported as what they are, apart from the steady share.

    Example::

        finding = stalls(evidence)
        finding.headline      # "stall: batch 40 waited 2.10 s for the loader, 3.5 s into the epoch; ..."
    """
    summary, step = evidence.summary, evidence.step_mean
    if not summary.stalls or not step:
        return None
    stalled = sum(stall.wait_s for stall in summary.stalls)
    steps = summary.steps / max(1, summary.world_size)  # this rank's steps; the stalls are this rank's
    # the stalls' share of this rank's epoch: their time against it plus the steady steps around them
    share = stalled / (stalled + step * max(1.0, steps - len(summary.stalls)))
    first = summary.stalls[0]
    wait_p50 = evidence.timing(tags.DATA_LOADING, "p50")
    steady = f"; the steady data loading is {1e3 * wait_p50:.1f} ms per step (p50)" if wait_p50 is not None else ""
    more = f" (and {len(summary.stalls) - 1} more)" if len(summary.stalls) > 1 else ""
    return Finding(
        kind="stall",
        headline=(
            f"stall: batch {first.step} waited {first.wait_s:.2f} s for the loader, {first.at_s:.1f} s into the "
            f"epoch{more}{steady}"
        ),
        share=share,
        evidence={"stall_s": stalled, "stalls": float(len(summary.stalls)), "step_ms": 1e3 * step},
        advice=[
            "a one-off, not the steady state: look at what happened then (storage or network hiccup, a worker "
            "restart, another process); the watchdog reports waits longer than hang_timeout as they happen"
        ],
    )
