"""Issue 39: autotune's table lists the trials in the order measured (the policy's pick first, the hand-over's trial
where it was made), and marks the chosen one."""

from __future__ import annotations

from autotune_fakes import SlowSamples
from helpers import fake_hardware

from lightning_dataperf.autotune.consumer import TransferPath
from lightning_dataperf.autotune.result import AutotuneResult
from lightning_dataperf.autotune.runner import TrialRunner
from lightning_dataperf.autotune.trial import Limits, Trial
from lightning_dataperf.loader.settings import LoaderSettings


def test_trials_come_in_the_order_measured_and_the_pick_is_marked(monkeypatch):
    limits = Limits(100.0, 60, 0.03, 0.5, None, 0)
    runner = TrialRunner(SlowSamples(100), 4, {}, fake_hardware(), TransferPath(), limits)
    rates = {1: 14.0, 4: 55.0, 16: 209.0}

    def run(workers, prefetch, pin, cap_scale=1.0, against=None, sharing=None):
        rate = 180.0 if sharing else rates[workers]
        return Trial(workers, prefetch if workers else None, pin, rate, batches=40, sharing=sharing)

    monkeypatch.setattr(runner, "run", run)
    for workers in (1, 4, 16):
        best = runner.measure(workers, 2, False)
    runner.measure_sharing(best, "file_system")  # the hand-over's trial, kept apart in runner.earlier
    ordered = runner.in_order()
    assert [(trial.num_workers, trial.sharing) for trial in ordered] == [
        (1, None),
        (4, None),
        (16, None),
        (16, "file_system"),
    ]
    settings = LoaderSettings(16, False, True, 2, {})
    result = AutotuneResult(settings, tuple(ordered), 3.0, 14.0, 209.0, 209.0, batch_size=4)
    rows = result.format().splitlines()[-4:]
    assert rows[0].split()[0] == "1", "the policy's pick, measured first, is the first row"
    assert [row.endswith("<- chosen") for row in rows] == [False, False, True, False]
