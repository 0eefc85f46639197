"""autotune=OnlineTuning(...): settings tried on the training steps, the same samples in the same order."""

from __future__ import annotations

from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from helpers import IndexData, RecordingModel, trainer_kwargs
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lightning_dataperf.autotune.online import Setting, SettingSpace
from lightning_dataperf.autotune.options import OnlineTuning
from lightning_dataperf.telemetry.processes import loader_worker_processes

#: every trial ends at its first 8 counted batches, so the loop switches whatever the machine's speed
QUICK = {"precision": 10.0, "max_batches": 8, "max_cost": 10.0, "min_seconds": 0.0}


def fit(tmp_path, datamodule, epochs=3, ckpt_path=None, every=None, callbacks=(), **trainer_options):
    model = RecordingModel()
    callbacks = list(callbacks)
    if every:
        callbacks.append(ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=every, save_top_k=-1))
    options = trainer_kwargs(tmp_path, enable_checkpointing=bool(every), num_sanity_val_steps=0, **trainer_options)
    trainer = pl.Trainer(max_epochs=epochs, callbacks=callbacks, **options)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return model


def indices(model):
    return [(epoch, index) for epoch, index, _, _ in model.rows]


def online(**kwargs):
    return IndexData(length=240, workers=1, seed=5, verbose=False, autotune=OnlineTuning(**QUICK), **kwargs)


def test_the_loop_switches_settings_and_the_model_sees_the_untuned_order(tmp_path):
    untuned = fit(tmp_path / "untuned", IndexData(length=240, workers=1, seed=5, verbose=False))
    datamodule = online()
    tuned = fit(tmp_path / "online", datamodule)
    result = datamodule.online_result
    assert len({trial.setting for trial in result.trials}) >= 2, "the loop tried more than its start"
    assert indices(tuned) == indices(untuned), "nothing lost, duplicated or reordered"
    assert len(indices(tuned)) == 3 * 240
    assert not loader_worker_processes(), "no worker left"


def test_every_batch_draws_the_same_whatever_settings_the_loop_tries(tmp_path):
    """Each batch's random draws are keyed by its number: an online run draws what a 0-worker run does."""
    in_process = fit(tmp_path / "zero", IndexData(length=240, workers=0, seed=5, verbose=False))
    datamodule = online()
    tuned = fit(tmp_path / "online", datamodule)
    assert len({trial.setting.num_workers for trial in datamodule.online_result.trials}) >= 2, "worker counts changed"
    assert tuned.rows == in_process.rows, "(epoch, index, the worker's epoch, the draw) of every sample"


