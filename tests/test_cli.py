"""The command line: probe (text and JSON) and report (PNG/HTML from a real run, clear error otherwise)."""

from __future__ import annotations

import json

import lightning.pytorch as pl
import pytest
from helpers import SleepyModel, sleepy_loader, trainer_kwargs

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.cli import main


def test_probe_prints_hardware_and_reasons(capsys, tmp_path):
    assert main(["probe", "--data-path", str(tmp_path), "--epochs", "5"]) == 0
    out = capsys.readouterr().out
    assert "usable" in out and "num_workers=" in out and "Storage of" in out
    assert main(["probe", "--json", "--local-world-size", "2"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["hardware"]["local_world_size"] == 2
    assert set(payload["settings"]) >= {"num_workers", "pin_memory", "persistent_workers", "reasons"}


def test_report_draws_a_png_and_html_from_a_cpu_run(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    perf = DataPerfCallback(print_summary=False, telemetry_interval=0.05)
    trainer = pl.Trainer(max_epochs=2, callbacks=[perf], log_every_n_steps=2, **trainer_kwargs(tmp_path))
    trainer.fit(SleepyModel(), sleepy_loader(48, 4, 0.01))
    out = tmp_path / "report.png"
    assert main(["report", trainer.logger.log_dir, "--out", str(out), "--html"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    page = out.with_suffix(".html").read_text()
    assert "data:image/png;base64," in page and "DataPerf verdict (train epoch 1)" in page
    assert "input-bound" in capsys.readouterr().out


def test_report_on_a_directory_without_data_says_what_to_do(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "holds no DataPerf data" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
