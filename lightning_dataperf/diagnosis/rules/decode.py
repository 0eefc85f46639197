"""The input-bound cause on the GPU-decode path: what keeps a GpuDecodeLoader's step waiting for decoded batches."""

from __future__ import annotations

import math

from lightning_dataperf.decode.stats import GPU_BACKENDS, DecodeStats
from lightning_dataperf.diagnosis.evidence import Evidence

__all__ = ["GPU_BACKENDS", "compile_prediction", "decoded_on", "gpu_decode_cause", "placement_words"]

#: The JPEG engines busier than this (NVML's share of time with an engine at work) are the decode path's limit:
#: past it a batch's images queue behind the previous batch's, as a CPU past its cores does.
ENGINE_BUSY_PERCENT = 80.0
#: A decode thread (or its GPU work) needing at least this share of the step per batch keeps the step waiting:
#: below 1 because batches do not arrive evenly, and a stage with less slack than that falls behind at times.
DECODE_PACE_SHARE = 0.8
#: A host gap (the GPU idle inside the step, waiting for the training thread's launches) at least this share
#: of the step span is worth compiling away.
HOST_GAP_SHARE = 0.1
#: How the step is compiled (issue 38): one CUDA graph per step leaves the training thread almost no CPU work.
COMPILE_RECIPE = (
    'torch.compile(model, mode="reduce-overhead") in the LightningModule (CUDA graphs; or capture the step '
    "with torch.cuda.graphs yourself), docs/gpu_decode.md"
)


def compile_prediction(evidence: Evidence, decode: DecodeStats) -> str | None:
    """What compiling the step would give on an eager GPU-decode run, from the measured host gap: ``None``
    where the step is already compiled, or the host-gap probe did not run or found the step's gap small.

    Compiled with CUDA graphs, the step's host gap goes (the GPU no longer waits for the training thread's
    launches) and the training thread leaves the GIL to the decode threads, so the step is bound by the GPU's
    busy time or by the decode path's own pace, whichever is longer: the decode thread's and the prepare
    thread's own CPU time per batch (what they need without the training thread), and the decode library's
    call where it runs in a thread of its own. Issue 38's measurement on an H200: a batched nvJPEG decode
    thread beside a ResNet-18 step captured as one CUDA graph cost the step 0-3%, beside the eager step 19-35%.
    """
    gap = evidence.summary.host_gap
    step = evidence.step_mean
    if evidence.step_compiled is not None:
        return None
    if gap is None or not step or gap.gpu_busy_s <= 0 or gap.gap_share < HOST_GAP_SHARE:
        return None
    pace = max(
        decode.per_batch(decode.submit_cpu_seconds),
        decode.per_batch(decode.prepare_cpu_seconds),
        decode.per_batch(decode.call_seconds),
    )
    predicted = max(gap.gpu_busy_s, pace)
    # a predicted gain under 5% is within what one epoch's figures can tell: no advice to compile for it
    if predicted >= 0.95 * step:
        return None
    binds = "the GPU's busy time" if gap.gpu_busy_s >= pace else "the decode path's own pace"
    return (
        f"compiling the step would remove its host gap of {1e3 * gap.host_gap_s:.1f} ms (GPU busy "
        f"{1e3 * gap.gpu_busy_s:.1f} ms of a {1e3 * gap.span_s:.1f} ms span): predicted {1e3 * predicted:.1f} ms per "
        f"step instead of {1e3 * step:.1f} ms, {step / predicted:.2f}x the images/s, bound then by {binds} (the "
        f"decode threads need {1e3 * pace:.1f} ms per batch of their own CPU); how: {COMPILE_RECIPE}"
    )


def gpu_decode_cause(evidence: Evidence, decode: DecodeStats) -> tuple[str, str, list[str]]:
    """``(kind, words, advice)``: the engines, the decode thread, its GPU work, or the workers reading the files.

    Example::

        kind, words, advice = gpu_decode_cause(evidence, evidence.summary.decode)
        kind                  # "input_bound_decode"
        words                 # "GPU decode, the decode thread's submission"
    """
    step = evidence.step_mean
    wall, cpu = decode.per_batch(decode.submit_seconds), decode.per_batch(decode.submit_cpu_seconds)
    gpu, engine = decode.per_batch(decode.decode_seconds), decode.jpeg_util_percent
    where = decoded_on(evidence, decode)
    split = (
        f", {100 * decode.cpu_share / decode.images:.0f}% of the images by the CPU workers" if decode.cpu_share else ""
    )
    facts = (
        f"the step waited {1e3 * decode.wait_per_take:.1f} ms per batch for decoded images, with "
        f"{decode.lookahead_mean:.1f} of them ready on average ({decode.backend or where} decode{split})"
    )
    if where == "CPU":
        return _on_cpu(decode, facts, wall)
    kind, words, advice = _cause(evidence, decode, facts, wall, cpu, gpu, engine, step)
    extra = [compile_prediction(evidence, decode), placement_words(evidence)]
    return kind, words, [*advice, *(line for line in extra if line is not None)]


