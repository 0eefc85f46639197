"""Every stage name and every scalar/text tag DataPerf writes, defined once.

Modules build tags from these names only (``tags.time(tags.COMPUTE)``, ``Stage.VAL.prefix``); the
``System/...`` tags are the field names of :class:`~lightning_dataperf.system_stats.SystemStats`.

Example::

    from lightning_dataperf import tags

    tags.time(tags.DATA_LOADING)                    # "Time/DataLoading"
    tags.time(tags.COMPUTE, tags.Stage.VAL)         # "val/Time/Compute"
    tags.Stage.of_loop("validate")                  # Stage.VAL
"""

from __future__ import annotations

from enum import Enum

__all__ = [
    "COMPUTE",
    "DATA_LOADING",
    "DEVICE_IDLE",
    "STEP",
    "TIMINGS",
    "TRANSFER",
    "Stage",
    "epoch",
    "time",
]


class Stage(str, Enum):
    """The four loops DataPerf times. Training metrics carry no prefix, the others ``val/`` and so on."""

    TRAIN = "train"
    VAL = "val"
    TEST = "test"
    PREDICT = "predict"

    @property
    def prefix(self) -> str:
        return "" if self is Stage.TRAIN else f"{self.value}/"

    @classmethod
    def of_loop(cls, name: str) -> Stage:
        """The stage of a Lightning loop or trainer function name (``validate`` runs the val stage)."""
        return cls.VAL if name == "validate" else cls(name)


#: The per-step timings (``Time/<name>``), in the order a reader meets them.
DATA_LOADING = "DataLoading"  # host blocked in the loader's next()
TRANSFER = "Transfer"  # host-to-device copy on the compute stream (fetch end -> step start)
COMPUTE = "Compute"  # the step's work
STEP = "Step"  # wall time between step ends
DEVICE_IDLE = "DeviceIdle"  # CUDA: GPU idle between steps, waiting for this step's input
TIMINGS = (DATA_LOADING, TRANSFER, COMPUTE, STEP, DEVICE_IDLE)
#: CUDA, from the host-gap probe's profiled steps: the step's device span split into GPU work and waiting for the host.
GPU_BUSY = "GpuBusy"
HOST_GAP = "HostGap"

EPOCH_START = "Time/EpochStart"
SAMPLES_PER_SEC = "Throughput/samples_per_sec"
INPUT_STALL = "DataPerf/input_stall_fraction"

#: Side-stream copies (:class:`~lightning_dataperf.copy_stats.CopyStats`).
COPY_S = "Transfer/copy_s"
COPY_EXPOSED_S = "Transfer/exposed_s"
COPY_HIDDEN = "Transfer/hidden_fraction"
COPY_GBPS = "Transfer/GBps"
COPY_TRANSFORM_S = "Transfer/transform_s"

#: Epoch statistics of each timing and the epoch-level figures.
EPOCH_STATISTICS = ("mean", "p50", "p90", "p99", "max")
EPOCH_INPUT_STALL = "Epoch/input_stall_fraction"
EPOCH_DATA_WAIT_SHARE = "Epoch/data_wait_share"
EPOCH_SAMPLES_PER_SEC = "Epoch/samples_per_sec"
EPOCH_STRAGGLER_RATIO = "Epoch/straggler_ratio"
EPOCH_SLOWEST_RANK = "Epoch/slowest_rank"

#: TensorBoard text tags.
DIAGNOSIS_TEXT = "DataPerf/diagnosis"
AUTOTUNE_TEXT = "DataPerf/autotune"

#: The JSON-lines file of epoch summaries and verdicts, in the run's log directory.
SUMMARY_FILE = "dataperf_summaries.jsonl"


def time(name: str, stage: Stage = Stage.TRAIN) -> str:
    """``Time/<name>`` with the stage's prefix."""
    return f"{stage.prefix}Time/{name}"


def epoch(name: str, statistic: str, stage: Stage = Stage.TRAIN) -> str:
    """``Epoch/Time/<name>_<statistic>`` with the stage's prefix."""
    return f"{stage.prefix}Epoch/Time/{name}_{statistic}"
