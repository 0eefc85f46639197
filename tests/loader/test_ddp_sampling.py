"""Two gloo ranks on the CPU: disjoint shards, padding/trimming counts, new order per epoch, exact resume."""

import json
from collections import Counter

import pytest
from helpers import run_two_ranks
from scripts.ddp_sampling_script import TRAIN_LENGTH, VAL_LENGTH


def load(out_dir, mode):
    return [json.loads((out_dir / f"{mode}_rank{rank}.json").read_text()) for rank in (0, 1)]


def epoch_indices(record, epoch):
    return [row[1] for row in record["rows"] if row[0] == epoch]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("ddp_sampling")
    run_two_ranks("ddp_sampling_script.py", out_dir, "pad")
    run_two_ranks("ddp_sampling_script.py", out_dir, "rerun")
    run_two_ranks("ddp_sampling_script.py", out_dir, "drop")
    # 31 samples / 2 ranks = 16 per rank = 4 steps per epoch; step 6 is mid-epoch 1 (2 of its 4 batches done)
    run_two_ranks("ddp_sampling_script.py", out_dir, "resume", str(out_dir / "ckpt" / "epoch=1-step=6.ckpt"))
    return out_dir


@pytest.mark.slow
def test_padded_shards_are_disjoint_and_cover_the_dataset(runs):
    rank0, rank1 = load(runs, "pad")
    for epoch in range(3):
        seen = Counter(epoch_indices(rank0, epoch) + epoch_indices(rank1, epoch))
        assert set(seen) == set(range(TRAIN_LENGTH))
        assert sum(seen.values()) == TRAIN_LENGTH + 1 and sum(count - 1 for count in seen.values()) == 1
    assert rank0["padded"] == rank1["padded"] == 1 and rank0["dropped"] == 0
    assert epoch_indices(rank0, 0) != epoch_indices(rank0, 1) != epoch_indices(rank0, 2)
    assert rank0["val_padded"] == 1, "Lightning's evaluation sampler repeats one sample; we report it"


@pytest.mark.slow
def test_a_rerun_sees_the_same_order(runs):
    assert load(runs, "rerun") == load(runs, "pad")


@pytest.mark.slow
def test_trimmed_shards_and_unpadded_evaluation(runs):
    rank0, rank1 = load(runs, "drop")
    for epoch in range(3):
        first, second = set(epoch_indices(rank0, epoch)), set(epoch_indices(rank1, epoch))
        assert not first & second and len(first | second) == TRAIN_LENGTH - 1
    assert rank0["dropped"] == 1 and rank0["padded"] == 0
    val = Counter(rank0["val_indices"] + rank1["val_indices"])
    assert sorted(val) == list(range(VAL_LENGTH)) and set(val.values()) == {3}, "each sample once per validation"
    assert rank0["val_avoided"] == 1


@pytest.mark.slow
def test_resumed_ddp_run_continues_the_uninterrupted_order(runs):
    full = load(runs, "pad")
    resumed = load(runs, "resume")
    for rank in (0, 1):
        assert epoch_indices(resumed[rank], 1) == epoch_indices(full[rank], 1)[2 * 4 :]
        assert epoch_indices(resumed[rank], 2) == epoch_indices(full[rank], 2)
        assert [row[3] for row in resumed[rank]["rows"] if row[0] == 2] == [
            row[3] for row in full[rank]["rows"] if row[0] == 2
        ]
