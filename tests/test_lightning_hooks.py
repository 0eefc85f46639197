"""Contract tests for the private Lightning API that lightning_dataperf relies on.

If one fails after a Lightning upgrade, ``lightning_dataperf/_lightning_hooks.py`` needs updating.
"""

import inspect
import time

import lightning.pytorch as pl
import pytest
import torch
from helpers import SleepyModel, sleepy_loader, trainer_kwargs
from lightning.pytorch.loops import fetchers
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.trainer.connectors import accelerator_connector
from torch.utils.data import DataLoader

from lightning_dataperf import SideStreamStrategy
from lightning_dataperf._lightning_hooks import (
    FETCH_HOOKS,
    FetchHooks,
    ProcessDataloaderHook,
    StepCompilation,
    check_lightning_compatibility,
    compiled_step,
    cuda_sleep,
    fetching_loops,
    forget_persistent_iterator,
    global_step_reader,
    persistent_iterator_started,
    pin_batch,
    queued_batches,
    recorded_loader_arguments,
    reinit_loader,
    replace_loader_dataset,
    shared_storage,
    shutdown_loader_iterator,
)
from lightning_dataperf.tags import Stage


def test_fetcher_brackets_next_with_profiler_hooks():
    source = inspect.getsource(fetchers._DataFetcher.__next__)
    assert "self._start_profiler()" in source and "self._stop_profiler()" in source
    assert source.index("_start_profiler") < source.index("next(self.iterator)") < source.rindex("_stop_profiler")


def test_every_loop_points_its_fetcher_at_the_hooks(tmp_path):
    trainer = pl.Trainer(**trainer_kwargs(tmp_path))
    for stage, loop in fetching_loops(trainer):
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
    train_events = [kind for kind, stage in events if stage is Stage.TRAIN]
    # a sized loader of 3 batches: exactly 3 fetches, before/after strictly alternating
    assert train_events == ["before", "after"] * 3
    hooks.uninstall()
    assert all(name not in loop.__dict__ for _, loop in fetching_loops(trainer) for name in FETCH_HOOKS)


def test_missing_hook_raises_clear_error(tmp_path, monkeypatch):
    trainer = pl.Trainer(**trainer_kwargs(tmp_path))
    monkeypatch.setattr(type(trainer.test_loop), "_on_before_fetch", None)
    with pytest.raises(RuntimeError, match="cannot time batch fetches"):
        check_lightning_compatibility(trainer)


def test_the_connector_assigns_devices_to_a_strategy_with_parallel_devices():
    # SideStreamStrategy() given no device learns it the way Lightning's accelerator connector tells
    # strategies: by assigning `parallel_devices` when the attribute exists and is empty.
    source = inspect.getsource(accelerator_connector._AcceleratorConnector._lazy_init_strategy)
    assert 'hasattr(self.strategy, "parallel_devices")' in source
    assert "self.strategy.parallel_devices = self._parallel_devices" in source
    assert "_root_device" in inspect.getsource(SingleDeviceStrategy.__init__)
    trainer = pl.Trainer(accelerator="cpu", devices=1, strategy=SideStreamStrategy(), logger=False)
    assert trainer.strategy.parallel_devices and trainer.strategy.root_device.type == "cpu"


def test_loader_iterators_shut_their_workers_down_on_request():
    iterator = iter(DataLoader(range(64), batch_size=4, num_workers=2))
    next(iterator)
    workers = list(iterator._workers)
    assert workers and all(worker.is_alive() for worker in workers)
    stopped = shutdown_loader_iterator(iterator)
    assert not any(worker.is_alive() for worker in workers), "PyTorch's _shutdown_workers no longer stops them"
    assert stopped == tuple(worker.pid for worker in workers) and len(set(stopped)) == 2  # whose batches to reclaim
    assert shutdown_loader_iterator(iter(range(3))) == ()  # not a loader iterator: nothing to stop, no error


def test_a_loader_iterators_queued_batches_are_counted():
    # the online loop's rate leaves out batches made before its window (PyTorch's queues, read privately)
    loader = DataLoader(range(64), batch_size=2, num_workers=2, prefetch_factor=2)
    iterator = iter(loader)
    next(iterator)
    deadline = time.monotonic() + 60
    while queued_batches(iterator) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)  # the workers refill what the first batch took: 2 workers x 2 prefetched
    assert queued_batches(iterator) == 4
    next(iterator)
    assert queued_batches(iterator) <= 4
    shutdown_loader_iterator(iterator)
    assert queued_batches(iter(DataLoader(range(4)))) == 0, "no workers: nothing queued"


