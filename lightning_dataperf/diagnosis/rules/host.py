"""The host-bound rules: the host, not data or the model, keeps the step waiting (launches, syncs, loop overhead)."""

from __future__ import annotations

from lightning_dataperf import tags
from lightning_dataperf.diagnosis.evidence import Evidence
from lightning_dataperf.diagnosis.findings import Finding
from lightning_dataperf.diagnosis.rules.decode import placement_words
from lightning_dataperf.diagnosis.rules.thresholds import SIGNIFICANT_SHARE

__all__ = ["HOST_OVERHEAD_SHARE", "compiled_step_advice", "host_bound", "host_gap"]

#: CPU runs: per-step overhead (hooks, callbacks, logging) below this share of the step is not named. Higher
#: than SIGNIFICANT_SHARE because it is a remainder (step less compute, wait and copy): it also holds the
#: timers' own cost and what the other figures miss, so a small remainder is noise, not overhead.
HOST_OVERHEAD_SHARE = 0.25


def host_bound(evidence: Evidence) -> Finding | None:
    """Between steps: on CUDA the GPU idles though the host is not waiting for data; on the CPU, loop overhead.

    Example::

        finding = host_bound(evidence)
        finding.kind          # "host_bound"
    """
    if evidence.summary.on_device:
        return _device_starved_by_host(evidence)
    return _loop_overhead(evidence)


def _device_starved_by_host(evidence: Evidence) -> Finding | None:
    """CUDA: the GPU idles between steps though the host is not waiting for data — launches and syncs bind."""
    compute, step = evidence.step_work, evidence.step_mean
    idle = evidence.timing(tags.DEVICE_IDLE)
    if compute is None or idle is None or not step or evidence.host_explains_idle():
        return None
    if (copies := evidence.summary.copies) is not None:
        idle = max(0.0, idle - copies.exposed_s)  # waiting for a look-ahead copy is the transfer rule's
    share = idle / step
    if share < SIGNIFICANT_SHARE:
        return None
    wait = evidence.timing(tags.DATA_LOADING) or 0.0
    return Finding(
        kind="host_bound",
        headline=f"host-bound: the GPU idles {100 * share:.0f}% of the step though the host is not waiting for data",
        share=share,
        evidence={"device_idle_ms": 1e3 * idle, "device_span_ms": 1e3 * compute, "data_loading_ms": 1e3 * wait},
        advice=compiled_step_advice(evidence)
        or [
            "Python or kernel-launch overhead dominates: use a larger batch, torch.compile or CUDA graphs, "
            "and avoid per-step host syncs (.item(), .cpu(), printing tensors)",
        ],
    )


