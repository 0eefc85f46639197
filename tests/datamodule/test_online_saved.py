"""The loop's kept setting saved beside the run; the loop's reasons where it is off; stragglers named."""

from __future__ import annotations

import json

import lightning.pytorch as pl
import pytest
import torch
from helpers import IndexData, IndexedDataset, RecordingModel, trainer_kwargs
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler, SequentialSampler

from lightning_dataperf import OnlineTuning, TunedDataModule
from lightning_dataperf.autotune.online import Setting, SettingSpace
from lightning_dataperf.autotune.online.saved import SAVED_FILE, ConfirmSpace, SavedKey, load_saved, save_setting
from lightning_dataperf.datamodule.online_ddp import RankWaits

QUICK = {"precision": 10.0, "max_batches": 8, "max_cost": 10.0, "min_seconds": 0.0}
KEY = SavedKey("host cpus=2 gpus=none", 1, "IndexedDataset len=240 batch_size=4 collate=default_collate")
SETTING = Setting(3, 4, False, 1)


def test_a_saved_setting_is_read_back_under_its_key_only(tmp_path):
    save_setting(tmp_path, KEY, SETTING)
    save_setting(tmp_path, SavedKey(KEY.machine, 2, KEY.loader), Setting(1, 2, False, 1))
    assert load_saved(tmp_path, KEY)[0] == SETTING
    setting, note = load_saved(tmp_path, SavedKey(KEY.machine, 1, "IndexedDataset len=240 batch_size=8"))
    assert setting is None and "no setting for this loader or world size" in note
    setting, note = load_saved(tmp_path, SavedKey("another cpus=64 gpus=H200", 1, KEY.loader))
    assert setting is None and "no setting for this machine" in note
    assert load_saved(tmp_path / "nowhere", KEY) == (None, "")


@pytest.mark.parametrize(
    "text",
    [
        '{"version": 1, "entries": {"a',  # cut off mid-write
        "[]",
        json.dumps(
            {"entries": {KEY.text(): {"num_workers": -2, "prefetch_factor": 2, "pin_memory": False, "threads": 1}}}
        ),
        json.dumps({"entries": {KEY.text(): {"num_workers": 2, "colour": "blue"}}}),
    ],
)
def test_a_bad_saved_file_is_ignored_with_a_note(tmp_path, text):
    (tmp_path / SAVED_FILE).write_text(text)
    setting, note = load_saved(tmp_path, KEY)
    assert setting is None and "could not be read" in note and "starts afresh" in note
    save_setting(tmp_path, KEY, SETTING)  # and a new one is written over it
    assert load_saved(tmp_path, KEY)[0] == SETTING


def test_a_saved_setting_is_only_confirmed_against_the_users():
    space = SettingSpace(max_workers=8, cpus=4, tune_threads=True, tune_pinning=False)
    user = Setting(1, 2, False, 4)
    confirm = ConfirmSpace.around(space, user)
    assert list(confirm.neighbours(SETTING)) == [user]
    assert list(confirm.neighbours(user)) == []


def fit(root, datamodule, epochs=1, **options):
    trainer = pl.Trainer(max_epochs=epochs, **trainer_kwargs(root, **options))
    trainer.fit(RecordingModel(), datamodule=datamodule)
    return datamodule


def online_data(**kwargs):
    return IndexData(length=240, workers=1, seed=5, verbose=False, autotune=OnlineTuning(**QUICK), **kwargs)


def test_the_next_run_starts_from_the_kept_setting_and_a_corrupt_file_starts_afresh(tmp_path):
    fit(tmp_path, online_data(), epochs=5)  # 300 steps: the search of 8-batch trials ends
    # beside the logger's versions, which every run shares
    path = tmp_path / "lightning_logs" / SAVED_FILE
    (saved,) = json.loads(path.read_text())["entries"].values()
    again = fit(tmp_path, online_data())
    assert again.online_result.start.setting == Setting(**saved)
    assert any("started from the setting a previous run kept" in note for note in again.loader_plans["train"][0].notes)
    path.write_text('{"version": 1, "entr')
    afresh = fit(tmp_path, online_data())
    assert afresh.online_result.start.setting.num_workers == 1, "the loader's own setting"
    assert any("could not be read" in note for note in afresh.loader_plans["train"][0].notes)


class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(32, dtype=torch.float32).reshape(-1, 1).repeat(1, 3))


class LoaderModule(TunedDataModule):
    def __init__(self, loader, **options):
        super().__init__(verbose=False, autotune=OnlineTuning(**QUICK), **options)
        self.loader = loader

    def train_dataloader(self):
        return self.loader


class EveryOther(Sampler):
    def __init__(self, length):
        self.length = length

    def __len__(self):
        return self.length // 2

    def __iter__(self):
        return iter(range(0, self.length, 2))


@pytest.mark.parametrize(
    ("loader", "words"),
    [
        (lambda: DataLoader(Stream(), batch_size=4), "an IterableDataset"),
        (
            lambda: DataLoader(IndexedDataset(32), batch_sampler=_Batches(SequentialSampler(range(32)), 4, False)),
            "your batch_sampler",
        ),
        (
            lambda: DataLoader(IndexedDataset(32), batch_sampler=BatchSampler(SequentialSampler(range(32)), 4, False)),
            "your batch_sampler",
        ),
        (lambda: DataLoader(IndexedDataset(32), batch_size=4, sampler=EveryOther(32)), "your sampler"),
    ],
)
def test_online_off_says_why_in_the_notes_and_the_result(tmp_path, loader, words):
    datamodule = fit(tmp_path, LoaderModule(loader()))
    result = datamodule.online_result
    assert result is not None and result.stop_reason.startswith(f"off: {words}") and not result.trials
    assert any(note.startswith(f"online tuning off: {words}") for note in datamodule.loader_plans["train"][0].notes)


class _Batches(BatchSampler):
    """A user's own batch sampler class."""


def test_a_straggling_rank_and_a_whole_straggling_node_are_named():
    setting = Setting(8, 2, False, 1)
    one = RankWaits(setting, (0, 0, 1, 1), [0.01, 0.01, 0.01, 0.5], [100] * 4)
    assert one.stragglers() == [3] and "rank 3 (node 1)" in one.describe() and "5.0 ms per batch" in one.describe()
    node = RankWaits(setting, (0, 0, 1, 1, 2, 2), [0.01, 0.01, 0.5, 0.6, 0.01, 0.01], [100] * 6)
    assert node.stragglers() == [2, 3]
    assert "node 1 waited" in node.describe() and "rank 2" not in node.describe(), "the node, not its ranks"
    two = RankWaits(setting, (0, 0), [0.0, 1.0], [100, 100])
    assert two.stragglers() == [1], "of two ranks, the one that waits while the other does not"
    even = RankWaits(setting, (0, 0), [0.01, 0.012], [100, 100])
    assert even.describe() == ""
