"""The epoch start-up rule: worker spawn and the first batches take a large share of a short epoch."""

from __future__ import annotations

from lightning_dataperf.diagnosis.evidence import Evidence
from lightning_dataperf.diagnosis.findings import Finding

__all__ = ["EPOCH_START_SHARE", "epoch_start"]

#: Start-up is named from this share of the epoch, twice SIGNIFICANT_SHARE: it is paid once per epoch, not per
#: step, and a longer epoch amortises it, so it is worth a finding only where it dominates a short epoch.
EPOCH_START_SHARE = 0.2


def epoch_start(evidence: Evidence) -> Finding | None:
    """The time to the first batch against the epoch's steady steps, with what keeps workers alive.

    Example::

        finding = epoch_start(evidence)
        finding.headline      # "epoch start-up takes 20% of the epoch"
    """
    summary = evidence.summary
    step = evidence.step_mean
    if summary.epoch_start is None or not step or summary.steps == 0:
        return None
    steps = summary.steps / max(1, summary.world_size)  # steps is summed over the ranks
    epoch_time = summary.epoch_start + step * steps
    share = summary.epoch_start / epoch_time
    if share < EPOCH_START_SHARE:
        return None
    advice = ["epoch start-up (worker spawn and first batches) dominates this short epoch"]
    several = evidence.planned_epochs is None or evidence.planned_epochs > 1
    longer = "make epochs longer (fewer, larger epochs) so start-up is amortised"
    if evidence.loader.persistent_workers is False and evidence.loader.num_workers and several:
        advice.append("set persistent_workers=True to keep workers alive between epochs")
        longer = f"or {longer}"
    elif evidence.loader.persistent_workers and evidence.loader.num_workers:
        longer = f"the workers persist already (their start-up is paid at the first epoch only): {longer}"
    advice.append(longer)
    return Finding(
        kind="epoch_start",
        headline=f"epoch start-up takes {100 * share:.0f}% of the epoch",
        share=share,
        evidence={"epoch_start_ms": 1e3 * summary.epoch_start, "steady_epoch_ms": 1e3 * step * steps},
        advice=advice,
    )
