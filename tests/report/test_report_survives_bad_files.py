"""Issue 47: a summaries file cut off mid-append (a killed run) is read up to its bad line, which the report names;
``--out DIR/`` writes the default file name into that folder."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
from helpers import SleepyModel, sleepy_loader, trainer_kwargs
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.cli import REPORT_NAME, main
from lightning_dataperf.report.run import load_run
from lightning_dataperf.tags import SUMMARY_FILE


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A real three-epoch CPU run logged by TensorBoard: three train records in its summaries file."""
    root = tmp_path_factory.mktemp("truncated_run")
    perf = DataPerfCallback(print_summary=False, telemetry=False)
    options = trainer_kwargs(root, limit_val_batches=0)
    trainer = pl.Trainer(
        max_epochs=3, callbacks=[perf], log_every_n_steps=2, logger=TensorBoardLogger(str(root)), **options
    )
    trainer.fit(SleepyModel(), sleepy_loader(16, 4, 0.0))
    return Path(trainer.logger.log_dir)


def test_a_cut_off_last_line_is_skipped_named_and_the_report_written(run_dir, tmp_path, capsys):
    summaries = run_dir / SUMMARY_FILE
    lines = summaries.read_text().splitlines(keepends=True)
    assert len(lines) == 3
    # as a run killed mid-append leaves it: the last record half written, no newline
    summaries.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])

    run = load_run(run_dir)
    assert [record["summary"]["epoch"] for record in run.epochs] == [0, 1]
    assert len(run.skipped) == 1 and f"{summaries}:3: not a JSON record" in run.skipped[0]

    out = tmp_path / "report.png"
    assert main(["report", str(run_dir), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr()
    assert f"warning: {summaries}:3: not a JSON record" in printed.err and "skipped" in printed.err
    assert f"wrote {out}" in printed.out


def test_a_line_that_is_json_but_no_epoch_record_is_skipped_too(run_dir, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    first = (run_dir / SUMMARY_FILE).read_text().splitlines()[0]  # intact whatever the other tests did
    (folder / SUMMARY_FILE).write_text(f'[1, 2]\n{{"summary": "train"}}\n\n{first}\n')
    run = load_run(folder)
    assert [record["summary"]["epoch"] for record in run.epochs] == [0]
    assert [line.split(": ", 1)[0].rsplit(":", 1)[1] for line in run.skipped] == ["1", "2"]
    assert all("not an epoch record" in line for line in run.skipped)


def test_out_names_a_folder_that_does_not_exist_yet(run_dir, tmp_path, capsys):
    folder = tmp_path / "reports"
    assert main(["report", str(run_dir), "--out", f"{folder}/", "--force"]) == 0
    assert (folder / REPORT_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["report", str(run_dir), "--out", str(tmp_path / "report.jpg")]) == 2
    assert f"or a folder to write {REPORT_NAME} into" in capsys.readouterr().err
