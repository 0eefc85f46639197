"""A one-page picture of a run: per-step time split, data-wait share per epoch, GPU or CPU use, verdict.

Reads what :class:`~lightning_dataperf.DataPerfCallback` wrote for one run: the TensorBoard event
files, or a CSVLogger's ``metrics.csv`` when there are none, and ``dataperf_summaries.jsonl``. Draws a
PNG, optionally wrapped in a self-contained HTML page. A folder holding several runs (``version_0``,
``version_1``, ... of one logger) draws the latest and names the others; ``run=`` picks one.

Example::

    from lightning_dataperf.report.run import load_run, render_png

    run = load_run("dataperf_logs/quickstart")  # the latest version_N, or run="version_0"
    render_png(run, "report.png")
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_dataperf import tags
from lightning_dataperf.diagnosis.findings import Diagnosis
from lightning_dataperf.tags import SUMMARY_FILE
from lightning_dataperf.telemetry.stats import SystemStats
from lightning_dataperf.timing.summary import EpochSummary

__all__ = ["RunData", "find_runs", "load_run", "render_figure", "render_html", "render_png"]

# The logged tags this report reads, in one place: key -> tag.
TAGS = {
    "data_wait": tags.time(tags.DATA_LOADING),
    "transfer": tags.time(tags.TRANSFER),
    "compute": tags.time(tags.COMPUTE),
    "device_span": tags.time(tags.DEVICE_SPAN),
    "device_idle": tags.time(tags.DEVICE_IDLE),
    "input_stall": tags.INPUT_STALL,
    "gpu_util": SystemStats.tag("gpu_util_percent"),
    "pcie_rx": SystemStats.tag("gpu_pcie_rx_mbps"),
    "cpu_busy": SystemStats.tag("cpu_busy_percent_mean"),
    "main_cpu": SystemStats.tag("main_cpu_percent"),
    "workers_cpu": SystemStats.tag("workers_cpu_percent"),
}
#: Tags of runs logged by earlier versions -> today's (so their reports still draw).
_LEGACY = {"DataPerf/input_stall_fraction": tags.INPUT_STALL, "Throughput/samples_per_sec": tags.SAMPLES_PER_SEC}


def current_tag(tag: str) -> str:
    """Today's name of a logged tag (``System/gpu_util_percent`` -> ``Usage/gpu_util_percent``)."""
    if tag in _LEGACY:
        return _LEGACY[tag]
    if tag.startswith("System/"):
        field = tag.removeprefix("System/")
        for old, new in (("_MBps", "_mbps"), ("_MB", "_mb"), ("_MHz", "_mhz"), ("_W", "_w")):
            if field.endswith(old):
                field = field[: -len(old)] + new
        return SystemStats.tag(field) if field in SystemStats.fields() else tag
    return tag


# Legend words: those of README's metric table ("meaning" column).
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
STACK = ("data_wait", "transfer", "compute")
#: On CUDA the step's per-step time is its device span (``Time/Compute`` is the GPU busy time, per epoch).
STACK_CUDA = ("data_wait", "transfer", "device_span")

Series = list[tuple[int, float]]
_EVENTS = "events.out.tfevents.*"
_CSV = "metrics.csv"
_RUN_MARKERS = (_EVENTS, _CSV, SUMMARY_FILE, "hparams.yaml")


@dataclass
class RunData:
    """Scalars (tag -> [(step, value)]) and the epoch records of one run directory.

    ``name`` is the run's path relative to the folder that was asked for (``"."`` when it is the run),
    ``other_runs`` the names of the runs in that folder that were not loaded, and ``sources`` the
    files the scalars came from (``"TensorBoard events"``, ``"metrics.csv"``).
    """

    directory: Path
    scalars: dict[str, Series] = field(default_factory=dict)
    epochs: list[dict] = field(default_factory=list)
    name: str = "."
    other_runs: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    @property
    def on_gpu(self) -> bool:
        return TAGS["device_idle"] in self.scalars or TAGS["gpu_util"] in self.scalars

    @property
    def stack(self) -> tuple[str, ...]:
        """The per-step timings that make up a step, as this run logged them."""
        return STACK_CUDA if TAGS["device_span"] in self.scalars else STACK

    def series(self, key: str) -> Series:
        """The points of one metric (a key of ``TAGS``), empty when it was not logged."""
        return self.scalars.get(TAGS[key], [])

    def diagnosis_text(self) -> str:
        train = [record for record in self.epochs if record["summary"]["stage"] == "train"]
        if not train:
            return "no epoch summaries recorded"
        summary = EpochSummary.from_dict(train[-1]["summary"])
        parts = (summary.loader, summary.host_gap, summary.decode)
        return "\n".join([Diagnosis.from_dict(train[-1]["diagnosis"]).format(), *(p.format() for p in parts if p)])


def _run_files(directory: Path) -> list[Path]:
    return [path for marker in _RUN_MARKERS for path in directory.rglob(marker) if path.is_file()]


