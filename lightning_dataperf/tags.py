"""Every stage name and every scalar/text tag DataPerf writes, defined once.

Example::

    from lightning_dataperf import tags

    tags.time(tags.DATA_LOADING)                    # "Time/DataLoading"
    tags.time(tags.COMPUTE, tags.Stage.VAL)         # "val/Time/Compute"
    tags.Stage.of_loop("validate")                  # Stage.VAL
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

__all__ = [
    "COMPUTE",
    "DATA_LOADING",
    "DEVICE_IDLE",
    "DEVICE_SPAN",
    "HOST_GAP",
    "STEP",
    "TIMINGS",
    "TRANSFER",
    "Stage",
    "epoch_percentile",
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
    def parse(cls, stages: str | Iterable[str]) -> tuple[Stage, ...]:
        """One stage name (``"train"``) or several (``("train", "val")``) as stages; anything else is refused."""
        names = (stages,) if isinstance(stages, str) else tuple(stages) if isinstance(stages, Iterable) else (stages,)
        known = [stage.value for stage in cls]
        if unknown := [name for name in names if name not in known]:
            raise ValueError(
                f"stages={stages!r}: {', '.join(map(repr, unknown))} is not a stage; choose from {known} "
                '(e.g. stages="train" or stages=("train", "val")).'
            )
        return tuple(cls(name) for name in names)

    @classmethod
    def of_loop(cls, name: str) -> Stage:
        """The stage of a Lightning loop or trainer function name (``validate`` runs the val stage)."""
        return cls.VAL if name == "validate" else cls(name)


#: The per-step timings (``Time/<name>``), in the order a reader meets them.
DATA_LOADING = "DataLoading"  # host blocked in the loader's next()
TRANSFER = "Transfer"  # host-to-device copy on the compute stream (fetch end -> step start)
COMPUTE = "Compute"  # the step's work: host time on the CPU; on CUDA the GPU's busy time (host-gap probe, per epoch)
DEVICE_SPAN = "DeviceSpan"  # CUDA: the step's span on the device = GPU busy + host gap
STEP = "Step"  # wall time between step ends
DEVICE_IDLE = "DeviceIdle"  # CUDA: GPU idle between steps, waiting for this step's input
TIMINGS = (DATA_LOADING, TRANSFER, COMPUTE, DEVICE_SPAN, STEP, DEVICE_IDLE)
#: CUDA, per epoch from the host-gap probe's profiled steps: the part of the device span in which the GPU
#: waited for the host (late kernel launches). ``Time/Compute`` on CUDA is the other part, the GPU's work.
HOST_GAP = "HostGap"

#: Scalar groups sort after ``Time`` in TensorBoard, so the timings open first (docs/report.md, section 4).

#: The GPU-decode path's own figures (:class:`~lightning_dataperf.decode.stats.DecodeStats`), logged only for a
#: ``GpuDecodeLoader``; the one group that sorts before ``Time``, so such runs open on it.
DECODE_GROUP = "Decode/"

EPOCH_START = "Time/EpochStart"
SAMPLES_PER_SEC = "Time/samples_per_sec"
INPUT_STALL = "Time/input_stall_fraction"

#: Side-stream copies (:class:`~lightning_dataperf.transfer.stats.CopyStats`).
COPY_S = "Transfer/copy_s"
COPY_EXPOSED_S = "Transfer/exposed_s"
COPY_HIDDEN = "Transfer/hidden_fraction"
COPY_GBPS = "Transfer/GBps"
COPY_TRANSFORM_S = "Transfer/transform_s"

#: Per epoch: the timings whose 90th percentile is logged (``Time/<name>_p90``; the whole distribution is
#: in the printed summary, the TensorBoard text and the summaries file), and, with more than one rank,
#: the straggler figures.
EPOCH_PERCENTILE = "p90"
EPOCH_PERCENTILE_TIMINGS = (DATA_LOADING, COMPUTE, DEVICE_SPAN)
EPOCH_STRAGGLER_RATIO = "Time/straggler_ratio"
EPOCH_SLOWEST_RANK = "Time/slowest_rank"

#: TensorBoard text tags.
DIAGNOSIS_TEXT = "DataPerf/diagnosis"
AUTOTUNE_TEXT = "DataPerf/autotune"

#: The JSON-lines file of epoch summaries and verdicts, in the run's log directory.
SUMMARY_FILE = "dataperf_summaries.jsonl"


def time(name: str, stage: Stage = Stage.TRAIN) -> str:
    """``Time/<name>`` with the stage's prefix."""
    return f"{stage.prefix}Time/{name}"


def epoch_percentile(name: str, stage: Stage = Stage.TRAIN) -> str:
    """``Time/<name>_p90`` with the stage's prefix: the epoch's 90th percentile of one timing."""
    return f"{time(name, stage)}_{EPOCH_PERCENTILE}"
