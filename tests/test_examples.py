import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "examples"))


@pytest.mark.slow
def test_quickstart_runs_and_reports(tmp_path, capsys):
    import quickstart

    perf = quickstart.main(["--epochs", "1", "--samples", "256", "--sample-ms", "1", "--logdir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "DataPerf | train epoch 0" in out and "DataPerf verdict" in out
    assert perf.last_diagnosis.bottleneck.startswith("input_bound")
    assert list(tmp_path.glob("quickstart/version_0/events.out.tfevents.*"))