def _run_name(root: Path, directory: Path) -> str:
    return "." if directory == root else directory.relative_to(root).as_posix()


def find_runs(directory: str | Path) -> list[str]:
    """The runs in ``directory``, oldest first: itself if it holds a run's files, else the topmost folders
    below it that do (a logger's ``version_N`` folders). Ordered by their newest file's modification time,
    then by version number; the last is the latest."""
    root = Path(directory)
    holders = {path.parent for path in _run_files(root)}
    runs = [folder for folder in holders if not any(parent in holders for parent in folder.parents)]

    def age(folder: Path) -> tuple[float, int, str]:
        newest = max(path.stat().st_mtime for path in _run_files(folder))
        version = re.fullmatch(r"version_(\d+)", folder.name)
        return newest, int(version.group(1)) if version else -1, folder.as_posix()

    return [_run_name(root, folder) for folder in sorted(runs, key=age)]


def _pick(root: Path, runs: list[str], wanted: str | None) -> str:
    if wanted is None:
        return runs[-1]
    if wanted in runs:
        return wanted
    matches = [name for name in runs if name.rsplit("/", 1)[-1] == wanted.strip("/")]
    if len(matches) == 1:
        return matches[0]
    what = f"matches {len(matches)} runs" if matches else "names no run"
    raise LookupError(f"--run {wanted} {what} in {root}; the runs there are: {', '.join(runs)}.")


def load_run(directory: str | Path, run: str | None = None) -> RunData:
    """Read one run under ``directory``: the run itself, or the latest run in it (see :func:`find_runs`).

    Args:
        directory: a run's log directory (``.../version_0``) or a folder holding several runs.
        run: the run to read when there are several: its name as listed by :func:`find_runs`
            (``"version_0"``, or ``"quickstart/version_0"`` from one level up).

    Raises:
        FileNotFoundError: the directory does not exist, or holds no DataPerf data.
        LookupError: ``run`` names no run in ``directory``.
    """
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory; pass the log directory of a run (e.g. .../version_0).")
    runs = find_runs(root)
    if not runs:
        raise FileNotFoundError(_no_data(root))
    name = _pick(root, runs, run)
    folder = root if name == "." else root / name
    data = RunData(folder, name=name, other_runs=[other for other in runs if other != name])
    _read_events(folder, data)
    _read_csv(folder, data)
    for summaries in sorted(folder.rglob(SUMMARY_FILE)):
        data.epochs.extend(json.loads(line) for line in summaries.read_text().splitlines() if line.strip())
    if not {TAGS["compute"], TAGS["device_span"]} & set(data.scalars) and not data.epochs:
        raise FileNotFoundError(_no_data(folder))
    for points in data.scalars.values():
        points.sort()
    return data


def _no_data(directory: Path) -> str:
    return (
        f"{directory} holds no DataPerf data (no {TAGS['compute']} scalars in TensorBoard event files or "
        f"{_CSV}, no {SUMMARY_FILE}). Train with Trainer(callbacks=[DataPerfCallback()]) and a TensorBoard "
        "or CSV logger, then point this at its log directory."
    )


def _read_events(folder: Path, data: RunData) -> None:
    files = sorted(folder.rglob(_EVENTS))
    if not files:
        return
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for events in files:
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags().get("scalars", []):
            points = [(event.step, event.value) for event in accumulator.Scalars(tag)]
            data.scalars.setdefault(current_tag(tag), []).extend(points)
    data.sources.append("TensorBoard events")