def test_a_resume_in_the_middle_of_a_trial_continues_the_untuned_order(tmp_path):
    untuned = fit(tmp_path / "untuned", IndexData(length=240, workers=1, seed=5, verbose=False), epochs=2)

    class Stop(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == 75:  # epoch 1, batch 15: the loop is mid-trial
                raise RuntimeError("stopped mid-epoch")

    stopped_module = online()
    stopped = RecordingModel()
    options = trainer_kwargs(tmp_path / "stopped", enable_checkpointing=True, num_sanity_val_steps=0)
    checkpoint = ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    trainer = pl.Trainer(max_epochs=2, callbacks=[checkpoint, Stop()], **options)
    with pytest.raises(RuntimeError, match="stopped mid-epoch"):
        trainer.fit(stopped, datamodule=stopped_module)
    assert stopped_module.online_result.trials, "a trial had ended before the stop"
    resumed = fit(tmp_path / "resumed", online(), epochs=2, ckpt_path=tmp_path / "ckpt" / "epoch=1-step=75.ckpt")
    assert indices(stopped) + indices(resumed) == indices(untuned)


def test_the_loop_restores_the_users_threads_and_leaves_the_training_generator_alone(tmp_path):
    threads = torch.get_num_threads()
    pl.seed_everything(3)
    fit(tmp_path / "a", IndexData(length=240, workers=1, seed=5, verbose=False), epochs=1)
    untuned_draw = torch.rand(1)
    pl.seed_everything(3)
    fit(tmp_path / "b", online(), epochs=1)
    assert torch.rand(1) == untuned_draw, "rebuilding the iterator draws from a forked generator"
    assert torch.get_num_threads() == threads


def test_online_is_off_with_a_reason_where_it_cannot_run(tmp_path):
    datamodule = online()
    trainer = pl.Trainer(fast_dev_run=2, **trainer_kwargs(tmp_path))
    trainer.fit(RecordingModel(), datamodule=datamodule)
    assert datamodule.online_result is None
    assert any("online tuning off: fast_dev_run" in note for note in datamodule.loader_plans["train"][0].notes)


def test_a_bad_autotune_value_names_the_choices():
    with pytest.raises(TypeError, match=r"autotune='onlin'\): use autotune=OnlineTuning\(\.\.\.\).*SearchTuning"):
        IndexData(autotune="onlin")


def _fake_trainer(batches_per_epoch=1000):
    progress = SimpleNamespace(total=SimpleNamespace(ready=0))
    loop = SimpleNamespace(epoch_loop=SimpleNamespace(val_loop=SimpleNamespace(batch_progress=progress)))
    return SimpleNamespace(current_epoch=0, fit_loop=loop, max_epochs=1, num_training_batches=batches_per_epoch)


START = Setting(1, 2, False, 2)


def _tuner(monkeypatch, max_workers, precision):
    """A tuner from :data:`START` on a fake 1000-step run whose budget (1%) is 1 s at 10 steps/s."""
    from lightning_dataperf.datamodule.online import OnlineTuner

    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)
    space = SettingSpace(max_workers=max_workers, cpus=2, tune_threads=False, tune_pinning=False)
    options = {"precision": precision, "max_cost": 0.01, "min_seconds": 0.0}
    return OnlineTuner(_fake_trainer(), START, space, position=lambda: (0, 0), **options)


def _drive(tuner, period_of, steps, stall=0.0, epoch=None, burst=1):
    """Calls the tuner as the loader's iterator would, with step periods that depend on the setting in use.

    ``stall``: seconds each switch stops training; ``epoch``: steps between epoch starts (each skips ``burst``).
    """
    now, current = 0.0, tuner.trial.setting if tuner.trial is not None else tuner.result.kept.setting
    for step in range(steps):
        if epoch and step % epoch == 0:
            tuner.restart_segment(burst)
        switch = tuner.step(now)
        if switch is not None:
            tuner.switched(stall, switch)
            current = switch
            tuner.restart_segment(burst)
        now += period_of(current)
    return current


def test_the_loop_stops_at_its_cost_cap_on_the_setting_it_stood_on(monkeypatch):
    start = START
    # a neighbour at half the speed spends the 1-s budget in 10 steps
    tuner = _tuner(monkeypatch, max_workers=4, precision=0.5)
    in_use = _drive(tuner, lambda setting: 0.1 if setting == start else 0.2, 200)
    result = tuner.result
    assert result.done and "cost 1.0% of the run" in result.stop_reason
    assert len(result.trials) == 2, "the start and one slower neighbour, cut where it spent the budget"
    assert result.kept.setting == start and in_use == start, "back on the start, not on an unconfirmed trial"
    assert 1.0 <= result.cost_s <= 1.3


def test_a_trial_far_faster_is_kept_even_where_its_switch_spent_the_budget(monkeypatch):
    # benchmarks/online.py's "large" pipeline: 2 workers read 1.41x the start and the start was kept
    tuner = _tuner(monkeypatch, max_workers=4, precision=0.5)
    faster = Setting(2, 2, False, 2)
    in_use = _drive(tuner, lambda setting: 0.05 if setting == faster else 0.1, 200, stall=1.5)
    result = tuner.result
    assert result.done and "cost 1.0% of the run" in result.stop_reason
    assert result.kept.setting == faster and in_use == faster


