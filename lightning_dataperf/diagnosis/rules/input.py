"""The input-bound verdict: why the step waits for the loader, and what would help by how much (docs/diagnosis.md)."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_dataperf import tags
from lightning_dataperf.diagnosis.evidence import Evidence
from lightning_dataperf.diagnosis.findings import Finding
from lightning_dataperf.diagnosis.rules import cores
from lightning_dataperf.diagnosis.rules import estimate as estimates
from lightning_dataperf.diagnosis.rules.decode import gpu_decode_cause
from lightning_dataperf.diagnosis.rules.thresholds import SIGNIFICANT_SHARE
from lightning_dataperf.loader.policy import workers_needed

__all__ = ["SIGNIFICANT_SHARE", "input_bound"]

#: Workers busier than this (fetch + collate over wall time, measured in the workers) are the limit: below 1
#: because a saturated worker still spends some of its time between batches (taking an index, the hand-over).
SATURATED_BUSY = 0.85
#: ... or, when the CPUs are spent, busier than this (idle workers on a busy machine are not its CPU load).
BUSY_WHEN_SPENT = 0.5
#: iowait (% of a core, mean across cores) or disk %util above which storage is the suspect: a tenth of the
#: cores' time blocked on I/O, or a disk with a request in flight most of the time.
IOWAIT_PERCENT, DISK_UTIL_PERCENT = 10.0, 80.0
#: ... but only when this run itself read at least this much (MiB/s, this process and its workers, any
#: filesystem): iowait and %util are machine-wide, and another process's writes can look like storage.
OWN_READ_MBPS = 1.0


@dataclass(frozen=True)
class _Cause:
    kind: str
    words: str
    advice: list[str]


def input_bound(evidence: Evidence) -> Finding | None:
    """The step waits for the loader for at least :data:`SIGNIFICANT_SHARE` of it: the measured cause and advice.

    Example::

        finding = input_bound(evidence)
        finding.kind          # "input_bound_cpu"
        finding.advice[0]     # "15 workers are 97% busy and the CPUs are spent: more workers cannot help ..."
    """
    summary = evidence.summary
    share = summary.input_stall_fraction
    if share is None or share < SIGNIFICANT_SHARE:
        return None
    own, step = summary.own_data_wait, evidence.step_mean  # the rank whose loader figures the verdict reads
    if evidence.straggling and own is not None and step and own < SIGNIFICANT_SHARE * step:
        return None  # the ranks' mean stall is the straggler's wait (its finding names it): not this rank's loader
    if summary.on_device and not evidence.host_explains_idle():
        # the GPU idles but the host was not waiting for data: host-bound, not input-bound
        return None
    numbers: dict[str, float] = {"input_stall_fraction": share}
    if (wait := evidence.timing(tags.DATA_LOADING)) is not None:
        numbers["data_loading_ms"] = 1e3 * wait
    if summary.on_device and (idle := evidence.timing(tags.DEVICE_IDLE)) is not None:
        numbers["device_idle_ms"] = 1e3 * idle
    if evidence.loader.num_workers is not None:
        numbers["num_workers"] = float(evidence.loader.num_workers)
    inside = summary.loader
    if inside is not None:
        numbers["workers_fetch_ms"] = 1e3 * inside.fetch_s
        numbers["workers_collate_ms"] = 1e3 * inside.collate_s
        if inside.busy_fraction is not None:
            numbers["workers_busy_fraction"] = inside.busy_fraction
    system = evidence.system
    for key in ("worker_cpu_percent_mean", "cpu_busy_percent_mean", "runnable_tasks", "cpu_iowait_percent_mean"):
        if (value := getattr(system, key)) is not None:
            numbers[key] = value
    cause = _cause(evidence)
    if evidence.measured_online:
        # the loop measured worker settings on this run: its result, not a model's, speaks for them
        cause = _Cause(
            cause.kind, cause.words, [evidence.measured_online] + [a for a in cause.advice if "num_workers" not in a]
        )
    if cause.kind == "input_bound_storage" and system.disk_util_percent is not None:
        numbers["disk_util_percent"] = system.disk_util_percent
    if system.own_read_mbps is not None:
        numbers["own_read_mbps"] = system.own_read_mbps
    where = "the GPU sits idle waiting for input" if summary.on_device else "the step waits for the loader"
    advice = list(cause.advice)
    if contention := evidence.contention():
        advice.append(contention)
    if evidence.straggling:
        advice.append(
            f"no gain is predicted for this rank's loader: every rank's step also holds the wait for rank "
            f"{summary.slowest_rank} (the straggler above); fix that first, then judge this loader again"
        )
    if evidence.loader.persistent_workers is False and evidence.loader.num_workers and _several_epochs(evidence):
        advice.append("set persistent_workers=True so workers are not restarted every epoch")
    return Finding(
        kind=cause.kind,
        headline=f"input-bound ({cause.words}): {where} {100 * share:.0f}% of the step time",
        share=share,
        evidence=numbers,
        advice=advice,
    )


def _several_epochs(evidence: Evidence) -> bool:
    return evidence.planned_epochs is None or evidence.planned_epochs > 1


def _cause(evidence: Evidence) -> _Cause:
    system, loader, inside = evidence.system, evidence.loader, evidence.summary.loader
    iowait, disk = system.cpu_iowait_percent_mean, system.disk_util_percent
    busy_storage = (iowait is not None and iowait > IOWAIT_PERCENT) or (disk is not None and disk > DISK_UTIL_PERCENT)
    own = system.own_read_mbps
    if busy_storage and (own is None or own >= OWN_READ_MBPS):  # unknown: the machine-wide figures decide
        return _Cause("input_bound_storage", "storage", [_STORAGE_ADVICE])
    if (decode := evidence.summary.decode) is not None and decode.takes:
        return _Cause(*gpu_decode_cause(evidence, decode))
    if loader.num_workers == 0:
        return _in_main_process(evidence)
    if inside is None or inside.busy_fraction is None:
        return _without_inside(evidence)
    busy_on_spent = inside.busy_fraction >= BUSY_WHEN_SPENT and cores.cpus_spent(evidence)
    if inside.busy_fraction >= SATURATED_BUSY or busy_on_spent:
        if cores.waiting_not_computing(evidence):
            return _latency_bound(evidence)
        return _cpu_bound(evidence)
    if inside.handover_s <= inside.worker_wait_s:  # the wait is for a batch still being made
        return _Cause(
            "input_bound_workers",
            "batches arrive late though the workers idle at times",
            [
                f"the workers are {100 * inside.busy_fraction:.0f}% busy, yet each batch is waited for "
                f"{1e3 * inside.worker_wait_s:.1f} ms while it is still being made: uneven samples (one slow "
                f"sample holds its batch) or too little in flight; raise prefetch_factor (now {loader.prefetch_factor})"
            ],
        )
    if inside.busy_fraction >= BUSY_WHEN_SPENT and not cores.waiting_not_computing(evidence):
        return _Cause(
            "input_bound_cpu",
            "CPU preprocessing in the workers, which also delays their hand-over",
            [
                f"the workers are {100 * inside.busy_fraction:.0f}% busy computing, and each finished batch waits "
                f"{1e3 * inside.handover_s:.1f} ms before the training process has it: a DataLoader worker sends its "
                "batch from a second thread of its process, which needs the worker's GIL while the worker computes "
                f"the next batch; make __getitem__ ({1e3 * inside.fetch_s:.1f} ms of worker time per batch) cheaper "
                "or GIL-free (vectorised or C-backed transforms, decode on the GPU)"
            ],
        )
    spent = f"each batch spends {1e3 * inside.handover_s:.1f} ms in the hand-over (worker queue, unpickling in the " + (
        "training process)" + (f" and {1e3 * inside.pin_s:.1f} ms being pinned" if inside.pin_s else "")
    )
    if cores.oversubscribed(evidence):
        others = cores.others_cpus(evidence)
        outside = f", {others:.1f} cores' worth by processes outside this run" if others is not None else ""
        return _Cause(
            "input_bound_handover",
            "the hand-over, slowed by CPU contention",
            [
                f"the workers are only {100 * inside.busy_fraction:.0f}% busy, yet {spent}: the training process "
                f"takes each batch itself and waits for a CPU to do it ({evidence.system.runnable_tasks:.0f} runnable "
                f"tasks on {evidence.usable_cpus} usable CPUs{outside}); free CPUs for it, then judge again"
            ],
        )
    return _Cause(
        "input_bound_handover",
        "the batches' hand-over to the training process",
        [
            f"the workers are only {100 * inside.busy_fraction:.0f}% busy, yet the step waits: {spent}; send fewer, "
            "larger tensors per batch (one stacked tensor instead of many small ones) and raise prefetch_factor "
            f"(now {loader.prefetch_factor}) so ready batches queue up"
        ],
    )


def _step_and_compute(evidence: Evidence) -> tuple[float | None, float | None]:
    """The step and its work to predict from; no step (so no prediction) while the ranks wait for a straggler."""
    step = None if evidence.straggling else evidence.step_mean
    compute = evidence.step_work
    return step, compute


def _budget(evidence: Evidence) -> int | None:
    """Workers this rank can run next to its training process (on a CPU run its threads are cut to make room)."""
    if evidence.usable_cpus is None:
        return None
    # benchmarks/online.py, 2 cores: 2 workers + 1 thread 1.68x and 1.89x, 1 worker + 1 thread 1.03x and 0.99x
    return evidence.usable_cpus if not evidence.summary.on_device else max(1, evidence.usable_cpus - 1)


def _in_main_process(evidence: Evidence) -> _Cause:
    inside, step, compute = evidence.summary.loader, *_step_and_compute(evidence)
    budget = _budget(evidence)
    advice = []
    work = None if inside is None else inside.work_s + inside.pin_s
    below_floor = work is not None and work < estimates.HANDOVER_FLOOR_S and not evidence.summary.on_device
    if below_floor:
        advice.append(estimates.handover_floor_words(work))
    elif inside is not None and work is not None and compute and budget:
        # the rule the online loop's first trial follows too (loader/policy.py first_workers): the two agree
        workers = workers_needed(work, compute, budget)
        beside = estimates.compute_beside(evidence, compute, workers)
        new_step = max(beside, work / workers)
        if not evidence.summary.on_device:
            # on a CPU run the workers' loading and this process's step share the cores
            new_step = max(new_step, (work + beside) / budget)
        change = f"set num_workers={workers}" + estimates.threads_beside(evidence, workers)
        advice.append(
            f"each batch takes {1e3 * work:.1f} ms to load in the training process (fetch {1e3 * inside.fetch_s:.1f}"
            f" + collate {1e3 * inside.collate_s:.1f} ms) next to {1e3 * compute:.1f} ms of compute: "
            + estimates.advised(evidence, step, new_step, change, estimates.UNSEEN_FIRST_WORKERS)
        )
    else:
        advice.append("num_workers=0 loads every batch in the training process: set num_workers > 0")
    # the policy's count is no CPU run's answer (the quickstart on 2 cores: its 1 worker read 1.00x, 2 read 1.85x)
    if evidence.autotune or evidence.summary.on_device:
        advice.append(evidence.autotune or "TunedDataModule picks num_workers from the CPUs this process may use")
    return _Cause("input_bound_workers", "batches are loaded in the training process (num_workers=0)", advice)


def _cpu_bound(evidence: Evidence) -> _Cause:
    inside, loader, system = evidence.summary.loader, evidence.loader, evidence.system
    assert inside is not None and inside.busy_fraction is not None
    workers = loader.num_workers or inside.workers
    step, compute = _step_and_compute(evidence)
    busy_pct = 100 * inside.busy_fraction
    spare = evidence.idle_cpus
    advice = []
    starved = evidence.training_thread_starved
    if spare is None:
        advice.append(
            f"{workers} workers are {busy_pct:.0f}% busy; the machine's idle cores were not measured this epoch "
            "(no telemetry sample): raise num_workers only if cores are idle"
        )
        words = "CPU preprocessing"
    elif spare >= cores.MIN_SPARE_CPUS and not starved and workers:
        added = max(1, round(spare))
        beside = estimates.compute_beside(evidence, compute or 0.0, workers + added)
        predicted = max(beside, (step or 0.0) * workers / (workers + min(added, spare)))
        change = f"raise num_workers from {workers} to {workers + added}" + estimates.threads_beside(
            evidence, workers + added
        )
        advice.append(
            f"{workers} workers are {busy_pct:.0f}% busy and about {spare:.{0 if spare >= 2 else 1}f} cores are idle: "
            + estimates.advised(evidence, step, predicted, change, estimates.UNSEEN_MORE_WORKERS)
        )
        words = "CPU preprocessing, with idle cores"
    elif cores.threads_hold_cores(evidence, workers):
        # benchmarks/online.py, fft on 2 cores: 1 worker + 2 threads 7.5 steps/s, 2 workers + 1 thread 14.0
        threads, cpus = evidence.intra_op_threads, evidence.usable_cpus
        predicted = max(estimates.compute_beside(evidence, compute or 0.0, cpus), (step or 0.0) * workers / cpus)
        change = f"set num_workers={cpus}" + estimates.threads_beside(evidence, cpus)
        advice.append(
            f"{workers} workers are {busy_pct:.0f}% busy and the CPUs are spent, {threads} of them by this process's "
            "intra-op threads: " + estimates.advised(evidence, step, predicted, change, estimates.UNSEEN_MORE_WORKERS)
        )
        words = "CPU preprocessing, cores held by the training process's intra-op threads"
    else:
        runnable = f", {system.runnable_tasks:.0f} runnable tasks" if system.runnable_tasks is not None else ""
        cpus = f" on {evidence.usable_cpus} usable CPUs" if evidence.usable_cpus is not None else ""
        others = cores.others_cpus(evidence)
        shared = not starved and others is not None and others >= 1.0 and cores.oversubscribed(evidence) and workers
        if shared:
            # The scheduler shares the cores per runnable task: one worker more takes its share from the others.
            tasks = evidence.system.runnable_tasks or 1.0
            faster = (workers + 1) / workers * tasks / (tasks + 1)
            # the training process loses the same share of its core: on the CPU its own work slows too
            slower = 1.0 if evidence.summary.on_device else (tasks + 1) / tasks
            predicted = max((compute or 0.0) * slower, (step or 0.0) / faster)
            advice.append(
                f"{workers} workers are {busy_pct:.0f}% busy and the CPUs are shared with processes outside this run "
                f"({others:.1f} cores' worth{runnable}{cpus}): a worker more takes its share of the cores from them: "
                + estimates.advised(
                    evidence, step, predicted, f"set num_workers={workers + 1}", estimates.UNSEEN_MORE_WORKERS
                )
                + "; on a machine of your own, free the CPUs"
            )
            words = "CPU preprocessing, CPUs shared with other processes"
        else:
            why = "the training thread already waits for a CPU" if starved else f"the CPUs are spent{runnable}{cpus}"
            advice.append(f"{workers} workers are {busy_pct:.0f}% busy and {why}: more workers cannot help")
            words = "CPU preprocessing, the CPUs are spent"
    advice.append(
        f"__getitem__ (read, decode, augment) takes {1e3 * inside.fetch_s:.1f} ms of worker time per batch "
        f"({100 * inside.fetch_share:.0f}% of the workers' time; collate {1e3 * inside.collate_s:.1f} ms): make it "
        "cheaper (smaller stored images, cached decoded samples)"
    )
    if evidence.summary.on_device:
        share = evidence.summary.input_stall_fraction or 0.0
        advice.append(
            "decode and augment on the GPU instead (JPEG: lightning_dataperf.decode, docs/gpu_decode.md; "
            "otherwise ship uint8 and normalise with SideStreamStrategy(device_transform=...)): ceiling "
            f"{1 / max(1e-6, 1 - share):.2f}x if input cost nothing"
        )
    if line := evidence.autotune:
        advice.append(line)
    return _Cause("input_bound_cpu", words, advice)


def _latency_bound(evidence: Evidence) -> _Cause:
    inside, loader = evidence.summary.loader, evidence.loader
    assert inside is not None and inside.busy_fraction is not None
    workers = loader.num_workers or inside.workers
    step, compute = _step_and_compute(evidence)
    more = workers * 2
    predicted = max(compute or 0.0, (step or 0.0) * workers / more)
    ratio = inside.cpu_fraction
    computing = (
        f"compute only {100 * ratio:.0f}% of that time"
        if ratio is not None
        else f"use only {evidence.system.worker_cpu_percent_mean or 0.0:.0f}% of a core each"
    )
    waiting = (
        f"{workers} workers spend {100 * inside.busy_fraction:.0f}% of their time loading batches but {computing}: "
        "they wait (I/O latency, remote storage, sleeps)"
    )
    if lost := estimates.more_workers_lost(evidence):
        advice = [f"{waiting}; {lost}"]
    else:
        change = (
            f"raise num_workers from {workers} to {more}, and prefetch_factor (now {loader.prefetch_factor}) to keep"
            " more reads in flight"
        )
        advice = [
            f"{waiting}, so more of them overlap the waits: "
            + estimates.advised(evidence, step, predicted, change, estimates.UNSEEN_MORE_READS)
        ]
    if line := evidence.autotune:
        advice.append(line)
    return _Cause("input_bound_workers", "the workers wait on I/O latency", advice)


def _without_inside(evidence: Evidence) -> _Cause:
    """No in-loader figures: judge from process CPU%, and say so."""
    blind = evidence.loader_blind or "no batch timings reached the training process this epoch"
    note = f"inside the loader not measured ({blind}); judged from process CPU% only"
    cpu = evidence.system.worker_cpu_percent_mean
    if cpu is None:
        return _Cause(
            "input_bound_unknown",
            "cause not measured",
            [f"{note}, and no worker CPU sample was taken in this epoch (too short, or telemetry off)"],
        )
    fair = cores.fair_share_percent(evidence)
    if cpu >= cores.CPU_SHARE_OF_FAIR * fair:
        return _Cause(
            "input_bound_cpu",
            "CPU preprocessing",
            [
                f"{note}: the workers use {cpu:.0f}% of a core each ({fair:.0f}% is their fair share): make "
                "preprocessing cheaper or move it to the GPU"
            ],
        )
    loader = evidence.loader
    settings = (
        f"raise num_workers from {loader.num_workers} and prefetch_factor (now {loader.prefetch_factor})"
        if loader.num_workers is not None and loader.prefetch_factor is not None
        else "raise the loader's workers and prefetch (its settings were not readable)"
    )
    settings = estimates.more_workers_lost(evidence) or settings
    return _Cause(
        "input_bound_workers",
        "too few loader workers",
        [f"{note}: the workers use only {cpu:.0f}% of a core each, so they mostly wait: {settings}"],
    )


_STORAGE_ADVICE = (
    "storage is the limit: copy the dataset to local NVMe or RAM (/dev/shm), use a sequential format "
    "(WebDataset/LitData shards) and raise prefetch_factor to keep more reads in flight"
)
