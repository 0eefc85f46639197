"""A one-page picture of a run: per-step time split, data-wait share per epoch, GPU or CPU use, verdict.

Example::

    from lightning_dataperf.report.run import load_run, render_png

    run = load_run("dataperf_logs/quickstart")  # the latest version_N, or run="version_0"
    render_png(run, "report.png")
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_dataperf import tags
from lightning_dataperf.diagnosis.findings import Diagnosis
from lightning_dataperf.report.panels import COLOURS, LABELS, device_panel, stall_per_epoch, timeline, wrap
from lightning_dataperf.tags import SUMMARY_FILE
from lightning_dataperf.telemetry.stats import SystemStats
from lightning_dataperf.timing.summary import EpochSummary

__all__ = ["COLOURS", "LABELS", "RunData", "find_runs", "load_run", "render_figure", "render_png"]

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
    "workers_alive": SystemStats.tag("loader_workers_alive"),
}


def current_tag(tag: str) -> str:
    """Today's name of a logged tag (``Time/samples_per_sec`` -> ``Time/SamplesPerSec``: :data:`tags.RENAMED`;
    ``System/gpu_util_percent`` -> ``Usage/gpu_util_percent``)."""
    if tag.startswith("System/"):
        field = tag.removeprefix("System/")
        for old, new in (("_MBps", "_mbps"), ("_MB", "_mb"), ("_MHz", "_mhz"), ("_W", "_w")):
            if field.endswith(old):
                field = field[: -len(old)] + new
        return SystemStats.tag(field) if field in SystemStats.fields() else tag
    return tags.current(tag)


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
    ``other_runs`` the names of the runs in that folder that were not loaded, ``sources`` the
    files the scalars came from (``"TensorBoard events"``, ``"metrics.csv"``), and ``skipped`` one line per
    record of a summaries file that could not be read (file, line number, what was wrong).
    """

    directory: Path
    scalars: dict[str, Series] = field(default_factory=dict)
    epochs: list[dict] = field(default_factory=list)
    name: str = "."
    other_runs: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def on_gpu(self) -> bool:
        return TAGS["device_idle"] in self.scalars or TAGS["gpu_util"] in self.scalars

    @property
    def world_size(self) -> int:
        """Ranks of the run (from its epoch summaries; 1 without). The logged scalars are rank 0's."""
        return max((int(record["summary"].get("world_size", 1)) for record in self.epochs), default=1)

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
        record = train[-1]
        summary = EpochSummary.from_dict(record["summary"])
        own = f"[rank {summary.rank}] " if summary.world_size > 1 else ""  # one rank's figures, not reduced
        parts = [own + part.format() for part in (summary.loader, summary.host_gap, summary.decode) if part]
        verdict = [Diagnosis.from_dict(record["diagnosis"]).format()] if "diagnosis" in record else []
        return "\n".join([*verdict, *parts])


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
        _read_summaries(summaries, data)
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


def _read_summaries(path: Path, data: RunData) -> None:
    """Each line of a summaries file is one epoch's record; a bad one is skipped and named in ``data.skipped``."""
    # a run killed mid-append leaves its last line cut off: the other records, and the event files, still hold
    text = path.read_text(encoding="utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            data.skipped.append(f"{path}:{number}: not a JSON record ({error.msg} at column {error.colno}); skipped")
            continue
        if not isinstance(record, dict) or not isinstance(record.get("summary"), dict):
            data.skipped.append(f"{path}:{number}: not an epoch record (no 'summary' object); skipped")
            continue
        try:
            EpochSummary.from_dict(record["summary"])
        except (KeyError, TypeError, ValueError) as error:
            data.skipped.append(f"{path}:{number}: an epoch record this version cannot read ({error!r}); skipped")
            continue
        data.epochs.append(record)


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

    figure = Figure(figsize=(13, 10.5), dpi=110)
    grid = figure.add_gridspec(3, 2, height_ratios=[1.1, 1.0, 0.9], hspace=0.7, wspace=0.22)
    timeline(figure.add_subplot(grid[0, :]), run)
    stall_per_epoch(figure.add_subplot(grid[1, 0]), run)
    device_panel(figure.add_subplot(grid[1, 1]), run)
    text = figure.add_subplot(grid[2, :])
    text.axis("off")
    text.text(0, 1, wrap(run.diagnosis_text()), va="top", ha="left", family="monospace", fontsize=9)
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
