"""TunedDataModule's autotune and gpu_decode: records, the old spellings converted with a DeprecationWarning, and
every typo refused when the module is made, not in fit."""

from __future__ import annotations

import dataclasses
import re
import warnings

import lightning.pytorch as pl
import pytest
import torch
from helpers import IndexData, IndexedDataset, RecordingModel, trainer_kwargs
from torch.utils.data import DataLoader

from lightning_dataperf import GpuDecodeOptions, OnlineTuning, SearchTuning, TunedDataModule
from lightning_dataperf.datamodule import tuning as tuning_module


def _made_quietly(**options):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        return IndexData(verbose=False, **options)


def test_the_new_spellings_are_kept_as_given_and_warn_nothing():
    online, search, decode = OnlineTuning(max_cost=0.05), SearchTuning(time_budget=20), GpuDecodeOptions(size=8)
    assert _made_quietly(autotune=online).autotune is online
    assert _made_quietly(autotune=search, gpu_decode=decode).gpu_decode is decode
    for off in ({}, {"autotune": None, "gpu_decode": None}, {"autotune": False, "gpu_decode": False}):
        module = _made_quietly(**off)
        assert module.autotune is None and module.gpu_decode is None, off


@pytest.mark.parametrize(
    ("old", "new", "spelled"),
    [
        ({"autotune": True}, SearchTuning(), "autotune=SearchTuning()"),
        (
            {"autotune": True, "autotune_options": {"time_budget": 20, "cache_path": "c.json"}},
            SearchTuning(time_budget=20, cache_path="c.json"),
            "autotune=SearchTuning(time_budget=20, cache_path='c.json')",
        ),
        ({"autotune": "online"}, OnlineTuning(), "autotune=OnlineTuning()"),
        (
            {"autotune": "online", "autotune_options": {"max_cost": 0.1}},
            OnlineTuning(max_cost=0.1),
            "autotune=OnlineTuning(max_cost=0.1)",
        ),
    ],
)
def test_an_old_autotune_spelling_warns_with_the_new_one_and_becomes_its_record(old, new, spelled):
    with pytest.warns(DeprecationWarning) as caught:
        module = TunedDataModule(verbose=False, **old)
    (warning,) = [w for w in caught if w.category is DeprecationWarning]
    assert f"write TunedDataModule({spelled})" in str(warning.message), str(warning.message)
    assert f"from lightning_dataperf import {type(new).__name__}" in str(warning.message)
    assert warning.filename == __file__  # pointed at the line that spelt it (a subclass: its super().__init__)
    assert module.autotune == new and type(module.autotune) is type(new)


@pytest.mark.parametrize(
    ("old", "new", "spelled"),
    [
        (True, GpuDecodeOptions(), "gpu_decode=GpuDecodeOptions()"),
        ({}, GpuDecodeOptions(), "gpu_decode=GpuDecodeOptions()"),
        (
            {"size": 8, "dtype": torch.bfloat16},
            GpuDecodeOptions(size=8, dtype=torch.bfloat16),
            "gpu_decode=GpuDecodeOptions(size=8, dtype=torch.bfloat16)",
        ),
    ],
)
def test_an_old_gpu_decode_spelling_warns_with_the_new_one_and_becomes_its_record(old, new, spelled):
    with pytest.warns(DeprecationWarning, match=re.escape(f"write TunedDataModule({spelled})")):
        module = IndexData(verbose=False, gpu_decode=old)
    assert module.gpu_decode == new


@pytest.mark.parametrize(
    ("options", "bad", "record"),
    [
        ({"autotune": "online", "autotune_options": {"max_cots": 0.1}}, "max_cots", OnlineTuning),
        ({"autotune": True, "autotune_options": {"time_budgt": 20}}, "time_budgt", SearchTuning),
        ({"autotune": True, "autotune_options": {"max_batches": 20}}, "max_batches", SearchTuning),  # the loop's
        ({"gpu_decode": {"sise": 224}}, "sise", GpuDecodeOptions),
        ({"gpu_decode": {"device": "cuda"}}, "device", GpuDecodeOptions),  # the Trainer's device is used
    ],
)
def test_a_typo_in_an_old_dict_fails_when_the_module_is_made_naming_the_valid_keys(options, bad, record):
    with pytest.raises(TypeError) as raised:
        IndexData(verbose=False, **options)
    message = str(raised.value)
    assert message.startswith("TunedDataModule(") and f"{record.__name__}({bad}=...): no such option" in message
    assert message.endswith("the options are " + ", ".join(field.name for field in dataclasses.fields(record)))


