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

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from lightning_dataperf.stats import EpochSummary

__all__ = ["Diagnosis", "Evidence", "Finding", "LoaderFacts", "diagnose"]

#: A stage that costs at least this share of the step is called a bottleneck.
SIGNIFICANT_SHARE = 0.10


@dataclass(frozen=True)
class LoaderFacts:
    """The DataLoader settings that the advice refers to."""

    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    batch_size: int | None = None

    @classmethod
    def of(cls, loader: Any) -> LoaderFacts:
        """Read the settings of a ``DataLoader`` (anything else gives unknowns)."""
        loader = getattr(loader, "dataloader", loader)
        return cls(
            num_workers=getattr(loader, "num_workers", None),
            pin_memory=getattr(loader, "pin_memory", None),
            persistent_workers=getattr(loader, "persistent_workers", None),
            prefetch_factor=getattr(loader, "prefetch_factor", None),
            batch_size=getattr(loader, "batch_size", None),
        )


@dataclass(frozen=True)
class Evidence:
    """Everything a rule may look at. ``system`` holds ``System/...`` interval means, if sampled."""

    summary: EpochSummary
    loader: LoaderFacts = field(default_factory=LoaderFacts)
    system: Mapping[str, float] = field(default_factory=dict)
    side_stream_transfer: bool = False
    usable_cpus: int | None = None

    def timing(self, name: str, statistic: str = "mean") -> float | None:
        summary = self.summary.timings.get(name)
        return None if summary is None else getattr(summary, statistic)

    @property
    def step_mean(self) -> float | None:
        return self.timing("Step")


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
    """The verdict for one epoch: the binding stage first, then secondary findings."""

    stage: str
    epoch: int
    findings: list[Finding]

    @property
    def bottleneck(self) -> str:
        return self.findings[0].kind if self.findings else "unknown"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for finding, raw in zip(self.findings, data["findings"], strict=True):
            raw["ceiling_speedup"] = finding.ceiling_speedup
        data["bottleneck"] = self.bottleneck
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def format(self) -> str:
        if not self.findings:
            return f"DataPerf verdict ({self.stage} epoch {self.epoch}): not enough steps measured yet."
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


Rule = Callable[[Evidence], "Finding | None"]


def _input_bound(evidence: Evidence) -> Finding | None:
    summary = evidence.summary
    share = summary.input_stall_fraction
    if share is None or share < SIGNIFICANT_SHARE:
        return None
    loader = evidence.loader
    numbers: dict[str, float] = {"input_stall_fraction": share}
    wait = evidence.timing("DataLoading")
    if wait is not None:
        numbers["data_wait_ms"] = 1e3 * wait
    if summary.on_device and (idle := evidence.timing("DeviceIdle")) is not None:
        numbers["device_idle_ms"] = 1e3 * idle
    where = "the GPU sits idle waiting for input" if summary.on_device else "the step waits for the loader"
    advice = _input_advice(evidence)
    kind, cause = _input_cause(evidence)
    if loader.num_workers is not None:
        numbers["num_workers"] = float(loader.num_workers)
    return Finding(
        kind=kind,
        headline=f"input-bound ({cause}): {where} {100 * share:.0f}% of the step time",
        share=share,
        evidence=numbers,
        advice=advice,
    )


def _input_cause(evidence: Evidence) -> tuple[str, str]:
    system = evidence.system
    iowait = system.get("System/cpu_iowait_mean")
    disk_util = system.get("System/disk_util_percent")
    if (iowait is not None and iowait > 10) or (disk_util is not None and disk_util > 80):
        return "input_bound_storage", "storage"
    busy = system.get("System/cpu_busy_percent_mean")
    workers = evidence.loader.num_workers or 0
    if busy is not None and busy > 85 and workers > 0:
        return "input_bound_cpu", "CPU preprocessing"
    return "input_bound_workers", "too few loader workers / too little prefetch"


