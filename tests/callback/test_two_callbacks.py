"""Issue 47: two DataPerfCallbacks of different ``stages=`` fit, checkpoint and resume with their own state; two that
time the same stage are refused with what to change."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from helpers import SleepyModel, sleepy_loader, trainer_kwargs
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_dataperf import DataPerfCallback
from lightning_dataperf.callback.several import stages_state_key
from lightning_dataperf.tags import Stage

QUIET = dict(print_summary=False, write_json=False, telemetry=False, hang_timeout=None, preflight=False)


def fit(tmp_path, callbacks, epochs, ckpt_path=None):
    checkpoint = ModelCheckpoint(tmp_path / "ckpt", save_top_k=-1, every_n_epochs=1)
    options = trainer_kwargs(tmp_path, enable_checkpointing=True, limit_val_batches=2)
    trainer = pl.Trainer(max_epochs=epochs, callbacks=[*callbacks, checkpoint], logger=False, **options)
    trainer.fit(SleepyModel(), sleepy_loader(16, 4, 0.0), sleepy_loader(8, 4, 0.0), ckpt_path=ckpt_path)
    return trainer


def test_two_callbacks_of_different_stages_save_and_restore_their_own_state(tmp_path):
    train, val = DataPerfCallback(stages="train", **QUIET), DataPerfCallback(stages=("val",), **QUIET)
    fit(tmp_path, [train, val], epochs=2)
    assert [summary.stage for summary in train.summaries] == ["train", "train"]
    assert [summary.stage for summary in val.summaries] == ["val", "val"]
    assert train.summaries[0].steps == 4 and train.summaries[0].loader is not None  # its loader still instrumented
    saved = torch.load(tmp_path / "ckpt" / "epoch=1-step=8.ckpt", weights_only=False)["callbacks"]
    assert len(saved[train.state_key]["summaries"]) == 2 and len(saved[val.state_key]["summaries"]) == 2
    assert val.state_key == "DataPerfCallback{'stages': ('val',)}"

    resumed = DataPerfCallback(stages="train", **QUIET), DataPerfCallback(stages="val", **QUIET)
    fit(tmp_path / "resumed", resumed, epochs=3, ckpt_path=str(tmp_path / "ckpt" / "epoch=1-step=8.ckpt"))
    assert [(s.stage, s.epoch) for s in resumed[0].summaries] == [("train", 0), ("train", 1), ("train", 2)]
    assert [(s.stage, s.epoch) for s in resumed[1].summaries] == [("val", 0), ("val", 1), ("val", 2)]


def test_the_default_callback_keeps_the_key_older_checkpoints_have():
    assert stages_state_key("DataPerfCallback", tuple(Stage)) == "DataPerfCallback"
    assert stages_state_key("DataPerfCallback", (Stage.VAL,)) == "DataPerfCallback{'stages': ('val',)}"


@pytest.mark.parametrize("second", [{}, {"stages": ("val", "test")}])
def test_two_callbacks_timing_one_stage_are_refused_with_what_to_change(tmp_path, second):
    with pytest.raises(ValueError, match=r"time the same stage.*give each its own stages=") as error:
        fit(tmp_path, [DataPerfCallback(**QUIET), DataPerfCallback(**QUIET, **second)], epochs=1)
    assert "'val'" in str(error.value) and 'DataPerfCallback(stages="train")' in str(error.value)
