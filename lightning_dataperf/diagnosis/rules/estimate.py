"""Predicted gains, said to be estimates (what one epoch cannot see, never above the ceiling), and what was measured."""

from __future__ import annotations

from lightning_dataperf.diagnosis.evidence import Evidence
from lightning_dataperf.loader.policy import HANDOVER_FLOOR_S

__all__ = [
    "HANDOVER_FLOOR_S",
    "MORE_DID_NOT_HELP",
    "UNSEEN_FIRST_WORKERS",
    "UNSEEN_MORE_READS",
    "UNSEEN_MORE_WORKERS",
    "advised",
    "compute_beside",
    "estimate",
    "handover_floor_words",
    "more_workers_lost",
    "reads_slower",
    "threads_beside",
]

#: A worker count above autotune's pick that read at most this much faster than the pick did not help
#: (autotune's default noise): the verdict then quotes it instead of advising more workers.
MORE_DID_NOT_HELP = 0.03

#: What an estimate from one epoch cannot see, by the change it is for.
UNSEEN_FIRST_WORKERS = (
    "not measured at num_workers=0: the hand-over of each batch from a worker process, and the workers"
    " competing with this process's own threads for the cores"
)
UNSEEN_MORE_WORKERS = "not measured: what the added workers take from this process's threads and the hand-over"
UNSEEN_MORE_READS = "not measured: whether the storage serves more reads at once, and the hand-over"


def estimate(evidence: Evidence, step: float | None, new_step: float, unseen: str) -> str:
    """A predicted gain, said to be an estimate, never above the ceiling of removing the wait altogether, and
    never below 1.0x: a model that reads slower says it cannot tell (:func:`advised` then advises nothing)."""
    if not step or new_step <= 0 or evidence.measured_online:
        return ""
    ceiling = 1.0 / max(1e-6, 1.0 - (evidence.summary.input_stall_fraction or 0.0))
    gain = min(step / new_step, ceiling)
    if gain < 1.0:
        return f" (no estimate: this epoch cannot tell; {unseen}; {_MEASURE})"
    return (
        f" (an estimate from this epoch: up to {gain:.2f}x, {1e3 * step:.1f} -> {1e3 * step / gain:.1f} ms; {unseen};"
        " measure it on your steps: TunedDataModule(autotune=OnlineTuning()), or for a plain DataLoader"
        " TunedDataModule.from_loaders(loader, autotune=OnlineTuning()))"
    )


_MEASURE = (
    "measure it on your steps: TunedDataModule(autotune=OnlineTuning()), or for a plain DataLoader"
    " TunedDataModule.from_loaders(loader, autotune=OnlineTuning())"
)


def reads_slower(evidence: Evidence, step: float | None, new_step: float) -> bool:
    """The model of a change predicts a slower step (its bound on the step's compute beside fewer threads is an
    upper bound: the tokeniser pipeline's "up to 0.77x" measured 1.08-1.10x)."""
    return bool(step) and new_step > step and not evidence.measured_online  # type: ignore[operator]


def advised(evidence: Evidence, step: float | None, new_step: float, change: str, unseen: str) -> str:
    """``change`` with its estimate; where the estimate reads slower, no change is advised and the loop is named
    to measure it (an advised change must not slow the run: three held-out pipelines measured 0.64-0.87x).

    Example::

        advised(evidence, 0.088, 0.114, "set num_workers=2", UNSEEN_FIRST_WORKERS)   # "no change is advised ..."
    """
    if reads_slower(evidence, step, new_step):
        return (
            f"no change is advised from this epoch: whether to {change} cannot be told from it ({unseen}; a"
            f" model of it reads slower, an upper bound that has been wrong both ways); {_MEASURE}"
        )
    return change + estimate(evidence, step, new_step, unseen)


def more_workers_lost(evidence: Evidence) -> str | None:
    """Where the loader runs autotune's pick and autotune measured more workers no faster (within
    :data:`MORE_DID_NOT_HELP`): that, instead of advice to add workers the search already measured."""
    more, workers = evidence.autotune_more, evidence.loader.num_workers
    if more is None or workers != more.pick or more.change > MORE_DID_NOT_HELP:
        return None
    return (
        f"autotune measured {more.workers} workers at {100 * more.change:+.0f}% against these {more.pick}: more "
        "workers did not help here (each costs CPU and hand-over time); shorten what each sample waits on (a "
        "local or cached copy of the data, fewer reads per sample)"
    )


def compute_beside(evidence: Evidence, compute: float, workers: int) -> float:
    """The step's compute once :func:`threads_beside` cut its intra-op threads: as if it scaled with them (an
    upper bound; benchmarks/verdicts.py's large batches, 2 -> 1 thread: 1.25x where the workers alone said 2.3x)."""
    threads, cpus = evidence.intra_op_threads, evidence.usable_cpus
    if not threads_beside(evidence, workers) or not threads or not cpus:
        return compute
    return compute * threads / max(1, cpus - workers)


def threads_beside(evidence: Evidence, workers: int) -> str:
    """CPU runs: the intra-op threads to set beside ``workers`` workers, so the two do not outnumber the cores."""
    threads, cpus = evidence.intra_op_threads, evidence.usable_cpus
    if evidence.summary.on_device or not threads or not cpus or threads + workers <= cpus:
        return ""
    # benchmarks/online.py, 2 cores: at the same workers one intra-op thread beat two on every pipeline
    return f" and torch.set_num_threads({max(1, cpus - workers)}) (now {threads}: the workers need the cores too)"


def handover_floor_words(work: float) -> str:
    """Advice for a loader whose batches cost less to make here than a worker's hand-over would."""
    return (
        f"each batch takes {1e3 * work:.1f} ms to load in the training process, about what a worker process's"
        " hand-over of it costs (pickling, shared memory, the pin thread): workers may well be slower, so no"
        " worker count is advised; TunedDataModule(autotune=OnlineTuning()) measures it on your steps (also"
        " TunedDataModule.from_loaders(loader, autotune=OnlineTuning()) for a plain DataLoader); cheaper loading"
        " (fewer, larger tensors per sample) helps either way"
    )
