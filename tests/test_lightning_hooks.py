"""Contract tests for the private Lightning API that lightning_dataperf relies on.

If one fails after a Lightning upgrade, ``lightning_dataperf/_lightning_hooks.py`` needs updating.
"""

import inspect

import lightning.pytorch as pl
import pytest
from conftest import trainer_kwargs
from helpers import SleepyModel, sleepy_loader
from lightning.pytorch.loops import fetchers

from lightning_dataperf._lightning_hooks import (
    FETCH_HOOKS,
    FetchHooks,
    check_lightning_compatibility,
    loops_by_stage,
)


def test_fetcher_brackets_next_with_profiler_hooks():
    source = inspect.getsource(fetchers._DataFetcher.__next__)
    assert "self._start_profiler()" in source and "self._stop_profiler()" in source
    assert source.index("_start_profiler") < source.index("next(self.iterator)") < source.rindex("_stop_profiler")


def test_every_loop_points_its_fetcher_at_the_hooks(tmp_path):
    trainer = pl.Trainer(**trainer_kwargs(tmp_path))
    for stage, loop in loops_by_stage(trainer).items():
        for name in FETCH_HOOKS:
            assert callable(getattr(loop, name)), (stage, name)
        source = inspect.getsource(type(loop))
        assert "_start_profiler = self._on_before_fetch" in source, stage
        assert "_stop_profiler = self._on_after_fetch" in source, stage
    check_lightning_compatibility(trainer)


def test_hooks_fire_around_each_fetch_and_uninstall(tmp_path):
    events = []
    hooks = FetchHooks(
        before=lambda stage: events.append(("before", stage)),
        after=lambda stage: events.append(("after", stage)),
    )
    trainer = pl.Trainer(max_epochs=1, **trainer_kwargs(tmp_path))

    class Install(pl.Callback):
        def setup(self, trainer, pl_module, stage):
            hooks.install(trainer)

    trainer.callbacks.append(Install())
    trainer.fit(SleepyModel(), sleepy_loader(12, 4, 0.0))
    train_events = [kind for kind, stage in events if stage == "train"]
    # a sized loader of 3 batches: exactly 3 fetches, before/after strictly alternating
    assert train_events == ["before", "after"] * 3
    hooks.uninstall()
    assert all(name not in loop.__dict__ for loop in loops_by_stage(trainer).values() for name in FETCH_HOOKS)


def test_missing_hook_raises_clear_error(tmp_path, monkeypatch):
    trainer = pl.Trainer(**trainer_kwargs(tmp_path))
    monkeypatch.setattr(type(trainer.test_loop), "_on_before_fetch", None)
    with pytest.raises(RuntimeError, match="cannot time batch fetches"):
        check_lightning_compatibility(trainer)