#: Two step rates closer than this many of their combined standard errors are not called faster or slower.
PLACEMENT_NOISE = 2.0


def placement_words(evidence: Evidence) -> str | None:
    """Where the decode measured faster on this run's steps: the online loop's CPU-workers-only and GPU-only
    ends of the split decode, with their rates (``None``: the loop did not measure both).

    Example::

        placement_words(evidence)
        # "measured by the online loop on this run's steps: the CPU workers alone (gpu_share=0, 8 workers) 48.0
        #  steps/s (6144 images/s), the GPU decode alone (gpu_share=1) 39.0 steps/s (4992 images/s): ..."
    """
    placed = evidence.decode_placement
    if placed is None:
        return None
    decode = evidence.summary.decode
    per_batch = decode.images / decode.batches if decode is not None and decode.batches else None

    def rate(steps: float) -> str:
        return f"{steps:.1f} steps/s" + (f" ({steps * per_batch:.0f} images/s)" if per_batch else "")

    cpu, gpu = placed.cpu_only, placed.gpu_only
    noise = PLACEMENT_NOISE * math.hypot(cpu * placed.cpu_only_error, gpu * placed.gpu_only_error)
    if abs(cpu - gpu) <= noise:
        verdict = "the two ends measured the same within their noise"
    elif cpu > gpu:
        verdict = f"the CPU workers decode faster here, {cpu / gpu:.2f}x the GPU decode's rate"
    else:
        verdict = f"the GPU decode is faster here, {gpu / cpu:.2f}x the CPU workers' rate"
    kept = (
        f"; the loop kept gpu_share={placed.kept_share:g} at {rate(placed.kept)}"
        if placed.kept_share is not None and placed.kept is not None
        else ""
    )
    return (
        f"measured by the online loop on this run's steps: the CPU workers alone (gpu_share=0, "
        f"{placed.cpu_only_workers} workers) {rate(cpu)}, the GPU decode alone (gpu_share=1) {rate(gpu)}: "
        f"{verdict}{kept}"
    )


def decoded_on(evidence: Evidence, decode: DecodeStats) -> str:
    """``"CPU"`` or ``"GPU"``: where the batches were decoded, from the evidence.

    PIL decodes on the CPU (a loader on a machine without CUDA); the GPU libraries on the GPU. A backend that is
    neither (a custom backend object, or a summary that did not record it) decodes where the run computes.

    Example::

        decoded_on(evidence, DecodeStats(backend="pil"))   # "CPU"
    """
    if decode.backend == "pil":
        return "CPU"
    if decode.backend in GPU_BACKENDS or evidence.summary.on_device:
        return "GPU"
    return "CPU"


def _on_cpu(decode: DecodeStats, facts: str, wall: float) -> tuple[str, str, list[str]]:
    """The decode thread decodes on the CPU: no engines, no GPU time to weigh; the advice is the GPU."""
    took = f"{1e3 * wall:.1f} ms per batch"
    if decode.backend in ("pil", ""):  # no CUDA: the same loader decodes with PIL in its thread
        library = "with PIL" if decode.backend else "on the CPU"
        return (
            "input_bound_decode",
            "decode on the CPU (no CUDA device)",
            [f"{facts}; without CUDA the decode thread decodes {library} ({took}): run on a GPU"],
        )
    return (
        "input_bound_decode",
        f"decode on the CPU ({decode.backend} backend)",
        [f"{facts}; the decode thread decodes on the CPU with the {decode.backend} backend ({took}): run on a GPU"],
    )


