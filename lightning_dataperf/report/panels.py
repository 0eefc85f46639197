"""The report's panels: where each step's time goes, the input stall per epoch, CPU or GPU use.

Each panel draws one :class:`~lightning_dataperf.report.run.RunData` (any object with its attributes: see
:class:`DrawnRun`) onto matplotlib axes; :func:`~lightning_dataperf.report.run.render_figure` lays them out.
"""

from __future__ import annotations

import math
import textwrap
from typing import Protocol

from lightning_dataperf.tags import SUMMARY_FILE
from lightning_dataperf.timing.summary import EpochSummary

__all__ = [
    "ALL_CORES_UNIT",
    "COLOURS",
    "LABELS",
    "ONE_CORE_UNIT",
    "DrawnRun",
    "device_panel",
    "stall_per_epoch",
    "timeline",
    "wrap",
]

Series = list[tuple[int, float]]


class DrawnRun(Protocol):
    """What the panels read of a run (:class:`~lightning_dataperf.report.run.RunData` has it)."""

    epochs: list[dict]

    @property
    def on_gpu(self) -> bool: ...

    @property
    def world_size(self) -> int: ...

    @property
    def stack(self) -> tuple[str, ...]: ...

    def series(self, key: str) -> Series: ...


# Legend words: those of docs/figures.md's table ("meaning" column).
LABELS = {
    "data_wait": "data loading: host time blocked getting the batch",
    "transfer": "transfer: host-to-device copy",
    "compute": "compute: forward, backward, optimizer",
    "device_span": "the step on the GPU: its work and the gaps waiting for the host",
    "device_idle": "GPU idle between the end of one step and the next step's work",
    "input_stall": "share of step time lost to input",
    "gpu_util": "GPU utilisation (this rank's GPU)",
    "pcie_rx": "PCIe bytes into the GPU",
    "cpu_busy": "CPU use, mean across cores",
    "main_cpu": "the training process",
    "workers_cpu": "its DataLoader workers",
}
# One colour per metric, the same in every panel, no two metrics alike.
COLOURS = {
    "data_wait": "#d62728",
    "transfer": "#ff7f0e",
    "compute": "#1f77b4",
    "device_span": "#aec7e8",
    "device_idle": "#000000",
    "input_stall": "#8c1c13",
    "gpu_util": "#2ca02c",
    "pcie_rx": "#9467bd",
    "cpu_busy": "#7f7f7f",
    "main_cpu": "#17becf",
    "workers_cpu": "#bcbd22",
}
#: Each rank's epoch-mean data loading, over the stack (several ranks only): colours none of the metrics use.
RANK_COLOURS = ("#e377c2", "#8c564b", "#393b79", "#637939", "#843c39", "#7b4173", "#3182bd", "#e6550d")


def wrap(text: str, width: int = 150) -> str:
    """Lines longer than ``width`` wrapped, the continuation indented."""
    return "\n".join(
        textwrap.fill(line, width, subsequent_indent="     ") if len(line) > width else line
        for line in text.splitlines()
    )


def _no_data_note(axes, text: str) -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes, fontsize=9, color="#555555")


def _rank_zero(run: DrawnRun) -> str:
    """`` (rank 0 of N)`` for a run of several ranks: what rank 0 alone logged (scalars, telemetry)."""
    return f" (rank 0 of {run.world_size})" if run.world_size > 1 else ""


#: The timings are logged in seconds; the report draws them in ms, the unit of the printed summary and verdict.
MS = 1000.0


def timeline(axes, run: DrawnRun) -> None:
    steps = [step for step, _ in run.series(run.stack[-1])]
    axes.set_title(f"Where each training step's time goes (mean per logging window){_rank_zero(run)}")
    axes.set_xlabel("global step")
    axes.set_ylabel("ms per step")
    if not steps:
        _no_data_note(axes, "no per-step times logged")
        return
    layers, labels, colours = [], [], []
    for key in run.stack:
        values = dict(run.series(key))
        if values:
            # stackplot needs every layer at every step; a missing point draws as zero.
            layers.append([values.get(step, 0.0) * MS for step in steps])
            labels.append(LABELS[key])
            colours.append(COLOURS[key])
    axes.stackplot(steps, *layers, labels=labels, colors=colours)
    idle = dict(run.series("device_idle"))
    if idle:
        idle_ms = [idle.get(step, 0.0) * MS for step in steps]
        axes.plot(steps, idle_ms, "--", color=COLOURS["device_idle"], lw=1, label=LABELS["device_idle"])
    _ranks_data_loading(axes, run)
    # Below the plot: a legend inside would hide part of the stack.
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, fontsize=9, frameon=False)