def test_a_constructed_loader_refuses_a_new_dataset_except_through_the_hook():
    loader = DataLoader(list(range(8)), batch_size=4)
    with pytest.raises(ValueError, match="dataset"):
        loader.dataset = list(range(4))  # PyTorch guards it; the probe must swap it before the first iterator
    replace_loader_dataset(loader, [10 * value for value in range(8)])
    assert [batch.tolist() for batch in loader] == [[0, 10, 20, 30], [40, 50, 60, 70]]
    assert pin_batch({"x": [1, 2]}) == {"x": [1, 2]}  # PyTorch's nested walk: non-tensors pass through


def test_lightning_hands_every_loader_to_process_dataloader_before_iterating(tmp_path):
    from lightning.pytorch.trainer.connectors import data_connector

    source = inspect.getsource(data_connector._process_dataloader)
    assert "_prepare_dataloader" in source and "trainer.strategy.process_dataloader(dataloader)" in source
    assert source.index("_prepare_dataloader") < source.index("process_dataloader(dataloader)")
    seen = []
    hook = ProcessDataloaderHook(after=lambda loader, stage: seen.append((type(loader).__name__, stage)) or loader)
    trainer = pl.Trainer(max_epochs=1, **trainer_kwargs(tmp_path))

    class Install(pl.Callback):
        def setup(self, trainer, pl_module, stage):
            hook.install(trainer)

    trainer.callbacks.append(Install())
    trainer.fit(SleepyModel(), sleepy_loader(8, 4, 0.0))
    assert seen == [("DataLoader", "train")]
    hook.uninstall()
    assert "process_dataloader" not in trainer.strategy.__dict__


class _ManualModel(SleepyModel):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(self._step(batch))
        optimizer.step()


@pytest.mark.parametrize(
    ("model", "options"),
    [(SleepyModel, {}), (SleepyModel, {"accumulate_grad_batches": 3}), (_ManualModel, {})],
    ids=["automatic", "accumulated", "manual"],
)
def test_global_step_reader_follows_trainer_global_step(tmp_path, model, options):
    seen = []

    class Compare(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            self.read = global_step_reader(trainer)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append((self.read(), trainer.global_step))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append((self.read(), trainer.global_step))

    trainer = pl.Trainer(max_epochs=2, callbacks=[Compare()], **trainer_kwargs(tmp_path), **options)
    trainer.fit(model(), sleepy_loader(24, 4, 0.0))
    assert len(seen) == 2 * 2 * 6 and all(read == expected for read, expected in seen), seen
    assert seen[-1][1] == (12 if not options else 4)  # the steps did advance (12 batches; 3 per optimizer step)


def test_a_persistent_loader_keeps_its_iterator_until_forgotten():
    loader = DataLoader(range(8), batch_size=4, num_workers=1, persistent_workers=True)
    assert not persistent_iterator_started(loader)
    first = iter(loader)
    assert persistent_iterator_started(loader) and iter(loader) is first, "PyTorch's _iterator is no longer reused"
    forget_persistent_iterator(loader)
    assert not persistent_iterator_started(loader)
    second = iter(loader)
    assert second is not first
    shutdown_loader_iterator(first)
    shutdown_loader_iterator(second)


def test_a_built_loader_is_built_again_in_place():
    loader = DataLoader(list(range(8)), batch_size=4)
    reinit_loader(loader, {"dataset": list(range(6)), "batch_size": 3, "num_workers": 0})
    assert [batch.tolist() for batch in loader] == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="batch_size"):
        loader.batch_size = 2  # PyTorch's guard is back once __init__ ran
    assert recorded_loader_arguments(loader) is None, "outside a Trainer nothing records the arguments"


def test_lightning_records_the_arguments_a_hook_builds_its_loader_with():
    from lightning.fabric.utilities.data import _replace_dunder_methods

    # what Lightning's data connector wraps every *_dataloader call in (_request_dataloader)
    from lightning.pytorch.trainer.connectors import data_connector

    assert '_replace_dunder_methods(DataLoader, "dataset")' in inspect.getsource(data_connector._request_dataloader)
    with _replace_dunder_methods(DataLoader, "dataset"):
        loader = DataLoader(list(range(8)), 4, num_workers=0)
        assert recorded_loader_arguments(loader) == {"dataset": list(range(8)), "batch_size": 4, "num_workers": 0}
        reinit_loader(loader, {"dataset": list(range(8)), "batch_size": 2})
    assert getattr(loader, "__pl_saved_kwargs") == {"dataset": list(range(8)), "batch_size": 2}
    assert getattr(loader, "__pl_saved_args") == () and "num_workers" in getattr(loader, "__pl_saved_default_kwargs")


