"""The online loop on two gloo ranks: one decision, the same batch's switch on each, the untuned samples on each."""

from __future__ import annotations

import json
import subprocess
import time

import psutil
import pytest
from helpers import HERE, ROOT, run_two_ranks
from scripts.ddp_online_script import EPOCHS, LENGTH

from lightning_dataperf.testing import loopback_ranks


def load(out_dir, mode):
    return [json.loads((out_dir / f"{mode}_rank{rank}.json").read_text()) for rank in (0, 1)]


#: Each run of the module's fixture takes about 10 s; past this it fails with each rank's stacks.
RUN_TIMEOUT = 120.0

# the six runs of the fixture under one test's timeout: a hung run must reach its stack dump (it once did not, at
# the 300-s default: the dump comes 30 s before RUN_TIMEOUT and the launcher's shutdown takes up to 45 s more)
pytestmark = pytest.mark.timeout(6 * (RUN_TIMEOUT + 45) + 60)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("ddp_online")
    saved_root = str(out_dir / "root")

    def run(*args: str) -> None:
        run_two_ranks("ddp_online_script.py", out_dir, *args, timeout=RUN_TIMEOUT)

    run("untuned")
    run("online", str(out_dir / "online"))
    # 120 samples per rank in batches of 4: step 20 is mid-epoch 0, mid-trial (a trial is 8 batches and its start-up)
    run("resume", str(out_dir / "fresh"), str(out_dir / "ckpt" / "epoch=0-step=20.ckpt"))
    run("saving", saved_root)
    run("again", saved_root)
    run("changed", saved_root)
    return out_dir


@pytest.mark.slow
def test_each_rank_sees_the_untuned_samples_order_and_draws_across_switches(runs):
    untuned, tuned = load(runs, "untuned"), load(runs, "online")
    for rank in (0, 1):
        assert tuned[rank]["switches"], "the loop switched settings"
        assert tuned[rank]["rows"] == untuned[rank]["rows"], "(epoch, index, worker epoch, draw) of every sample"
    for epoch in range(EPOCHS):
        first, second = ({row[1] for row in tuned[rank]["rows"] if row[0] == epoch} for rank in (0, 1))
        assert not first & second and first | second == set(range(LENGTH)), "disjoint shards that cover the epoch"


@pytest.mark.slow
def test_every_rank_switches_at_the_same_batch_and_keeps_the_same_setting(runs):
    for mode in ("online", "changed"):
        rank0, rank1 = load(runs, mode)
        assert rank0["switches"] == rank1["switches"]
        # QUICK's trials of 8 batches: a sync point every 4 batches
        assert all(batch % 4 == 0 for batch, _ in rank0["switches"]), "switches only at the sync points"
    rank0, rank1 = load(runs, "online")
    assert rank0["summary"] == rank1["summary"] and "one decision for all 2 ranks" in rank0["summary"]
    assert rank0["waits"] == rank1["waits"] and sum(sum(batches) for batches in rank0["waits"]) == 2 * EPOCHS * 30, (
        "each rank's data wait over every batch it fetched, gathered under the setting in use"
    )
    rank0, rank1 = load(runs, "saving")
    assert rank0["kept"] is not None and rank0["kept"] == rank1["kept"] and rank0["summary"] == rank1["summary"]


@pytest.mark.slow
def test_a_resume_from_a_checkpoint_saved_mid_trial_continues_each_ranks_order(runs):
    untuned, resumed = load(runs, "untuned"), load(runs, "resume")
    for rank in (0, 1):
        assert resumed[rank]["rows"] == untuned[rank]["rows"][20 * 4 :]


@pytest.mark.slow
def test_the_next_run_starts_from_the_saved_setting_and_a_changed_loader_starts_afresh(runs):
    tuned, again, changed = load(runs, "saving"), load(runs, "again"), load(runs, "changed")
    for rank in (0, 1):
        assert again[rank]["start"] == tuned[0]["kept"], "the loop starts where the last run ended"
        assert any("started from the setting a previous run kept" in note for note in again[rank]["notes"])
        assert again[rank]["rows"] == load(runs, "untuned")[rank]["rows"]
        assert any("no setting for this loader or world size" in note for note in changed[rank]["notes"])
    user = "num_workers=1, prefetch_factor=2, pin_memory=False, threads=1"
    assert set(again[0]["tried"]) <= {tuned[0]["kept"], user}, "the saved setting only confirmed against the user's"


@pytest.mark.slow
def test_a_stop_by_max_steps_mid_trial_ends_every_rank(runs):
    changed = load(runs, "changed")
    for rank in (0, 1):
        assert len(changed[rank]["rows"]) == 25 * 6, "25 steps of 6 samples, then the fit ends on both ranks"
        assert "rank 1 (node 0) waited for data" in changed[rank]["summary"], "the straggler named on both ranks"


@pytest.mark.slow
@pytest.mark.parametrize("failing", [0, 1])
def test_a_rank_failing_mid_switch_ends_both_ranks_with_its_error_and_no_worker_left(tmp_path, failing):
    script = str(HERE / "scripts" / "ddp_online_script.py")
    command, env = loopback_ranks(script, str(tmp_path), f"fail{failing}", pythonpath=str(ROOT))
    run = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode != 0
    assert f"rank {failing} failed mid-switch" in run.stdout + run.stderr
    pids = [pid for rank in (0, 1) for pid in json.loads((tmp_path / f"fail{failing}_pids{rank}.json").read_text())]
    # a worker notices its parent is gone within the DataLoader's 5-s status check
    deadline = time.monotonic() + 30
    while (alive := [pid for pid in pids if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive, "no rank or loader worker outlives the failed run"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
