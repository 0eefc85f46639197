"""Issue 39: ``lightning-dataperf report`` writes next to the run it draws (or where --out says), never over an
earlier report unless --force; its page holds the verdict, the epoch table and the figure, and renders in a real
browser (headless Chromium, skipped without it); the CPU panel's legend hides no line, no flat workers line."""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import lightning.pytorch as pl
import pytest
from helpers import SleepyModel, sleepy_loader, trainer_kwargs
from lightning.pytorch.loggers import TensorBoardLogger
from matplotlib.backends.backend_agg import FigureCanvasAgg

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.cli import main
from lightning_dataperf.report.panels import LABELS
from lightning_dataperf.report.run import load_run, render_figure

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A real two-epoch CPU run without loader workers, logged by TensorBoard, with telemetry points."""
    root = tmp_path_factory.mktemp("report_run")
    perf = DataPerfCallback(print_summary=False, telemetry_interval=0.05)
    trainer = pl.Trainer(
        max_epochs=2,
        callbacks=[perf],
        log_every_n_steps=2,
        logger=TensorBoardLogger(str(root), name="exp"),
        **trainer_kwargs(root),
    )
    trainer.fit(SleepyModel(), sleepy_loader(48, 4, 0.01))
    return Path(trainer.logger.log_dir)


def _written(folder: Path) -> set[str]:
    return {path.name for path in folder.iterdir()}


def test_the_report_goes_next_to_its_run_and_replaces_nothing_unasked(run_dir, tmp_path, monkeypatch, capsys):
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["report", str(run_dir.parent), "--html"]) == 0
    png, page = run_dir / "dataperf_report.png", run_dir / "dataperf_report.html"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and page.is_file()
    assert not list(elsewhere.iterdir()), "nothing written into the working directory"
    assert f"wrote {png}" in capsys.readouterr().out
    before = png.read_bytes(), page.read_bytes()

    assert main(["report", str(run_dir.parent), "--html"]) == 2  # a second report: refused, nothing touched
    error = capsys.readouterr().err
    assert "already exist" in error and "--force" in error and "--out PATH" in error
    assert (png.read_bytes(), page.read_bytes()) == before
    assert main(["report", str(run_dir), "--force"]) == 0  # asked: replaced (the PNG only)
    assert page.read_bytes() == before[1]

    assert main(["report", str(run_dir), "--out", str(elsewhere)]) == 0  # a folder: the report goes into it
    assert _written(elsewhere) == {"dataperf_report.png"}
    assert main(["report", str(run_dir), "--out", str(elsewhere / "mine.svg")]) == 2
    assert "pass a path ending in .png" in capsys.readouterr().err
    assert _written(elsewhere) == {"dataperf_report.png"}


def test_the_cpu_panel_has_no_workers_line_without_workers_and_its_legend_hides_no_line(run_dir):
    figure = render_figure(load_run(run_dir))
    device = figure.axes[2]
    labels = [line.get_label() for line in _panel_lines(device)]  # the processes' lines are on a twin axis
    assert LABELS["cpu_busy"] in labels and LABELS["main_cpu"] in labels
    assert LABELS["workers_cpu"] not in labels, "num_workers=0: no workers line"
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    for axes in figure.axes[:3]:
        legend = axes.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent(renderer)
        for line in _panel_lines(axes):
            points = line.axes.transData.transform(line.get_xydata())
            inside = [(x, y) for x, y in points if box.x0 <= x <= box.x1 and box.y0 <= y <= box.y1]
            assert not inside, f"the legend of {axes.get_title()!r} covers {line.get_label()!r}"


def _panel_lines(axes) -> list:
    """The lines of a panel, those on its twin axis (``twinx``) included."""
    return [line for each in axes.get_shared_x_axes().get_siblings(axes) for line in each.lines]


class _Structure(HTMLParser):
    """Every element closed in order (void elements excepted), and what the page holds."""

    VOID = {"meta", "img", "br", "link", "input", "hr"}

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []
        self.errors: list[str] = []
        self.seen: dict[str, int] = {}
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.seen[tag] = self.seen.get(tag, 0) + 1
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_endtag(self, tag):
        if not self.open or self.open[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.open[-1:] or 'nothing'}")
        else:
            self.open.pop()

    def handle_data(self, data):
        self.text.append(data)


def _page(run_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "page" / "report.png"
    assert main(["report", str(run_dir), "--html", "--out", str(out)]) == 0
    return out.with_suffix(".html")


def test_the_page_holds_the_verdict_the_epoch_table_and_the_figure(run_dir, tmp_path):
    source = _page(run_dir, tmp_path).read_text(encoding="utf-8")
    assert source.startswith('<!DOCTYPE html>\n<html lang="en">')
    parser = _Structure()
    parser.feed(source)
    assert not parser.errors and not parser.open, (parser.errors, parser.open)
    assert parser.seen["table"] == 1 and parser.seen["tr"] == 1 + 2  # a header row, one row per training epoch
    assert parser.seen["img"] == 1 and 'src="data:image/png;base64,' in source
    text = " ".join(parser.text)
    assert "Verdict (training epoch 1, the last)" in text and "input-bound" in text
    assert "loader per batch: fetch" in text  # each epoch as printed, in <details>


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian: apt-get install chromium)")
def test_the_page_renders_in_headless_chromium(run_dir, tmp_path):
    page = _page(run_dir, tmp_path)
    home = tmp_path / "home"  # Chromium's profile and caches stay in the test's folder (its socket, in TMPDIR, goes)
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    env["XDG_CACHE_HOME"] = str(home / ".cache")
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={home / 'profile'}",
    ]
    url = page.resolve().as_uri()
    command = [CHROMIUM, *flags, "--dump-dom", url]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    dom = result.stdout
    assert "<table>" in dom and "Verdict (training epoch 1" in dom and "data:image/png;base64," in dom
    shot = tmp_path / "page.png"
    command = [CHROMIUM, *flags, "--hide-scrollbars", "--window-size=1300,2200", f"--screenshot={shot}", url]
    subprocess.run(command, capture_output=True, timeout=180, env=env, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000  # the page and its figure
