"""The autotune cache: a hit skips the search, changes invalidate it, an unwritable one warns once; the key follows
the transfer path."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import fake_hardware

from lightning_dataperf import autotune_loader
from lightning_dataperf.autotune.tune import AutotuneResult
from lightning_dataperf.testing import SleepingLoaderDataset


def test_cache_hit_skips_the_search_and_changes_invalidate_it(tmp_path):
    cache = tmp_path / "cache.json"
    dataset = SleepingLoaderDataset(512)
    first = autotune_loader(dataset, 16, time_budget=1.5, cache_path=cache)
    again = autotune_loader(dataset, 16, time_budget=1.5, cache_path=cache)
    assert not first.cached and again.cached and again.settings == first.settings
    assert again.trials == first.trials
    assert not autotune_loader(SleepingLoaderDataset(513), 16, time_budget=1.0, cache_path=cache).cached
    assert not autotune_loader(dataset, 32, time_budget=1.0, cache_path=cache).cached
    assert not autotune_loader(dataset, 16, time_budget=1.0, cache_path=cache, force=True).cached
    assert len(json.loads(cache.read_text())) == 3
    assert AutotuneResult.from_dict(first.to_dict()) == first


def test_unwritable_cache_warns_once_naming_the_path(tmp_path):
    blocker = tmp_path / "not_a_directory"
    blocker.write_text("x")
    cache = blocker / "cache.json"
    with pytest.warns(UserWarning, match="cannot (read|write) its cache") as caught:
        for _ in range(2):
            autotune_loader(SleepingLoaderDataset(256), 16, time_budget=0.5, cache_path=cache, progress=False)
    messages = [str(warning.message) for warning in caught if "its cache" in str(warning.message)]
    assert len(messages) == 1 and str(cache) in messages[0]


def test_pinning_and_cache_key_follow_the_transfer_path():
    from lightning_dataperf.autotune.cache import cache_key
    from lightning_dataperf.autotune.consumer import TransferPath

    cuda = torch.device("cuda", 0)
    assert TransferPath(device=cuda, side_stream=True).pin_choices() == (True,)
    assert TransferPath(device=cuda).pin_choices() == (True, False)
    assert TransferPath().pin_choices() == (False,)
    hardware, dataset = fake_hardware(), SleepingLoaderDataset(64)
    keys = {
        cache_key(hardware, dataset, 8, {}, path.describe())
        for path in (
            TransferPath(device=cuda),
            TransferPath(device=cuda, side_stream=True),
            TransferPath(device=cuda, side_stream=True, device_transform=torch.nn.functional.relu),
            TransferPath(device=cuda, step_seconds=0.01),
        )
    }
    assert len(keys) == 4

    class WithTransform(SleepingLoaderDataset):
        def __init__(self, length, transform):
            super().__init__(length)
            self.transform = transform

    assert cache_key(hardware, WithTransform(64, abs), 8, {}, "x") != cache_key(
        hardware, WithTransform(64, round), 8, {}, "x"
    )
    assert cache_key(hardware, dataset, 8, {}, "x") != cache_key(fake_hardware(usable_cpus=4), dataset, 8, {}, "x")