def host_gap(evidence: Evidence) -> Finding | None:
    """CUDA, from the host-gap probe: inside the step, the GPU waits for kernels the host launches late.

    Example::

        finding = host_gap(evidence)
        finding.headline      # "host-bound: inside each step the GPU waits 30% of the time for kernel launches"
    """
    gap, step = evidence.summary.host_gap, evidence.step_mean
    if gap is None or not step:
        return None
    share = min(gap.host_gap_s, step) / step
    if share < SIGNIFICANT_SHARE:
        return None
    numbers = {
        "host_gap_ms": 1e3 * gap.host_gap_s,
        "gpu_busy_ms": 1e3 * gap.gpu_busy_s,
        "step_span_ms": 1e3 * gap.span_s,
        "profiled_steps": float(gap.steps),
    }
    system, workers, cpus = evidence.system, evidence.loader.num_workers, evidence.usable_cpus
    runnable, queued = system.runnable_tasks, gap.main_runqueue_s
    if gap.main_cpu_fraction is not None:
        numbers["main_thread_cpu_fraction"] = gap.main_cpu_fraction
    if queued is not None:
        numbers["main_thread_runqueue_ms"] = 1e3 * queued
    # Starved, measured: the training thread waited on a run queue for a large part of the gap (schedstat),
    # or more tasks were runnable than CPUs, while loader workers run next to it.
    starved = gap.training_thread_starved
    crowded = workers and (starved or (runnable is not None and cpus is not None and runnable > cpus))
    if crowded:
        numbers.update(num_workers=float(workers))
        if runnable is not None and cpus is not None:
            numbers.update(runnable_tasks=runnable, usable_cpus=float(cpus))
        queue_words = f"; it waited {1e3 * queued:.1f} ms per step for a CPU" if queued is not None else ""
        load = f" (runnable tasks {runnable:.0f} on {cpus} usable CPUs)" if runnable is not None else ""
        headline = (
            f"host-bound: the main thread is starved for CPU by {workers} busy workers{load}{queue_words}: the "
            f"GPU waits for it {100 * share:.0f}% of each step"
        )
        # at least one worker fewer, and no more workers than the cores less two: the training thread's own core
        # and one for the rest of its process (pinning, the CUDA driver's threads)
        fewer = max(1, min(workers - 1, cpus - 2)) if cpus is not None else max(1, workers - 1)
        advice = [
            f"leave cores for the training process: num_workers <= {fewer}, or move decode/augment off "
            "the CPU (lightning_dataperf.decode for JPEG); the step would take about "
            f"{1e3 * (step - gap.host_gap_s):.1f} ms instead of {1e3 * step:.1f} ms without the gap",
        ]
    else:
        without = step - gap.host_gap_s
        headline = f"host-bound: inside each step the GPU waits {100 * share:.0f}% of the time for kernel launches"
        if advice := compiled_step_advice(evidence):
            headline = (
                f"host-bound: inside each compiled step the GPU waits {100 * share:.0f}% of the time for the host"
            )
            advice[0] += f"; without the gap a step would take {1e3 * without:.1f} ms instead of {1e3 * step:.1f} ms"
        else:
            advice = [
                "Python or kernel-launch overhead inside the step: torch.compile or CUDA graphs, a larger batch, and "
                f"no per-step host syncs (.item(), .cpu()); without the gap a step would take {1e3 * without:.1f} ms "
                f"instead of {1e3 * step:.1f} ms",
            ]
    return Finding(kind="host_bound", headline=headline, share=share, evidence=numbers, advice=advice)


def compiled_step_advice(evidence: Evidence) -> list[str]:
    """A compiled step kept waiting by its host: what the host was measured doing, largest first, and what
    shortens the largest; ``[]`` where the step is not compiled (the rules then advise compiling it).

    Example::

        compiled_step_advice(evidence)[0]
        # "the step is already compiled (torch.compile (CUDA graphs)): compiling again does not remove this wait;
        #  measured on the host, largest first: the training thread ran 8.0 ms on a CPU per 20.0-ms profiled ..."
    """
    if evidence.step_compiled is None:
        return []
    occupants = sorted(_host_occupants(evidence), key=lambda occupant: occupant[0], reverse=True)
    if occupants:
        largest, step = occupants[0][0], evidence.step_mean or 0.0
        # a remedy for the largest only where it could account for a stage's worth of the step
        remedy = (
            occupants[0][2]
            if largest >= SIGNIFICANT_SHARE * step
            else "none of these takes a tenth of the step: what else holds the host was not measured (a profile "
            "of a few steps with torch.profiler shows it)"
        )
        measured = "; ".join(words for _, words, _ in occupants)
        measured = f"measured on the host, largest first: {measured}; {remedy}"
    else:
        measured = (
            "what occupies the host was not measured this epoch (the host-gap probe's training-thread figures and "
            "the decode path's come from CUDA runs: DataPerfCallback(host_gap_probe=...), GpuDecodeLoader)"
        )
    compiled = f"the step is already compiled ({evidence.step_compiled}): compiling again does not remove this wait"
    advice = [f"{compiled}; {measured}"]
    if (placement := placement_words(evidence)) is not None:
        advice.append(placement)
    return advice


