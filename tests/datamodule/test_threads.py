"""CPU training: the intra-op threads TunedDataModule sets beside the loader's workers, and gives back (issue 37)."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from helpers import IndexData, RecordingModel, trainer_kwargs
from lightning.pytorch.callbacks import Callback

from lightning_dataperf import OnlineTuning
from lightning_dataperf.autotune.online import Setting, SettingSpace
from lightning_dataperf.datamodule.online import OnlineTuner
from lightning_dataperf.loader.policy import intra_op_threads


def test_the_policy_cuts_the_threads_only_where_workers_and_threads_outnumber_the_cores():
    threads, reason = intra_op_threads(workers=1, cpus=2, current=2)
    assert threads == 1 and "1 workers and this process's 2 intra-op threads would share 2 cores" in reason
    assert intra_op_threads(workers=3, cpus=2, current=2)[0] == 1, "at least one"
    assert intra_op_threads(workers=2, cpus=8, current=4) is None, "2 + 4 fit 8 cores"
    assert intra_op_threads(workers=0, cpus=2, current=2) is None


class Threads(Callback):
    def on_train_start(self, trainer, pl_module):
        self.during = torch.get_num_threads()


def fit(tmp_path, **options):
    data, seen = IndexData(length=16, workers=1, verbose=False, **options), Threads()
    pl.Trainer(max_epochs=1, callbacks=[seen], **trainer_kwargs(tmp_path)).fit(RecordingModel(), datamodule=data)
    return data, seen.during


@pytest.fixture
def more_threads_than_cores():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_cpu_fit_runs_with_the_threads_beside_its_workers_and_gives_the_users_back(tmp_path, more_threads_than_cores):
    data = IndexData(verbose=False)
    cpus = data.hardware.cpus_per_rank
    torch.set_num_threads(cpus + 1)  # with 1 worker, more than the cores whatever the machine
    data, during = fit(tmp_path)
    assert during == max(1, cpus - 1)
    assert torch.get_num_threads() == cpus + 1, "the user's count back after fit"
    plan = data.loader_plans["train"][0]
    assert plan.chosen["intra_op_threads"] == during
    assert any(f"torch.set_num_threads({during}) (was {cpus + 1})" in note for note in plan.notes), plan.notes


def test_intra_op_threads_none_leaves_them_alone_and_a_count_is_set(tmp_path, more_threads_than_cores):
    cpus = IndexData(verbose=False).hardware.cpus_per_rank
    torch.set_num_threads(cpus + 1)
    assert fit(tmp_path, intra_op_threads=None)[1] == cpus + 1
    assert fit(tmp_path, intra_op_threads=3)[1] == 3 and torch.get_num_threads() == cpus + 1
    with pytest.raises(ValueError, match="'auto', None or a positive int"):
        IndexData(intra_op_threads=0)


class Fails(RecordingModel):
    """Raises ``error`` mid-run, in the first step from the fourth on that runs with other intra-op threads than
    ``user``'s (``intra_op_threads=1``, or the online loop's trial), else in its 36th."""

    def __init__(self, error: BaseException, user: int) -> None:
        super().__init__()
        self.error, self.user, self.threads_then = error, user, None

    def training_step(self, batch, batch_idx):
        if (batch_idx >= 3 and torch.get_num_threads() != self.user) or batch_idx == 35:
            self.threads_then = torch.get_num_threads()
            raise self.error
        return super().training_step(batch, batch_idx)


@pytest.fixture
def sigint_kept():
    """Lightning ignores SIGINT from a KeyboardInterrupt on (a second Ctrl+C must not cut its shutdown)."""
    handler = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, handler)


QUICK = OnlineTuning(precision=10.0, max_batches=2, max_cost=10.0, min_seconds=0.0)


@pytest.mark.parametrize(
    ("error", "raised"),
    [(RuntimeError("boom"), RuntimeError), (KeyboardInterrupt(), SystemExit)],
    ids=["raise", "ctrl-c"],
)
@pytest.mark.parametrize("threads", [1, None], ids=["intra_op_threads=1", "the-loop's-threads"])
def test_a_fit_that_fails_mid_trial_gives_the_threads_back(
    tmp_path, more_threads_than_cores, sigint_kept, error, raised, threads
):
    torch.set_num_threads(2)
    data = IndexData(length=160, workers=0, verbose=False, autotune=QUICK, intra_op_threads=threads)
    model = Fails(error, user=2)
    with pytest.raises(raised):
        pl.Trainer(max_epochs=1, **trainer_kwargs(tmp_path)).fit(model, datamodule=data)
    assert model.threads_then == 1, "the fit (or its loop) had changed the threads when it failed"
    assert torch.get_num_threads() == 2, "the user's count, not the fit's"


def test_the_loop_calls_set_num_threads_only_where_the_count_changes(monkeypatch):
    """Every switch of the loop sets the threads it names; a count already in force is not set again."""
    calls = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda count: (calls.append(count), real(count)))
    before = torch.get_num_threads()
    trainer = SimpleNamespace(max_epochs=1, max_steps=-1, num_training_batches=100, global_step=0)
    tuner = OnlineTuner(trainer, Setting(0, None, False, before), SettingSpace(4, 2, True, False), lambda: (0, 0))
    try:
        tuner.switched(0.0, Setting(2, 2, False, before))
        tuner.switched(0.0, Setting(3, 2, False, before))
        assert calls == [], "the same count: no call"
        tuner.switched(0.0, Setting(3, 2, False, before + 1))
        assert calls == [before + 1] and torch.get_num_threads() == before + 1
        tuner.close()
        assert calls == [before + 1, before] and torch.get_num_threads() == before
    finally:
        real(before)
