"""What a verdict may look at: one epoch's summary, the loader's settings, telemetry, the hardware."""

from __future__ import annotations

from dataclasses import dataclass, field

from lightning_dataperf import tags
from lightning_dataperf.loader.settings import LoaderFacts
from lightning_dataperf.telemetry.stats import SystemStats
from lightning_dataperf.timing.summary import EpochSummary

__all__ = [
    "STEP_COMPILED",
    "STEP_COMPILED_CUDA_GRAPHS",
    "STEP_CUDA_GRAPHS",
    "STRAGGLER_RATIO",
    "DecodePlacementMeasured",
    "Evidence",
    "MoreWorkersMeasured",
]

#: One rank waiting for data at least this many times longer than the fastest is a straggler.
STRAGGLER_RATIO = 1.5

#: How the training step runs where it is not eager (``Evidence.step_compiled``), in the verdict's words.
STEP_COMPILED = "torch.compile"
STEP_COMPILED_CUDA_GRAPHS = "torch.compile (CUDA graphs)"
STEP_CUDA_GRAPHS = "CUDA graphs (torch.cuda.make_graphed_callables)"


@dataclass(frozen=True)
class MoreWorkersMeasured:
    """The fastest worker count above autotune's pick that its search measured, against the pick.

    Example::

        MoreWorkersMeasured(pick=10, workers=16, change=-0.13)   # 16 workers read 13% below 10
    """

    pick: int
    workers: int
    change: float  # its rate against the pick's, relative (-0.13: 13% slower)


@dataclass(frozen=True)
class DecodePlacementMeasured:
    """The online loop's fastest measured step rate at each end of the split decode, on this run's steps.

    Example::

        DecodePlacementMeasured(cpu_only=48.0, gpu_only=39.0, cpu_only_error=0.02, gpu_only_error=0.03,
                                cpu_only_workers=8, kept_share=0.5, kept=52.0)
    """

    cpu_only: float  # steps/s at gpu_share=0: the loader's workers decode every image
    gpu_only: float  # steps/s at gpu_share=1: the GPU path decodes every image
    cpu_only_error: float  # relative standard errors of the two rates
    gpu_only_error: float
    cpu_only_workers: int  # the workers of the fastest CPU-only trial
    kept_share: float | None = None  # the gpu_share the loop kept, and its rate (None: none kept yet)
    kept: float | None = None


