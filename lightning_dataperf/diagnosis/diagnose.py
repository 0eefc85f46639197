"""Turn one epoch's timings (and, when available, telemetry) into a plain-words verdict (docs/diagnosis.md)."""

from __future__ import annotations

from collections.abc import Callable

from lightning_dataperf import tags
from lightning_dataperf.diagnosis.evidence import Evidence
from lightning_dataperf.diagnosis.findings import Diagnosis, Finding
from lightning_dataperf.diagnosis.rules.input import SIGNIFICANT_SHARE, input_bound

__all__ = ["RULES", "diagnose"]

#: Fewer steady steps than this in an epoch are too few to judge.
MIN_STEPS = 5

Rule = Callable[[Evidence], "Finding | None"]


#: Share of the link's capacity above which PCIe counts as saturated.
PCIE_SATURATED = 0.8


def _transfer_bound(evidence: Evidence) -> Finding | None:
    """The copy costs the step: on the compute stream (stock), or the side stream's copy left exposed."""
    if not evidence.summary.on_device:
        return None  # no device copy to speak of: CPU runs have no host-to-device transfer
    step, copies = evidence.step_mean, evidence.summary.copies
    # Side stream: what the compute stream waited for, not the copy itself (mostly hidden behind compute).
    transfer = copies.exposed_s if copies is not None else evidence.timing(tags.TRANSFER)
    if transfer is None or not step:
        return None
    share = transfer / step
    if share < SIGNIFICANT_SHARE:
        return None
    numbers = {"transfer_ms": 1e3 * transfer, "step_ms": 1e3 * step, "transfer_share": share}
    if copies is not None:
        numbers["transfer_copy_ms"] = 1e3 * copies.copy_s
        numbers["transfer_hidden_fraction"] = copies.hidden_fraction
    rx = evidence.system.gpu_pcie_rx_mbps
    if rx is not None:
        numbers["gpu_pcie_rx_mbps"] = rx
    saturated = rx is not None and evidence.pcie_capacity_mbps and rx > PCIE_SATURATED * evidence.pcie_capacity_mbps
    advice = []
    if evidence.loader.pin_memory is False:
        advice.append(
            "the loader has pin_memory=False: unless your dataset returns pinned tensors, copies come from pageable "
            "memory and the driver stages them synchronously; set pin_memory=True"
        )
    if not evidence.side_stream_transfer:
        advice.append(
            "overlap the copy with compute: Trainer(strategy='side_stream') copies the next batch on a "
            "side CUDA stream while this one computes"
        )
    if saturated:
        numbers["pcie_capacity_mbps"] = float(evidence.pcie_capacity_mbps or 0.0)
        advice.append("PCIe is saturated: only fewer bytes help (uint8 instead of float32, crop before the copy)")
    advice.append("ship compact dtypes (uint8 images) and cast/normalise on the GPU: 4x fewer PCIe bytes")
    cause = "PCIe saturated" if saturated else "copies not overlapped with compute"
    return Finding(
        kind="transfer_bound",
        headline=f"transfer-bound ({cause}): the host-to-device copy costs {100 * share:.0f}% of the step",
        share=share,
        evidence=numbers,
        advice=advice,
    )


HOST_OVERHEAD_SHARE = 0.25


def _host_bound(evidence: Evidence) -> Finding | None:
    if evidence.summary.on_device:
        return _device_starved_by_host(evidence)
    return _loop_overhead(evidence)


def _device_starved_by_host(evidence: Evidence) -> Finding | None:
    """CUDA: the GPU idles between steps though the host is not waiting for data — launches and syncs bind."""
    compute, step = evidence.step_work, evidence.step_mean
    idle = evidence.timing(tags.DEVICE_IDLE)
    if compute is None or idle is None or not step or evidence.host_explains_idle():
        return None
    if (copies := evidence.summary.copies) is not None:
        idle = max(0.0, idle - copies.exposed_s)  # waiting for a look-ahead copy is the transfer rule's
    share = idle / step
    if share < SIGNIFICANT_SHARE:
        return None
    wait = evidence.timing(tags.DATA_LOADING) or 0.0
    return Finding(
        kind="host_bound",
        headline=f"host-bound: the GPU idles {100 * share:.0f}% of the step though the host is not waiting for data",
        share=share,
        evidence={"device_idle_ms": 1e3 * idle, "device_span_ms": 1e3 * compute, "data_loading_ms": 1e3 * wait},
        advice=[
            "Python or kernel-launch overhead dominates: use a larger batch, torch.compile or CUDA graphs, "
            "and avoid per-step host syncs (.item(), .cpu(), printing tensors)",
        ],
    )


