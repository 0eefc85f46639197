import json
import os
import re
import statistics
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from helpers import FakeClock, SleepyModel, scalar_tags, sleepy_loader, trainer_kwargs
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch.utils.data import DataLoader

from lightning_dataperf import DataPerfCallback, Diagnosis, EpochSummary
from lightning_dataperf.report.outputs import custom_scalars
from lightning_dataperf.tags import SUMMARY_FILE


def test_ground_truth_medians_on_cpu(tmp_path):
    loader_s, step_s = 0.050, 0.060  # long enough that scheduling noise on a loaded machine stays < 15%
    perf = DataPerfCallback(print_summary=False)
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], log_every_n_steps=4, **trainer_kwargs(tmp_path))
    trainer.fit(SleepyModel(step_s=step_s), sleepy_loader(15 * 4, 4, loader_s))
    (summary,) = perf.summaries
    assert summary.steps == 15
    assert summary.timings["DataLoading"].p50 == pytest.approx(loader_s, rel=0.15)
    assert summary.timings["Compute"].p50 == pytest.approx(step_s, rel=0.15)
    assert summary.timings["Step"].p50 == pytest.approx(loader_s + step_s, rel=0.15)
    assert summary.input_stall_fraction == pytest.approx(loader_s / (loader_s + step_s), rel=0.15)
    assert summary.samples_per_sec == pytest.approx(4 / (loader_s + step_s), rel=0.15)
    assert summary.epoch_start is not None and summary.epoch_start >= loader_s * 0.9
    # the logged values (means over log windows) agree with the truth too
    events = scalar_tags(trainer.logger.log_dir)
    logged_wait = [event.value for event in events.Scalars("Time/DataLoading")]
    logged_compute = [event.value for event in events.Scalars("Time/Compute")]
    assert len(logged_wait) >= 3
    assert statistics.median(logged_wait) == pytest.approx(loader_s, rel=0.15)
    assert statistics.median(logged_compute) == pytest.approx(step_s, rel=0.15)


@pytest.mark.slow
def test_workers_hide_the_loader(tmp_path):
    perf = DataPerfCallback(print_summary=False)
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], **trainer_kwargs(tmp_path))
    loader_s = 0.040
    loader = sleepy_loader(20 * 2, 2, loader_s, num_workers=2, prefetch_factor=4)
    trainer.fit(SleepyModel(step_s=0.100), loader)
    (summary,) = perf.summaries
    # well under what the loader costs per batch; the margin absorbs a fully loaded 2-core machine,
    # where handing a batch over from a worker alone took ~5 ms
    assert summary.timings["DataLoading"].p50 < loader_s / 4
    assert summary.epoch_start > summary.timings["DataLoading"].p50  # worker start-up is kept apart
    assert perf.last_diagnosis.bottleneck == "compute_bound"


def test_tensorboard_scalars_layout_and_text(tmp_path):
    perf = DataPerfCallback(print_summary=False)
    trainer = pl.Trainer(
        max_epochs=2, callbacks=[perf], log_every_n_steps=2, limit_val_batches=3, **trainer_kwargs(tmp_path)
    )
    trainer.fit(SleepyModel(), sleepy_loader(32, 4, 0.002), sleepy_loader(32, 4, 0.001))
    events = scalar_tags(trainer.logger.log_dir)
    tags = set(events.Tags()["scalars"])
    for name in (
        "Time/DataLoading",
        "Time/Compute",
        "Time/Transfer",
        "Time/Step",
        "Time/DataLoading_max",
        "Time/SamplesPerSec",
        "Time/InputStallFraction",
        "Time/EpochStart",
        "Time/DataLoading_p90",
        "Time/Compute_p90",
        "val/Time/DataLoading_p90",
        "val/Time/DataLoading",
        "val/Time/Compute",
        "val/Time/EpochStart",
    ):
        assert name in tags, name
    assert "Time/DeviceIdle" not in tags  # CPU run: no device idle
    steps = [event.step for event in events.Scalars("Time/DataLoading")]
    assert steps == sorted(steps) and len(steps) >= 4
    plugin_tags = events.Tags()
    assert "DataPerf/diagnosis/text_summary" in plugin_tags["tensors"]
    layout_files = [name for name in os.listdir(trainer.logger.log_dir) if name.startswith("events")]
    assert any(b"custom_scalars" in Path(trainer.logger.log_dir, f).read_bytes() for f in layout_files)
    logged = events.Tags()["scalars"]
    for title, (_, patterns) in custom_scalars(cuda=False)["DataPerf"].items():
        for pattern in patterns:  # every series of a CPU run's charts is logged, under exactly one tag
            assert len([tag for tag in logged if re.search(pattern, tag)]) == 1, (title, pattern)
    records = [json.loads(line) for line in Path(trainer.logger.log_dir, SUMMARY_FILE).read_text().splitlines()]
    assert [(r["summary"]["stage"], r["summary"]["epoch"]) for r in records] == [
        ("val", 0),
        ("train", 0),
        ("val", 1),
        ("train", 1),
    ]
    # each record holds the epoch's verdict as it was printed, and reads back into the same Diagnosis
    train_diagnoses = [d for d in perf.diagnoses if d.stage == "train"]
    assert [Diagnosis.from_dict(r["diagnosis"]) for r in records[1::2]] == train_diagnoses
    assert [EpochSummary.from_dict(r["summary"]) for r in records] == perf.summaries


