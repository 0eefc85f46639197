"""Autotune's trials: run one DataLoader configuration on the real dataset, the way training will consume it."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from lightning.fabric.utilities.data import sized_len
from torch.utils.data import DataLoader, Dataset, default_collate

from lightning_dataperf._lightning_hooks import shutdown_loader_iterator
from lightning_dataperf.autotune.bounds import Resources
from lightning_dataperf.autotune.consumer import TransferPath
from lightning_dataperf.autotune.drain import drain
from lightning_dataperf.autotune.measures import pooled_error
from lightning_dataperf.autotune.order import TrialOrder, coprime_stride
from lightning_dataperf.autotune.trial import (
    BUDGET_REFUSAL,
    DATASET_REFUSAL,
    OUTLIER_SHARE,
    Limits,
    Trial,
    TrialListener,
    cheapest_near,
    confirmation_candidates,
    rated,
    steady_rate,
    trial_rate,
)
from lightning_dataperf.batches import BatchFootprint, iter_tensors
from lightning_dataperf.loader.probe import TimedCollate, TimedDataset
from lightning_dataperf.loader.sharing import reclaim_segments, with_strategy
from lightning_dataperf.telemetry.hardware import Hardware

__all__ = [
    "Limits",
    "Trial",
    "TrialRunner",
    "cheapest_near",
    "confirmation_candidates",
    "repeat_outliers",
    "steady_rate",
    "threads_at_most",
]

#: The limits that end a trial before one steady round (:attr:`TrialRunner.last_cut`): the search's time budget
#: (less what it keeps back), or the trial's pass over the dataset.
BUDGET_CUT = ("the time budget ran out", "")
#: What a repeat's record takes from the latest measurement, or the earlier one where the repeat could not read it.
_LATEST_KNOWN = ("worker_busy", "worker_mb", "wait_share", "work_s", "cpu_s", "main_s", "tree_cpu_s")


class TrialRunner:
    """State of one search: budgets, the measured trials, the memory guard, the machine's bounds.

    What a trial measures and how its rate is read is in docs/autotune.md, sections 1-2.

    Example::

        runner = TrialRunner(dataset, 64, {}, hardware, TransferPath(), limits=Limits(10.0, 200, 0.03, 0.5, None, 0))
        runner.learn_batch_size()
        trial = runner.measure(4, 2, False)      # Trial(num_workers=4, ..., batches_per_sec=..., startup_s=...)
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        loader_kwargs: Mapping[str, Any],
        hardware: Hardware,
        path: TransferPath,
        limits: Limits,
        listener: TrialListener | None = None,
    ) -> None:
        self.dataset, self.batch_size, self.loader_kwargs = dataset, batch_size, dict(loader_kwargs)
        self.hardware, self.path, self.limits = hardware, path, limits
        self.listener = listener or (lambda event, value: None)
        self.deadline = time.perf_counter() + limits.time_budget
        self.trials: dict[tuple[int, int | None, bool], Trial] = {}  # measured with the workers' ``sharing``
        self.sharing: str | None = None  # how trial workers send their batches (None: the process's strategy)
        self.earlier: list[Trial] = []  # trials measured another way than ``sharing`` (see :meth:`adopt`)
        length = sized_len(dataset) or 0
        batches_per_epoch = length // max(1, batch_size) if length else None
        self.resources = Resources(hardware, limits.memory_fraction, batches_per_epoch)
        self.length, self.stride, self.offset = length, coprime_stride(length), 0
        self._kept: tuple[Any, Iterator[Any]] | None = None  # the last trial's live workers: ((config, sharing), them)
        self._reserve = 0.0
        #: Why the last :meth:`run` ended before one steady round (``None``: it did not): the limit that cut it and
        #: what to know about it, e.g. ``("the dataset ran out", "one pass of it is 24 batches, ...")``.
        self.last_cut: tuple[str, str] | None = None
        self._order: dict[Any, int] = {}  # each configuration and hand-over, by when it was first measured

    @property
    def remaining(self) -> float:
        """Seconds of the time budget left to spend now (less any :meth:`reserved` for later)."""
        return self.deadline - time.perf_counter() - self._reserve

    @contextlib.contextmanager
    def reserved(self, seconds: float) -> Iterator[None]:
        """Inside, :attr:`remaining` keeps ``seconds`` of the budget back (for what comes after: the choice, the
        hand-over's trial)."""
        outer, self._reserve = self._reserve, self._reserve + max(0.0, seconds)
        try:
            yield
        finally:
            self._reserve = outer

    def release(self, seconds: float) -> None:
        """Give ``seconds`` kept by the innermost :meth:`reserved` back early (its exit restores the outer amount)."""
        self._reserve = max(0.0, self._reserve - seconds)

    def learn_batch_size(self) -> None:
        """Load one batch in this process, so the memory guard knows the batch bytes before any trial.

        The load uses at most the rank's CPUs as PyTorch threads (:func:`threads_at_most`): a process whose
        thread count was set from the whole machine (a CPU quota, an affinity set after start-up) loads a batch
        of a CPU-heavy dataset many times slower.
        """
        kwargs = {key: value for key, value in self.loader_kwargs.items() if key in {"collate_fn", "drop_last"}}
        sampler = TrialOrder(self.length, self.offset, self.stride) if self.length else None
        with threads_at_most(self.hardware.cpus_per_rank):
            batch = next(iter(DataLoader(self.dataset, batch_size=self.batch_size, sampler=sampler, **kwargs)))
        self.offset += self.batch_size
        self.learn_footprint(batch)
        consume = self.path.consumer()  # the step's own warm-up (CUDA context, cuDNN plans) before any trial
        for _ in range(2):
            consume(batch)
        consume.finish()

    def learn_footprint(self, batch: Any) -> None:
        """The memory guard learns a batch's bytes and tensors."""
        self.resources.learn(BatchFootprint.of(batch).bytes, sum(1 for _ in iter_tensors(batch)))

    # ------------------------------------------------------------------ bounds
    def worker_bounds(self, prefetch: int | None, pin: bool) -> dict[str, int]:
        """The most workers each resource allows at this prefetch (:meth:`Resources.worker_bounds`, from the
        trials so far): the search never goes past the smallest."""
        return self.resources.worker_bounds(prefetch, pin, self.all_trials())  # a worker's memory, CPU: either way

    # ------------------------------------------------------------------ trials
    def all_trials(self) -> list[Trial]:  # those measured another way (:attr:`earlier`) first
        return [*self.earlier, *self.trials.values()]

    def in_order(self) -> list[Trial]:
        """Every trial (:meth:`all_trials`) in the order first measured: the policy's pick first, as the log showed."""
        return sorted(self.all_trials(), key=lambda trial: self._order.get(trial.measured_as, len(self._order)))

    def _current(self, trial: Trial) -> bool:  # measured the way trials are measured now
        return trial.sharing == _sent(trial.num_workers, self.sharing)

    def latest(self, trial: Trial) -> Trial:
        """The newest record of ``trial``'s configuration measured the same way (it may have been re-measured)."""
        if self._current(trial):
            return self.trials.get(trial.config, trial)
        return next((kept for kept in reversed(self.earlier) if kept.measured_as == trial.measured_as), trial)

    def measure_sharing(self, trial: Trial, strategy: str) -> Trial:
        """``trial``'s settings, the workers sending with ``strategy``; in :attr:`earlier` until adopted."""
        self.listener("start", trial.config)
        other = self.run(*trial.config, against=trial, sharing=strategy)
        self.listener("done", other)
        self.earlier.append(other)
        self._order.setdefault(other.measured_as, len(self._order))
        return other

    def adopt(self, trial: Trial) -> None:
        """From now on the trials' workers send the way ``trial``'s did (:meth:`measure_sharing`): the trials
        measured so far move to :attr:`earlier`, and ``trial`` is the first of the new way."""
        self.earlier = [kept for kept in self.earlier if kept is not trial] + list(self.trials.values())
        self.trials, self.sharing = {trial.config: trial}, trial.sharing

    def measure(self, workers: int, prefetch: int | None, pin: bool, against: Trial | None = None) -> Trial:
        """Measure a configuration once and store it (stored already: that trial); ``against``: the trial the
        search compares it with, stopped once :func:`~lightning_dataperf.autotune.trial.decided`."""
        key = (workers, prefetch if workers else None, pin)
        if key in self.trials:
            return self.trials[key]
        if (reason := self.resources.refusal(*key)) is not None:
            sent = _sent(workers, self.sharing)
            trial = Trial(*key, memory_mb=self.resources.memory_mb(*key), refused=reason, sharing=sent)
        else:
            self.listener("start", key)
            trial = self.run(*key, against=against, sharing=self.sharing)
            self.listener("done", trial)
        self.trials[key] = trial
        self._order.setdefault(trial.measured_as, len(self._order))
        return trial

    def remeasure(self, trial: Trial, cap_scale: float = 1.0, against: Trial | None = None) -> Trial:
        """Measure ``trial`` once more (``cap_scale``, ``against``: see :meth:`run`); its rate becomes the mean.

        Returns ``trial`` itself when nothing was measured (the budget is spent, or the repeat was rough: cut
        before one steady round), a new record otherwise (a rough first measurement is replaced, not averaged).

        When it was the last configuration measured, its workers are still alive (kept, idle, with their
        queues full): the repeat continues with them, so it pays no start-up (which no rate includes).
        """
        if trial.refused is not None or self.remaining <= 0:
            return trial
        self.listener("start", trial.config)
        before = trial
        again = self.run(*trial.config, cap_scale=cap_scale, against=against, sharing=trial.sharing)
        # a repeat cut before one steady round is not averaged in: its rate is the burst of queued batches
        if trial.rough and again.batches > 1 and not again.rough:
            trial = again  # the first was rough (the burst's rate): the steady repeat replaces it
        elif again.batches > 1 and again.batches_per_sec > 0 and not again.rough:
            count = trial.measurements
            trial = dataclasses.replace(
                again,
                batches_per_sec=(trial.batches_per_sec * count + again.batches_per_sec) / (count + 1),
                batches=trial.batches + again.batches,
                measurements=count + 1,
                seconds=trial.seconds + again.seconds,
                startup_s=trial.startup_s if again.startup_s < 0 else min(trial.startup_s, again.startup_s),
                precision=pooled_error(trial, again, count),
                **{name: getattr(trial, name) for name in _LATEST_KNOWN if getattr(again, name) is None},
            )
        if self._current(trial):
            self.trials[trial.config] = trial
        else:  # a trial measured before the search adopted another hand-over: it stays where it was
            self.earlier = [trial if kept.measured_as == trial.measured_as else kept for kept in self.earlier]
        if trial is before:  # the repeat measured nothing: say which limit cut it (not always the time budget)
            self.listener("nothing", (trial, self.last_cut or BUDGET_CUT))
        else:
            self.listener("done", trial)
        return trial

    def _cut_by(self, exhausted: bool, batches: int, workers: int, in_flight: int) -> tuple[str, str]:
        """The limit that ended a trial before one steady round, in words (the progress line and the stop name it)."""
        if exhausted:
            per_pass = -(-self.length // max(1, self.batch_size)) if self.length else batches
            held = f", {in_flight} of them in flight at {workers} workers" if in_flight else ""
            return (
                "the dataset ran out",
                f"one pass of it is {per_pass} batches{held}: a longer time_budget cannot help",
            )
        return BUDGET_CUT

    def close(self) -> None:
        """Shut down the workers kept from the last trial."""
        kept, self._kept = self._kept, None
        if kept is not None:
            _stop(kept[1])
            gc.collect()

    def _loader(self, workers: int, prefetch: int | None, pin: bool, sharing: str | None = None) -> DataLoader:
        sampler = TrialOrder(self.length, self.offset, self.stride) if self.length else None
        kwargs = {
            key: value
            for key, value in with_strategy(self.loader_kwargs, sharing).items()
            if key not in {"shuffle", "sampler", "batch_sampler", "collate_fn"}
        }
        kwargs.update(num_workers=workers, pin_memory=pin, generator=torch.Generator().manual_seed(0))
        if workers:
            kwargs["prefetch_factor"] = prefetch
        collate = TimedCollate(self.loader_kwargs.get("collate_fn") or default_collate)
        return DataLoader(TimedDataset(self.dataset), self.batch_size, sampler=sampler, collate_fn=collate, **kwargs)

    def run(
        self,
        workers: int,
        prefetch: int | None,
        pin: bool,
        cap_scale: float = 1.0,
        against: Trial | None = None,
        sharing: str | None = None,
    ) -> Trial:
        """One measurement of a configuration, not stored (:meth:`measure` stores it; the benchmark's grid uses this).

        ``cap_scale`` stretches the trial's time and batch caps and tightens its precision by as much (a close
        call is measured longer). ``against``: stop once decided against that trial (see :meth:`measure`).
        ``sharing``: the workers send their batches with this ``torch.multiprocessing`` sharing strategy
        (:class:`~lightning_dataperf.loader.sharing.ShareBy`; ``None``: the process's own). ``startup_s`` is -1 when
        the kept workers of the previous measurement of the same configuration were reused (no start-up paid).
        """
        config = (workers, prefetch if workers else None, pin)
        sharing = _sent(workers, sharing)
        kept_as = (config, sharing)  # workers that send another way are not these workers
        reused = self._kept is not None and self._kept[0] == kept_as
        if reused:
            iterator = self._kept[1]  # type: ignore[index]
        else:
            self.close()
        self._kept = None
        started = time.perf_counter()
        if not reused:
            iterator = iter(self._loader(*config, sharing=sharing))
        # the batches the workers may hold made (queued, or in hand-over)
        in_flight = workers * (prefetch or 0)
        skip = max(0, in_flight - 1)  # the burst: the batches after the first queued during start-up
        try:
            drained = drain(self, iterator, started, workers, skip, in_flight, cap_scale, against)
        except BaseException:
            _stop(iterator)
            raise
        if drained.exhausted:
            _stop(iterator)
            gc.collect()
        else:
            self._kept = (kept_as, iterator)
        arrivals = drained.arrivals
        seconds = time.perf_counter() - started
        self.offset += len(arrivals) * self.batch_size
        rate, error, rough = trial_rate(arrivals, drained.made_at, workers, skip, in_flight)  # rough: no steady round
        self.last_cut = None
        if rough or len(arrivals) < 2:
            self.last_cut = self._cut_by(drained.exhausted, len(arrivals), workers, in_flight)
        memory = self.resources.memory_mb(workers, prefetch, pin)
        startup = -1.0 if reused else drained.startup
        if len(arrivals) < 2:  # no rate could be measured: not a result
            reason = DATASET_REFUSAL if drained.exhausted else BUDGET_REFUSAL
            return Trial(*config, startup_s=startup, batches=len(arrivals), seconds=seconds, memory_mb=memory,
                         refused=reason, sharing=sharing)  # fmt: skip
        return Trial(
            *config,
            rate,
            startup,
            len(arrivals),
            memory,
            seconds=seconds,
            worker_busy=drained.busy,
            worker_mb=drained.worker_mb,
            precision=None if math.isinf(error) else error,
            wait_share=drained.wait_share,
            work_s=drained.work_s,
            cpu_s=drained.cpu_s,
            main_s=drained.main_s,
            tree_cpu_s=drained.tree_cpu_s,
            rough=rough,
            sharing=sharing,
        )


@contextlib.contextmanager
def threads_at_most(cpus: int) -> Iterator[None]:
    """PyTorch's intra-op threads capped at ``cpus`` inside the block, as they were after it.

    Example::

        with threads_at_most(hardware.cpus_per_rank):
            batch = next(iter(loader))       # no more threads than this rank's CPUs
    """
    before = torch.get_num_threads()
    if before > cpus >= 1:
        torch.set_num_threads(cpus)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def repeat_outliers(runner: TrialRunner) -> None:
    """Measure again any trial much slower than both neighbours in worker count (a peak is real, a dip suspect:
    below :data:`~lightning_dataperf.autotune.trial.OUTLIER_SHARE` of the slower neighbour), while budget is left."""
    groups: dict[tuple[int | None, bool], list[Trial]] = {}
    for trial in rated(runner.trials.values()):
        if trial.num_workers:
            groups.setdefault((trial.prefetch_factor, trial.pin_memory), []).append(trial)
    for trials in groups.values():
        trials.sort(key=lambda trial: trial.num_workers)
        for left, middle, right in zip(trials, trials[1:], trials[2:], strict=False):
            low = min(left.batches_per_sec, right.batches_per_sec)
            outlier = middle.batches_per_sec < OUTLIER_SHARE * low  # a dip (start-up, memory artefacts)
            if outlier and middle.measurements == 1 and runner.remaining > 0:
                runner.remeasure(runner.trials[middle.config])


def _stop(iterator: Iterator[Any]) -> None:
    """Stop a trial loader's workers, and remove the batches the exited ones had sent by file name that no trial
    received (:func:`~lightning_dataperf.loader.sharing.reclaim_segments`: they would stay in ``/dev/shm`` until the
    process ends)."""
    reclaim_segments(shutdown_loader_iterator(iterator))


def _sent(workers: int, sharing: str | None) -> str | None:
    """How a trial of ``workers`` sends its batches with ``sharing`` asked for: no workers, nothing is sent."""
    return sharing if workers else None