def test_a_trial_does_not_count_the_backlog_a_switch_left_queued(monkeypatch):
    # on the H200, 32 JPEG workers read 56 steps/s in the loop (the queue filled while they started) and 25 alone
    tuner = _tuner(monkeypatch, max_workers=2, precision=0.5)
    candidate, backlog, last = Setting(2, 2, False, 2), [0], [START]
    tuner.queued = lambda: backlog[0]

    def period(setting):
        if setting != last[0]:
            last[0] = setting
            backlog[0] = 40 if setting == candidate else 0
        if backlog[0]:  # a queued batch: only the step's own time
            backlog[0] -= 1
            return 0.02
        return 0.2 if setting == candidate else 0.1

    in_use = _drive(tuner, period, 200)
    trial = next(trial for trial in tuner.result.trials if trial.setting == candidate)
    assert trial.steps_per_sec < 10, "the rate the workers made batches at, not the backlog's"
    assert trial.pooled(trial).steps_per_sec == pytest.approx(trial.steps_per_sec), "a second look keeps it"
    assert tuner.result.kept.setting == START and in_use == START


def test_a_trial_of_fast_steps_lasts_its_minimum_seconds_past_max_batches(monkeypatch):
    # 200 steps of tiny batches took 0.17 s on 2 cores: a trial (or drift window) that short reads the moment
    from lightning_dataperf.datamodule.online import OnlineTuner

    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)
    space = SettingSpace(max_workers=2, cpus=2, tune_threads=False, tune_pinning=False)
    options = {"precision": 1e-6, "max_batches": 20, "max_cost": 1.0, "min_seconds": 0.5}
    tuner = OnlineTuner(_fake_trainer(), START, space, position=lambda: (0, 0), **options)
    periods = iter([0.001, 0.003] * 1000)
    _drive(tuner, lambda setting: next(periods), 600)
    first = tuner.result.trials[0]
    assert first.seconds >= 0.5 and first.batches >= 200, (first.seconds, first.batches)


def test_a_long_trial_reads_its_rate_at_a_few_of_its_steps(monkeypatch):
    # reading the rate is O(periods): read at every step, a trial of thousands of tiny steps slows them
    from lightning_dataperf.autotune.online import Segment
    from lightning_dataperf.datamodule import online

    reads = []
    rate = Segment.rate
    monkeypatch.setattr(Segment, "rate", lambda trial: reads.append(len(trial.periods)) or rate(trial))
    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)
    space = SettingSpace(max_workers=2, cpus=2, tune_threads=False, tune_pinning=False)
    options = {"precision": 1e-6, "max_batches": 10_000, "max_cost": 1.0, "min_seconds": 100.0}
    tuner = online.OnlineTuner(_fake_trainer(), START, space, position=lambda: (0, 0), **options)
    periods = iter([0.001, 0.003] * 2000)
    _drive(tuner, lambda setting: next(periods), 4000)
    assert tuner.result.trials == [], "min_seconds=100 not reached: still the first trial"
    assert 0 < len(reads) < 100, len(reads)


def test_a_trial_of_many_workers_ends_on_short_epochs():
    # 32 workers x 4 prefetched skipped every batch of a 125-batch epoch: the H200 JPEG loop never ended a trial
    from torch.utils.data import DataLoader

    from lightning_dataperf.datamodule.online import OnlineTuner, _burst

    loader = DataLoader(range(500), batch_size=4, num_workers=32, prefetch_factor=4)
    space = SettingSpace(max_workers=32, cpus=16, tune_threads=False, tune_pinning=False)
    options = {"precision": 0.2, "max_cost": 1.0, "min_seconds": 0.0}
    tuner = OnlineTuner(_fake_trainer(), Setting(32, 4, True, 1), space, position=lambda: (0, 0), **options)
    _drive(tuner, lambda setting: 0.025, 4 * len(loader), epoch=len(loader), burst=_burst(loader))
    assert tuner.result.trials, "the first trial ended within four epochs"


