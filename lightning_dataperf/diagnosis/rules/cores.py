"""What the CPU measurements say about a loader: spent, shared with other processes, oversubscribed, waiting."""

from __future__ import annotations

from lightning_dataperf.diagnosis.evidence import Evidence

__all__ = [
    "CPU_SHARE_OF_FAIR",
    "MIN_SPARE_CPUS",
    "cpus_spent",
    "fair_share_percent",
    "others_cpus",
    "oversubscribed",
    "threads_hold_cores",
    "waiting_not_computing",
]

#: Fewer idle cores than this (measured: mean CPU busy % of the usable CPUs) leave no room for another worker.
MIN_SPARE_CPUS = 0.5
#: A worker using less CPU than this share of its fair share of the cores is waiting (I/O, sleeps), not computing.
CPU_SHARE_OF_FAIR = 0.6
#: ... and, measured in the worker itself: CPU time over wall time in fetch + collate below this is waiting.
FETCH_CPU_WAITING = 0.3


def oversubscribed(evidence: Evidence) -> bool:
    """Measured: more runnable tasks than usable CPUs this epoch (every task waits for a core at times)."""
    runnable, cpus = evidence.system.runnable_tasks, evidence.usable_cpus
    return runnable is not None and cpus is not None and runnable > cpus


def cpus_spent(evidence: Evidence) -> bool:
    """No core to spare, measured: the CPUs this rank may use are busy (by this run or others) this epoch."""
    spare = evidence.idle_cpus
    return spare is not None and spare < MIN_SPARE_CPUS


def threads_hold_cores(evidence: Evidence, workers: int | None) -> bool:
    """A CPU run whose intra-op threads and busy workers outnumber the cores, with fewer workers than cores."""
    threads, cpus = evidence.intra_op_threads, evidence.usable_cpus
    if evidence.summary.on_device or not threads or not cpus or not workers:
        return False
    return threads > 1 and workers < cpus and workers + threads > cpus


def others_cpus(evidence: Evidence) -> float | None:
    """Cores' worth of CPU used by processes other than this run (machine busy less the training tree's own)."""
    system, cpus = evidence.system, evidence.usable_cpus
    if system.cpu_busy_percent_mean is None or system.main_cpu_percent is None or cpus is None:
        return None
    own = system.main_cpu_percent + (system.workers_cpu_percent or 0.0)
    return max(0.0, cpus * system.cpu_busy_percent_mean / 100.0 - own / 100.0)


def waiting_not_computing(evidence: Evidence) -> bool:
    """Busy in ``__getitem__`` but using little CPU there: the time goes to I/O latency or sleeps.

    Measured in the workers (their threads' CPU time over wall time in fetch + collate) where possible.
    Otherwise from process CPU%: on a saturated machine a CPU-bound worker gets only its fair share of a
    core (``100 * C / R`` % with ``R`` runnable tasks on ``C`` CPUs), so it is compared with that share.
    """
    inside = evidence.summary.loader
    if inside is not None and (ratio := inside.cpu_fraction) is not None:  # time-shared cores lower it too
        return ratio < FETCH_CPU_WAITING * fair_share_percent(evidence) / 100.0
    cpu = evidence.system.worker_cpu_percent_mean
    if cpu is None:
        return False
    return cpu < CPU_SHARE_OF_FAIR * fair_share_percent(evidence)


def fair_share_percent(evidence: Evidence) -> float:
    runnable, cpus = evidence.system.runnable_tasks, evidence.usable_cpus
    if runnable is None or cpus is None:
        return 100.0
    return 100.0 * min(1.0, cpus / max(1.0, runnable))
