"""The memory-pressure rule: swap, page-fault storms, a nearly full ``/dev/shm``, pinned memory beyond RAM."""

from __future__ import annotations

from lightning_dataperf.diagnosis.evidence import Evidence
from lightning_dataperf.diagnosis.findings import Finding

__all__ = ["MAJOR_FAULTS_PER_SEC", "SHM_FREE_MB", "SWAP_USED_MB", "memory_pressure"]

#: Swap in use above this (MiB) is named: a little swap holds idle pages pushed out long ago and costs nothing;
#: more means the working set (workers' copies, prefetched batches) outgrew RAM.
SWAP_USED_MB = 256.0
#: Major page faults per second above this: each blocks its thread on a read from storage (a millisecond or
#: more), so a hundred a second can hold a process a tenth of its time.
MAJOR_FAULTS_PER_SEC = 100.0
#: Free ``/dev/shm`` below this (MiB): workers hand every batch over through it, and a few large batches in
#: flight (num_workers x prefetch_factor of them) no longer fit, and a worker then dies with a bus error.
SHM_FREE_MB = 256.0


def memory_pressure(evidence: Evidence) -> Finding | None:
    """Any of the thresholds above crossed this epoch; a side note (share 0), never the bottleneck.

    Example::

        finding = memory_pressure(evidence)
        finding.headline      # "memory pressure: swap_used_mb=2048"
    """
    system = evidence.system
    numbers = {}
    if (swap := system.swap_used_mb) is not None and swap > SWAP_USED_MB:
        numbers["swap_used_mb"] = swap
    if (faults := system.major_faults_per_sec) is not None and faults > MAJOR_FAULTS_PER_SEC:
        numbers["major_faults_per_sec"] = faults
    shm_free = system.shm_free_mb
    if shm_free is not None and shm_free < SHM_FREE_MB:
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