def test_any_logger_and_eval_stages(tmp_path):
    perf = DataPerfCallback(print_summary=False)
    logger = CSVLogger(tmp_path)
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], logger=logger, **trainer_kwargs(tmp_path))
    model = SleepyModel()
    trainer.fit(model, sleepy_loader(16, 4, 0.001))
    trainer.test(model, sleepy_loader(12, 4, 0.001), verbose=False)
    trainer.predict(model, sleepy_loader(8, 4, 0.001))
    stages = [(summary.stage, summary.steps) for summary in perf.summaries]
    assert stages == [("train", 4), ("test", 3), ("predict", 2)]
    header = Path(logger.log_dir, "metrics.csv").read_text().splitlines()[0]
    assert "Time/DataLoading" in header and "test/Time/Compute" in header


@pytest.mark.parametrize(
    ("overrides", "expected_steps"),
    [
        (dict(fast_dev_run=True), 1),
        (dict(max_epochs=1, limit_train_batches=3), 3),
        (dict(max_epochs=1, accumulate_grad_batches=3), 8),
        (dict(max_steps=5, max_epochs=-1), 5),
    ],
)
def test_trainer_modes(tmp_path, overrides, expected_steps):
    perf = DataPerfCallback(print_summary=False)
    trainer = pl.Trainer(callbacks=[perf], **trainer_kwargs(tmp_path, **overrides))
    model = SleepyModel()
    trainer.fit(model, sleepy_loader(32, 4, 0.001))
    assert perf.summaries[0].stage == "train"
    assert perf.summaries[0].steps == expected_steps
    assert len(model.seen) == expected_steps
    assert not perf._hooks.installed


class ManualModel(SleepyModel):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        loss = self._step(batch)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()


def test_manual_optimization_and_multiple_val_loaders(tmp_path):
    perf = DataPerfCallback(print_summary=False)
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], **trainer_kwargs(tmp_path))
    val = [sleepy_loader(8, 4, 0.001), sleepy_loader(12, 4, 0.001)]
    trainer.fit(ManualModel(), sleepy_loader(16, 4, 0.001), val)
    by_stage = {summary.stage: summary.steps for summary in perf.summaries}
    assert by_stage == {"train": 4, "val": 5}


class Explodes(SleepyModel):
    def training_step(self, batch, batch_idx):
        if batch_idx == 3:
            raise RuntimeError("boom")
        return super().training_step(batch, batch_idx)


def test_exception_mid_fit_leaves_nothing_behind(tmp_path):
    perf = DataPerfCallback(print_summary=False)
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], **trainer_kwargs(tmp_path))
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Explodes(), sleepy_loader(32, 4, 0.001))
    assert not perf._hooks.installed
    loop = trainer.fit_loop.epoch_loop
    assert "_on_before_fetch" not in loop.__dict__ and "_on_after_fetch" not in loop.__dict__
    assert all(timer.clock.pending == 0 and not timer.active for timer in perf._timers.values())


def test_state_dict_round_trip_through_checkpoint(tmp_path):
    perf = DataPerfCallback(print_summary=False)
    trainer = pl.Trainer(max_epochs=2, callbacks=[perf], **trainer_kwargs(tmp_path, enable_checkpointing=True))
    trainer.fit(SleepyModel(), sleepy_loader(16, 4, 0.001))
    checkpoint = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=False)
    state = next(value for key, value in checkpoint["callbacks"].items() if "DataPerfCallback" in key)
    restored = DataPerfCallback()
    restored.load_state_dict(state)
    assert [s.to_dict() for s in restored.summaries] == [s.to_dict() for s in perf.summaries]