def _host_gap(evidence: Evidence) -> Finding | None:
    """CUDA, from the host-gap probe: inside the step, the GPU waits for kernels the host launches late."""
    gap, step = evidence.summary.host_gap, evidence.step_mean
    if gap is None or not step:
        return None
    share = min(gap.host_gap_s, step) / step
    if share < SIGNIFICANT_SHARE:
        return None
    numbers = {
        "host_gap_ms": 1e3 * gap.host_gap_s,
        "gpu_busy_ms": 1e3 * gap.gpu_busy_s,
        "step_span_ms": 1e3 * gap.span_s,
        "profiled_steps": float(gap.steps),
    }
    system, workers, cpus = evidence.system, evidence.loader.num_workers, evidence.usable_cpus
    runnable, queued = system.runnable_tasks, gap.main_runqueue_s
    if gap.main_cpu_fraction is not None:
        numbers["main_thread_cpu_fraction"] = gap.main_cpu_fraction
    if queued is not None:
        numbers["main_thread_runqueue_ms"] = 1e3 * queued
    # Starved, measured: the training thread waited on a run queue for a large part of the gap (schedstat),
    # or more tasks were runnable than CPUs, while loader workers run next to it.
    starved = gap.training_thread_starved
    crowded = workers and (starved or (runnable is not None and cpus is not None and runnable > cpus))
    if crowded:
        numbers.update(num_workers=float(workers))
        if runnable is not None and cpus is not None:
            numbers.update(runnable_tasks=runnable, usable_cpus=float(cpus))
        queue_words = f"; it waited {1e3 * queued:.1f} ms per step for a CPU" if queued is not None else ""
        load = f" (runnable tasks {runnable:.0f} on {cpus} usable CPUs)" if runnable is not None else ""
        headline = (
            f"host-bound: the main thread is starved for CPU by {workers} busy workers{load}{queue_words}: the "
            f"GPU waits for it {100 * share:.0f}% of each step"
        )
        fewer = max(1, min(workers - 1, cpus - 2)) if cpus is not None else max(1, workers - 1)
        advice = [
            f"leave cores for the training process: num_workers <= {fewer}, or move decode/augment off "
            "the CPU (lightning_dataperf.decode for JPEG); the step would take about "
            f"{1e3 * (step - gap.host_gap_s):.1f} ms instead of {1e3 * step:.1f} ms without the gap",
        ]
    else:
        headline = f"host-bound: inside each step the GPU waits {100 * share:.0f}% of the time for kernel launches"
        without = step - gap.host_gap_s
        advice = [
            "Python or kernel-launch overhead inside the step: torch.compile or CUDA graphs, a larger batch, and no "
            f"per-step host syncs (.item(), .cpu()); without the gap a step would take {1e3 * without:.1f} ms "
            f"instead of {1e3 * step:.1f} ms",
        ]
    return Finding(kind="host_bound", headline=headline, share=share, evidence=numbers, advice=advice)


def _loop_overhead(evidence: Evidence) -> Finding | None:
    """CPU: time outside data wait, transfer and the step itself (hooks, callbacks, logging) dominates."""
    compute, step = evidence.step_work, evidence.step_mean
    if compute is None or not step:
        return None
    wait = evidence.timing(tags.DATA_LOADING) or 0.0
    transfer = evidence.timing(tags.TRANSFER) or 0.0
    share = max(0.0, step - compute - wait - transfer) / step
    if share < HOST_OVERHEAD_SHARE:
        return None
    return Finding(
        kind="host_bound",
        headline=f"host-bound: {100 * share:.0f}% of each step is per-step framework overhead, not data or compute",
        share=share,
        evidence={"step_ms": 1e3 * step, "compute_ms": 1e3 * compute, "data_loading_ms": 1e3 * wait},
        advice=[
            "the batches are too small for the per-step cost of the loop (hooks, callbacks, logging, optimizer "
            "bookkeeping): raise the batch size, log less often (log_every_n_steps) and drop per-step callbacks",
        ],
    )


def _epoch_start(evidence: Evidence) -> Finding | None:
    summary = evidence.summary
    step = evidence.step_mean
    if summary.epoch_start is None or not step or summary.steps == 0:
        return None
    steps = summary.steps / max(1, summary.world_size)  # steps is summed over the ranks
    epoch_time = summary.epoch_start + step * steps
    share = summary.epoch_start / epoch_time
    if share < 0.2:
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


