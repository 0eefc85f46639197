"""Issue 39: with several ranks the figures that are one rank's say which rank, and the report draws every rank's
data loading beside rank 0's logged steps (a straggler's wait is another rank's)."""

from __future__ import annotations

import dataclasses
import math

from lightning_dataperf.loader.stats import LoaderStats
from lightning_dataperf.report.run import TAGS, RunData, render_figure
from lightning_dataperf.timing.summary import EpochSummary, TimingSummary


def _summary(epoch: int, world: int) -> EpochSummary:
    timing = TimingSummary(0.016, 0.016, 0.03, 0.03, 0.03, 32)
    return EpochSummary(
        stage="train",
        epoch=epoch,
        steps=32,
        timings={"DataLoading": timing, "Compute": timing, "Step": timing},
        input_stall_fraction=0.39,
        data_wait_share=0.39,
        samples_per_sec=375.0,
        epoch_start=0.04,
        world_size=world,
        rank_data_wait=[0.0012, 0.0296][:world],
        slowest_rank=world - 1,
        straggler_ratio=24.7 if world > 1 else None,
        loader=LoaderStats(16, 16.0, 0.00049, 0.00014, 0.0, 0.0, 0.0, 0.0012, 0),
    )


def test_one_rank_s_figures_are_labelled_with_their_rank():
    assert "\n  [rank 0] loader per batch: fetch 0.49 ms" in _summary(0, 2).format()
    assert "\n  [rank 1] loader per batch" in dataclasses.replace(_summary(0, 2), rank=1).format()
    single = _summary(0, 1).format()
    assert "\n  loader per batch: fetch 0.49 ms" in single and "[rank" not in single


def test_the_report_of_a_straggler_run_draws_each_rank_s_data_loading(tmp_path):
    scalars = {TAGS["data_wait"]: [(step, 0.0012) for step in range(4, 33, 4)]}
    scalars |= {TAGS["compute"]: [(step, 0.04) for step in range(4, 33, 4)]}
    epochs = [{"summary": _summary(epoch, 2).to_dict(), "global_step": 16 * (epoch + 1)} for epoch in range(2)]
    run = RunData(tmp_path, scalars=scalars, epochs=epochs)
    assert "[rank 0] loader per batch" in run.diagnosis_text()
    figure = render_figure(run)
    timeline, stall, device = figure.axes[:3]
    assert "(rank 0 of 2)" in timeline.get_title() and "all 2 ranks" in stall.get_title()
    assert "(rank 0 of 2)" in device.get_title()
    ranks = {line.get_label(): line for line in timeline.lines if line.get_label().startswith("rank ")}
    assert set(ranks) == {"rank 0: data loading, epoch mean", "rank 1: data loading, epoch mean (the slowest)"}
    drawn = ranks["rank 1: data loading, epoch mean (the slowest)"].get_ydata()
    slow = [value for value in drawn if not math.isnan(value)]
    assert slow == [29.6] * 4  # each epoch's mean over its steps (0-16, 16-32), in ms as the printed summary
    legend = {text.get_text() for text in timeline.get_legend().get_texts()}
    assert set(ranks) <= legend


def test_a_single_rank_report_has_no_rank_labels(tmp_path):
    scalars = {TAGS["data_wait"]: [(1, 0.01), (2, 0.01)], TAGS["compute"]: [(1, 0.004), (2, 0.004)]}
    epochs = [{"summary": _summary(0, 1).to_dict(), "global_step": 2}]
    timeline = render_figure(RunData(tmp_path, scalars=scalars, epochs=epochs)).axes[0]
    assert "rank" not in timeline.get_title() and not [line for line in timeline.lines if "rank" in line.get_label()]