def test_a_persistent_loaders_workers_outlive_the_epoch_once_the_search_has_ended(tmp_path):
    class Workers(Callback):
        def __init__(self):
            self.seen = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 1:
                self.seen.append(sorted(process.pid for process in loader_worker_processes()))

    # no budget: the search ends on its first trial, at the start
    options = {**QUICK, "max_cost": 0.0}
    # the deprecated spelling (kept for one release) runs the same loop: OnlineTuning(**options)
    with pytest.warns(DeprecationWarning, match=r"autotune=OnlineTuning\(.*max_cost=0\.0"):
        datamodule = IndexData(
            length=240, workers=1, seed=5, verbose=False, autotune="online", autotune_options=options
        )
    assert datamodule.autotune == OnlineTuning(**options)
    workers = Workers()
    fit(tmp_path, datamodule, callbacks=[workers])
    assert datamodule.loader_plans["train"][0].chosen.get("persistent_workers", True)
    assert datamodule.online_result.done and len(datamodule.online_result.trials) == 1
    assert workers.seen[1] == workers.seen[2] and len(workers.seen[1]) == 1, "the same worker in epochs 1 and 2"


def test_a_plain_dataloader_gets_the_loop_in_one_line_and_keeps_its_own_settings(tmp_path):
    from helpers import IndexedDataset
    from torch.utils.data import DataLoader

    from lightning_dataperf import TunedDataModule

    def loader():
        return DataLoader(IndexedDataset(240), batch_size=4, shuffle=True, drop_last=True, num_workers=0)

    untuned = fit(tmp_path / "untuned", TunedDataModule.from_loaders(loader(), seed=5, verbose=False))
    datamodule = TunedDataModule.from_loaders(loader(), seed=5, verbose=False, autotune=OnlineTuning(**QUICK))
    tuned = fit(tmp_path / "online", datamodule)
    plan = datamodule.loader_plans["train"][0]
    assert plan.explicit["num_workers"] == 0 and plan.explicit["drop_last"] is True, "what the user set is kept"
    assert datamodule.online_result.start.setting.num_workers == 0, "the loop starts from the user's setting"
    assert tuned.rows == untuned.rows


@pytest.mark.cuda
def test_on_a_gpu_the_loop_switches_a_pinned_loader_and_the_order_holds(tmp_path):
    untuned = fit(tmp_path / "untuned", IndexData(length=240, workers=1, seed=5, verbose=False), accelerator="gpu")
    datamodule = online()
    tuned = fit(tmp_path / "online", datamodule, accelerator="gpu")
    assert len({trial.setting for trial in datamodule.online_result.trials}) >= 2
    assert datamodule.online_result.trials[0].setting.pin_memory, "pinned to start with, on a GPU run"
    assert indices(tuned) == indices(untuned), "pin thread stopped and restarted without a batch lost"


def test_a_slow_trial_ends_where_it_alone_would_pass_the_cost_cap(monkeypatch):
    start = START
    # a neighbour far slower and never decided (a huge error) would run max_batches=200 steps without the cap
    tuner = _tuner(monkeypatch, max_workers=2, precision=0.01)
    periods = iter([0.01, 0.01, 5.0, 5.0] * 100)
    _drive(tuner, lambda setting: next(periods) if setting != start else 0.1, 60)
    slow = tuner.result.trials[1]
    assert slow.batches < 10, "cut once its own cost passed the cap, not at max_batches"
    assert tuner.result.done and "cost 1.0% of the run" in tuner.result.stop_reason


def test_after_the_search_a_drifting_step_rate_makes_the_loop_look_again(monkeypatch):
    tuner = _tuner(monkeypatch, max_workers=2, precision=0.05)
    tuner.max_cost = 1.0  # budget left for a second search
    faster = Setting(2, 2, False, 2)
    drifted = [False]

    def period(setting):
        if drifted[0]:  # the pipeline changed: 2 workers now win by far
            return 0.05 if setting == faster else 0.2
        return 0.1 if setting == START else 0.2

    _drive(tuner, period, 300)
    result = tuner.result
    assert result.done and result.kept.setting == START and result.looks == 0, "steady: no second look"
    drifted[0] = True
    tuner.restart_segment(0)  # the drive's clock starts again at 0
    in_use = _drive(tuner, period, 1200)
    assert result.looks == 1 and result.done and result.kept.setting == faster and in_use == faster
    assert "looked again 1 times after the step rate drifted" in result.summary()