def _cause(
    evidence: Evidence,
    decode: DecodeStats,
    facts: str,
    wall: float,
    cpu: float,
    gpu: float,
    engine: float | None,
    step: float | None,
) -> tuple[str, str, list[str]]:
    if engine is not None and engine >= ENGINE_BUSY_PERCENT:
        return (
            "input_bound_decode",
            "GPU decode, the JPEG engines are busy",
            [
                f"{facts}; the JPEG engines are {engine:.0f}% busy: the hardware decoder binds; store the images "
                "smaller (fewer pixels to decode) or spread the decode over more GPUs"
            ],
        )
    if not step:
        return ("input_bound_unknown", "GPU decode, cause not measured", [f"{facts}; the step time was not measured"])
    call = decode.per_batch(decode.call_seconds)
    if call >= DECODE_PACE_SHARE * step and call >= wall:
        advice = [_call_advice(facts, call, step, engine)]
        return ("input_bound_decode", "GPU decode, the decode library's call", advice)
    if wall >= DECODE_PACE_SHARE * step:
        return (
            "input_bound_decode",
            "GPU decode, the decode thread's submission",
            [
                f"{facts}; the decode thread needs {1e3 * wall:.1f} ms per batch ({1e3 * cpu:.1f} ms of its own CPU, "
                f"the rest waiting for the GIL or a core) for a {1e3 * step:.1f} ms step, and the JPEG engines are "
                + ("not measured" if engine is None else f"only {engine:.0f}% busy")
                + ": the submission binds, not the decoder; "
                + _fewer_python_calls(evidence)
            ],
        )
    if gpu >= DECODE_PACE_SHARE * step:
        return (
            "input_bound_decode",
            "GPU decode, its time on the GPU",
            [
                f"{facts}; from the decode's start to the augment's end {1e3 * gpu:.1f} ms pass per batch on the "
                "GPU (its work and its waits behind the step's), next to the step's own"
            ],
        )
    # Neither the decode thread nor its GPU side keeps the step waiting: the encoded batches arrive late. The
    # workers behind a GpuDecodeLoader are not instrumented, so only the machine's idle cores say whether more help.
    idle, starved = evidence.idle_cpus, evidence.training_thread_starved
    workers = evidence.loader.num_workers
    now = f" (now {workers})" if workers is not None else ""
    if starved:
        more = "the training thread already waits for a CPU: make reading cheaper (local storage, larger files)"
    elif idle is None:
        more = f"idle cores were not measured this epoch: raise the wrapped loader's num_workers{now} if some are"
    elif idle >= 1.0:
        more = f"about {idle:.0f} cores are idle: raise the wrapped loader's num_workers{now}"
    else:
        more = "no core is idle to run more of them: make reading cheaper (local storage, larger files)"
    return (
        "input_bound_workers",
        "the workers reading the files for the GPU decode",
        [
            f"{facts}; the decode thread ({1e3 * wall:.1f} ms per batch) and its GPU side ({1e3 * gpu:.1f} ms) keep up "
            f"with the {1e3 * step:.1f} ms step, so the encoded batches arrive late (the workers behind the "
            f"GpuDecodeLoader are not measured inside); {more}"
        ],
    )


def _call_advice(facts: str, call: float, step: float, engine: float | None) -> str:
    """The decode library's call (in a thread of its own) takes about a step or more per batch."""
    busy = "not measured" if engine is None else f"{engine:.0f}% busy"
    return (
        f"{facts}; the decode library's call takes {1e3 * call:.1f} ms per batch for a {1e3 * step:.1f} ms step "
        f"(the JPEG engines {busy}): the decoder binds, not the loader's threads. Measured on an H200 "
        "(benchmarks/README.md, issue 38): after the engines, nvJPEG puts a copy and a colour conversion per image "
        "on the GPU, which wait behind the step's work, so beside a step that keeps the GPU busy a batch decodes "
        "at a fraction of its idle rate, with every decode library tried; store the images smaller (fewer pixels "
        "to decode), or spread the decode over more GPUs"
    )


def _fewer_python_calls(evidence: Evidence) -> str:
    """How the training thread can leave the decode thread more of the GIL: compiling, unless it is compiled."""
    if evidence.step_compiled is None:
        return (
            "fewer Python calls in the training step (torch.compile, CUDA graphs) leave the decode thread more of "
            "the GIL, and graph_augment=True keeps the augment to one launch"
        )
    return (
        f"the step is already compiled ({evidence.step_compiled}): the training thread's remaining Python (per-step "
        "logging, host syncs such as .item()) and a lower gpu_share (the loader's workers decode the rest, "
        "GpuDecodeLoader(gpu_share=...)) leave the decode thread more of the GIL; graph_augment=True keeps the "
        "augment to one launch"
    )
