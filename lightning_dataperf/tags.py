"""Every stage name and every scalar/text tag DataPerf writes, defined once, and the names they replaced.

The naming scheme (``Group/Name``, the unit at the end) is in docs/report.md, section 4.

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
    "current",
    "epoch_percentile",
    "loader_settings_text",
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
        # Lower-case prefixes sort the evaluation stages after training's groups in TensorBoard.
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
#: Derived from the step's time: the unit ends the name.
SAMPLES_PER_SEC = "Time/SamplesPerSec"
INPUT_STALL = "Time/InputStallFraction"

#: Side-stream copies (:class:`~lightning_dataperf.transfer.stats.CopyStats`).
COPY_S = "Transfer/copy_s"
COPY_EXPOSED_S = "Transfer/exposed_s"
COPY_HIDDEN = "Transfer/hidden_fraction"
COPY_GBPS = "Transfer/copy_gbps"
COPY_TRANSFORM_S = "Transfer/transform_s"

#: Inside the loader (:class:`~lightning_dataperf.loader.stats.LoaderStats`), per batch. The hand-over and the
#: busy and CPU shares are the workers' own: logged only for a loader with workers.
WORKERS_FETCH_S = "Workers/fetch_s"
WORKERS_COLLATE_S = "Workers/collate_s"
WORKERS_PIN_S = "Workers/pin_s"
WORKERS_WAIT_S = "Workers/worker_wait_s"
WORKERS_HANDOVER_S = "Workers/handover_s"
WORKERS_BUSY = "Workers/busy_fraction"
WORKERS_CPU = "Workers/cpu_fraction"

#: Telemetry: ``Usage/<field>`` for each field of :class:`~lightning_dataperf.telemetry.stats.SystemStats`.
USAGE_GROUP = "Usage/"

#: Per epoch: the timings whose 90th percentile is logged (``Time/<name>_p90``; the whole distribution is
#: in the printed summary, the TensorBoard text and the summaries file), and, with more than one rank,
#: the straggler figures.
EPOCH_PERCENTILE = "p90"
EPOCH_PERCENTILE_TIMINGS = (DATA_LOADING, COMPUTE, DEVICE_SPAN)
EPOCH_STRAGGLER_RATIO = "Time/StragglerRatio"
EPOCH_SLOWEST_RANK = "Time/SlowestRank"

#: TensorBoard text tags (and ``DataPerf/loader_settings_<stage>``: :func:`loader_settings_text`).
DIAGNOSIS_TEXT = "DataPerf/diagnosis"
AUTOTUNE_TEXT = "DataPerf/autotune"

#: Tags logged by earlier versions -> today's (CHANGELOG, "Deprecated"): ``lightning-dataperf report`` reads runs
#: logged under them (:func:`current`); ``System/...`` became ``Usage/...`` earlier (the report maps those itself).
RENAMED = {
    "Time/samples_per_sec": SAMPLES_PER_SEC,
    "Time/input_stall_fraction": INPUT_STALL,
    "Time/straggler_ratio": EPOCH_STRAGGLER_RATIO,
    "Time/slowest_rank": EPOCH_SLOWEST_RANK,
    "Transfer/GBps": COPY_GBPS,
    "Throughput/samples_per_sec": SAMPLES_PER_SEC,
    "DataPerf/input_stall_fraction": INPUT_STALL,
}

#: The JSON-lines file of epoch summaries and verdicts, in the run's log directory.
SUMMARY_FILE = "dataperf_summaries.jsonl"


def time(name: str, stage: Stage = Stage.TRAIN) -> str:
    """``Time/<name>`` with the stage's prefix."""
    return f"{stage.prefix}Time/{name}"


def loader_settings_text(stage: str) -> str:
    """The TensorBoard text tag of a ``TunedDataModule`` stage's loader settings."""
    return f"DataPerf/loader_settings_{stage}"


def current(tag: str) -> str:
    """Today's name of a tag an earlier version logged (:data:`RENAMED`, with a stage's prefix); others unchanged."""
    stage, _, rest = tag.partition("/")
    if stage in {other.value for other in Stage} and rest in RENAMED:  # "val/Time/samples_per_sec"
        return f"{stage}/{RENAMED[rest]}"
    return RENAMED.get(tag, tag)


def epoch_percentile(name: str, stage: Stage = Stage.TRAIN) -> str:
    """``Time/<name>_p90`` with the stage's prefix: the epoch's 90th percentile of one timing."""
    return f"{time(name, stage)}_{EPOCH_PERCENTILE}"
