"""Predicted gains, said to be estimates (what one epoch cannot see, never above the ceiling), and what was measured."""

from __future__ import annotations

from lightning_dataperf.diagnosis.evidence import Evidence

__all__ = [
    "HANDOVER_FLOOR_S",
    "MORE_DID_NOT_HELP",
    "UNSEEN_FIRST_WORKERS",
    "UNSEEN_MORE_READS",
    "UNSEEN_MORE_WORKERS",
    "compute_beside",
    "estimate",
    "handover_floor_words",
    "more_workers_lost",
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
    """A predicted gain, said to be an estimate, never above the ceiling of removing the wait altogether."""
    if not step or new_step <= 0 or evidence.measured_online:
        return ""
    ceiling = 1.0 / max(1e-6, 1.0 - (evidence.summary.input_stall_fraction or 0.0))
    gain = min(step / new_step, ceiling)
    return (
        f" (an estimate from this epoch: up to {gain:.2f}x, {1e3 * step:.1f} -> {1e3 * step / gain:.1f} ms; {unseen};"
        " measure it on your steps: TunedDataModule(autotune=OnlineTuning()), or for a plain DataLoader"
        " TunedDataModule.from_loaders(loader, autotune=OnlineTuning()))"
    )


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


#: Loading a batch in the training process cheaper than this is about what a worker's hand-over of it costs:
#: benchmarks/online.py's dict of small tensors (batch 8) read 0.46x at one worker (issue 37's: 0.34x).
HANDOVER_FLOOR_S = 0.002


def handover_floor_words(work: float) -> str:
    """Advice for a loader whose batches cost less to make here than a worker's hand-over would."""
    return (
        f"each batch takes {1e3 * work:.1f} ms to load in the training process, about what a worker process's"
        " hand-over of it costs (pickling, shared memory, the pin thread): workers may well be slower, so no"
        " worker count is advised; TunedDataModule(autotune=OnlineTuning()) measures it on your steps (also"
        " TunedDataModule.from_loaders(loader, autotune=OnlineTuning()) for a plain DataLoader); cheaper loading"
        " (fewer, larger tensors per sample) helps either way"
    )
