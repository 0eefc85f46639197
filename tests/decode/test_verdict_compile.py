"""The verdict on an eager GPU-decode run says what compiling the step would give, from the measured host gap
(issue 38): the predicted step is the GPU's busy time or the decode path's own pace, whichever is longer. A
compiled step is never told to compile (issue 46); the decode figures say where the decode ran (issue 47)."""

from __future__ import annotations

import dataclasses

import lightning.pytorch as pl
import pytest
import torch
from helpers import SleepyModel, recorded_evidence, sleepy_loader, trainer_kwargs

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.decode.stats import DecodeStats
from lightning_dataperf.diagnosis.evidence import (
    STEP_COMPILED,
    STEP_COMPILED_CUDA_GRAPHS,
    DecodePlacementMeasured,
    Evidence,
)
from lightning_dataperf.diagnosis.rules.decode import compile_prediction, gpu_decode_cause
from lightning_dataperf.loader.settings import LoaderFacts
from lightning_dataperf.timing.host_gap import HostGapStats
from lightning_dataperf.timing.summary import EpochSummary, TimingSummary


def _evidence(decode: DecodeStats, gap: HostGapStats | None, step_s: float = 0.0213, **more) -> Evidence:
    timing = TimingSummary(step_s, step_s, step_s, step_s, step_s, 100)
    summary = EpochSummary(
        stage="train", epoch=0, steps=100, timings={"DataLoading": timing, "Step": timing},
        input_stall_fraction=0.3, data_wait_share=0.3, samples_per_sec=6000.0, epoch_start=0.1,
        decode=decode, host_gap=gap,
    )  # fmt: skip
    return Evidence(summary, LoaderFacts(num_workers=4), **more)


# An eager ResNet-18 step fed by the decode path: 21.3 ms, of which the GPU is busy 12.2 ms.
GAP = HostGapStats(steps=8, span_s=0.0213, gpu_busy_s=0.0122, host_gap_s=0.0091, first_step=20)
DECODE = DecodeStats(
    batches=100, takes=100, wait_seconds=0.6, lookahead_mean=0.2, backend="torchvision", submit_seconds=1.9,
    submit_cpu_seconds=0.15, decode_seconds=0.3, prepare_seconds=0.12, prepare_cpu_seconds=0.1, call_seconds=0.7,
)  # fmt: skip


def test_the_gpu_binds_once_compiled():
    words = compile_prediction(_evidence(DECODE, GAP), DECODE)
    assert words is not None
    assert "host gap of 9.1 ms (GPU busy 12.2 ms of a 21.3 ms span)" in words
    assert "predicted 12.2 ms per step instead of 21.3 ms, 1.75x the images/s" in words
    assert "bound then by the GPU's busy time" in words and 'mode="reduce-overhead"' in words


def test_the_decode_path_binds_once_compiled():
    slow = dataclasses.replace(DECODE, call_seconds=1.5)  # the decode call: 15 ms per batch
    words = compile_prediction(_evidence(slow, GAP), slow)
    assert words is not None and "predicted 15.0 ms per step" in words and "the decode path's own pace" in words


def test_no_prediction_without_a_measured_or_a_large_gap():
    assert compile_prediction(_evidence(DECODE, None), DECODE) is None
    small = dataclasses.replace(GAP, host_gap_s=0.001, span_s=0.0132)
    assert compile_prediction(_evidence(DECODE, small), DECODE) is None


def test_the_verdicts_advice_carries_it():
    kind, _, advice = gpu_decode_cause(_evidence(DECODE, GAP), DECODE)
    assert kind == "input_bound_decode" and advice[-1].startswith("compiling the step would remove its host gap")
    _, _, plain = gpu_decode_cause(_evidence(DECODE, None), DECODE)
    assert not any("compiling the step" in line for line in plain)


def test_a_compiled_step_gets_no_prediction_and_no_advice_to_compile():
    for how in (STEP_COMPILED, STEP_COMPILED_CUDA_GRAPHS):
        evidence = _evidence(DECODE, GAP, step_compiled=how)
        assert compile_prediction(evidence, DECODE) is None
        kind, words, advice = gpu_decode_cause(evidence, DECODE)
        assert (kind, words) == ("input_bound_decode", "GPU decode, the decode thread's submission")
        text = " | ".join(advice)
        assert "torch.compile, CUDA graphs" not in text and "compiling the step would" not in text
        assert f"the step is already compiled ({how})" in text and "GpuDecodeLoader(gpu_share=...)" in text


def test_the_decode_cause_carries_the_measured_faster_end():
    placed = DecodePlacementMeasured(
        cpu_only=30.0, gpu_only=39.0, cpu_only_error=0.02, gpu_only_error=0.02, cpu_only_workers=15
    )
    split = dataclasses.replace(DECODE, images=12800, cpu_share=3200)
    _, _, advice = gpu_decode_cause(_evidence(split, None, decode_placement=placed), split)
    assert "(torchvision decode, 25% of the images by the CPU workers)" in advice[0]
    assert advice[-1].endswith(
        "the CPU workers alone (gpu_share=0, 15 workers) 30.0 steps/s (3840 images/s), the GPU decode alone "
        "(gpu_share=1) 39.0 steps/s (4992 images/s): the GPU decode is faster here, 1.30x the CPU workers' rate"
    )


def test_the_decode_figures_say_where_the_decode_ran():
    # issue 47: a CPU (PIL) decode run's text said "on the GPU"
    on_cpu = dataclasses.replace(DECODE, backend="pil").format()
    assert "on the CPU from decode to augment" in on_cpu and "on the GPU" not in on_cpu
    assert "ms on the GPU from decode to augment" in DECODE.format()
    custom = dataclasses.replace(DECODE, backend="custom").format()
    assert "on the GPU" not in custom and "on the CPU" not in custom


@pytest.mark.cuda
def test_a_reduce_overhead_model_is_a_cuda_graph_step_and_not_told_to_compile(tmp_path, monkeypatch):
    gathered: list[Evidence] = recorded_evidence(monkeypatch)
    model = SleepyModel()
    model.layer = torch.compile(model.layer, mode="reduce-overhead")
    perf = DataPerfCallback(print_summary=False)
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], **trainer_kwargs(tmp_path, accelerator="gpu"))
    trainer.fit(model, sleepy_loader(256, 4, 0.0))
    assert gathered and all(evidence.step_compiled == STEP_COMPILED_CUDA_GRAPHS for evidence in gathered)
    text = perf.last_diagnosis.format()
    assert "torch.compile or CUDA graphs" not in text and "compiling the step would" not in text, text
