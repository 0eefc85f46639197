"""Turn measured timings (and, when available, system telemetry) into a plain-words verdict.

Each rule looks at an :class:`Evidence` bundle and may return a :class:`Finding`: what binds, the
numbers that show it, the ceiling speed-up if that stage cost nothing (``1 / (1 - share)``), and
what to change. On CUDA, whether input costs anything is decided from the device's idle time between
steps, not from the host's wait: when the host runs ahead of the GPU, waiting for data is free.

Example::

    diagnosis = diagnose(Evidence(summary=callback.last_summary, loader=LoaderFacts.of(dataloader)))
    print(diagnosis.format())
"""

from __future__ import annotations

from collections.abc import Callable

from lightning_dataperf import tags
from lightning_dataperf.evidence import Evidence
from lightning_dataperf.findings import Diagnosis, Finding

__all__ = ["RULES", "diagnose"]

#: A stage that costs at least this share of the step is called a bottleneck.
SIGNIFICANT_SHARE = 0.10


Rule = Callable[[Evidence], "Finding | None"]


def _input_bound(evidence: Evidence) -> Finding | None:
    summary = evidence.summary
    share = summary.input_stall_fraction
    if share is None or share < SIGNIFICANT_SHARE:
        return None
    if summary.on_device and not evidence.host_explains_idle():
        return None  # the GPU idles but the host was not waiting for data: host-bound, not input-bound
    loader = evidence.loader
    numbers: dict[str, float] = {"input_stall_fraction": share}
    wait = evidence.timing(tags.DATA_LOADING)
    if wait is not None:
        numbers["data_wait_ms"] = 1e3 * wait
    if summary.on_device and (idle := evidence.timing(tags.DEVICE_IDLE)) is not None:
        numbers["device_idle_ms"] = 1e3 * idle
    where = "the GPU sits idle waiting for input" if summary.on_device else "the step waits for the loader"
    kind, cause = _input_cause(evidence)
    advice = _input_advice(evidence, kind, cause)
    if loader.num_workers is not None:
        numbers["num_workers"] = float(loader.num_workers)
    for key in ("worker_cpu_percent_mean", "cpu_busy_percent_mean", "runnable_tasks", "cpu_iowait_percent_mean"):
        if (value := getattr(evidence.system, key)) is not None:
            numbers[key] = value
    if (disk := evidence.system.disk_util_percent) is not None and kind == "input_bound_storage":
        numbers["disk_util_percent"] = disk
    return Finding(
        kind=kind,
        headline=f"input-bound ({cause}): {where} {100 * share:.0f}% of the step time",
        share=share,
        evidence=numbers,
        advice=advice,
    )


#: Loader workers busier than this (% of one core each) are doing CPU work, not waiting on I/O.
WORKER_BUSY_PERCENT = 70.0
#: Mean CPU busy % above which the cores count as saturated.
SATURATED_PERCENT = 90.0
SATURATED_CAUSE = "CPU: every core is busy and the workers get only their share of it"
#: iowait (% of a core, mean across cores) or disk %util above which storage is the suspect.
IOWAIT_PERCENT, DISK_UTIL_PERCENT = 10.0, 80.0


def _input_cause(evidence: Evidence) -> tuple[str, str]:
    system = evidence.system
    iowait = system.cpu_iowait_percent_mean
    disk_util = system.disk_util_percent
    if (iowait is not None and iowait > IOWAIT_PERCENT) or (disk_util is not None and disk_util > DISK_UTIL_PERCENT):
        return "input_bound_storage", "storage"
    workers = evidence.loader.num_workers or 0
    worker_cpu = system.worker_cpu_percent_mean
    if workers > 0 and worker_cpu is not None and worker_cpu > WORKER_BUSY_PERCENT:
        return "input_bound_cpu", "CPU preprocessing"
    if workers > 0 and worker_cpu is not None and _starved_of_cpu(evidence, worker_cpu):
        return "input_bound_cpu", SATURATED_CAUSE
    if workers == 0:
        return "input_bound_workers", "batches are loaded in the training process (num_workers=0)"
    return "input_bound_workers", "too few loader workers / too little prefetch"


def _starved_of_cpu(evidence: Evidence, worker_cpu: float) -> bool:
    """Cores saturated, and the workers use most of the share a runnable task can get: they want CPU.

    A worker waiting on I/O uses far less than its fair share even on a busy machine, so it is not
    counted here; with ``R`` runnable tasks on ``C`` cores each gets about ``100 * C / R`` % of a core.
    """
    system = evidence.system
    busy, runnable = system.cpu_busy_percent_mean, system.runnable_tasks
    if busy is None or busy < SATURATED_PERCENT or runnable is None or evidence.usable_cpus is None:
        return False
    fair_share = 100.0 * min(1.0, evidence.usable_cpus / max(1.0, runnable))
    return worker_cpu >= 0.6 * fair_share


def _spare_cpus(evidence: Evidence) -> float | None:
    """Idle cores, from mean CPU busy % and the CPUs this process may use."""
    busy = evidence.system.cpu_busy_percent_mean
    if busy is None or evidence.usable_cpus is None:
        return None
    return evidence.usable_cpus * (100.0 - busy) / 100.0


