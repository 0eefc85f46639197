"""The compute-bound fallback: no input, copy or host stage binds, so the model itself is the limit."""

from __future__ import annotations

from lightning_dataperf.diagnosis.evidence import Evidence
from lightning_dataperf.diagnosis.findings import Finding

__all__ = ["CONTENTION_SHARE", "GPU_SLOWDOWN_SHARE", "compute_bound"]

#: Where this process's threads waited for a core for at least this share of the step, the waiting is most of
#: the step: the headline says contention, not compute (under another process's load, 752 of a 756-ms step).
CONTENTION_SHARE = 0.5

#: Share of the epoch's NVML readings with a thermal or hardware slowdown above which it is named: a reading
#: now and then is a transient; more than one in ten slows the step throughout.
GPU_SLOWDOWN_SHARE = 0.1


def compute_bound(evidence: Evidence) -> Finding | None:
    """The step's own work against the step; ``diagnose`` puts it first where no other rule found a bottleneck.

    Example::

        finding = compute_bound(evidence)
        finding.headline      # "compute-bound: input is not the limit; speed up the model itself"
    """
    compute, step = evidence.step_work, evidence.step_mean
    if compute is None:
        return None
    share = compute / step if step else 1.0
    if evidence.summary.on_device:
        # a compiled step is not sent to torch.compile again
        compile_it = "" if evidence.step_compiled else " torch.compile,"
        advice = [f"profile the model (torch.profiler), use mixed precision,{compile_it} larger batches"]
    else:
        # bf16 and torch.compile measured slower or no faster for small models on the CPU (issue 37)
        advice = ["profile the model (torch.profiler); on the CPU try larger batches and the intra-op threads"]
    if contention := evidence.contention():
        advice.insert(0, contention)
    if (evidence.system.gpu_slowdown or 0.0) > GPU_SLOWDOWN_SHARE:
        advice.append(
            "the GPU clocks are slowed by heat or a hardware slowdown (not just the power cap): check cooling"
        )
    headline = "compute-bound: input is not the limit; speed up the model itself"
    queued = evidence.queued_per_step
    if queued is not None and step and queued >= CONTENTION_SHARE * step:
        # the step's time is mostly a wait for a core: a faster model would not shorten it
        headline = (
            f"contention: this process's threads waited for a core {1e3 * queued:.0f} ms of each"
            f" {1e3 * step:.0f}-ms step; input is not the limit, and most of the step is waiting, not the model"
        )
    return Finding(
        kind="compute_bound",
        headline=headline,
        # below 1 so that the ceiling speed-up stays finite (the compute finding's is not printed)
        share=min(share, 0.999),
        evidence=_compute_evidence(evidence, compute, share),
        advice=advice,
    )


def _compute_evidence(evidence: Evidence, compute: float, share: float) -> dict[str, float]:
    work = "device_span_ms" if evidence.summary.on_device else "compute_ms"
    numbers = {work: 1e3 * compute, "compute_share": share}
    if (gap := evidence.summary.host_gap) is not None:
        numbers.update(gpu_busy_ms=1e3 * gap.gpu_busy_s, host_gap_ms=1e3 * gap.host_gap_s)
    for key in ("gpu_util_percent", "gpu_slowdown", "gpu_power_capped", "gpu_sm_clock_mhz"):
        if (value := getattr(evidence.system, key)) is not None:
            numbers[key] = value
    return numbers