def _read_csv(folder: Path, data: RunData) -> None:
    """Add the tags of CSVLogger ``metrics.csv`` files that the event files did not have."""
    have = set(data.scalars)
    found: dict[str, Series] = {}
    for path in sorted(folder.rglob(_CSV)):
        with path.open(newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                step = _number(row.get("step"))
                if step is None:
                    continue
                for tag, text in row.items():
                    value = _number(text)
                    if tag not in ("step", "epoch") and tag not in have and value is not None:
                        found.setdefault(current_tag(tag), []).append((int(step), value))
    if found:
        data.scalars.update(found)
        data.sources.append(_CSV)


def _number(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def render_figure(run: RunData) -> Any:
    """The report as a matplotlib ``Figure`` (three panels and the verdict)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 10), dpi=110)
    grid = figure.add_gridspec(3, 2, height_ratios=[1.1, 1.0, 0.9], hspace=0.55, wspace=0.22)
    _timeline(figure.add_subplot(grid[0, :]), run)
    _stall_per_epoch(figure.add_subplot(grid[1, 0]), run)
    _device_panel(figure.add_subplot(grid[1, 1]), run)
    text = figure.add_subplot(grid[2, :])
    text.axis("off")
    text.text(0, 1, _wrap(run.diagnosis_text()), va="top", ha="left", family="monospace", fontsize=9)
    title = f"DataPerf report: run {run.name}" if run.name != "." else "DataPerf report"
    subtitle = f"{run.directory} (from {', '.join(run.sources) or 'epoch summaries only'})"
    if run.other_runs:
        subtitle += f"\nnot drawn, also in this folder: {', '.join(run.other_runs)} (pick one with --run NAME)"
    figure.suptitle(f"{title}\n{subtitle}", fontsize=11)
    return figure


def render_png(run: RunData, path: str | Path) -> Path:
    """Draw the report into ``path``."""
    figure = render_figure(run)
    path = Path(path)
    figure.savefig(path, bbox_inches="tight")
    return path


def _wrap(text: str, width: int = 150) -> str:
    import textwrap

    return "\n".join(
        textwrap.fill(line, width, subsequent_indent="     ") if len(line) > width else line
        for line in text.splitlines()
    )


def _no_data_note(axes, text: str) -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes, fontsize=9, color="#555555")


def _timeline(axes, run: RunData) -> None:
    steps = [step for step, _ in run.series(run.stack[-1])]
    axes.set_title("Where each training step's time goes (mean per logging window)")
    axes.set_xlabel("global step")
    axes.set_ylabel("s per step")
    if not steps:
        _no_data_note(axes, "no per-step times logged")
        return
    layers, labels, colours = [], [], []
    for key in run.stack:
        values = dict(run.series(key))
        if values:
            layers.append([values.get(step, 0.0) for step in steps])
            labels.append(LABELS[key])
            colours.append(COLOURS[key])
    axes.stackplot(steps, *layers, labels=labels, colors=colours)
    idle = dict(run.series("device_idle"))
    if idle:
        idle_s = [idle.get(step, 0.0) for step in steps]
        axes.plot(steps, idle_s, "--", color=COLOURS["device_idle"], lw=1, label=LABELS["device_idle"])
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4, fontsize=9, frameon=False)


def _stall_per_epoch(axes, run: RunData) -> None:
    summaries = [EpochSummary.from_dict(record["summary"]) for record in run.epochs]
    train = [summary for summary in summaries if summary.stage == "train" and summary.input_stall_fraction is not None]
    where = "GPU idle / GPU step time" if run.on_gpu else "data wait / step time"
    axes.set_title(f"Share of step time lost to input, per epoch ({where})")
    axes.set_xlabel("epoch")
    axes.set_ylabel("share of step time (0-1)")
    axes.set_ylim(0, 1.05)
    if not train:
        _no_data_note(axes, f"no epoch summaries ({SUMMARY_FILE}) with an input stall")
        return
    shares = [summary.input_stall_fraction for summary in train]
    epochs = [summary.epoch for summary in train]
    axes.bar(epochs, shares, color=COLOURS["input_stall"], label=LABELS["input_stall"])
    for epoch, share in zip(epochs, shares, strict=True):
        axes.text(epoch, share, f"{share:.2f}", ha="center", va="bottom", fontsize=9)
    axes.set_xticks(epochs)
    axes.set_xlim(min(epochs) - 0.6, max(epochs) + 0.6)


def _line(axes, run: RunData, key: str, scale: float = 1.0) -> bool:
    points = run.series(key)
    if not points:
        return False
    steps, values = zip(*points, strict=True)
    axes.plot(steps, [value * scale for value in values], "o-", ms=3, color=COLOURS[key], label=LABELS[key])
    return True


def _device_panel(axes, run: RunData) -> None:
    axes.set_xlabel("global step")
    if run.on_gpu and run.series("gpu_util"):
        _line(axes, run, "gpu_util")
        axes.set_ylabel("GPU utilisation (%)")
        axes.set_ylim(0, 105)
        if run.series("pcie_rx"):
            right = axes.twinx()
            _line(right, run, "pcie_rx")
            right.set_ylabel("PCIe bytes into the GPU (MB/s)")
            right.legend(loc="lower right", fontsize=9)
        axes.set_title("GPU utilisation and PCIe traffic (NVML)")
    else:
        drawn = [_line(axes, run, key) for key in ("cpu_busy", "main_cpu", "workers_cpu")]
        axes.set_ylabel("% of one core")
        axes.set_title("CPU use (no GPU in this run)" if not run.on_gpu else "CPU use (no GPU telemetry)")
        if not any(drawn):
            _no_data_note(axes, "no Usage/ telemetry logged (DataPerfCallback(telemetry=False)?)")
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc="upper left", fontsize=9)


def render_html(run: RunData, png: str | Path, path: str | Path) -> Path:
    """A self-contained page: the PNG inlined and the verdict as text."""
    image = base64.b64encode(Path(png).read_bytes()).decode()
    others = (
        f"<p>Not drawn, also in this folder: {html.escape(', '.join(run.other_runs))}</p>" if run.other_runs else ""
    )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>DataPerf report</title></head><body>"
        f"<h1>DataPerf report: run {html.escape(run.name)}</h1><p>{html.escape(str(run.directory))}</p>{others}"
        f"<img alt='DataPerf report' style='max-width:100%' src='data:image/png;base64,{image}'>"
        f"<pre>{html.escape(run.diagnosis_text())}</pre></body></html>"
    )
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path
