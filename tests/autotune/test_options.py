"""OnlineTuning and SearchTuning: a misspelt key or a bad value fails at construction, saying what to give."""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import re
import subprocess
import sys

import pytest
from helpers import ROOT

from lightning_dataperf.autotune.options import OnlineTuning, SearchTuning
from lightning_dataperf.autotune.progress import SearchProgress
from lightning_dataperf.autotune.tune import autotune_loader
from lightning_dataperf.datamodule.online import OnlineTuner

#: autotune_loader's keywords the datamodule gives itself (the Trainer's path, its hardware probe, the loader's own)
SET_BY_THE_DATAMODULE = {"dataset", "batch_size", "loader_kwargs", "hardware", "path", "device"}
#: SearchTuning's defaults that stand for "as the run says" (the Trainer's epochs, its progress bar, the step)
FROM_THE_RUN = {"max_epochs": None, "min_workers": None, "progress": "auto"}


@pytest.mark.parametrize(
    ("record", "typo", "hint"),
    [(OnlineTuning, "max_cots", "max_cost"), (SearchTuning, "time_budgt", "time_budget")],
)
def test_a_misspelt_key_is_named_with_the_valid_ones(record, typo, hint):
    with pytest.raises(TypeError) as raised:
        record(**{typo: 0.1})
    message = str(raised.value)
    assert message.startswith(f"{record.__name__}({typo}=...): no such option ({typo}: did you mean {hint}?)")
    assert message.endswith("the options are " + ", ".join(field.name for field in dataclasses.fields(record)))


def test_a_key_nothing_resembles_is_named_too_and_positional_values_are_refused():
    with pytest.raises(TypeError, match=r"OnlineTuning\(workers=\.\.\.\): no such option; the options are precision"):
        OnlineTuning(workers=4)
    with pytest.raises(TypeError, match=r"takes keywords only, e.g. SearchTuning\(time_budget=\.\.\.\)"):
        SearchTuning(20)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "value", "rule"),
    [
        ("precision", 0, "above 0"),
        ("precision", math.nan, "above 0"),
        ("precision", "0.03", "above 0"),
        ("max_batches", 0, "at least 1"),
        ("max_batches", 2.5, "whole number"),
        ("max_batches", True, "whole number"),
        ("max_cost", -0.1, "0 or more"),
        ("min_seconds", -1, "0 or more"),
        ("max_seconds", 0, "above 0"),
    ],
)
def test_online_tuning_refuses_a_bad_value_and_says_what_to_give(name, value, rule):
    with pytest.raises(ValueError, match=rf"^OnlineTuning\({name}={re.escape(repr(value))}\): give .*{rule}"):
        OnlineTuning(**{name: value})


@pytest.mark.parametrize(
    ("name", "value", "rule"),
    [
        ("time_budget", 0, "above 0"),
        ("batch_budget", 1, "at least 2"),
        ("noise", -0.01, "0 or more"),
        ("trial_seconds", 0, "above 0"),
        ("memory_fraction", 1.5, r"\(0, 1\]"),
        ("memory_fraction", 0, r"\(0, 1\]"),
        ("min_workers", -1, "0 or more"),
        ("cache_path", 3, "file path"),
        ("force", "yes", "True or False"),
        ("progress", "bars", "'bar'"),
        ("step_seconds", math.inf, "0 or more"),
        ("step_fn", 3, "function"),
        ("side_stream", 1, "True or False"),
    ],
)
def test_search_tuning_refuses_a_bad_value_and_says_what_to_give(name, value, rule):
    with pytest.raises(ValueError, match=rf"^SearchTuning\({name}={re.escape(repr(value))}\): give .*{rule}"):
        SearchTuning(**{name: value})


def test_values_at_the_edges_and_every_progress_are_accepted(tmp_path):
    assert OnlineTuning(max_cost=0).max_cost == 0  # measures the start, tries nothing else
    assert OnlineTuning(max_cost=10.0, min_seconds=0.0).max_cost == 10.0  # more than the run: no cap in practice
    for progress in ("auto", "bar", "log", "off", True, False, None, SearchProgress()):
        assert SearchTuning(progress=progress).progress is progress
    assert SearchTuning(cache_path=tmp_path / "cache.json", memory_fraction=1.0, max_epochs=-1).max_epochs == -1


def test_the_records_are_frozen_and_compare_by_value():
    tuning = OnlineTuning(max_cost=0.1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tuning.max_cost = 0.2  # type: ignore[misc]
    assert tuning == OnlineTuning(max_cost=0.1) != OnlineTuning()
    assert hash(tuning) == hash(OnlineTuning(max_cost=0.1))


def _keywords(function, after):
    parameters = list(inspect.signature(function).parameters.values())
    return {p.name: p.default for p in parameters[[p.name for p in parameters].index(after) + 1 :]}


def test_online_tuning_holds_exactly_what_the_loop_takes_with_its_defaults():
    fields = {field.name: field.default for field in dataclasses.fields(OnlineTuning)}
    assert fields == _keywords(OnlineTuner.__init__, "position")


def test_search_tuning_holds_autotune_loaders_options_with_its_defaults():
    fields = {field.name: field.default for field in dataclasses.fields(SearchTuning)}
    search = {name: p.default for name, p in inspect.signature(autotune_loader).parameters.items()}
    assert set(fields) == set(search) - SET_BY_THE_DATAMODULE
    assert {name: default for name, default in fields.items() if name not in FROM_THE_RUN} == {
        name: search[name] for name in fields if name not in FROM_THE_RUN
    }
    assert {name: fields[name] for name in FROM_THE_RUN} == FROM_THE_RUN


def test_the_module_loads_no_torch():
    code = "import sys, lightning_dataperf.autotune.options\nprint('torch' in sys.modules, 'lightning' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False False"