@dataclass(frozen=True)
class Evidence:
    """Everything a rule may look at. ``system`` holds the epoch's telemetry means (empty if not sampled).

    Example::

        evidence = Evidence(summary=callback.last_summary, loader=LoaderFacts.of(dataloader))
        evidence.timing(tags.DATA_LOADING)  # mean data wait per step (s)
        evidence.step_work                  # the step's own work: host compute, or the device span on CUDA
        evidence.step_mean                  # on the timeline that binds (device on CUDA)
    """

    summary: EpochSummary
    loader: LoaderFacts = field(default_factory=LoaderFacts)
    system: SystemStats = field(default_factory=SystemStats)
    side_stream_transfer: bool = False
    usable_cpus: int | None = None
    pcie_capacity_mbps: float | None = None
    planned_epochs: int | None = None  # the Trainer's max_epochs (None: unknown or unlimited)
    autotune: str | None = None  # what autotune measured for this loader, when it ran (quoted, not suggested)
    autotune_more: MoreWorkersMeasured | None = None  # the most autotune measured above its pick, when it did
    loader_blind: str | None = None  # why the loader's inside was not measured, when it was not
    measured_online: str | None = None  # what the online loop measured on this run's steps, when it ran
    intra_op_threads: int | None = None  # torch.get_num_threads() of the training process
    step_compiled: str | None = None  # how the step runs where not eager: STEP_COMPILED, ... (None: eager)
    decode_placement: DecodePlacementMeasured | None = None  # the online loop's split-decode ends, when measured

    @property
    def step_graphed(self) -> bool:
        """The step replays CUDA graphs: one launch per step, almost no CPU work in the training thread."""
        return self.step_compiled in (STEP_COMPILED_CUDA_GRAPHS, STEP_CUDA_GRAPHS)

    def timing(self, name: str, statistic: str = "mean") -> float | None:
        summary = self.summary.timings.get(name)
        return None if summary is None else getattr(summary, statistic)

    @property
    def step_work(self) -> float | None:
        """Mean time of the step's own work: host compute on the CPU, the device span on CUDA.

        The device span is GPU busy time plus the host gaps inside the step (``summary.host_gap`` splits
        the two where the probe measured them).
        """
        host = self.timing(tags.COMPUTE)
        return host if host is not None else self.timing(tags.DEVICE_SPAN)

    @property
    def step_mean(self) -> float | None:
        """Mean step time on the timeline that binds: the device's on CUDA, the host's elsewhere.

        On CUDA the host may run ahead of the GPU, so its step time can be shorter than the GPU's work;
        the device step (end of step N-1 to end of step N) is idle + transfer + compute.
        """
        if self.summary.on_device:
            parts = [self.timing(tags.DEVICE_IDLE), self.timing(tags.TRANSFER), self.step_work]
            if parts[2] is not None:
                return sum(part or 0.0 for part in parts)
        return self.timing(tags.STEP)

    @property
    def idle_cpus(self) -> float | None:
        """Idle cores this epoch, from the mean CPU busy % and the CPUs this rank may use (``None``: not measured)."""
        busy = self.system.cpu_busy_percent_mean
        return None if busy is None or self.usable_cpus is None else self.usable_cpus * (100.0 - busy) / 100.0

    @property
    def training_thread_starved(self) -> bool:
        """CUDA, from the host-gap probe: the training thread waited for a CPU for much of the host gap."""
        gap = self.summary.host_gap
        return gap is not None and gap.training_thread_starved

    @property
    def queued_per_step(self) -> float | None:
        """CPU runs: seconds per step this process's threads were runnable but waited for a core (measured)."""
        queued, step = self.system.main_runqueue_percent, self.timing(tags.STEP)
        if self.summary.on_device or queued is None or step is None:
            return None
        return queued / 100.0 * step

    def contention(self) -> str | None:
        """The step's wait for a core in words, where it is at least a tenth of the step (CPU runs)."""
        queued, step = self.queued_per_step, self.timing(tags.STEP)
        # a tenth of the step, the bar a stage must pass to be named (SIGNIFICANT_SHARE)
        if queued is None or not step or queued < 0.1 * step:
            return None
        workers = self.loader.num_workers or 0
        threads = f"{self.intra_op_threads} intra-op threads" if self.intra_op_threads else "its threads"
        cores = f" share {self.usable_cpus} cores" if self.usable_cpus else " share the cores"
        return (
            f"contention, measured: this process's threads together waited {1e3 * queued:.1f} ms"
            f" per {1e3 * step:.1f}-ms step"
            f" for a core ({workers} worker processes and {threads}{cores}), so Time/Compute includes waiting, not"
            " only the model's work; fewer intra-op threads (torch.set_num_threads) or workers may be faster:"
            + (
                # the run already has the loop: sent to it again, a user would not know why it stopped
                " the online loop tries both while its cost cap allows (OnlineTuning(max_cost=...))"
                if self.measured_online
                else " TunedDataModule(autotune=OnlineTuning()) measures both on these steps"
            )
        )

    @property
    def straggling(self) -> bool:
        """Several ranks, one waiting far longer for data: every rank's step then holds the wait for it."""
        ratio = self.summary.straggler_ratio
        return self.summary.world_size > 1 and ratio is not None and ratio >= STRAGGLER_RATIO

    def host_explains_idle(self) -> bool:
        """CUDA: was the host blocked in the loader for at least half of the GPU's idle time?"""
        idle, wait = self.timing(tags.DEVICE_IDLE) or 0.0, self.timing(tags.DATA_LOADING) or 0.0
        # half, not all: after the batch arrives the host still copies it and launches the step's first kernels
        return wait >= 0.5 * idle