def _ranks_data_loading(axes, run: DrawnRun) -> None:
    """With several ranks: each rank's data loading per step, an epoch mean over that epoch's steps (the logged
    window means are rank 0's; a straggler's wait is another rank's)."""
    train = [record for record in run.epochs if record["summary"].get("stage") == "train"]
    start, spans = 0, []
    for record in train:
        end = int(record.get("global_step", start))
        waits = record["summary"].get("rank_data_wait") or []
        if len(waits) > 1 and end > start:
            spans.append((start, end, waits, record["summary"].get("slowest_rank")))
        start = end
    if not spans:
        return
    ranks = max(len(waits) for _, _, waits, _ in spans)
    # The last epoch's slowest rank is the one its verdict names.
    slowest = spans[-1][3]
    for rank in range(ranks):
        xs, ys = [], []
        for begin, end, waits, _ in spans:
            if rank < len(waits):
                # NaN breaks the line, so each epoch's mean is a segment of its own.
                xs += [begin, end, math.nan]
                ys += [waits[rank] * MS, waits[rank] * MS, math.nan]
        loud = rank == slowest
        axes.plot(
            xs,
            ys,
            "-" if loud else ":",
            lw=2.2 if loud else 1.4,
            color=RANK_COLOURS[rank % len(RANK_COLOURS)],
            label=f"rank {rank}: data loading, epoch mean" + (" (the slowest)" if loud else ""),
        )


def stall_per_epoch(axes, run: DrawnRun) -> None:
    summaries = [EpochSummary.from_dict(record["summary"]) for record in run.epochs]
    train = [summary for summary in summaries if summary.stage == "train" and summary.input_stall_fraction is not None]
    where = "GPU idle / GPU step time" if run.on_gpu else "data loading / step time"
    ranks = f", all {run.world_size} ranks" if run.world_size > 1 else ""
    axes.set_title(f"Share of step time lost to input, per epoch ({where}{ranks})")
    axes.set_xlabel("epoch")
    axes.set_ylabel("share of step time (0-1)")
    # Headroom above 1 for the label of a full bar.
    axes.set_ylim(0, 1.05)
    if not train:
        _no_data_note(axes, f"no epoch summaries ({SUMMARY_FILE}) with an input stall")
        return
    shares = [summary.input_stall_fraction for summary in train]
    epochs = [summary.epoch for summary in train]
    axes.bar(epochs, shares, color=COLOURS["input_stall"], label=LABELS["input_stall"])
    for epoch, share in zip(epochs, shares, strict=True):
        axes.text(epoch, share, f"{share:.2f}", ha="center", va="bottom", fontsize=9)
    # Whole epochs only, no ticks between them.
    axes.set_xticks(epochs)
    axes.set_xlim(min(epochs) - 0.6, max(epochs) + 0.6)


def _line(axes, run: DrawnRun, key: str, scale: float = 1.0) -> bool:
    points = run.series(key)
    if not points:
        return False
    steps, values = zip(*points, strict=True)
    axes.plot(steps, [value * scale for value in values], "o-", ms=3, color=COLOURS[key], label=LABELS[key])
    return True


def _has_workers(run: DrawnRun) -> bool:
    """Whether the run's loader had workers (a flat zero line is not drawn for ``num_workers=0``)."""
    alive = run.series("workers_alive")
    if alive:
        return max(value for _, value in alive) > 0
    return any(value > 0 for _, value in run.series("workers_cpu"))


#: The CPU panel's two units: machine-wide use is a share of all cores (0-100), a process's is a share of one core
#: (a process busy on two cores reads 200), so each has an axis of its own.
ALL_CORES_UNIT = "% of all cores"
ONE_CORE_UNIT = "% of one core"


def device_panel(axes, run: DrawnRun) -> None:
    axes.set_xlabel("global step")
    handles = axes
    if run.on_gpu and run.series("gpu_util"):
        _line(axes, run, "gpu_util")
        axes.set_ylabel("GPU utilisation (%)")
        axes.set_ylim(0, 105)
        if run.series("pcie_rx"):
            # MB/s and % need axes of their own.
            handles = axes.twinx()
            _line(handles, run, "pcie_rx")
            handles.set_ylabel("PCIe bytes into the GPU (MB/s)")
        axes.set_title(f"GPU utilisation and PCIe traffic (NVML){_rank_zero(run)}")
    else:
        handles = _cpu_panel(axes, run)
    lines, labels = axes.get_legend_handles_labels()
    # A twin axes' lines are not in the main axes' legend.
    if handles is not axes:
        more, more_labels = handles.get_legend_handles_labels()
        lines, labels = lines + more, labels + more_labels
    if lines:  # below the panel, as the top panel's: a legend inside would hide a line
        axes.legend(lines, labels, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, fontsize=9, frameon=False)


def _cpu_panel(axes, run: DrawnRun):
    """Machine-wide CPU use on the left axis (% of all cores), the processes' on a right one (% of one core).

    Returns the axes holding the processes' lines (``axes`` itself when there are none).
    """
    title = "CPU use (no GPU in this run)" if not run.on_gpu else "CPU use (no GPU telemetry)"
    axes.set_title(f"{title}{_rank_zero(run)}")
    drawn = _line(axes, run, "cpu_busy")
    axes.set_ylabel(f"machine: {ALL_CORES_UNIT}")
    axes.set_ylim(0, 105)
    keys = ("main_cpu", "workers_cpu") if _has_workers(run) else ("main_cpu",)
    if not any(run.series(key) for key in keys):
        if not drawn:
            _no_data_note(axes, "no Usage/ telemetry logged (DataPerfCallback(telemetry=False)?)")
        return axes
    processes = axes.twinx()
    for key in keys:
        _line(processes, run, key)
    processes.set_ylabel(f"processes: {ONE_CORE_UNIT}")
    # from zero, as the left axis: two scales that start apart would read as one
    processes.set_ylim(bottom=0)
    return processes