def test_batch_size_fn_and_bad_arguments(tmp_path):
    perf = DataPerfCallback(print_summary=False, batch_size_fn=lambda batch: 2 * len(batch))
    trainer = pl.Trainer(max_epochs=1, callbacks=[perf], **trainer_kwargs(tmp_path))
    trainer.fit(SleepyModel(step_s=0.01), sleepy_loader(18, 4, 0.0))  # last batch holds 2 samples
    summary = perf.summaries[0]
    mean_step = summary.timings["Step"].mean
    assert summary.samples_per_sec == pytest.approx(8 * 3 / (mean_step * 3), rel=0.35)
    with pytest.raises(ValueError, match="stages"):
        DataPerfCallback(stages=("training",))
    with pytest.raises(ValueError, match="log_every_n_steps"):
        DataPerfCallback(log_every_n_steps=0)


def test_prints_summary_and_verdict(tmp_path, capsys):
    trainer = pl.Trainer(max_epochs=1, callbacks=[DataPerfCallback()], **trainer_kwargs(tmp_path))
    trainer.fit(SleepyModel(step_s=0.005), sleepy_loader(24, 4, 0.02))
    out = capsys.readouterr().out
    assert "DataPerf | train epoch 0" in out and "DataPerf verdict (train epoch 0): input-bound" in out
    assert "num_workers=0" in out


def test_tensorboard_logger_explicit(tmp_path):
    trainer = pl.Trainer(
        max_epochs=1,
        callbacks=[DataPerfCallback(print_summary=False)],
        logger=TensorBoardLogger(tmp_path, name="tb"),
        **trainer_kwargs(tmp_path),
    )
    trainer.fit(SleepyModel(), sleepy_loader(16, 4, 0.0))
    assert "Time/Compute" in scalar_tags(trainer.logger.log_dir).Tags()["scalars"]


class ClockedDataset(torch.utils.data.Dataset):
    def __init__(self, clock, length, per_sample_s):
        self.clock, self.length, self.per_sample_s = clock, length, per_sample_s

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        self.clock.advance(self.per_sample_s)
        return torch.full((8,), float(index))


class ClockedModel(SleepyModel):
    def __init__(self, clock, step_s):
        super().__init__()
        self.clock, self.clock_step_s = clock, step_s

    def training_step(self, batch, batch_idx):
        self.clock.advance(self.clock_step_s)
        return super().training_step(batch, batch_idx)


def test_timing_logic_with_an_injected_clock(tmp_path):
    """Exact figures from a clock that moves only inside next() and inside the step (no real sleeps)."""
    clock = FakeClock()
    perf = DataPerfCallback(print_summary=False, telemetry=False, hang_timeout=None, preflight=False, clock=clock)
    trainer = pl.Trainer(max_epochs=2, callbacks=[perf], log_every_n_steps=5, **trainer_kwargs(tmp_path))
    loader = DataLoader(ClockedDataset(clock, 40, 0.005), batch_size=4)  # 20 ms per batch, in the main process
    trainer.fit(ClockedModel(clock, 0.030), loader)
    for summary in perf.summaries:
        assert summary.steps == 10
        assert summary.timings["DataLoading"].p50 == pytest.approx(0.020)
        assert summary.timings["DataLoading"].max == pytest.approx(0.020)
        assert summary.timings["Compute"].mean == pytest.approx(0.030)
        assert summary.timings["Step"].mean == pytest.approx(0.050)  # wait + compute, nothing else moves the clock
        assert summary.input_stall_fraction == pytest.approx(0.4)
        assert summary.samples_per_sec == pytest.approx(4 / 0.050)
        assert summary.epoch_start == pytest.approx(0.020)  # the first batch's wait is start-up, not steady state
    assert perf.last_diagnosis.bottleneck == "input_bound_workers"
    assert perf.last_diagnosis.findings[0].share == pytest.approx(0.4)
    events = scalar_tags(trainer.logger.log_dir)
    assert [event.value for event in events.Scalars("Time/Compute")] == pytest.approx([0.030] * 4)
