"""AutotuneResult: its dict round trip, its summary line, and what the verdict reads from its trials."""

from __future__ import annotations

import dataclasses
import json

import pytest
from helpers import fake_hardware

from lightning_dataperf.autotune.trial import Trial
from lightning_dataperf.autotune.tune import AutotuneResult


def test_result_round_trips_through_its_dict():
    result = AutotuneResult(
        settings=dataclasses.replace(
            __import__("lightning_dataperf").recommend_loader_settings(fake_hardware()), reasons={"a": "b"}
        ),
        trials=(
            Trial(4, 2, True, 12.5, 0.3, 40, 64.0),
            Trial(4, 2, True, 14.0, 0.3, 40, 64.0, sharing="file_system"),  # the same settings, sent by file name
            Trial(32, 2, True, refused="needs ~9000 MB"),
        ),
        search_seconds=1.0,
        baseline_batches_per_sec=2.0,
        best_batches_per_sec=4.0,
        chosen_batches_per_sec=4.0,
        key="abc",
        sharing_strategy="file_system",
    )
    again = AutotuneResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again == result
    assert result.speedup_over_start == 2.0
    settings = dataclasses.replace(result.settings, num_workers=4, prefetch_factor=2, pin_memory=True)
    assert dataclasses.replace(result, settings=settings).chosen_trial.batches_per_sec == 14.0  # the way it was sent
    plain = dataclasses.replace(result, settings=settings, sharing_strategy=None)
    assert plain.chosen_trial.batches_per_sec == 12.5 and "file_system" in plain.format().splitlines()[-2]


def test_summary_line_quotes_the_measurement_and_the_stop():
    result = AutotuneResult(
        settings=__import__("lightning_dataperf").LoaderSettings(16, True, True, 2),
        trials=(Trial(16, 2, True, 29.8, 0.4, 100, 64.0), Trial(24, 2, True, 29.5, 0.6, 100, 96.0)),
        search_seconds=12.0,
        baseline_batches_per_sec=28.0,
        best_batches_per_sec=29.8,
        chosen_batches_per_sec=29.77,
        batch_size=128,
        stop_reason="gain",
        stop_detail="more gave nothing (24 workers: -1%)",
        bounds={"CPU share": 17},
    )
    assert result.summary_line() == (
        "autotune measured 16 workers (prefetch 2, pinned) at 3,811 samples/s; more gave nothing (24 workers: -1%)"
    )
    assert AutotuneResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result
    assert "stopped: more gave nothing" in result.format()
    cached = dataclasses.replace(result, cached=True).summary_line()
    assert cached.startswith("autotune (in an earlier run, from the cache) measured 16 workers")


def test_the_verdict_learns_the_most_autotune_measured_above_its_pick():
    from lightning_dataperf.callback.run_evidence import more_workers_measured
    from lightning_dataperf.diagnosis.evidence import MoreWorkersMeasured

    result = AutotuneResult(
        settings=__import__("lightning_dataperf").LoaderSettings(10, True, False, 2),
        trials=(
            Trial(10, 2, False, 180.0, 0.2, 100, 10.0),
            Trial(16, 2, False, 156.6, 0.3, 100, 16.0),  # -13%
            Trial(20, 2, False, 99.0, 0.4, 100, 20.0),
            Trial(64, 2, False, refused="needs ~9000 MB"),
            Trial(4, 2, False, 110.3, 0.1, 100, 4.0),
        ),
        search_seconds=2.6,
        baseline_batches_per_sec=60.0,
        best_batches_per_sec=180.0,
        chosen_batches_per_sec=180.0,
    )
    assert more_workers_measured(result) == MoreWorkersMeasured(10, 16, pytest.approx(-0.13))
    assert more_workers_measured(dataclasses.replace(result, trials=result.trials[::3])) is None  # none rated above
    assert more_workers_measured(None) is None