def test_shared_storage_and_cuda_sleep_exist():
    storage = shared_storage(16)
    assert storage.nbytes() == 16 and storage.is_shared(), "torch.UntypedStorage._new_shared changed"
    assert callable(torch.cuda._sleep), "torch.cuda._sleep is gone: autotune's and testing's GPU step need another"
    if torch.cuda.is_available():
        cuda_sleep(1000)
        torch.cuda.synchronize()


class Holder(pl.LightningModule):
    """A LightningModule holding ``net`` as a child, as ``self.net = torch.compile(net)`` does."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net


def test_torch_compile_is_found_where_a_lightning_user_puts_it():
    # torch.compile wraps lazily: nothing here compiles, so the test needs no compiler
    from lightning.pytorch.utilities.compile import from_compiled

    net = torch.nn.Linear(2, 2)
    eager, graphs = StepCompilation(True, False), StepCompilation(True, True)
    assert compiled_step(Holder(net)) is None
    assert compiled_step(Holder(torch.compile(net))) == eager
    assert compiled_step(Holder(torch.compile(net, mode="reduce-overhead"))) == graphs
    assert compiled_step(Holder(torch.compile(net, mode="max-autotune-no-cudagraphs"))) == eager
    assert compiled_step(Holder(torch.compile(net, backend="cudagraphs"))) == graphs
    assert compiled_step(Holder(torch.compile(net, options={"triton.cudagraphs": True}))) == graphs
    assert compiled_step(Holder(torch.compiler.disable(net))) is None, "disabled is not compiled"
    in_place = torch.nn.Linear(2, 2)
    in_place.compile(mode="reduce-overhead")
    assert compiled_step(Holder(in_place)) == graphs
    # fit(torch.compile(module)): Lightning unwraps it with from_compiled and keeps the dynamo context
    assert compiled_step(from_compiled(torch.compile(Holder(net)))) == eager
    assert compiled_step(from_compiled(torch.compile(Holder(net), mode="reduce-overhead"))) == graphs

    class CompiledStep(Holder):
        @torch.compile(mode="reduce-overhead")
        def training_step(self, batch, batch_idx):
            return self.net(batch).sum()

    assert compiled_step(CompiledStep(net)) == graphs


def test_the_compile_internals_the_detection_reads():
    from lightning.pytorch.utilities import compile as lightning_compile
    from torch._dynamo.eval_frame import OptimizeContext, _TorchDynamoContext, innermost_backend
    from torch.cuda import graphs

    module = torch.compile(torch.nn.Linear(2, 2), mode="reduce-overhead")
    assert isinstance(module.dynamo_ctx, OptimizeContext) and module.dynamo_ctx.compiler_config["triton.cudagraphs"]
    assert (
        innermost_backend(torch.compile(torch.nn.Linear(2, 2), backend="cudagraphs").dynamo_ctx.callback).compiler_name
        == "cudagraphs"
    )
    function = torch.compile(lambda x: x + 1)
    cells = [cell.cell_contents for cell in function.get_compiler_config.__closure__]
    assert any(isinstance(cell, _TorchDynamoContext) for cell in cells), "get_compiler_config closes over its context"
    assert '"dynamo_ctx": model.dynamo_ctx' in inspect.getsource(lightning_compile.from_compiled)
    assert torch.nn.Linear(2, 2)._compiled_call_impl is None
    # make_graphed_callables gives a module's forward a closure of its own (its qualified name names it)
    source = inspect.getsource(graphs.make_graphed_callables)
    assert "def new_fwd" in source and "func.forward = make_graphed_forward(" in source


def test_persistent_workers_set_after_init_is_refused_plainly_and_honoured_when_set_by_the_hook():
    from torch.utils.data import DataLoader

    from lightning_dataperf._lightning_hooks import set_persistent_workers, shutdown_loader_iterator

    loader = DataLoader(list(range(8)), batch_size=2, num_workers=1)
    # the reason for the hook: DataLoader guards this attribute after __init__
    with pytest.raises(ValueError, match="persistent_workers"):
        loader.persistent_workers = True
    set_persistent_workers(loader, True)
    first = iter(loader)
    assert [batch.tolist() for batch in first] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert iter(loader) is first, "the next epoch reuses the persistent iterator, its workers alive"
    shutdown_loader_iterator(first)
