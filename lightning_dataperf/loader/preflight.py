"""Pre-flight checks: problems a DataLoader configuration will run into, found before they bite (nothing raises)."""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from lightning_dataperf.batches import BatchFootprint
from lightning_dataperf.loader.main_rng import rng_restored
from lightning_dataperf.loader.settings import LoaderFacts, first_loader
from lightning_dataperf.telemetry.hardware import Hardware, default_start_method

__all__ = [
    "BatchFootprint",
    "FitPreflight",
    "Problem",
    "check_batch",
    "check_loader",
    "estimate_footprint",
    "open_file_limit",
    "pinned_bytes",
    "startup_problems",
]

_MB = 2**20
#: Share of available RAM that pinned batches may take before we warn.
PINNED_RAM_SHARE = 0.5


@dataclass(frozen=True)
class Problem:
    """One pre-flight finding: a short ``check`` id and a message with numbers and the fix."""

    check: str
    message: str


def pinned_bytes(batch_bytes: int, batches: int) -> int:
    """Pinned RAM for ``batches`` batches: the CachingHostAllocator rounds each block up to a power of two."""
    return pinned_block_bytes(batch_bytes) * batches


def pinned_block_bytes(batch_bytes: int) -> int:
    return 2 ** math.ceil(math.log2(max(1, batch_bytes)))


def open_file_limit() -> int | None:
    """The soft ``RLIMIT_NOFILE`` of this process (``None`` off Unix)."""
    try:
        import resource
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def _start_method(loader: Any) -> str:
    context = getattr(getattr(loader, "dataloader", loader), "multiprocessing_context", None)
    if context is None:
        return default_start_method()
    # multiprocessing_context may be a name or a context object.
    return context if isinstance(context, str) else context.get_start_method()


def check_loader(loader: Any, hardware: Hardware, cuda_initialized: bool | None = None) -> list[Problem]:
    """Checks that need only the loader's settings and the hardware.

    Example::

        from lightning_dataperf.telemetry.hardware import probe_hardware
        from lightning_dataperf.loader.preflight import check_loader

        for problem in check_loader(train_loader, probe_hardware()):
            print(problem.message)
    """
    problems = []
    workers = LoaderFacts.of(loader).num_workers or 0
    budget = hardware.cpus_per_rank
    if workers > budget:
        problems.append(
            Problem(
                "workers_exceed_cpus",
                f"num_workers={workers} but this rank may use {budget} CPUs ({hardware.usable_cpus} usable "
                f"[{hardware.usable_cpus_source}] / {hardware.local_world_size} local ranks): workers will "
                f"time-share the cores and the main process starves. Use num_workers<={max(1, budget - 1)} "
                "(TunedDataModule does this for you).",
            )
        )
    if cuda_initialized is None:
        cuda_initialized = torch.cuda.is_available() and torch.cuda.is_initialized()
    if workers and cuda_initialized and _start_method(loader) == "fork":
        problems.append(
            Problem(
                "fork_after_cuda",
                "CUDA is already initialised in this process and the loader's workers will be forked: any CUDA "
                "call in a worker fails with 'Cannot re-initialize CUDA in forked subprocess'. Keep datasets "
                "CPU-only, or pass DataLoader(multiprocessing_context='spawn' or 'forkserver').",
            )
        )
    return problems


def check_batch(footprint: BatchFootprint, loader: Any, hardware: Hardware) -> list[Problem]:
    """Checks that need the size of a real batch: ``/dev/shm``, open files, pinned RAM."""
    problems = []
    settings = LoaderFacts.of(loader)
    workers = settings.num_workers or 0
    # 2 is DataLoader's own default with workers.
    prefetch = (settings.prefetch_factor or 2) if workers else 0
    in_flight = workers * prefetch
    # Only workers pass batches through /dev/shm.
    if workers and hardware.shm_free_mb is not None:
        need = footprint.bytes * in_flight / _MB
        if need > hardware.shm_free_mb:
            problems.append(
                Problem(
                    "shm_too_small",
                    f"/dev/shm has {hardware.shm_free_mb:.0f} MB free but {workers} workers x prefetch_factor "
                    f"{prefetch} x {footprint.bytes / _MB:.1f} MB batches need about {need:.0f} MB: expect "
                    "'No space left on device' or 'DataLoader worker ... killed by signal: Bus error'. Enlarge it "
                    "(docker run --shm-size=...), or lower num_workers / prefetch_factor.",
                )
            )
    limit = open_file_limit()
    # Only file_descriptor sharing holds a descriptor per tensor in flight.
    if workers and limit is not None and torch.multiprocessing.get_sharing_strategy() == "file_descriptor":
        # Doubled, plus 256, for margin: the process holds other files too.
        need = 2 * in_flight * max(1, footprint.tensors) + 256
        if need > limit:
            problems.append(
                Problem(
                    "open_files",
                    f"the open-file limit is {limit} but {in_flight} batches in flight x {footprint.tensors} tensors "
                    f"share one file descriptor each (about {need} with margin): expect 'Too many open files' or "
                    "'received 0 items of ancdata'. Raise it (ulimit -n 65536) or call "
                    "torch.multiprocessing.set_sharing_strategy('file_system').",
                )
            )
    pinned = bool(settings.pin_memory)
    if pinned and hardware.ram_available_mb:
        block = pinned_block_bytes(footprint.bytes)
        need = pinned_bytes(footprint.bytes, in_flight + 2) / _MB
        if need > PINNED_RAM_SHARE * hardware.ram_available_mb:
            problems.append(
                Problem(
                    "pinned_ram",
                    f"pinned batches need about {need:.0f} MB ({in_flight + 2} batches, each rounded up to a "
                    f"{block / _MB:.0f} MB power-of-two block by the CachingHostAllocator) of "
                    f"{hardware.ram_available_mb:.0f} MB available RAM; pinned pages cannot be swapped. Lower "
                    "prefetch_factor / num_workers or the batch size; ulimit -l does not matter for cudaHostAlloc.",
                )
            )
    return problems


