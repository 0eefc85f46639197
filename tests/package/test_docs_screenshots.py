"""docs/screenshot_tensorboard.py keeps working: TensorBoard on a logged run, headless-Chromium PNGs."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest
from helpers import ROOT
from lightning.pytorch.loggers import TensorBoardLogger


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")), reason="needs Chromium")
def test_screenshot_script_writes_each_page(tmp_path):
    logger = TensorBoardLogger(str(tmp_path / "logs"), name="quickstart")
    for step in range(1, 11):
        logger.log_metrics({"Time/DataLoading": 0.03, "Time/Compute": 0.004}, step)
    logger.finalize("success")
    out = tmp_path / "shots"
    command = [sys.executable, str(ROOT / "docs" / "screenshot_tensorboard.py"), str(tmp_path / "logs")]
    command += ["--out-dir", str(out), "--port", str(_free_port()), "--wait", "8"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(command, capture_output=True, text=True, timeout=280, env=env, check=False)
    assert result.returncode == 0, result.stderr
    names = {"tensorboard_scalars.png", "tensorboard_custom_scalars.png", "tensorboard_time_series.png"}
    assert {path.name for path in out.iterdir()} == names
    for path in out.iterdir():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
