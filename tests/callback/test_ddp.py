import json

import pytest
from helpers import run_two_ranks


@pytest.mark.slow
def test_cross_rank_summary_names_the_straggler(tmp_path):
    run_two_ranks("ddp_timing_script.py", tmp_path)
    rank0, rank1 = (json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1))
    local = ("loader", "stalls", "host_gap", "rank")  # each rank's own loader and probe figures, and which rank
    assert {k: v for k, v in rank0.items() if k not in local} == {k: v for k, v in rank1.items() if k not in local}
    assert rank0["loader"]["batches"] == rank1["loader"]["batches"] == 11  # 12 steps, the first is start-up
    assert rank0["world_size"] == 2 and rank0["steps"] == 24  # 12 steps on each rank
    assert rank0["slowest_rank"] == 1 and (rank0["rank"], rank1["rank"]) == (0, 1)
    wait0, wait1 = rank0["rank_data_wait"]
    assert wait1 == pytest.approx(0.040, rel=0.25) and wait0 < 0.015
    assert rank0["straggler_ratio"] > 2.5
    # the gathered distribution holds both ranks' waits: p90 is rank 1's, p50 sits between
    assert rank0["timings"]["DataLoading"]["max"] >= 0.040 * 0.9
    assert rank0["timings"]["DataLoading"]["count"] == 22  # the first step of each rank is start-up
    verdict = json.loads((tmp_path / "rank0_verdict.json").read_text())
    straggler = [finding for finding in verdict["findings"] if finding["kind"] == "straggler"]
    assert straggler and "rank 1" in straggler[0]["headline"]
