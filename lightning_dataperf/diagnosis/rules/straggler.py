"""The straggler rule: under DDP one rank waits far longer for data, and every rank waits for it."""

from __future__ import annotations

from lightning_dataperf.diagnosis.evidence import Evidence
from lightning_dataperf.diagnosis.findings import Finding

__all__ = ["MAX_SHARE", "straggler"]

#: The share is capped below 1 so that its ceiling speed-up (``1 / (1 - share)``) stays finite: the excess can
#: exceed the mean step where one rank's wait dwarfs the others'.
MAX_SHARE = 0.99


def straggler(evidence: Evidence) -> Finding | None:
    """Several ranks, one waiting at least ``STRAGGLER_RATIO`` times longer for data than the fastest.

    Example::

        finding = straggler(evidence)
        finding.headline      # "straggler: rank 1 waits 3.2x longer for data than the fastest rank (...)"
    """
    summary = evidence.summary
    if not evidence.straggling or summary.straggler_ratio is None:
        return None
    waits = summary.rank_data_wait
    slow, step = summary.slowest_rank, evidence.step_mean
    if not waits or not step:
        return None
    excess = max(waits) - min(waits)  # what every rank would save per step if the slowest waited no longer
    share = min(MAX_SHARE, excess / step)
    numbers = {f"rank{rank}_data_loading_ms": 1e3 * wait for rank, wait in enumerate(waits)}
    numbers.update(straggler_excess_ms=1e3 * excess, step_ms=1e3 * step)
    return Finding(
        kind="straggler",
        headline=(
            f"straggler: rank {slow} waits {summary.straggler_ratio:.1f}x longer for data than the fastest rank "
            f"({1e3 * excess:.1f} ms more per {1e3 * step:.1f} ms step)"
        ),
        share=share,
        evidence=numbers,
        advice=[
            f"every rank waits for rank {slow} at each gradient all-reduce: check its node's CPU load, storage "
            "and shard sizes (uneven samples, slow files); give it more loader workers",
        ],
    )
