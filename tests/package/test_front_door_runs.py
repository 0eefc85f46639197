"""What a first run leaves behind and how it logs: fast_dev_run, no logger, accumulated gradients, early pre-flight."""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import torch
from helpers import SleepyModel, fake_hardware, scalar_tags, sleepy_loader, trainer_kwargs
from torch.utils.data import DataLoader

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.tags import SUMMARY_FILE


def test_fast_dev_run_writes_no_files_and_gives_no_verdict(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    perf = DataPerfCallback()
    trainer = pl.Trainer(fast_dev_run=True, callbacks=[perf], enable_progress_bar=False, accelerator="cpu")
    trainer.fit(SleepyModel(), sleepy_loader(16, 4, 0.0))
    assert not any(path.name == SUMMARY_FILE for path in tmp_path.rglob("*")), sorted(tmp_path.rglob("*"))
    assert perf.last_diagnosis.findings == [] and "too few steps to judge" in perf.last_diagnosis.format()
    assert "too few steps to judge" in capsys.readouterr().out


def test_without_a_logger_the_summaries_go_with_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "run"
    trainer = pl.Trainer(
        max_epochs=1, callbacks=[DataPerfCallback(print_summary=False)], **trainer_kwargs(root, logger=False)
    )
    trainer.fit(SleepyModel(), sleepy_loader(32, 4, 0.0))
    assert (root / SUMMARY_FILE).is_file()
    assert not (tmp_path / SUMMARY_FILE).exists(), "not in the working directory"


def test_accumulated_gradients_log_each_point_at_its_own_step(tmp_path):
    perf = DataPerfCallback(print_summary=False, telemetry=False)
    trainer = pl.Trainer(
        max_epochs=1, accumulate_grad_batches=4, log_every_n_steps=1, callbacks=[perf], **trainer_kwargs(tmp_path)
    )
    trainer.fit(SleepyModel(), sleepy_loader(4 * 32, 4, 0.0))  # 32 batches, 8 optimizer steps
    steps = [event.step for event in scalar_tags(trainer.logger.log_dir).Scalars("Time/DataLoading")]
    assert len(steps) == len(set(steps)), steps
    assert len(steps) >= 7  # one per optimizer step (the epoch's last window is logged at its end)


def test_shm_shortage_is_predicted_before_the_first_batch(tmp_path, monkeypatch):
    cramped = fake_hardware(usable_cpus=4, shm_total_mb=8.0, shm_free_mb=1.0)
    monkeypatch.setattr("lightning_dataperf.callback.callback.probe_hardware", lambda *args, **kwargs: cramped)
    perf = DataPerfCallback(print_summary=False, telemetry=False)
    known_at_start = []

    class AfterPerf(pl.Callback):  # runs right after DataPerfCallback's on_train_start, before any batch
        def on_train_start(self, trainer, pl_module):
            known_at_start.extend(problem.check for problem in perf.preflight_problems)

    big = DataLoader([torch.zeros(64, 1024) for _ in range(16)], batch_size=4, num_workers=2)  # 1 MB batches
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf, AfterPerf()], **trainer_kwargs(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(SleepyModel(features=1024), big)
    assert "shm_too_small" in known_at_start, known_at_start
    assert [problem.check for problem in perf.preflight_problems].count("shm_too_small") == 1, "not again later"