def _input_advice(evidence: Evidence, kind: str, cause: str) -> list[str]:
    loader = evidence.loader
    advice: list[str] = []
    workers = loader.num_workers
    if kind == "input_bound_storage":
        advice.append(
            "storage is the limit: copy the dataset to local NVMe or RAM (/dev/shm), use a sequential "
            "format (WebDataset/LitData shards) and raise prefetch_factor to keep more reads in flight"
        )
    elif cause == SATURATED_CAUSE:
        advice.append(
            "all cores are busy: the workers compete with other work for CPU, so more workers will not help; "
            "stop competing processes (or other ranks' oversubscribed workers), make preprocessing cheaper, "
            "or move augmentation to the GPU"
        )
    elif kind == "input_bound_cpu":
        spare = _spare_cpus(evidence)
        if workers and spare is not None and spare >= 1:
            advice.append(
                f"the workers are CPU-bound and about {spare:.0f} cores are idle: raise num_workers "
                f"from {workers} to {workers + int(spare)}"
            )
        advice.append(
            "make preprocessing cheaper: decode smaller images, move augmentation to the GPU (ship uint8 and "
            "normalise on device: SideStreamStrategy(device_transform=...)), or cache decoded samples"
        )
    if workers == 0:
        advice.append(
            "num_workers=0 loads every batch in the training process: set num_workers > 0 "
            "(TunedDataModule picks it from the CPUs this process may use)"
        )
    elif workers is not None and kind == "input_bound_workers":
        more = workers * 2
        if evidence.usable_cpus is not None:
            more = max(workers + 1, min(more, evidence.usable_cpus - 1))
        advice.append(
            f"the workers are mostly waiting, not computing: raise num_workers from {workers} (try {more}) and "
            f"prefetch_factor (now {loader.prefetch_factor}) to keep more batches in flight; "
            "TunedDataModule(autotune=True) measures the best setting"
        )
    if loader.persistent_workers is False and workers:
        advice.append("set persistent_workers=True so workers are not restarted every epoch")
    return advice


#: Share of the link's capacity above which PCIe counts as saturated.
PCIE_SATURATED = 0.8


def _transfer_bound(evidence: Evidence) -> Finding | None:
    """The copy costs the step: on the compute stream (stock), or the side stream's copy left exposed."""
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
        numbers["side_stream_copy_ms"] = 1e3 * copies.copy_s
        numbers["hidden_fraction"] = copies.hidden_fraction
    rx = evidence.system.gpu_pcie_rx_mbps
    if rx is not None:
        numbers["pcie_rx_mbps"] = rx
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
    compute, step = evidence.timing(tags.COMPUTE), evidence.step_mean
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
        evidence={"device_idle_ms": 1e3 * idle, "device_compute_ms": 1e3 * compute, "host_data_wait_ms": 1e3 * wait},
        advice=[
            "Python or kernel-launch overhead dominates: use a larger batch, torch.compile or CUDA graphs, "
            "and avoid per-step host syncs (.item(), .cpu(), printing tensors)",
        ],
    )


def _loop_overhead(evidence: Evidence) -> Finding | None:
    """CPU: time outside data wait, transfer and the step itself (hooks, callbacks, logging) dominates."""
    compute, step = evidence.timing(tags.COMPUTE), evidence.step_mean
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
        evidence={"step_ms": 1e3 * step, "compute_ms": 1e3 * compute, "data_wait_ms": 1e3 * wait},
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
    epoch_time = summary.epoch_start + step * summary.steps
    share = summary.epoch_start / epoch_time
    if share < 0.2:
        return None
    advice = ["epoch start-up (worker spawn and first batches) dominates this short epoch"]
    if not evidence.loader.persistent_workers:
        advice.append("set persistent_workers=True to keep workers alive between epochs")
    advice.append("or make epochs longer (fewer, larger epochs) so start-up is amortised")
    return Finding(
        kind="epoch_start",
        headline=f"epoch start-up takes {100 * share:.0f}% of the epoch",
        share=share,
        evidence={"epoch_start_ms": 1e3 * summary.epoch_start, "steady_epoch_ms": 1e3 * step * summary.steps},
        advice=advice,
    )


def _straggler(evidence: Evidence) -> Finding | None:
    summary = evidence.summary
    if summary.world_size < 2 or summary.straggler_ratio is None or summary.straggler_ratio < 1.5:
        return None
    waits = summary.rank_data_wait
    slow = summary.slowest_rank
    share = min(0.99, 1 - min(waits) / max(waits)) if waits and max(waits) > 0 else 0.0
    return Finding(
        kind="straggler",
        headline=(f"straggler: rank {slow} waits {summary.straggler_ratio:.1f}x longer for data than the fastest rank"),
        share=share,
        evidence={f"rank{rank}_data_wait_ms": 1e3 * wait for rank, wait in enumerate(waits)},
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
    compute, step = evidence.timing(tags.COMPUTE), evidence.step_mean
    if compute is None:
        return None
    share = compute / step if step else 1.0
    advice = ["profile the model (torch.profiler), use mixed precision, torch.compile, larger batches"]
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
    numbers = {"compute_ms": 1e3 * compute, "compute_share": share}
    for key in ("gpu_util_percent", "gpu_slowdown", "gpu_power_capped", "gpu_sm_clock_mhz"):
        if (value := getattr(evidence.system, key)) is not None:
            numbers[key] = value
    return numbers


RULES: tuple[Rule, ...] = (
    _input_bound,
    _transfer_bound,
    _host_bound,
    _straggler,
    _epoch_start,
    _memory_pressure,
)


def diagnose(evidence: Evidence, rules: tuple[Rule, ...] = RULES) -> Diagnosis:
    """Apply every rule; the largest share is the bottleneck. Falls back to compute-bound."""
    findings = [finding for rule in rules if (finding := rule(evidence)) is not None]
    findings.sort(key=lambda finding: finding.share, reverse=True)
    if not any(finding.share >= SIGNIFICANT_SHARE for finding in findings):
        compute = _compute_bound(evidence)
        if compute is not None:
            findings.insert(0, compute)
    return Diagnosis(stage=evidence.summary.stage, epoch=evidence.summary.epoch, findings=findings)