def _input_advice(evidence: Evidence) -> list[str]:
    loader = evidence.loader
    kind, _ = _input_cause(evidence)
    advice: list[str] = []
    if kind == "input_bound_storage":
        advice.append(
            "storage is the limit: copy the dataset to local NVMe or RAM (/dev/shm), use a sequential "
            "format (WebDataset/LitData shards) and raise prefetch_factor to keep more reads in flight"
        )
    elif kind == "input_bound_cpu":
        advice.append(
            "the CPUs are saturated by preprocessing: decode smaller images, move augmentation to the GPU "
            "(ship uint8 and normalise on device: SideStreamTransfer(device_transform=...)), or cache "
            "decoded samples; more workers will not help"
        )
    workers = loader.num_workers
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
            f"raise num_workers from {workers} (try {more}) and prefetch_factor "
            f"(now {loader.prefetch_factor}); TunedDataModule(autotune=True) measures the best setting"
        )
    if loader.persistent_workers is False and workers:
        advice.append("set persistent_workers=True so workers are not restarted every epoch")
    return advice


def _transfer_bound(evidence: Evidence) -> Finding | None:
    transfer, step = evidence.timing("Transfer"), evidence.step_mean
    if transfer is None or not step:
        return None
    share = transfer / step
    if share < SIGNIFICANT_SHARE:
        return None
    advice = []
    if evidence.loader.pin_memory is False:
        advice.append(
            "pin_memory=False: copies come from pageable memory and are staged synchronously by the driver; "
            "set pin_memory=True"
        )
    if not evidence.side_stream_transfer:
        advice.append(
            "overlap the copy with compute: Trainer(strategy='side_stream') copies the next batch on a "
            "side CUDA stream while this one computes"
        )
    advice.append("ship compact dtypes (uint8 images) and cast/normalise on the GPU: 4x fewer PCIe bytes")
    numbers = {"transfer_ms": 1e3 * transfer, "step_ms": 1e3 * step, "transfer_share": share}
    if (pcie := evidence.system.get("System/gpu_pcie_rx_MBps")) is not None:
        numbers["pcie_rx_MBps"] = pcie
    return Finding(
        kind="transfer_bound",
        headline=f"transfer-bound: the host-to-device copy takes {100 * share:.0f}% of the step",
        share=share,
        evidence=numbers,
        advice=advice,
    )


def _host_bound(evidence: Evidence) -> Finding | None:
    summary = evidence.summary
    compute, step = evidence.timing("Compute"), evidence.step_mean
    if not summary.on_device or compute is None or not step:
        return None
    stall = summary.input_stall_fraction or 0.0
    wait_share = summary.data_wait_share or 0.0
    idle_share = max(0.0, 1.0 - compute / step - stall)
    if idle_share < 0.25 or wait_share > 0.5 * idle_share + stall:
        return None
    return Finding(
        kind="host_bound",
        headline=(f"host-bound: the GPU is busy only {100 * compute / step:.0f}% of the step though data is ready"),
        share=idle_share,
        evidence={
            "device_compute_ms": 1e3 * compute,
            "step_ms": 1e3 * step,
            "host_data_wait_share": wait_share,
        },
        advice=[
            "Python or kernel-launch overhead dominates: use a larger batch, torch.compile or CUDA graphs, "
            "and avoid per-step host syncs (.item(), .cpu(), printing tensors)",
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
    if (swap := system.get("System/swap_used_MB")) is not None and swap > 256:
        numbers["swap_used_MB"] = swap
    if (faults := system.get("System/major_faults_per_sec")) is not None and faults > 100:
        numbers["major_faults_per_sec"] = faults
    shm_free = system.get("System/shm_free_MB")
    if shm_free is not None and shm_free < 256:
        numbers["shm_free_MB"] = shm_free
    if not numbers:
        return None
    return Finding(
        kind="memory_pressure",
        headline="memory pressure: " + ", ".join(f"{key}={value:.0f}" for key, value in numbers.items()),
        share=0.0,
        evidence=numbers,
        advice=[
            "lower prefetch_factor or num_workers (each holds batches in /dev/shm), keep pinned memory to what "
            "the copy needs, enlarge /dev/shm (docker --shm-size) and avoid swapping",
        ],
    )


def _compute_bound(evidence: Evidence) -> Finding | None:
    compute, step = evidence.timing("Compute"), evidence.step_mean
    if compute is None:
        return None
    share = compute / step if step else 1.0
    return Finding(
        kind="compute_bound",
        headline="compute-bound: input is not the limit; speed up the model itself",
        share=min(share, 0.999),
        evidence={"compute_ms": 1e3 * compute, "compute_share": share},
        advice=["profile the model (torch.profiler), use mixed precision, torch.compile, larger batches"],
    )


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
