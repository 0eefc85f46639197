"""The one place where lightning_dataperf touches private Lightning and PyTorch API.

``tests/test_lightning_hooks.py`` fails loudly if a release changes what these functions rely on.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader

from lightning_dataperf.tags import Stage

__all__ = [
    "FETCH_HOOKS",
    "FetchHooks",
    "ProcessDataloaderHook",
    "StepCompilation",
    "accept_connector_devices",
    "check_lightning_compatibility",
    "compiled_step",
    "cuda_sleep",
    "fetching_loops",
    "forget_persistent_iterator",
    "global_step_reader",
    "persistent_iterator_started",
    "pin_batch",
    "queued_batches",
    "recorded_loader_arguments",
    "reinit_loader",
    "replace_loader_dataset",
    "resume_position",
    "set_persistent_workers",
    "shared_storage",
    "shutdown_loader_iterator",
    "single_device_root",
    "tensorboard_prefixed",
    "validation_batches_seen",
]

FETCH_HOOKS = ("_on_before_fetch", "_on_after_fetch")

FetchCallback = Callable[[Stage], None]


def fetching_loops(trainer: pl.Trainer) -> list[tuple[Stage, Any]]:
    """The loops that fetch batches and the stage each one times (fit's val loop and ``validate``: val)."""
    return [
        (Stage.TRAIN, trainer.fit_loop.epoch_loop),
        (Stage.VAL, trainer.fit_loop.epoch_loop.val_loop),
        (Stage.VAL, trainer.validate_loop),
        (Stage.TEST, trainer.test_loop),
        (Stage.PREDICT, trainer.predict_loop),
    ]


def accept_connector_devices(strategy: Any) -> None:
    """Let Lightning's accelerator connector assign the devices (it sets ``parallel_devices`` if present)."""
    strategy.parallel_devices = None


def single_device_root(strategy: Any, device_given: bool) -> torch.device:
    """The device of a single-device strategy: the one given, else the first the connector assigned."""
    if not device_given and strategy.parallel_devices:
        return strategy.parallel_devices[0]
    return strategy._root_device


def replace_loader_dataset(loader: Any, dataset: Any) -> None:
    """Swap a constructed DataLoader's dataset (its ``__setattr__`` refuses ``dataset`` after ``__init__``).

    Done before the loader's first iterator exists, so workers receive the new dataset; the sampler
    keeps its reference to the original (same length and indices).
    """
    object.__setattr__(loader, "dataset", dataset)


def persistent_iterator_started(loader: DataLoader) -> bool:
    """Whether ``loader`` already holds the iterator its persistent workers run in (PyTorch's ``_iterator``)."""
    return getattr(loader, "_iterator", None) is not None


def forget_persistent_iterator(loader: DataLoader) -> None:
    """Make ``loader``'s next ``iter()`` start new workers rather than reuse its persistent iterator."""
    loader._iterator = None


def recorded_loader_arguments(loader: DataLoader) -> dict[str, Any] | None:
    """The arguments ``DataLoader.__init__`` was called with, by name, as Lightning recorded them while a Trainer
    asked a hook for its loaders (``__pl_saved_args``/``__pl_saved_kwargs``); ``None``: not recorded, or recorded
    for a subclass's own ``__init__`` (its arguments are not the DataLoader's)."""
    if not _inits_as_dataloader(type(loader)) or not hasattr(loader, "__pl_saved_args"):
        return None
    args, kwargs = getattr(loader, "__pl_saved_args"), getattr(loader, "__pl_saved_kwargs")
    # Bound to names, so that positional and keyword calls read alike.
    bound = _DATALOADER_SIGNATURE.bind_partial(loader, *args, **kwargs).arguments
    return {name: value for name, value in bound.items() if name != "self"}


def reinit_loader(loader: DataLoader, arguments: dict[str, Any]) -> None:
    """Run ``DataLoader.__init__`` on the built ``loader`` again with ``arguments``: it keeps its identity, class and
    its class's own attributes (PyTorch refuses a new sampler or batch size after ``__init__`` otherwise).

    Where Lightning recorded the first call, the record becomes this one (Lightning rebuilds loaders from it).
    """
    # DataLoader.__setattr__ refuses a new sampler or batch size once __initialized is set.
    object.__setattr__(loader, "_DataLoader__initialized", False)
    DataLoader.__init__(loader, **arguments)
    if _inits_as_dataloader(type(loader)) and hasattr(loader, "__pl_saved_args"):
        defaults = {
            name: parameter.default
            for name, parameter in _DATALOADER_SIGNATURE.parameters.items()
            if name != "self" and name not in arguments
        }
        # Lightning rebuilds loaders from this record, so it must describe the new call.
        for name, value in (("args", ()), ("kwargs", dict(arguments)), ("arg_names", ()), ("default_kwargs", defaults)):
            object.__setattr__(loader, f"__pl_saved_{name}", value)


_DATALOADER_SIGNATURE = inspect.signature(DataLoader.__init__)


def _inits_as_dataloader(cls: type) -> bool:
    """No class between ``cls`` and DataLoader has its own ``__init__``."""
    return all("__init__" not in vars(base) for base in cls.__mro__[: cls.__mro__.index(DataLoader)])


def shared_storage(nbytes: int) -> torch.UntypedStorage:
    """An untyped storage of ``nbytes`` in shared memory, as ``default_collate`` makes in a worker (``_new_shared``)."""
    return torch.UntypedStorage._new_shared(nbytes)


def cuda_sleep(cycles: int) -> None:
    """Keep the current CUDA stream busy for ``cycles`` GPU clock cycles (``torch.cuda._sleep``; tests, autotune)."""
    torch.cuda._sleep(cycles)


def pin_batch(batch: Any) -> Any:
    """Pin a batch the way the DataLoader's pin thread does (PyTorch's own nested-structure walk)."""
    from torch.utils.data._utils.pin_memory import pin_memory

    return pin_memory(batch)


@dataclass
class ProcessDataloaderHook:
    """Chains ``after(loader, stage)`` behind ``trainer.strategy.process_dataloader`` until uninstalled.

    Lightning hands every loader it sets up to the strategy's ``process_dataloader`` (see
    ``trainer/connectors/data_connector.py``: ``_process_dataloader``), after re-instantiating it and
    before the loop creates its iterator; that is the moment to look inside it.
    """

    after: Callable[[Any, Any], Any]
    _strategy: Any = None
    _ours: Any = None

    def install(self, trainer: pl.Trainer) -> None:
        # Installing twice would otherwise chain ours behind ours.
        self.uninstall()
        strategy = trainer.strategy
        original = strategy.process_dataloader

        def process_then_ours(dataloader: object) -> object:
            return self.after(original(dataloader), trainer.state.stage)

        # An instance attribute shadows the method: uninstall deletes it and the class is untouched.
        strategy.process_dataloader = process_then_ours
        self._strategy, self._ours = strategy, process_then_ours

    def uninstall(self) -> None:
        if self._strategy is not None:
            if self._strategy.__dict__.get("process_dataloader") is self._ours:  # never someone else's
                del self._strategy.__dict__["process_dataloader"]
            self._strategy = self._ours = None


def shutdown_loader_iterator(iterator: Any) -> tuple[int, ...]:
    """Stop a DataLoader iterator's workers and pin thread now, not at garbage collection; the process ids of
    the workers it stopped (PyTorch's ``_workers``; none for an iterator without workers)."""
    stop = getattr(iterator, "_shutdown_workers", None)
    if not callable(stop):
        return ()
    pids = tuple(pid for worker in getattr(iterator, "_workers", ()) if (pid := getattr(worker, "pid", None)))
    stop()
    return pids


def queued_batches(iterator: Any) -> int:
    """Batches a DataLoader iterator's workers made that the training process has not taken yet: in the result
    queue, the pin thread's queue and the reorder buffer (PyTorch's ``_worker_result_queue``, ``_data_queue``,
    ``_task_info``); 0 for an iterator without workers, or where a queue cannot say its size (macOS)."""
    names = ("_worker_result_queue", "_data_queue")
    # Without pin_memory both names hold the same queue: counted once.
    queues = {id(queue): queue for name in names if (queue := getattr(iterator, name, None)) is not None}
    queued = 0
    for queue in queues.values():
        with contextlib.suppress(NotImplementedError, OSError):
            queued += queue.qsize()
    # a batch that arrived before an earlier one waits here: (worker,) sent, (worker, data) received
    return queued + sum(len(task) == 2 for task in getattr(iterator, "_task_info", {}).values())


def global_step_reader(trainer: pl.Trainer) -> Callable[[], int]:
    """A zero-argument callable returning ``trainer.global_step``, for the per-step hooks (resolve it per epoch).

    ``trainer.global_step`` walks trainer, fit loop, epoch loop and module properties to the optimizer-step
    tracker of the loop's automatic or manual optimization; the trackers live as long as the loops
    (checkpoint restores and resets update them in place), so the walk is done here once. If Lightning's
    layout differs, the reader is ``trainer.global_step`` itself.
    """
    epoch_loop = trainer.fit_loop.epoch_loop
    module = trainer.lightning_module
    try:
        if module is None or module.automatic_optimization:
            tracker = epoch_loop.automatic_optimization.optim_progress.optimizer.step.total
        else:
            tracker = epoch_loop.manual_optimization.optim_step_progress.total
        if not isinstance(tracker.completed, int):
            raise AttributeError("completed")
    except AttributeError:
        return lambda: trainer.global_step
    return functools.partial(getattr, tracker, "completed")  # no Python frame per call


def resume_position(trainer: pl.Trainer) -> tuple[int, int]:
    """``(epoch, batches already trained in it)`` for the training iterator being created now.

    Lightning creates the first training iterator of a fit before it calls the sampler's
    ``set_epoch``; at that moment the restored loop counters already hold the epoch, and when it
    restarts mid-epoch, how many batches of it were completed. A checkpoint taken at the end of an
    epoch has ``processed`` already counting that epoch, so the next epoch starts from zero.
    """
    fit_loop = trainer.fit_loop
    progress = fit_loop.epoch_progress.current
    epoch = int(progress.processed)
    # Counters that disagree: an epoch was started and not finished.
    mid_epoch = progress.ready != progress.processed or progress.started != progress.processed
    if not (fit_loop.restarting and mid_epoch):
        return epoch, 0
    batches = fit_loop.epoch_loop.batch_progress
    # Saved on the epoch's last batch: the resume starts the next epoch from zero.
    if batches.is_last_batch:
        return epoch + 1, 0
    return epoch, int(batches.current.processed)


def validation_batches_seen(trainer: pl.Trainer) -> int:
    """Validation batches run so far in this fit (the fit loop's progress counter; moves when validation ran)."""
    return int(trainer.fit_loop.epoch_loop.val_loop.batch_progress.total.ready)


def tensorboard_prefixed(logger: TensorBoardLogger, metrics: Mapping[str, float]) -> dict[str, float]:
    """``metrics`` with the tags ``logger.log_metrics`` would write (its ``prefix`` joined on)."""
    prefix = logger._prefix
    if not prefix:
        return dict(metrics)
    return {f"{prefix}{logger.LOGGER_JOIN_CHAR}{tag}": value for tag, value in metrics.items()}


def check_lightning_compatibility(trainer: pl.Trainer) -> None:
    """Raise a clear error if the private fetch hooks are gone from this Lightning version."""
    missing = [
        f"{type(loop).__name__}.{name}"
        for _, loop in fetching_loops(trainer)
        for name in FETCH_HOOKS
        if not callable(getattr(loop, name, None))
    ]
    if missing:
        raise RuntimeError(
            f"lightning_dataperf cannot time batch fetches with lightning {pl.__version__}: "
            f"{', '.join(missing)} no longer exist. Pin lightning to a version listed in the "
            "lightning_dataperf README, or report this at the project's issue tracker."
        )


@dataclass
class FetchHooks:
    """Installs ``before(stage)`` / ``after(stage)`` around every loop's batch fetch.

    Lightning's data fetcher brackets exactly the loader's ``next()`` with ``data_fetcher._start_profiler`` /
    ``_stop_profiler``, which every loop points at its own ``_on_before_fetch`` / ``_on_after_fetch`` at the start
    of each run (``lightning/pytorch/loops/fetchers.py``, ``training_epoch_loop.py``). Those two methods are
    shadowed with instance attributes that call the original first and then ours, and removed at teardown.

    ``after`` runs even when ``next()`` raises ``StopIteration`` (Lightning's fetcher calls its stop
    hook in a ``finally``), so callers must tolerate an ``after`` without a batch.
    """

    before: FetchCallback
    after: FetchCallback
    _installed: list[tuple[Any, Stage]] = field(default_factory=list)

    def install(self, trainer: pl.Trainer) -> None:
        # Fail at install with a clear message rather than time nothing.
        check_lightning_compatibility(trainer)
        self.uninstall()
        for stage, loop in fetching_loops(trainer):
            original_before = loop._on_before_fetch
            original_after = loop._on_after_fetch
            loop._on_before_fetch = self._chain(original_before, self.before, stage, ours_last=True)
            loop._on_after_fetch = self._chain(original_after, self.after, stage, ours_last=False)
            self._installed.append((loop, stage))

    def uninstall(self) -> None:
        for loop, _ in self._installed:
            for name in FETCH_HOOKS:
                # Removing the instance attributes uncovers the loop's own methods again.
                loop.__dict__.pop(name, None)
        self._installed.clear()

    @property
    def installed(self) -> bool:
        return bool(self._installed)

    @staticmethod
    def _chain(original: Callable[[], None], ours: FetchCallback, stage: Stage, ours_last: bool) -> Callable[[], None]:
        # Our timer sits innermost, so the profiler's own bookkeeping is not counted as data wait.
        def before_then_ours() -> None:
            original()
            ours(stage)

        def ours_then_after() -> None:
            ours(stage)
            original()

        return before_then_ours if ours_last else ours_then_after


class StepCompilation(NamedTuple):
    """How a LightningModule's step runs: compiled by ``torch.compile``, replaying CUDA graphs, or both."""

    compiled: bool
    cuda_graphs: bool


def compiled_step(module: torch.nn.Module) -> StepCompilation | None:
    """How ``module``'s training step runs, where it is not plain eager PyTorch (``None``: eager).

    ``torch.compile`` is found where a Lightning user puts it: a compiled child (``self.net = torch.compile(net)``,
    an ``OptimizedModule``), a child compiled in place (``net.compile()``), the LightningModule compiled whole
    (``fit(torch.compile(module))``: Lightning's ``from_compiled`` keeps the compile in ``_compiler_ctx``), and
    ``training_step`` wrapped by ``torch.compile``. CUDA graphs: the compile's ``cudagraphs`` backend, Inductor's
    ``triton.cudagraphs`` (``mode="reduce-overhead"`` or ``"max-autotune"``), or a child's forward replaced by
    ``torch.cuda.make_graphed_callables``.
    """
    try:
        from torch._dynamo.eval_frame import OptimizeContext
    except ImportError:  # a torch without Dynamo: nothing here can be compiled by it
        return None
    contexts, graphed = [], False
    for child in module.modules():
        contexts += [getattr(child, "dynamo_ctx", None), _wrapper_context(getattr(child, "_compiled_call_impl", None))]
        forward = child.__dict__.get("forward")
        # make_graphed_callables replaces the forward with a closure of its own
        graphed |= "make_graphed_callables" in getattr(forward, "__qualname__", "")
    compiler = getattr(module, "_compiler_ctx", None)
    contexts += [compiler.get("dynamo_ctx") if isinstance(compiler, dict) else None]
    contexts.append(_wrapper_context(getattr(module, "training_step", None)))
    # torch.compiler.disable and torch._dynamo.run wrap the same way, without compiling
    compiles = [context for context in contexts if isinstance(context, OptimizeContext)]
    graphed |= any(_compiles_cuda_graphs(context) for context in compiles)
    return StepCompilation(bool(compiles), graphed) if compiles or graphed else None


def _wrapper_context(function: Any) -> Any:
    """The dynamo context a ``torch.compile``d function was made by (its ``get_compiler_config`` closes over it)."""
    from torch._dynamo.eval_frame import _TorchDynamoContext

    getter = getattr(function, "get_compiler_config", None)
    cells = getattr(getter, "__closure__", None) or ()
    return next((cell.cell_contents for cell in cells if isinstance(cell.cell_contents, _TorchDynamoContext)), None)


def _compiles_cuda_graphs(context: Any) -> bool:
    """A dynamo context whose backend captures CUDA graphs: ``backend="cudagraphs"``, or Inductor's cudagraphs."""
    from torch._dynamo.eval_frame import innermost_backend

    backend = innermost_backend(getattr(context, "callback", None))
    config = getattr(context, "compiler_config", None)
    return getattr(backend, "compiler_name", None) == "cudagraphs" or (
        isinstance(config, dict) and bool(config.get("triton.cudagraphs"))
    )


def set_persistent_workers(loader: Any, persistent: bool) -> None:
    """``loader.persistent_workers = persistent`` after ``__init__``, which ``DataLoader.__setattr__`` refuses;
    the next iterator honours it (the online loop sets it with each new worker count)."""
    object.__setattr__(loader, "persistent_workers", persistent)
