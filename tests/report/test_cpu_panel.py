"""The report's units: the CPU panel's machine-wide use (% of all cores) and the processes' (% of one core) on axes of
their own; the step times in ms, as the printed summary."""

from __future__ import annotations

import pytest

from lightning_dataperf.report.panels import ALL_CORES_UNIT, LABELS, ONE_CORE_UNIT, device_panel, timeline
from lightning_dataperf.report.run import TAGS, RunData

UNITS = (ALL_CORES_UNIT, ONE_CORE_UNIT)


def _cpu_run(tmp_path, workers: int) -> RunData:
    steps = range(5, 41, 5)
    scalars = {TAGS["cpu_busy"]: [(step, 90.0) for step in steps], TAGS["main_cpu"]: [(step, 140.0) for step in steps]}
    scalars[TAGS["workers_alive"]] = [(step, float(workers)) for step in steps]
    if workers:
        scalars[TAGS["workers_cpu"]] = [(step, 160.0) for step in steps]
    return RunData(tmp_path, scalars=scalars)


def _panel_axes(run: RunData) -> list:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figure = Figure()
    device_panel(figure.add_subplot(), run)
    return figure.axes


@pytest.mark.parametrize("workers", [0, 2])
def test_each_axis_of_the_cpu_panel_carries_one_unit(tmp_path, workers):
    axes = _panel_axes(_cpu_run(tmp_path, workers))
    by_unit = {}
    for each in axes:
        label = each.get_ylabel()
        units = [unit for unit in UNITS if unit in label]
        assert len(units) == 1, f"axis {label!r} names {units}: one unit per axis"
        by_unit[units[0]] = {line.get_label() for line in each.lines}
    assert by_unit[ALL_CORES_UNIT] == {LABELS["cpu_busy"]}
    processes = {LABELS["main_cpu"], LABELS["workers_cpu"]} if workers else {LABELS["main_cpu"]}
    assert by_unit[ONE_CORE_UNIT] == processes
    # a process busy on more than one core is drawn above 100 on its own axis, not cut at the machine's 100%
    one_core = next(each for each in axes if ONE_CORE_UNIT in each.get_ylabel())
    assert one_core.get_ylim()[1] >= max(max(line.get_ydata()) for line in one_core.lines) > 100


def test_the_cpu_panel_s_legend_holds_both_axes_lines(tmp_path):
    axes = _panel_axes(_cpu_run(tmp_path, 2))
    legend = {text.get_text() for text in axes[0].get_legend().get_texts()}
    assert legend == {LABELS["cpu_busy"], LABELS["main_cpu"], LABELS["workers_cpu"]}


def test_without_telemetry_the_cpu_panel_says_so_on_one_axis(tmp_path):
    axes = _panel_axes(RunData(tmp_path, scalars={TAGS["compute"]: [(5, 0.01)]}))
    assert len(axes) == 1 and ALL_CORES_UNIT in axes[0].get_ylabel()
    assert any("no Usage/ telemetry" in text.get_text() for text in axes[0].texts)


def test_the_step_times_are_drawn_in_ms_as_the_printed_summary_says(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    run = RunData(
        tmp_path, scalars={TAGS["data_wait"]: [(5, 0.036), (10, 0.034)], TAGS["compute"]: [(5, 0.01), (10, 0.01)]}
    )
    axes = Figure().add_subplot()
    timeline(axes, run)
    assert axes.get_ylabel() == "ms per step"
    top = axes.collections[-1].get_paths()[0].vertices[:, 1].max()  # data loading + compute, stacked
    assert top == pytest.approx(46.0)
