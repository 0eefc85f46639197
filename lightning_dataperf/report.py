"""A one-page picture of a run: per-step time split, data-wait share per epoch, GPU and PCIe, verdict.

Reads the TensorBoard event files that :class:`~lightning_dataperf.DataPerfCallback` wrote (and its
``dataperf_summaries.jsonl``) and draws a PNG, optionally wrapped in a self-contained HTML page.
Needs matplotlib (``pip install "lightning-dataperf[report]"``).

Example::

    from lightning_dataperf.report import load_run, render_png

    run = load_run("dataperf_logs/quickstart/version_0")
    render_png(run, "report.png")
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from pathlib import Path

from lightning_dataperf import tags
from lightning_dataperf.findings import Diagnosis
from lightning_dataperf.system_stats import SystemStats
from lightning_dataperf.tags import SUMMARY_FILE

__all__ = ["RunData", "load_run", "render_html", "render_png"]

STACK = (
    (tags.time(tags.DATA_LOADING), "data wait"),
    (tags.time(tags.TRANSFER), "transfer"),
    (tags.time(tags.COMPUTE), "compute"),
)
DEVICE_IDLE, COMPUTE = tags.time(tags.DEVICE_IDLE), tags.time(tags.COMPUTE)
GPU_UTIL, PCIE_RX = SystemStats.tag("gpu_util_percent"), SystemStats.tag("gpu_pcie_rx_mbps")
Series = list[tuple[int, float]]


@dataclass
class RunData:
    """Scalars (tag -> [(step, value)]) and the epoch records of one run directory."""

    directory: Path
    scalars: dict[str, Series] = field(default_factory=dict)
    epochs: list[dict] = field(default_factory=list)

    @property
    def on_gpu(self) -> bool:
        return DEVICE_IDLE in self.scalars or GPU_UTIL in self.scalars

    def diagnosis_text(self) -> str:
        train = [record for record in self.epochs if record["summary"]["stage"] == "train"]
        if not train:
            return "no epoch summaries recorded"
        return Diagnosis.from_dict(train[-1]["diagnosis"]).format()


def load_run(directory: str | Path) -> RunData:
    """Read every event file under ``directory`` (one run, or a logger's ``version_N`` folder).

    Raises:
        FileNotFoundError: the directory does not exist, or holds no DataPerf data.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory; pass the log directory of a run (e.g. .../version_0).")
    run = RunData(root)
    for events in sorted(root.rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events.parent), size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags().get("scalars", []):
            points = [(event.step, event.value) for event in accumulator.Scalars(tag)]
            run.scalars.setdefault(tag, []).extend(points)
    for summaries in sorted(root.rglob(SUMMARY_FILE)):
        run.epochs.extend(json.loads(line) for line in summaries.read_text().splitlines() if line.strip())
    if COMPUTE not in run.scalars and not run.epochs:
        raise FileNotFoundError(
            f"{root} holds no DataPerf data (no Time/Compute scalars, no {SUMMARY_FILE}). Train with "
            "Trainer(callbacks=[DataPerfCallback()]) and a TensorBoard logger, then point this at its log directory."
        )
    for points in run.scalars.values():
        points.sort()
    return run


def render_png(run: RunData, path: str | Path) -> Path:
    """Draw the four panels and the verdict into ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError('The report needs matplotlib: pip install "lightning-dataperf[report]"') from error
    figure = plt.figure(figsize=(13, 10), dpi=110)
    grid = figure.add_gridspec(3, 2, height_ratios=[1.1, 1.0, 0.9], hspace=0.45, wspace=0.22)
    _timeline(figure.add_subplot(grid[0, :]), run)
    _stall_per_epoch(figure.add_subplot(grid[1, 0]), run)
    _device_panel(figure.add_subplot(grid[1, 1]), run)
    text = figure.add_subplot(grid[2, :])
    text.axis("off")
    text.text(0, 1, _wrap(run.diagnosis_text()), va="top", ha="left", family="monospace", fontsize=9)
    figure.suptitle(f"DataPerf report: {run.directory}", fontsize=13)
    path = Path(path)
    figure.savefig(path, bbox_inches="tight")
    plt.close(figure)
    return path


def _wrap(text: str, width: int = 150) -> str:
    import textwrap

    return "\n".join(
        textwrap.fill(line, width, subsequent_indent="     ") if len(line) > width else line
        for line in text.splitlines()
    )


def _timeline(axes, run: RunData) -> None:
    steps = [step for step, _ in run.scalars.get(COMPUTE, [])]
    layers, labels = [], []
    for tag, label in STACK:
        values = dict(run.scalars.get(tag, []))
        if values:
            layers.append([1e3 * values.get(step, 0.0) for step in steps])
            labels.append(label)
    if steps:
        axes.stackplot(steps, *layers, labels=labels, colors=["#d62728", "#ff7f0e", "#1f77b4"][: len(layers)])
        idle = dict(run.scalars.get(DEVICE_IDLE, []))
        if idle:
            axes.plot(steps, [1e3 * idle.get(step, 0.0) for step in steps], "k--", lw=1, label="GPU idle")
        axes.legend(loc="upper right", fontsize=9)
    axes.set_title("Where each training step's time goes (mean per logging window)")
    axes.set_xlabel("global step")
    axes.set_ylabel("ms per step")


def _stall_per_epoch(axes, run: RunData) -> None:
    train = [record["summary"] for record in run.epochs if record["summary"]["stage"] == "train"]
    shares = [100 * (summary.get("input_stall_fraction") or 0.0) for summary in train]
    epochs = [summary["epoch"] for summary in train]
    if epochs:
        axes.bar(epochs, shares, color="#d62728")
        for epoch, share in zip(epochs, shares, strict=True):
            axes.text(epoch, share, f"{share:.0f}%", ha="center", va="bottom", fontsize=9)
    where = "GPU idle waiting for input" if run.on_gpu else "step time waiting for data"
    axes.set_xticks(epochs or [0])
    axes.set_xlim(min(epochs or [0]) - 0.6, max(epochs or [0]) + 0.6)
    axes.set_title(f"Input stall per epoch ({where})")
    axes.set_xlabel("epoch")
    axes.set_ylabel("% of step time")
    axes.set_ylim(0, 105)


def _device_panel(axes, run: RunData) -> None:
    if run.on_gpu and GPU_UTIL in run.scalars:
        steps, util = zip(*run.scalars[GPU_UTIL], strict=True)
        axes.plot(steps, util, "o-", color="#2ca02c", label="GPU utilisation %")
        axes.set_ylabel("GPU utilisation (%)")
        axes.set_ylim(0, 105)
        if PCIE_RX in run.scalars:
            right = axes.twinx()
            steps, rx = zip(*run.scalars[PCIE_RX], strict=True)
            right.plot(steps, [value / 1e3 for value in rx], "s-", color="#9467bd", label="PCIe RX GB/s (NVML)")
            right.set_ylabel("PCIe host-to-device (GB/s)")
            right.legend(loc="lower right", fontsize=9)
        axes.set_title("GPU utilisation and PCIe throughput")
    else:
        for tag, label in (
            (SystemStats.tag("cpu_busy_percent_mean"), "CPU busy % (mean core)"),
            (SystemStats.tag("workers_cpu_percent"), "loader workers CPU %"),
            (SystemStats.tag("main_cpu_percent"), "main process CPU %"),
        ):
            if tag in run.scalars:
                steps, values = zip(*run.scalars[tag], strict=True)
                axes.plot(steps, values, "o-", label=label)
        axes.set_ylabel("CPU %")
        axes.set_title("CPU use (no GPU in this run)")
    axes.set_xlabel("global step")
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc="upper left", fontsize=9)


def render_html(run: RunData, png: str | Path, path: str | Path) -> Path:
    """A self-contained page: the PNG inlined and the verdict as text."""
    image = base64.b64encode(Path(png).read_bytes()).decode()
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>DataPerf report</title></head><body>"
        f"<h1>DataPerf report</h1><p>{html.escape(str(run.directory))}</p>"
        f"<img alt='DataPerf report' style='max-width:100%' src='data:image/png;base64,{image}'>"
        f"<pre>{html.escape(run.diagnosis_text())}</pre></body></html>"
    )
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path
