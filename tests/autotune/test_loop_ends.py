"""The run's end during a search: a look that cannot be decided before the planned run ends is not started, a fit
that ends mid-search keeps the best it measured (said, saved), and max_steps counts accumulated batches."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import lightning.pytorch as pl
from helpers import IndexData, RecordingModel, trainer_kwargs
from lightning.pytorch.callbacks import Callback

from lightning_dataperf.autotune.online import OnlineLoop, Setting, SettingSpace
from lightning_dataperf.autotune.online.loop import ENDED, RAN_OUT
from lightning_dataperf.autotune.online.saved import SAVED_FILE
from lightning_dataperf.autotune.options import OnlineTuning
from lightning_dataperf.datamodule.online import OnlineTuner

ZERO = Setting(0, None, False, 2)
TWO = Setting(2, 2, False, 1)
CPU = SettingSpace(max_workers=4, cpus=2, tune_threads=True, tune_pinning=False)


def _drive(loop, steps, seed=0):
    """Noisy steps (30% a period, seeded): 2 workers + 1 thread 6% faster, a close call; the setting in use."""
    rng, now, current = random.Random(seed), 0.0, ZERO
    for _ in range(steps):
        if current.num_workers == 0:
            loop.fetched(0.03)
        setting = loop.step(now)
        if setting is not None:
            loop.switched(0.0)
            current = setting
            loop.restart(1)
        now += (0.094 if current == TWO else 0.1) * max(0.2, rng.gauss(1.0, 0.3))
    return current


def test_a_look_that_cannot_be_decided_before_the_planned_run_ends_is_not_started():
    loop = OnlineLoop(ZERO, CPU, min_seconds=0.0, max_cost=1.0, planned=lambda: 250.0)
    in_use = _drive(loop, 250)
    result = loop.result
    # the start and one look at 2 workers (+4%, within its error) fit; the start's second look (100 steps) does not
    assert [trial.setting for trial in result.trials] == [ZERO, TWO]
    assert result.done and result.stop_reason == RAN_OUT
    assert result.kept.setting == ZERO and in_use == ZERO, "the rest of the run on the best measured beyond noise"
    assert result.unconfirmed is not None and result.unconfirmed.setting == TWO
    summary = result.summary()
    assert "2 workers + 1 thread read +4% ± 4% in 102 batches; not confirmed: the planned run ends" in summary
    assert "a longer run would settle it" in summary and "cap" not in summary, summary
    # planned long, the same steps go on to settle it: the start measured again
    loop = OnlineLoop(ZERO, CPU, min_seconds=0.0, max_cost=1.0, planned=lambda: 1e6)
    _drive(loop, 250)
    assert not loop.result.done and loop.trial.setting == ZERO and len(loop.result.trials) == 2


def test_a_resumed_fit_counts_the_steps_it_took_before():
    # 900 of 1,000 planned steps taken before the resume: after the start, no look fits in the rest
    loop = OnlineLoop(ZERO, CPU, min_seconds=0.0, max_cost=1.0, planned=lambda: 1000.0, taken=lambda: 900.0)
    in_use = _drive(loop, 150)
    assert loop.result.done and loop.result.stop_reason == RAN_OUT and len(loop.result.trials) == 1
    assert in_use == ZERO


def test_a_fit_that_ends_mid_search_keeps_the_best_it_measured():
    loop = OnlineLoop(ZERO, CPU, min_seconds=0.0, max_cost=1.0, planned=lambda: 1e6)
    _drive(loop, 330)
    assert not loop.result.done and loop.result.kept is None
    assert loop.conclude()
    result = loop.result
    assert result.done and result.stop_reason == ENDED and result.kept.setting == ZERO
    assert "still searching" not in result.summary() and "not confirmed: the fit ended" in result.summary()
    assert not loop.conclude() and loop.step(1e3) is None, "decided once; nothing switched after the fit"
    # nothing measured yet: nothing to keep
    assert not OnlineLoop(ZERO, CPU, planned=lambda: 1e6).conclude()


def test_a_fit_stopped_mid_search_reports_and_saves_what_it_kept(tmp_path):
    class Stop(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 30:
                trainer.should_stop = True

    quick = OnlineTuning(precision=10.0, max_batches=8, max_cost=10.0, min_seconds=0.0)
    module = IndexData(length=240, workers=1, seed=5, verbose=False, autotune=quick)
    trainer = pl.Trainer(max_epochs=50, callbacks=[Stop()], **trainer_kwargs(tmp_path))
    trainer.fit(RecordingModel(), datamodule=module)
    result = module.online_result
    assert trainer.global_step == 30 and len(result.trials) >= 2
    assert result.done and result.stop_reason == ENDED, result.summary()
    (saved,) = json.loads((tmp_path / "lightning_logs" / SAVED_FILE).read_text())["entries"].values()
    assert Setting(**saved) == result.kept.setting, "the next run starts from it"


def test_max_steps_counts_the_batches_accumulate_grad_batches_takes():
    trainer = SimpleNamespace(max_epochs=-1, max_steps=100, accumulate_grad_batches=4, num_training_batches=1000)
    trainer.global_step = 10
    tuner = OnlineTuner(trainer, ZERO, CPU, position=lambda: (0, 0))
    assert tuner.loop.planned() == 400.0 and tuner.loop.taken() == 40.0
    trainer.max_epochs, trainer.max_steps = 2, -1
    assert tuner.loop.planned() == 2000.0


def test_a_switchs_burst_is_capped_at_a_quarter_of_the_epoch_as_the_glue_skips_it():
    from lightning_dataperf.autotune.online import Measured, burst_of

    assert burst_of(16, 4) == 64 and burst_of(16, 4, epoch_batches=40) == 10 and burst_of(0, None, 40) == 1
    many = Setting(16, 4, False, 1)
    loop = OnlineLoop(ZERO, SettingSpace(16, 2, True, False), min_seconds=0.0, planned=lambda: 100.0)
    loop._incumbent = Measured(ZERO, 10.0, 0.01, 100, 10.0)
    # a look of 48 batches (3 a worker) after 64 queued ones does not fit 100 planned; after the 10 skipped, it does
    assert not loop._fits(many, None, ZERO)
    loop.epoch_batches = 40
    assert loop._fits(many, None, ZERO)
