"""The report as one self-contained HTML page: the verdict, a table of the epochs, the figure, each epoch's text.

Example::

    from lightning_dataperf.report.page import render_html
    from lightning_dataperf.report.run import load_run, render_png

    run = load_run("dataperf_logs/quickstart")
    render_html(run, render_png(run, "report.png"), "report.html")   # opens in any browser, no network
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from lightning_dataperf import tags
from lightning_dataperf.diagnosis.findings import Diagnosis, Finding
from lightning_dataperf.report.run import RunData
from lightning_dataperf.timing.summary import EpochSummary

__all__ = ["render_html"]

#: The epoch table's timing columns: (timing name, column heading); the values are means per step in ms.
COLUMNS = (
    (tags.DATA_LOADING, "data loading"),
    (tags.TRANSFER, "transfer"),
    (tags.COMPUTE, "compute"),
    (tags.DEVICE_SPAN, "step on the GPU"),
    (tags.STEP, "step"),
)

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1280px;
       padding: 0 1rem; color: #1b1b1b; line-height: 1.45; }
h1 { margin-bottom: 0.2rem; } h2 { margin-top: 2rem; border-bottom: 1px solid #ddd; }
.where { color: #555; margin-top: 0; } code { background: #f3f3f3; padding: 0 0.25em; border-radius: 3px; }
.verdict { border-left: 6px solid #d62728; background: #fdf3f3; padding: 0.6rem 1rem; }
.verdict.also { border-left-color: #999; background: #f7f7f7; }
.verdict p.headline { font-weight: 600; margin: 0.2rem 0; }
.verdict ul { margin: 0.3rem 0; } .numbers { color: #444; font-size: 0.9rem; }
table { border-collapse: collapse; font-size: 0.92rem; margin-top: 0.5rem; }
th, td { border: 1px solid #ccc; padding: 0.3rem 0.55rem; text-align: right; vertical-align: top; }
th { background: #f0f0f0; } td.text, th.text { text-align: left; max-width: 34rem; }
figure { margin: 1rem 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { color: #555; font-size: 0.9rem; }
pre { background: #f7f7f7; padding: 0.6rem; overflow-x: auto; font-size: 0.85rem; }
"""


def render_html(run: RunData, png: str | Path, path: str | Path) -> Path:
    """Write the page for ``run`` to ``path``, with the report's PNG (``png``) inlined; nothing is fetched."""
    records = [(EpochSummary.from_dict(record["summary"]), record.get("diagnosis")) for record in run.epochs]
    # Inlined, so that the page is one file that opens with no network.
    image = base64.b64encode(Path(png).read_bytes()).decode("ascii")
    title = f"DataPerf report: run {run.name}" if run.name != "." else "DataPerf report"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title>",
        f"<style>{STYLE}</style>",
        "</head>",
        "<body>",
        "<header>",
        f"<h1>{_e(title)}</h1>",
        f'<p class="where">{_where(run)}</p>',
        "</header>",
        "<main>",
        _verdict_section(records),
        _epoch_table(records),
        "<section>",
        "<h2>Where the time goes</h2>",
        "<figure>",
        f'<img alt="{_e(title)}: per-step time split, input stall per epoch, CPU or GPU use, verdict" '
        f'src="data:image/png;base64,{image}">',
        "<figcaption>The report's figure (the same PNG as <code>lightning-dataperf report</code> writes): the top "
        "panel is read from the logged scalars, the others from the epoch summaries and telemetry.</figcaption>",
        "</figure>",
        "</section>",
        _details(records),
        "</main>",
        "</body>",
        "</html>",
    ]
    path = Path(path)
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return path


def _e(text: object) -> str:
    # quote=True: values also land inside attributes (the image's alt).
    return html.escape(str(text), quote=True)


def _where(run: RunData) -> str:
    sources = ", ".join(run.sources) or "epoch summaries only"
    text = f"<code>{_e(run.directory)}</code> (from {_e(sources)})"
    if run.other_runs:
        text += f"; not drawn, also in this folder: {_e(', '.join(run.other_runs))} (pick one with <code>--run</code>)"
    return text


def _diagnosis(raw: object) -> Diagnosis | None:
    return Diagnosis.from_dict(raw) if isinstance(raw, dict) else None