def estimate_footprint(loader: Any) -> BatchFootprint | None:
    """A batch's bytes before any batch exists: one sample (read in this process) times the batch size.

    The sample is read with the random generators' states restored afterwards, so the training run's
    draws are the same as without the check. ``None`` when it cannot be estimated (an iterable dataset,
    no ``batch_size``, a sample that fails to load); the first real batch is checked then.
    """
    from torch.utils.data import IterableDataset

    from lightning_dataperf.loader.probe import untimed

    loader = getattr(loader, "dataloader", loader)
    dataset, batch_size = untimed(getattr(loader, "dataset", None)), getattr(loader, "batch_size", None)
    if dataset is None or not batch_size or isinstance(dataset, IterableDataset):
        return None
    # Pre-flight never raises: a sample that fails to load leaves the check to the first real batch.
    try:
        # a shallow copy: a handle opened lazily by __getitem__ stays out of the original
        with rng_restored():
            sample = copy.copy(dataset)[0]
    except Exception:
        return None
    one = BatchFootprint.of(sample)
    # A sample without tensors says nothing about a batch's bytes.
    return BatchFootprint(one.bytes * batch_size, one.tensors) if one.tensors else None


def startup_problems(loader: Any, hardware: Hardware, worker_budget_checked: bool) -> tuple[list[Problem], bool]:
    """The checks at training start: the loader's settings, and the batch's needs where they can be estimated.

    Returns the problems and whether the batch checks ran (else they run on the first batch).
    ``worker_budget_checked``: the DataModule checked ``num_workers`` against the CPUs itself.
    """
    problems = check_loader(loader, hardware)
    if worker_budget_checked:
        # It warned about an explicit num_workers when it built the loader (and autotune's choice is
        # measured): saying it again here would only repeat or contradict it.
        problems = [problem for problem in problems if problem.check != "workers_exceed_cpus"]
    estimate = estimate_footprint(loader)
    if estimate is not None:
        problems += check_batch(estimate, loader, hardware)
    return problems, estimate is not None


class FitPreflight:
    """The checks :class:`~lightning_dataperf.DataPerfCallback` runs in a fit: the loader's settings when
    training starts, the first batch's footprint once; each problem warned on rank zero and kept in ``problems``.

    Example::

        preflight = FitPreflight()
        preflight.at_train_start(trainer, hardware)       # on_train_start
        preflight.first_batch(trainer, batch, hardware)   # the first on_train_batch_start
        [problem.check for problem in preflight.problems]
    """

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.batch_checked = False  # the first batch is checked (or needs no check: its footprint was estimated)

    def at_train_start(self, trainer: Any, hardware: Hardware) -> None:
        loader = first_loader(trainer.train_dataloader)
        if loader is not None:
            checked = getattr(trainer.datamodule, "dataperf_checks_worker_budget", False)
            problems, self.batch_checked = startup_problems(loader, hardware, checked)
            self._warn(trainer, problems)

    def first_batch(self, trainer: Any, batch: Any, hardware: Hardware) -> None:
        self.batch_checked = True
        loader = first_loader(trainer.train_dataloader)
        if loader is not None:
            self._warn(trainer, check_batch(BatchFootprint.of(batch), loader, hardware))

    def _warn(self, trainer: Any, problems: list[Problem]) -> None:
        self.problems.extend(problems)
        # Every rank keeps its problems; rank zero alone warns, so each is said once.
        if trainer.is_global_zero:
            for problem in problems:
                warnings.warn(f"DataPerf pre-flight [{problem.check}]: {problem.message}", stacklevel=2)
