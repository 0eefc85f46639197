"""Per-window metrics and the epoch accumulator: means, maxima, percentiles, a two-rank gather, the summary text."""

import dataclasses
import math

import pytest
import torch

from lightning_dataperf.tags import Stage
from lightning_dataperf.timing.clock import StepTiming
from lightning_dataperf.timing.epoch import EpochAccumulator
from lightning_dataperf.timing.host_gap import HostGapStats
from lightning_dataperf.timing.window import window_metrics
from lightning_dataperf.transfer.stats import CopyStats


def timing(step, wait, compute, step_time, first=False, samples=10, idle=None, device_step=None):
    return StepTiming(step, wait, 0.001, compute, step_time, device_step, idle, samples, first)


def test_window_metrics_means_maxima_throughput_and_stall():
    steps = [timing(0, 5.0, 0.1, None, first=True), timing(1, 0.2, 0.3, 0.5), timing(2, 0.4, 0.3, 1.0)]
    metrics = window_metrics(steps)
    assert metrics["Time/DataLoading"] == pytest.approx(0.3)  # start-up wait of step 0 left out
    assert metrics["Time/DataLoading_max"] == pytest.approx(0.4)
    assert metrics["Time/Compute"] == pytest.approx((0.1 + 0.3 + 0.3) / 3)
    assert metrics["Time/SamplesPerSec"] == pytest.approx(20 / 1.5)
    assert metrics["Time/InputStallFraction"] == pytest.approx(0.6 / 1.5)
    assert "Time/DeviceIdle" not in metrics


def test_window_metrics_on_device_use_idle_over_device_step():
    steps = [timing(1, 0.2, 0.1, 0.5, idle=0.05, device_step=0.25)]
    metrics = window_metrics(steps, Stage.VAL)
    assert metrics["val/Time/InputStallFraction"] == pytest.approx(0.2)
    assert metrics["val/Time/DeviceIdle"] == pytest.approx(0.05)


def test_on_cuda_the_step_span_is_not_called_compute_and_compute_is_the_measured_gpu_busy_time():
    """The device span holds host gaps; ``Time/Compute`` on CUDA is only what the host-gap probe measured."""
    steps = [
        dataclasses.replace(timing(i, 0.001, 0.019, 0.02, idle=0.0, device_step=0.02), on_device=True) for i in range(6)
    ]
    metrics = window_metrics(steps)
    assert metrics["Time/DeviceSpan"] == pytest.approx(0.019)
    assert "Time/Compute" not in metrics and "Time/Compute_max" not in metrics
    accumulator = EpochAccumulator()
    accumulator.update(steps)
    summary = accumulator.summarize("train", 0, torch.device("cpu"))
    assert set(summary.timings) == {"DataLoading", "Transfer", "DeviceSpan", "Step", "DeviceIdle"}
    assert "Time/Compute" not in summary.to_metrics()  # not measured: not logged, not guessed
    measured = HostGapStats(steps=8, span_s=0.019, gpu_busy_s=0.0108, host_gap_s=0.0082, first_step=20)
    epoch = dataclasses.replace(summary, host_gap=measured).to_metrics()
    assert epoch["Time/Compute"] == pytest.approx(0.0108) and epoch["Time/HostGap"] == pytest.approx(0.0082)
    assert epoch["Time/DeviceSpan_p90"] == pytest.approx(0.019)


def test_epoch_accumulator_percentiles_match_torch_quantile():
    values = torch.linspace(0.001, 0.1, 100, dtype=torch.float64)
    accumulator = EpochAccumulator()
    accumulator.update([timing(i, float(v), 0.01, 0.2) for i, v in enumerate(values)])
    summary = accumulator.summarize("train", 3, torch.device("cpu"))
    wait = summary.timings["DataLoading"]
    assert wait.count == 100
    assert wait.p50 == pytest.approx(torch.quantile(values, 0.5).item())
    assert wait.p99 == pytest.approx(torch.quantile(values, 0.99).item())
    assert wait.max == pytest.approx(0.1)
    assert summary.steps == 100 and summary.world_size == 1 and summary.straggler_ratio == 1.0
    assert "DeviceIdle" not in summary.timings
    assert summary.to_metrics()["Time/DataLoading_p90"] == pytest.approx(wait.p90)
    assert "DataLoading" in summary.format()


def test_epoch_accumulator_reduces_a_fake_gather_of_two_ranks():
    accumulator = EpochAccumulator()
    accumulator.update([timing(i, 0.01, 0.01, 0.1) for i in range(4)])

    def gather_two_ranks(local):  # rank 1 waits four times longer
        other = local.clone()
        other[2] *= 4
        other[0] *= 4
        return torch.stack([local, other])

    summary = accumulator.summarize("train", 0, torch.device("cpu"), all_gather=gather_two_ranks, world_size=2)
    assert summary.world_size == 2 and summary.slowest_rank == 1
    assert summary.straggler_ratio == pytest.approx(4.0)
    assert summary.rank_data_wait == pytest.approx([0.01, 0.04])


def test_empty_accumulator_summarizes_without_error():
    summary = EpochAccumulator().summarize("val", 0, torch.device("cpu"))
    assert summary.steps == 0 and summary.timings == {} and summary.input_stall_fraction is None
    assert not math.isnan(summary.world_size)


def test_summary_text_names_the_side_stream_copy_and_its_transform():
    accumulator = EpochAccumulator()
    accumulator.update([timing(i, 0.001, 0.01, 0.02) for i in range(4)])
    summary = accumulator.summarize("train", 0, torch.device("cpu"))
    copy_only = CopyStats(copies=4, copy_s=0.004, exposed_s=0.0004, transform_s=0.0, hidden_fraction=0.9, gbps=55.0)
    text = dataclasses.replace(summary, copies=copy_only).format()
    assert "side-stream copy 4.00 ms/batch at 55.0 GB/s, 90% hidden behind compute" in text
    assert "device_transform" not in text
    transformed = dataclasses.replace(copy_only, transform_s=0.002)
    text = dataclasses.replace(summary, copies=transformed).format()
    assert "(with the device_transform's 2.00 ms)" in text
