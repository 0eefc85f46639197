"""The input-bound cause on the GPU-decode path: what keeps a GpuDecodeLoader's step waiting for decoded batches.

Judged from the loader's own telemetry for the epoch (:class:`~lightning_dataperf.decode_stats.DecodeStats`):
the JPEG engines' utilisation (NVML), the decode thread's wall and CPU time per batch, the GPU time of decode
and augment, against the step.

Example::

    kind, words, advice = gpu_decode_cause(evidence, evidence.summary.decode)
    kind                  # "input_bound_decode"
    words                 # "GPU decode, the decode thread's submission"
"""

from __future__ import annotations

import math

from lightning_dataperf.decode_stats import DecodeStats
from lightning_dataperf.evidence import Evidence

__all__ = ["gpu_decode_cause"]

#: The JPEG engines busier than this (NVML) are the decode path's limit.
ENGINE_BUSY_PERCENT = 80.0
#: A decode thread (or its GPU work) needing at least this share of the step per batch keeps the step waiting.
DECODE_PACE_SHARE = 0.8


def gpu_decode_cause(evidence: Evidence, decode: DecodeStats) -> tuple[str, str, list[str]]:
    """``(kind, words, advice)``: the engines, the decode thread, its GPU work, or the workers reading the files."""
    step = evidence.step_mean or 0.0
    wall, cpu = decode.per_batch(decode.submit_seconds), decode.per_batch(decode.submit_cpu_seconds)
    gpu, engine = decode.per_batch(decode.decode_seconds), decode.jpeg_util_percent
    on_cpu = decode.backend == "pil"  # no CUDA: the same loader decodes with PIL in its thread
    facts = (
        f"the step waited {1e3 * decode.wait_per_take:.1f} ms per batch for decoded images, with "
        f"{decode.lookahead_mean:.1f} of them ready on average ({decode.backend or 'GPU'} decode)"
    )
    if on_cpu:
        return (
            "input_bound_decode",
            "decode on the CPU (no CUDA device)",
            [f"{facts}; without CUDA the decode thread decodes with PIL ({1e3 * wall:.1f} ms per batch): run on a GPU"],
        )
    if not math.isnan(engine) and engine >= ENGINE_BUSY_PERCENT:
        return (
            "input_bound_decode",
            "GPU decode, the JPEG engines are busy",
            [
                f"{facts}; the JPEG engines are {engine:.0f}% busy: the hardware decoder binds; store the images "
                "smaller (fewer pixels to decode) or spread the decode over more GPUs"
            ],
        )
    if step and wall >= DECODE_PACE_SHARE * step:
        return (
            "input_bound_decode",
            "GPU decode, the decode thread's submission",
            [
                f"{facts}; the decode thread needs {1e3 * wall:.1f} ms per batch ({1e3 * cpu:.1f} ms of its own CPU, "
                f"the rest waiting for the GIL or a core) for a {1e3 * step:.1f} ms step, and the JPEG engines are "
                + ("not measured" if math.isnan(engine) else f"only {engine:.0f}% busy")
                + ": the submission binds, not the decoder; fewer Python calls in the training step (torch.compile, "
                "CUDA graphs) leave the decode thread more of the GIL, and graph_augment=True keeps the augment "
                "to one launch"
            ],
        )
    if step and gpu >= DECODE_PACE_SHARE * step:
        return (
            "input_bound_decode",
            "GPU decode, its GPU work",
            [f"{facts}; decode and augment take {1e3 * gpu:.1f} ms of GPU time per batch next to the step's"],
        )
    workers = evidence.loader.num_workers
    return (
        "input_bound_workers",
        "the workers reading the files for the GPU decode",
        [
            f"{facts}; the decode thread ({1e3 * wall:.1f} ms per batch) and its GPU work ({1e3 * gpu:.1f} ms) keep "
            f"up with the {1e3 * step:.1f} ms step, so it waits for the workers reading the files: raise the "
            "wrapped loader's num_workers" + (f" (now {workers})" if workers is not None else "")
        ],
    )