def test_a_bad_value_in_an_old_dict_fails_when_the_module_is_made():
    with pytest.raises(ValueError, match=r"autotune_options=\{\.\.\.\}\): OnlineTuning\(max_cost=-1\): give"):
        IndexData(autotune="online", autotune_options={"max_cost": -1})
    with pytest.raises(ValueError, match=r"gpu_decode=\{\.\.\.\}\): GpuDecodeOptions\(on_error='skip'\): give"):
        IndexData(gpu_decode={"on_error": "skip"})


@pytest.mark.parametrize("autotune", ["onlin", "search", 1, 0.5, "True", SearchTuning])
def test_any_other_autotune_is_a_type_error_naming_what_is_accepted(autotune):
    with pytest.raises(TypeError, match=r"use autotune=OnlineTuning\(\.\.\.\) .*SearchTuning\(\.\.\.\) .*or None"):
        IndexData(autotune=autotune)


@pytest.mark.parametrize("gpu_decode", ["yes", 1, [("size", 8)], GpuDecodeOptions])
def test_any_other_gpu_decode_is_a_type_error_naming_what_is_accepted(gpu_decode):
    with pytest.raises(TypeError, match=r"use gpu_decode=GpuDecodeOptions\(\.\.\.\) .*or None"):
        IndexData(gpu_decode=gpu_decode)


def test_a_record_and_the_old_options_together_are_refused_and_options_alone_warn():
    with pytest.raises(TypeError, match=r"give the options in the record, SearchTuning\(\.\.\.\)"):
        IndexData(autotune=SearchTuning(), autotune_options={"time_budget": 20})
    with pytest.warns(DeprecationWarning, match="without a tuning mode it does nothing"):
        assert IndexData(autotune_options={"time_budget": 20}).autotune is None


def test_from_loaders_takes_the_records():
    loader = DataLoader(IndexedDataset(16), batch_size=4)
    online, decode = OnlineTuning(max_cost=0.1), GpuDecodeOptions(size=8)
    module = TunedDataModule.from_loaders(loader, loader, autotune=online, gpu_decode=decode, verbose=False)
    assert module.autotune is online and module.gpu_decode is decode


def test_the_search_gets_the_records_options_and_the_run_fills_in_the_rest(monkeypatch, tmp_path):
    calls = []

    class Result:
        def format(self):
            return "the search's table"

    def searching(dataset, batch_size, loader_kwargs, **options):
        calls.append(options)
        return Result()

    monkeypatch.setattr(tuning_module, "autotune_loader", searching)
    explicit = {"dataset": IndexedDataset(8), "batch_size": 2, "num_workers": 0}
    modelled = SearchTuning(time_budget=7, cache_path=tmp_path / "c.json", step_seconds=0.01, progress=False)
    tuning_module.autotune_for_datamodule(IndexData(autotune=modelled, verbose=False), explicit)
    tuning_module.autotune_for_datamodule(IndexData(autotune=SearchTuning(min_workers=3), verbose=False), explicit)
    first, second = calls
    assert first["time_budget"] == 7 and first["cache_path"] == tmp_path / "c.json" and first["progress"] is False
    assert first["min_workers"] == 0 and first["path"].step_seconds == 0.01  # a modelled step: 0 can be tried
    assert not {"step_seconds", "host_step_seconds", "step_fn", "device_transform", "side_stream"} & set(first)
    assert second["min_workers"] == 3 and second["time_budget"] == 30.0 and second["progress"] == "auto"
    assert second["max_epochs"] is None  # no Trainer here: nothing to fill in


def test_the_loop_gets_the_records_options(tmp_path):
    tuning = OnlineTuning(precision=0.5, max_batches=7, max_cost=0.5, min_seconds=0.0, max_seconds=3.0)
    datamodule = IndexData(length=16, workers=0, seed=1, autotune=tuning, verbose=False)
    pl.Trainer(max_epochs=1, logger=False, **trainer_kwargs(tmp_path)).fit(RecordingModel(), datamodule=datamodule)
    loop = datamodule._online.loop
    assert (loop.precision, loop.max_batches, loop.max_cost, loop.min_seconds, loop.max_seconds) == (
        0.5,
        7,
        0.5,
        0.0,
        3.0,
    )
