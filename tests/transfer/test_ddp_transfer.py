"""Side-stream copies under DDP: two ranks on the one GPU (gloo), each with its own side stream."""

import json

import pytest
from helpers import run_two_ranks

pytestmark = pytest.mark.cuda


@pytest.mark.slow
def test_each_rank_copies_its_own_shard_exactly_on_its_own_side_stream(tmp_path):
    run_two_ranks("ddp_side_stream_script.py", tmp_path)
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [record["rank"] for record in ranks] == [0, 1] and ranks[0]["world_size"] == 2
    for record in ranks:
        assert record["side_stream_active"] and not record["stream_is_default"]
        batches = len(record["indices"]) // 8
        assert batches == 8, f"64 samples / 2 ranks / batch 8 = 4 batches x 2 epochs, not {batches}"
        assert record["side_copies"] == batches, f"{record['side_copies']} side-stream copies for {batches} batches"
        assert record["mismatches"] == 0
        assert record["copies"]["gbps"] > 0
    for epoch in range(2):
        shards = [record["indices"][epoch * 32 : (epoch + 1) * 32] for record in ranks]
        assert not set(shards[0]) & set(shards[1]) and sorted(shards[0] + shards[1]) == list(range(64))