def _straggler(evidence: Evidence) -> Finding | None:
    summary = evidence.summary
    if not evidence.straggling or summary.straggler_ratio is None:
        return None
    waits = summary.rank_data_wait
    slow, step = summary.slowest_rank, evidence.step_mean
    if not waits or not step:
        return None
    excess = max(waits) - min(waits)  # what every rank would save per step if the slowest waited no longer
    share = min(0.99, excess / step)
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


def _memory_pressure(evidence: Evidence) -> Finding | None:
    system = evidence.system
    numbers = {}
    if (swap := system.swap_used_mb) is not None and swap > 256:
        numbers["swap_used_mb"] = swap
    if (faults := system.major_faults_per_sec) is not None and faults > 100:
        numbers["major_faults_per_sec"] = faults
    shm_free = system.shm_free_mb
    if shm_free is not None and shm_free < 256:
        numbers["shm_free_mb"] = shm_free
    pinned, available = system.pinned_host_mb, system.ram_available_mb
    if pinned is not None and available is not None and pinned > available:
        numbers["pinned_host_mb"], numbers["ram_available_mb"] = pinned, available
    if not numbers:
        return None
    return Finding(
        kind="memory_pressure",
        headline="memory pressure: " + ", ".join(f"{key}={value:.0f}" for key, value in numbers.items()),
        share=0.0,
        evidence=numbers,
        advice=[
            "lower prefetch_factor or num_workers (each holds batches in /dev/shm), keep pinned memory to what "
            "the copy needs (torch.cuda.host_memory_stats() shows the CachingHostAllocator's cached blocks), "
            "enlarge /dev/shm (docker --shm-size) and avoid swapping; page-fault storms come from datasets "
            "memory-mapped from slow storage or copy-on-write of Python objects in forked workers",
        ],
    )


def _compute_bound(evidence: Evidence) -> Finding | None:
    compute, step = evidence.step_work, evidence.step_mean
    if compute is None:
        return None
    share = compute / step if step else 1.0
    if evidence.summary.on_device:
        advice = ["profile the model (torch.profiler), use mixed precision, torch.compile, larger batches"]
    else:
        # bf16 and torch.compile measured slower or no faster for small models on the CPU (issue 37)
        advice = ["profile the model (torch.profiler); on the CPU try larger batches and the intra-op threads"]
    if contention := evidence.contention():
        advice.insert(0, contention)
    if (evidence.system.gpu_slowdown or 0.0) > 0.1:
        advice.append(
            "the GPU clocks are slowed by heat or a hardware slowdown (not just the power cap): check cooling"
        )
    return Finding(
        kind="compute_bound",
        headline="compute-bound: input is not the limit; speed up the model itself",
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


def _stalls(evidence: Evidence) -> Finding | None:
    """One or two long waits in an otherwise steady epoch: reported as what they are, apart from the steady share."""
    summary, step = evidence.summary, evidence.step_mean
    if not summary.stalls or not step:
        return None
    stalled = sum(stall.wait_s for stall in summary.stalls)
    steps = summary.steps / max(1, summary.world_size)  # this rank's steps; the stalls are this rank's
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


RULES: tuple[Rule, ...] = (
    input_bound,
    _transfer_bound,
    _host_bound,
    _host_gap,
    _straggler,
    _stalls,
    _epoch_start,
    _memory_pressure,
)


def diagnose(evidence: Evidence, rules: tuple[Rule, ...] = RULES) -> Diagnosis:
    """Apply every rule; the largest share is the bottleneck. Falls back to compute-bound.

    An epoch of fewer than ``MIN_STEPS`` steady steps gets no verdict, only a note saying so.

    Example::

        diagnosis = diagnose(Evidence(summary=callback.last_summary, loader=LoaderFacts.of(dataloader)))
        print(diagnosis.format())
    """
    summary = evidence.summary
    if summary.steps < MIN_STEPS:
        note = f"too few steps to judge ({summary.steps} measured, {MIN_STEPS} needed)"
        return Diagnosis(stage=summary.stage, epoch=summary.epoch, findings=[], note=note)
    findings = [finding for rule in rules if (finding := rule(evidence)) is not None]
    findings.sort(key=lambda finding: finding.share, reverse=True)
    if not any(finding.share >= SIGNIFICANT_SHARE for finding in findings):
        compute = _compute_bound(evidence)
        if compute is not None:
            findings.insert(0, compute)
    return Diagnosis(stage=summary.stage, epoch=summary.epoch, findings=findings)
