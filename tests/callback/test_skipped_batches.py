"""Issue 47, item 8: batches Lightning skips (a ``None`` batch, ``training_step`` returning ``None``) are no steps:
they stay out of the step count, the timings and the throughput, and make no false "host-bound" finding."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from helpers import SleepyModel, trainer_kwargs
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, Dataset

from lightning_dataperf import DataPerfCallback

BATCH = 4
# of every four batches: 0 is trained on, 1 and 2 the step skips (returns None), 3 the loader yields as None
REAL, NONE_BATCH = 0, 3


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Samples(Dataset):
    def __init__(self, clock: FakeClock, length: int) -> None:
        self.clock, self.length = clock, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        self.clock.advance(0.000125)  # 0.5 ms of loading per batch
        return torch.full((8,), float(index))


def collate(samples):
    batch = torch.stack(samples)
    return None if int(batch[0, 0]) // BATCH % 4 == NONE_BATCH else batch


class LoopCost(Callback):
    """Lightning's own cost of every batch (1 ms), after DataPerfCallback's end of the step: the next step's."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.clock.advance(0.001)


class SkippingModel(SleepyModel):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def training_step(self, batch, batch_idx):
        if batch_idx % 4 != REAL:
            return None  # Lightning skips the optimisation of this batch
        self.clock.advance(0.004)
        return super().training_step(batch, batch_idx)


def test_skipped_batches_are_no_steps_and_make_no_host_bound_finding(tmp_path):
    clock = FakeClock()
    perf = DataPerfCallback(print_summary=False, telemetry=False, hang_timeout=None, preflight=False, clock=clock)
    trainer = pl.Trainer(
        max_epochs=2, callbacks=[perf, LoopCost(clock)], log_every_n_steps=2, **trainer_kwargs(tmp_path)
    )
    with pytest.warns(UserWarning, match="yielded None"):
        trainer.fit(SkippingModel(clock), DataLoader(Samples(clock, 16 * BATCH), batch_size=BATCH, collate_fn=collate))
    for summary in perf.summaries:
        assert summary.steps == 4 and summary.skipped_batches == 12
        assert summary.timings["Compute"].mean == pytest.approx(0.004)
        # a step is the loop's cost since the last batch, its own fetch and compute: nothing of a skipped batch
        assert summary.timings["Step"].mean == pytest.approx(0.001 + 0.0005 + 0.004)
        assert summary.samples_per_sec == pytest.approx(BATCH / 0.0055)
        assert "12 batch(es) skipped" in summary.format()
    assert "host_bound" not in {finding.kind for finding in perf.last_diagnosis.findings}, perf.last_diagnosis.format()