def _verdict_section(records: list[tuple[EpochSummary, object]]) -> str:
    train = [(summary, _diagnosis(raw)) for summary, raw in records if summary.stage == tags.Stage.TRAIN.value]
    if not train or train[-1][1] is None:
        return "<section><h2>Verdict</h2><p>No epoch summaries were recorded for training.</p></section>"
    summary, diagnosis = train[-1]
    assert diagnosis is not None
    parts = ["<section>", f"<h2>Verdict (training epoch {summary.epoch}, the last)</h2>"]
    if not diagnosis.findings:
        parts.append(f"<p>{_e(diagnosis.note or 'not enough steps measured to judge')}</p>")
    for index, finding in enumerate(diagnosis.findings):
        parts.append(_finding(finding, also=index > 0))
    parts.append("</section>")
    return "\n".join(parts)


def _finding(finding: Finding, also: bool) -> str:
    numbers = ", ".join(f"{key}={value:.3g}" for key, value in finding.evidence.items())
    advice = "".join(f"<li>{_e(line)}</li>" for line in finding.advice)
    lead = "also: " if also else ""
    ceiling = (
        # A compute-bound run has no input bottleneck to remove.
        f" Ceiling speed-up if removed: {finding.ceiling_speedup:.2f}x." if finding.kind != "compute_bound" else ""
    )
    return (
        f'<div class="verdict{" also" if also else ""}">'
        f'<p class="headline">{_e(lead + finding.headline)}</p>'
        f'<p class="numbers">evidence: {_e(numbers)}.{_e(ceiling)}</p>'
        + (f"<ul>{advice}</ul>" if advice else "")
        + "</div>"
    )


def _ms(summary: EpochSummary, name: str) -> str:
    timing = summary.timings.get(name)
    return "-" if timing is None else f"{1e3 * timing.mean:.2f}"


def _epoch_table(records: list[tuple[EpochSummary, object]]) -> str:
    if not records:
        return "<section><h2>Epochs</h2><p>No epoch summaries recorded.</p></section>"
    # A column empty in every epoch (the device span off CUDA) would hold only dashes.
    shown = [(name, heading) for name, heading in COLUMNS if any(name in s.timings for s, _ in records)]
    head = "".join(f"<th>{_e(heading)}<br>ms/step</th>" for _, heading in shown)
    rows = []
    for summary, raw in records:
        diagnosis = _diagnosis(raw)
        if diagnosis is None:
            verdict = ""
        elif diagnosis.findings:
            verdict = diagnosis.findings[0].headline
        else:
            verdict = diagnosis.note or ""
        stall = "-" if summary.input_stall_fraction is None else f"{100 * summary.input_stall_fraction:.0f}%"
        rate = "-" if summary.samples_per_sec is None else f"{summary.samples_per_sec:,.0f}"
        cells = "".join(f"<td>{_ms(summary, name)}</td>" for name, _ in shown)
        rows.append(
            f"<tr><td>{_e(summary.stage)}</td><td>{summary.epoch}</td><td>{summary.steps}</td>"
            f"<td>{summary.world_size}</td>{cells}<td>{stall}</td><td>{rate}</td>"
            f'<td class="text">{_e(verdict)}</td></tr>'
        )
    return "\n".join(
        [
            "<section>",
            "<h2>Epochs</h2>",
            "<table>",
            "<thead><tr><th>stage</th><th>epoch</th><th>steps</th><th>ranks</th>"
            f"{head}<th>input stall</th><th>samples/s</th><th class='text'>verdict</th></tr></thead>",
            "<tbody>",
            *rows,
            "</tbody>",
            "</table>",
            '<p class="numbers">Means per step over the epoch, reduced over all ranks; the input stall is the share '
            "of step time lost to input.</p>",
            "</section>",
        ]
    )


def _details(records: list[tuple[EpochSummary, object]]) -> str:
    if not records:
        return ""
    parts = ["<section>", "<h2>Each epoch as printed</h2>"]
    for summary, raw in records:
        diagnosis = _diagnosis(raw)
        text = summary.format() + ("\n" + diagnosis.format() if diagnosis is not None else "")
        headline = diagnosis.findings[0].headline if diagnosis is not None and diagnosis.findings else ""
        parts.append(
            f"<details><summary>{_e(summary.stage)} epoch {summary.epoch}"
            f"{': ' + _e(headline) if headline else ''}</summary><pre>{_e(text)}</pre></details>"
        )
    parts.append("</section>")
    return "\n".join(parts)
