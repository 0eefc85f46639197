import subprocess
import sys

import pytest
from helpers import ROOT


@pytest.mark.slow
def test_quickstart_runs_and_reports(tmp_path, capsys):
    import quickstart

    perf = quickstart.main(["--epochs", "1", "--samples", "256", "--sample-ms", "1", "--logdir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "DataPerf | train epoch 0" in out and "DataPerf verdict" in out
    assert perf.last_diagnosis.bottleneck.startswith("input_bound")
    assert list(tmp_path.glob("quickstart/version_0/events.out.tfevents.*"))


@pytest.mark.slow
def test_quickstart_online_tunes_on_its_own_steps(tmp_path, capsys):
    import quickstart

    argv = ["--epochs", "2", "--samples", "1024", "--sample-ms", "1", "--logdir", str(tmp_path), "--online"]
    perf = quickstart.main(argv)
    assert "online tuning: these settings are the start" in capsys.readouterr().out
    assert perf.last_diagnosis is not None


@pytest.mark.slow
def test_input_bound_example_fixes_what_it_diagnoses(tmp_path, capsys):
    import input_bound

    results = input_bound.main(["--samples", "384", "--autotune-seconds", "4", "--logdir", str(tmp_path)])
    out = capsys.readouterr().out
    assert (
        "input-bound" in out and "loaded in the training process (num_workers=0)" in out and "set num_workers=" in out
    )
    assert results["after_num_workers"] > 0, "the fix the verdict names (loader workers) was applied"
    # a 1 ms sleep per sample dominates: workers overlap the sleeps. Only the direction is checked here (a
    # loaded 2-core machine moves the size of the gain: 1.15x-4x seen); the gain itself is benchmarks' business.
    assert results["after_samples_per_sec"] > results["before_samples_per_sec"]
    # the stall *fraction* is not compared: with a tiny model the fixed pipeline can stay input-bound,
    # and on a loaded 2-core machine its fraction moves either way by a few points (CI saw 79.0 -> 79.4%)


@pytest.mark.slow
def test_autotune_example_searches_then_hits_the_cache(tmp_path, capsys):
    import autotune as autotune_example

    cache = str(tmp_path / "cache.json")
    first = autotune_example.main(["--budget", "3", "--cache", cache])
    second = autotune_example.main(["--budget", "3", "--cache", cache])
    assert not first.cached and second.cached and second.settings == first.settings
    assert "DataLoader(num_workers=" in capsys.readouterr().out


@pytest.mark.slow
def test_gpu_example_falls_back_on_cpu(tmp_path, capsys):
    import gpu_side_stream
    import torch

    if torch.cuda.is_available():
        pytest.skip("the GPU path is exercised on the GPU machine (benchmarks/README.md)")
    results = gpu_side_stream.main(["--logdir", str(tmp_path)])
    assert "No CUDA GPU here" in capsys.readouterr().out and results["stock_step_ms"] > 0


@pytest.mark.slow
def test_ddp_cpu_example_names_the_straggler(tmp_path):
    command = [sys.executable, str(ROOT / "examples" / "ddp_cpu.py"), "--samples", "256", "--logdir", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "straggler: rank 1" in output
    assert "EpochAwareDistributedSampler(rank 0 of 2" in output
