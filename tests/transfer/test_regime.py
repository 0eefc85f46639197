"""CopyRegime: the side stream or the stock copy, from whether the GPU was idle at each hand-over."""

from __future__ import annotations

import pytest

from lightning_dataperf.transfer.regime import CopyRegime


def test_a_host_bound_window_sends_the_next_batches_the_stock_way():
    regime = CopyRegime(window=8)
    first = [regime.observe(compute_idle=True) for _ in range(8)]
    assert first == [False] * 7 + [True]  # decided at the window's end, applied from that batch on
    assert all(regime.observe(compute_idle=True) for _ in range(20))
    assert regime.switches == 1
    assert "host-bound" in regime.describe()


def test_a_gpu_bound_run_keeps_the_side_stream():
    regime = CopyRegime(window=8)
    # busy at most hand-overs: the side stream hides the copy behind queued compute
    pattern = [False, False, True, False]
    assert not any(regime.observe(compute_idle=pattern[i % 4]) for i in range(200))
    assert regime.switches == 0
    assert regime.describe() == "side stream for all 200 large batches"


def test_once_the_copy_delays_the_step_it_goes_back_and_looks_twice_as_long():
    regime = CopyRegime(window=4)
    for _ in range(4):
        regime.observe(compute_idle=True)
    assert regime.stock
    # the stock copy now keeps the GPU busy at the hand-overs
    for _ in range(4):
        regime.observe(compute_idle=False)
    assert not regime.stock and regime.window == 8 and regime.switches == 2
    # idle again: the next decision needs the longer window
    assert [regime.observe(compute_idle=True) for _ in range(8)] == [False] * 7 + [True]


def test_an_edge_between_the_thresholds_does_not_switch():
    regime = CopyRegime(window=10, to_stock=0.9, to_side=0.5)
    # idle 70% of the time: below to_stock, so the side stream stays
    assert not any(regime.observe(compute_idle=i % 10 < 7) for i in range(100))


def test_counts_every_batch_once():
    regime = CopyRegime(window=5)
    for i in range(23):
        regime.observe(compute_idle=i >= 5)
    assert regime.stock_batches + regime.side_batches == 23


@pytest.mark.parametrize(("window", "to_side", "to_stock"), [(0, 0.5, 0.9), (8, 0.9, 0.5), (8, 0.5, 1.5)])
def test_bad_settings_are_refused_with_the_rule(window, to_side, to_stock):
    with pytest.raises(ValueError, match=r"window|to_side"):
        CopyRegime(window=window, to_side=to_side, to_stock=to_stock)
