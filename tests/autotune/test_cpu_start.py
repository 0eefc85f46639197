"""Where a CPU run at num_workers=0 moves first: the first-workers rule the verdict and the online loop share."""

from __future__ import annotations

from lightning_dataperf.loader.policy import first_workers, workers_needed


def test_the_first_workers_keep_loading_up_with_the_step_and_leave_cores_as_threads():
    assert workers_needed(0.030, 0.018, 8) == 3 and workers_needed(0.030, 0.018, 2) == 2
    assert workers_needed(0.001, 0.100, 8) == 2, "one making the batch after next"
    assert first_workers(0.029, 0.059, 2) == [(2, 1), (1, 1)]
    assert first_workers(0.030, 0.018, 4)[:3] == [(3, 1), (4, 1), (2, 2)]
    assert first_workers(0.001, 0.018, 2) == [], "below a hand-over's cost no worker count is pointed to"