#: What shortens each thing the host was measured doing (``_host_occupants``), said for the largest.
TRAINING_THREAD_REMEDY = (
    "to shorten the training thread's part: no per-step host syncs (.item(), .cpu(), printing tensors) in "
    "training_step, log less often (log_every_n_steps), or a larger batch (fewer steps for the same images)"
)
DECODE_THREADS_REMEDY = (
    "the decode path's threads run in this process beside the training thread: a lower gpu_share moves part of "
    "each batch to the loader's workers (GpuDecodeLoader(gpu_share=...), docs/gpu_decode.md)"
)
HANDOVER_REMEDY = "the batches arrive late: the input-bound finding, where the wait makes one, says why"


def _host_occupants(evidence: Evidence) -> list[tuple[float, str, str]]:
    """``(seconds per step, words, remedy)`` for each thing measured on the host: the training thread, the decode
    path's threads in this process, the batch's hand-over from the loader."""
    found: list[tuple[float, str, str]] = []
    if (gap := evidence.summary.host_gap) is not None and gap.main_cpu_fraction is not None:
        span = gap.profiled_span_s or gap.span_s
        queued = "" if gap.main_runqueue_s is None else f", and waited {1e3 * gap.main_runqueue_s:.1f} ms for a core"
        words = (
            f"the training thread ran {1e3 * gap.main_cpu_fraction * span:.1f} ms on a CPU per {1e3 * span:.1f}-ms "
            f"profiled step (Python in training_step, the optimizer, Lightning's loop, the launches){queued}"
        )
        found.append((gap.main_cpu_fraction * span, words, TRAINING_THREAD_REMEDY))
    if (decode := evidence.summary.decode) is not None and decode.batches:
        call, submit = decode.per_batch(decode.call_seconds), decode.per_batch(decode.submit_seconds)
        prepare, own = decode.per_batch(decode.prepare_seconds), decode.per_batch(decode.submit_cpu_seconds)
        threads = [
            (call, f"the decode library's call {1e3 * call:.1f} ms per batch (a thread of its own)"),
            (submit, f"the decode thread {1e3 * submit:.1f} ms per batch ({1e3 * own:.1f} ms its own CPU)"),
            (prepare, f"preparing each batch {1e3 * prepare:.1f} ms (a thread of its own)"),
        ]
        found += [(seconds, words, DECODE_THREADS_REMEDY) for seconds, words in threads if seconds]
        if decode.takes:
            wait = decode.wait_per_take
            words = f"the hand-over: the step waited {1e3 * wait:.1f} ms per batch for decoded images"
            found.append((wait, words, HANDOVER_REMEDY))
    elif (fetch := evidence.timing(tags.DATA_LOADING)) is not None:
        words = f"the hand-over: the host waited {1e3 * fetch:.1f} ms per step in the loader's next()"
        found.append((fetch, words, HANDOVER_REMEDY))
    return found


def _loop_overhead(evidence: Evidence) -> Finding | None:
    """CPU: time outside data wait, transfer and the step itself (hooks, callbacks, logging) dominates."""
    compute, step = evidence.step_work, evidence.step_mean
    if compute is None or not step:
        return None
    wait = evidence.timing(tags.DATA_LOADING) or 0.0
    transfer = evidence.timing(tags.TRANSFER) or 0.0
    share = max(0.0, step - compute - wait - transfer) / step
    if share < HOST_OVERHEAD_SHARE:
        return None
    return Finding(
        kind="host_bound",
        headline=f"host-bound: {100 * share:.0f}% of each step is per-step framework overhead, not data or compute",
        share=share,
        evidence={"step_ms": 1e3 * step, "compute_ms": 1e3 * compute, "data_loading_ms": 1e3 * wait},
        advice=[
            "the batches are too small for the per-step cost of the loop (hooks, callbacks, logging, optimizer "
            "bookkeeping): raise the batch size, log less often (log_every_n_steps) and drop per-step callbacks",
        ],
    )
