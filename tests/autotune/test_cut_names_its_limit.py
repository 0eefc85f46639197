"""A trial cut before one steady round names the limit that cut it (issue 39: the dataset, not the time budget)."""

from __future__ import annotations

import io

import pytest

from lightning_dataperf.autotune.consumer import TransferPath
from lightning_dataperf.autotune.progress import LogProgress
from lightning_dataperf.autotune.runner import TrialRunner
from lightning_dataperf.autotune.trial import Limits
from lightning_dataperf.telemetry.hardware import probe_hardware
from lightning_dataperf.testing import SleepingLoaderDataset


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_a_repeat_the_dataset_cut_says_the_dataset_not_the_time_budget():
    # 64 samples in batches of 4: one pass is 16 batches, all of them in flight at 2 workers x prefetch 8, so every
    # trial runs out of data before one steady round, however fast or slow the machine (a minute of budget is left)
    stream = io.StringIO()
    limits = Limits(60.0, 400, 0.03, 0.5, None, 0)
    dataset = SleepingLoaderDataset(64)
    runner = TrialRunner(dataset, 4, {}, probe_hardware(), TransferPath(), limits, listener=LogProgress(stream))
    try:
        trial = runner.measure(2, 8, False)
        assert trial.rough and runner.last_cut is not None and runner.last_cut[0] == "the dataset ran out"
        assert runner.remeasure(trial) is trial  # the repeat ran out too: nothing measured
    finally:
        runner.close()
    nothing = stream.getvalue().splitlines()[-1]
    assert "measured nothing more (the dataset ran out before one steady round" in nothing, nothing
    assert "one pass of it is 16 batches, 16 of them in flight at 2 workers" in nothing
    assert "a longer time_budget cannot help" in nothing and "the time budget ran out" not in nothing
